#pragma once
#include <cstring>

#include "../../ops/shape_ops.hpp"
#include "../../runtime/backend.hpp"
#include "parallel.hpp"
#include "strided.hpp"

#include "abi.hpp"

namespace frugal::cpu::inline FRUGAL_KERNEL_ABI {

inline void reshape_kernel(const ops::Reshape&, const KernelArgs& a) {
  std::size_t bytes = std::size_t(a.in[0].numel()) * dtype_size(a.in[0].dtype);
  if (a.out[0].data != a.in[0].data) std::memcpy(a.out[0].data, a.in[0].data, bytes);
}

template <class T>
void permute_typed(const ops::Permute& op, const KernelArgs& a) {
  const Shape& in = *a.in[0].shape;
  const Shape& out = *a.out[0].shape;
  check_rank(in, "permute");
  if (out.rank() == 0) {
    a.out[0].as<T>()[0] = a.in[0].as<T>()[0];
    return;
  }
  Strides ist = strides_of(in), src;  // src[d]: input stride of output axis d
  for (int d = 0; d < out.rank(); ++d) src[d] = ist[op.perm()[std::size_t(d)]];
  const T* x = a.in[0].as<T>();
  T* y = a.out[0].as<T>();
  std::int64_t cols = out.dim(-1), rows = out.numel() / std::max<std::int64_t>(cols, 1), cs = src[out.rank() - 1];
  parallel_for(rows, cols, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t r = b; r < e; ++r) {
      const T* xr = x + row_offset(r, out, src);
      T* yr = y + r * cols;
      for (std::int64_t j = 0; j < cols; ++j) yr[j] = xr[j * cs];
    }
  });
}

inline void permute_kernel(const ops::Permute& op, const KernelArgs& a) {
  // Data movement only: dispatch on element size, so integer tensors permute too.
  switch (dtype_size(a.in[0].dtype)) {
    case 2: return permute_typed<std::uint16_t>(op, a);
    case 4: return permute_typed<std::uint32_t>(op, a);
    case 8: return permute_typed<std::uint64_t>(op, a);
    default: fail("cpu: permute cannot move elements of dtype ", dtype_name(a.in[0].dtype));
  }
}


}  // namespace frugal::cpu
