#pragma once
// Kernel unit (compiled once per program; see ../register.hpp): elementwise
// math, fused elementwise chains, the vectorised exact GELU, casts, reshape and permute,
// where and detach.
#include "../../../ops/gelu.hpp"
#include "../../../ops/pointwise.hpp"
#include "../detach.hpp"
#include "../where.hpp"
#include "../cast.hpp"
#include "../elementwise.hpp"
#include "../fused_elementwise.hpp"
#include "../register.hpp"
#include "../shape.hpp"

namespace frugal::cpu {

void add_elementwise_kernels(KernelTable& t, const BackendOptions&) {
  add_unary_kernels(t, ops::UnaryFunctors{});
  add_unary_kernels(t, ops::FunctorList<math::GeluErfPoly>{});
  add_binary_kernels(t, ops::BinaryFunctors{});
  t.add<ops::FusedElementwise>(fused_elementwise_kernel);
  t.add<ops::FillLike>(fill_kernel);
  t.add<ops::Cast>(cast_kernel);
  t.add<ops::Reshape>(reshape_kernel);
  t.add<ops::Permute>(permute_kernel);
  add_unary_kernels(t, ops::PointwiseFunctors{});
  add_binary_kernels(t, ops::MinMaxFunctors{});
  t.add<ops::Where>(where_kernel);
  t.add<ops::WhereGrad>(where_grad_kernel);
  t.add<ops::Detach>(detach_kernel);
}

}  // namespace frugal::cpu
