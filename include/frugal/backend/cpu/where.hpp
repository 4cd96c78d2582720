#pragma once
// where and its backward: a select over broadcast inputs.
#include "../../ops/where.hpp"
#include "../../runtime/backend.hpp"
#include "parallel.hpp"
#include "strided.hpp"

#include "abi.hpp"

namespace frugal::cpu::inline FRUGAL_KERNEL_ABI {

// Calls fn(M{}) with the condition's element type.
template <class Fn>
void dispatch_condition(DType t, Fn&& fn) {
  switch (t) {
    case DType::u8: fn(std::uint8_t{}); return;
    case DType::i32: fn(std::int32_t{}); return;
    case DType::i64: fn(std::int64_t{}); return;
    case DType::f32: fn(float{}); return;
    case DType::f64: fn(double{}); return;
    case DType::bf16: fn(BFloat16{}); return;
    case DType::f16: fn(Half{}); return;
  }
}

template <class M>
inline bool holds(M m) {
  if constexpr (std::is_same_v<M, BFloat16> || std::is_same_v<M, Half>) return static_cast<float>(m) != 0.0f;
  else return m != M(0);
}

// y[i] = cond[i] ? a[i] : b[i] over out's shape, each input read through its
// broadcast strides. a or b may be null: 0 is read instead.
template <class M, class T>
void select_broadcast(const M* cond, const Shape& cs, const T* a, const Shape& as, const T* b, const Shape& bs, T* y,
                      const Shape& out) {
  if (out.rank() == 0) {
    y[0] = holds(cond[0]) ? (a ? a[0] : T(0)) : (b ? b[0] : T(0));
    return;
  }
  const Strides sc = broadcast_strides(cs, out), sa = broadcast_strides(as, out), sb = broadcast_strides(bs, out);
  const int last = out.rank() - 1;
  const std::int64_t cols = out.dim(-1), rows = out.numel() / std::max<std::int64_t>(cols, 1);
  const std::int64_t cc = sc[last], ca = sa[last], cb = sb[last];
  parallel_for(rows, cols, [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t r = lo; r < hi; ++r) {
      const M* cr = cond + row_offset(r, out, sc);
      const T* ar = a ? a + row_offset(r, out, sa) : nullptr;
      const T* br = b ? b + row_offset(r, out, sb) : nullptr;
      T* yr = y + r * cols;
      for (std::int64_t j = 0; j < cols; ++j) {
        const T va = ar ? ar[j * ca] : T(0), vb = br ? br[j * cb] : T(0);
        yr[j] = holds(cr[j * cc]) ? va : vb;
      }
    }
  });
}

inline void where_kernel(const ops::Where&, const KernelArgs& a) {
  dispatch_bits(a.in[1].dtype, "where", [&](auto tag) {  // a select moves bits: any float storage
    using T = decltype(tag);
    dispatch_condition(a.in[0].dtype, [&](auto mtag) {
      using M = decltype(mtag);
      select_broadcast(a.in[0].as<M>(), *a.in[0].shape, a.in[1].as<T>(), *a.in[1].shape, a.in[2].as<T>(),
                       *a.in[2].shape, a.out[0].as<T>(), *a.out[0].shape);
    });
  });
}

inline void where_grad_kernel(const ops::WhereGrad& op, const KernelArgs& a) {
  dispatch_bits(a.in[1].dtype, "where_grad", [&](auto tag) {  // zero is all-zero bits in every float dtype
    using T = decltype(tag);
    dispatch_condition(a.in[0].dtype, [&](auto mtag) {
      using M = decltype(mtag);
      const T* g = a.in[1].as<T>();
      const Shape& gs = *a.in[1].shape;
      select_broadcast(a.in[0].as<M>(), *a.in[0].shape, op.take_true() ? g : nullptr, gs,
                       op.take_true() ? nullptr : g, gs, a.out[0].as<T>(), *a.out[0].shape);
    });
  });
}

}  // namespace frugal::cpu
