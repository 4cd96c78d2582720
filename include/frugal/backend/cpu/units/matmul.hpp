#pragma once
// Kernel unit (compiled once per program; see ../register.hpp): matmul,
// linear and sparse-dense products.
#include "../matmul.hpp"
#include "../register.hpp"
#include "../spmm.hpp"

namespace frugal::cpu {

void add_matmul_kernels(KernelTable& t, const BackendOptions&) {
  t.add<ops::MatMul>(matmul_kernel, f32_images_workspace<ops::MatMul>);
  t.add<ops::Linear>(linear_kernel, f32_images_workspace<ops::Linear>);
  t.add<ops::Spmm>(spmm_kernel);
  t.add<ops::SpmmPermuted>(spmm_permuted_kernel);
  t.add<ops::SpmmValuesGrad>(spmm_values_grad_kernel);
}

}  // namespace frugal::cpu
