#pragma once
// Sum over axes, and its adjoint broadcast_to.
#include <bit>
#include <cstring>

#include "../../ops/reduce.hpp"
#include "../../runtime/backend.hpp"
#include "isa.hpp"
#include "parallel.hpp"
#include "strided.hpp"

#include "abi.hpp"

namespace frugal::cpu::inline FRUGAL_KERNEL_ABI {

// out[o, i] = sum_r x[o, r, i], summed in r order in f64 (for f32, bf16 and
// f16 too), rounded once on store.
template <class T>
void sum_block(const T* x, T* out, std::int64_t O, std::int64_t R, std::int64_t I) {
  using Acc = double;
  if (I == 1) {
    parallel_for(O, R, [&](std::int64_t b, std::int64_t e) {
      for (std::int64_t o = b; o < e; ++o) {
        Acc s = 0;
        const T* row = x + o * R;
        for (std::int64_t r = 0; r < R; ++r) s += math::convert<Acc>(row[r]);
        out[o] = math::convert<T>(s);
      }
    });
    return;
  }
  // Columns: split (o, column block) pairs so a bias gradient ([N, C] -> [C])
  // parallelises: 64 columns a block (eight AVX-512 registers of doubles),
  // so even C = 256 makes four tasks. Each column's sum runs over r in order
  // whatever the blocking, so its bits do not depend on it.
  constexpr std::int64_t kBlock = 64;
  std::int64_t blocks = (I + kBlock - 1) / kBlock;
  parallel_for(O * blocks, R * kBlock, [&](std::int64_t b, std::int64_t e) {
    Acc acc[kBlock];
    for (std::int64_t t = b; t < e; ++t) {
      std::int64_t o = t / blocks, i0 = (t % blocks) * kBlock, w = std::min(kBlock, I - i0);
      for (std::int64_t j = 0; j < w; ++j) acc[j] = 0;
      run_widest_unless_f64<T>([&] {
        for (std::int64_t r = 0; r < R; ++r) {
          const T* src = x + (o * R + r) * I + i0;
          for (std::int64_t j = 0; j < w; ++j) acc[j] += math::convert<Acc>(src[j]);
        }
      });
      for (std::int64_t j = 0; j < w; ++j) out[o * I + i0 + j] = math::convert<T>(acc[j]);
    }
  });
}

inline void sum_kernel(const ops::Sum& op, const KernelArgs& a) {
  dispatch_storage(a.in[0].dtype, "sum", [&](auto tag) {
    using T = decltype(tag);
    const Shape& s = *a.in[0].shape;
    check_rank(s, "sum");
    std::uint32_t mask = op.axes_mask(s);
    const T* x = a.in[0].as<T>();
    T* y = a.out[0].as<T>();
    if (mask == 0) {
      std::memcpy(y, x, std::size_t(s.numel()) * sizeof(T));
      return;
    }
    int lo = std::countr_zero(mask), hi = 31 - std::countl_zero(mask);
    if (std::popcount(mask) == hi - lo + 1) {  // one contiguous block of axes: [O, R, I]
      std::int64_t O = 1, R = 1, I = 1;
      for (int d = 0; d < s.rank(); ++d) (d < lo ? O : d <= hi ? R : I) *= s[d];
      sum_block(x, y, O, R, I);
      return;
    }
    // Scattered axes: each output element walks its reduced sub-box.
    Strides st = strides_of(s);
    std::int64_t kept_n = 1, red_n = 1;
    for (int d = 0; d < s.rank(); ++d) ((mask >> d) & 1 ? red_n : kept_n) *= s[d];
    parallel_for(kept_n, red_n, [&](std::int64_t b, std::int64_t e) {
      for (std::int64_t o = b; o < e; ++o) {
        std::int64_t base = 0, rem = o;
        for (int d = s.rank() - 1; d >= 0; --d)
          if (!((mask >> d) & 1)) {
            base += (rem % s[d]) * st[d];
            rem /= s[d];
          }
        double acc = 0;
        for (std::int64_t r = 0; r < red_n; ++r) {
          std::int64_t off = 0, q = r;
          for (int d = s.rank() - 1; d >= 0; --d)
            if ((mask >> d) & 1) {
              off += (q % s[d]) * st[d];
              q /= s[d];
            }
          acc += math::convert<double>(x[base + off]);
        }
        y[o] = math::convert<T>(acc);
      }
    });
  });
}

inline void broadcast_kernel(const ops::BroadcastTo&, const KernelArgs& a) {
  // Data movement only: any dtype of the element's size.
  dispatch_bits(a.in[0].dtype, "broadcast_to", [&](auto tag) {
    using T = decltype(tag);
    const Shape& out = *a.out[0].shape;
    const T* x = a.in[0].as<T>();
    T* y = a.out[0].as<T>();
    if (out.rank() == 0) {
      y[0] = x[0];
      return;
    }
    auto sx = broadcast_strides(*a.in[0].shape, out);
    std::int64_t cols = out.dim(-1), rows = out.numel() / std::max<std::int64_t>(cols, 1), cx = sx[out.rank() - 1];
    parallel_for(rows, cols, [&](std::int64_t b, std::int64_t e) {
      for (std::int64_t r = b; r < e; ++r) {
        const T* xr = x + row_offset(r, out, sx);
        T* yr = y + r * cols;
        if (cx == 0)
          std::fill(yr, yr + cols, xr[0]);
        else
          for (std::int64_t j = 0; j < cols; ++j) yr[j] = xr[j * cx];
      }
    });
  });
}


}  // namespace frugal::cpu
