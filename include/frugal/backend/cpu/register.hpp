#pragma once
// The CPU backend's kernel table, filled family by family when a CpuBackend
// is made. Each family's function is defined in its unit (units/*.hpp): a
// program compiles every unit once, with frugal's own flags, through
// frugal_add_kernels(target) in CMake (one translation unit per unit, built
// in parallel) or by including <frugal/kernels.hpp> in exactly one file.
// Forgetting both is an undefined reference to these functions at link time.
//
// Adding a kernel family: its kernels in backend/cpu/<family>.hpp (inline,
// no registration), a unit units/<family>.hpp that defines add_<family>_kernels,
// its declaration and call here, and its include in <frugal/kernels.hpp>.
#include "../../runtime/backend.hpp"

namespace frugal::cpu {

void add_elementwise_kernels(KernelTable& t, const BackendOptions& o);
void add_reduction_kernels(KernelTable& t, const BackendOptions& o);
void add_matmul_kernels(KernelTable& t, const BackendOptions& o);
void add_conv_kernels(KernelTable& t, const BackendOptions& o);
void add_norm_pool_kernels(KernelTable& t, const BackendOptions& o);
void add_attention_kernels(KernelTable& t, const BackendOptions& o);
void add_indexing_kernels(KernelTable& t, const BackendOptions& o);
void add_optimizer_kernels(KernelTable& t, const BackendOptions& o);

inline void register_cpu_kernels(KernelTable& t, const BackendOptions& o) {
  add_elementwise_kernels(t, o);
  add_reduction_kernels(t, o);
  add_matmul_kernels(t, o);
  add_conv_kernels(t, o);
  add_norm_pool_kernels(t, o);
  add_attention_kernels(t, o);
  add_indexing_kernels(t, o);
  add_optimizer_kernels(t, o);
  for (auto& extra : o.extra_kernels) extra(t);
}

}  // namespace frugal::cpu
