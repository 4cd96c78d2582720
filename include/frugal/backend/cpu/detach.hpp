#pragma once
// detach is a view: the planner gives its output its input's memory, so
// this copies only when a plan did not (it never does today).
#include <cstring>

#include "../../ops/detach.hpp"
#include "../../runtime/backend.hpp"

#include "abi.hpp"

namespace frugal::cpu::inline FRUGAL_KERNEL_ABI {

inline void detach_kernel(const ops::Detach&, const KernelArgs& a) {
  const std::size_t bytes = std::size_t(a.in[0].numel()) * dtype_size(a.in[0].dtype);
  if (a.out[0].data != a.in[0].data) std::memcpy(a.out[0].data, a.in[0].data, bytes);
}

}  // namespace frugal::cpu
