#pragma once
// max/min along a dim (values and indices), argmax/argmin, and the
// backward that scatters the gradient to the chosen indices.
#include <cstring>

#include "../../ops/max_min.hpp"
#include "../../runtime/backend.hpp"
#include "parallel.hpp"

#include "abi.hpp"

namespace frugal::cpu::inline FRUGAL_KERNEL_ABI {

// bf16/f16 compare as f32 (exact), f32 and f64 as themselves.
template <class S>
using CompareAs = std::conditional_t<std::is_same_v<S, double>, double, float>;

// The index along the dim of the first maximum (is_max) or minimum of
// x[o, :, i]; a NaN beats every number and the first NaN wins (PyTorch).
template <class S>
std::int64_t extreme_index(const S* x, const AxisView& v, std::int64_t o, std::int64_t i, bool is_max) {
  const S* p = x + o * v.n * v.inner + i;
  CompareAs<S> best = math::convert<CompareAs<S>>(p[0]);
  std::int64_t at = 0;
  for (std::int64_t j = 1; j < v.n && best == best; ++j) {
    const auto c = math::convert<CompareAs<S>>(p[j * v.inner]);
    if ((is_max ? c > best : c < best) || c != c) best = c, at = j;
  }
  return at;
}

// fn(o, i, j) for every output position (o, i) with its chosen index j.
template <class S, class Fn>
void for_each_extreme(const S* x, const AxisView& v, bool is_max, Fn&& fn) {
  parallel_for(v.outer * v.inner, v.n, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t t = b; t < e; ++t) {
      const std::int64_t o = t / v.inner, i = t % v.inner;
      fn(t, o, i, extreme_index(x, v, o, i, is_max));
    }
  });
}

inline void max_min_dim_kernel(const ops::MaxMinDim& op, const KernelArgs& a) {
  dispatch_storage(a.in[0].dtype, op.name().c_str(), [&](auto tag) {
    using S = decltype(tag);
    const Shape& s = *a.in[0].shape;
    const AxisView v = axis_view(s, op.dim_for(s));
    const S* x = a.in[0].as<S>();
    S* y = a.out[0].as<S>();
    std::int64_t* idx = a.out[1].as<std::int64_t>();
    for_each_extreme(x, v, op.is_max(), [&](std::int64_t t, std::int64_t o, std::int64_t i, std::int64_t j) {
      y[t] = x[(o * v.n + j) * v.inner + i];
      idx[t] = j;
    });
  });
}

inline void argmax_min_kernel(const ops::ArgMaxMin& op, const KernelArgs& a) {
  dispatch_storage(a.in[0].dtype, op.name().c_str(), [&](auto tag) {
    using S = decltype(tag);
    const Shape& s = *a.in[0].shape;
    const AxisView v = axis_view(s, op.dim_for(s));
    const S* x = a.in[0].as<S>();
    const bool wide = a.out[0].dtype == DType::i64;
    for_each_extreme(x, v, op.is_max(), [&](std::int64_t t, std::int64_t, std::int64_t, std::int64_t j) {
      if (wide) a.out[0].as<std::int64_t>()[t] = j;
      else a.out[0].as<std::int32_t>()[t] = std::int32_t(j);
    });
  });
}

inline void max_min_dim_grad_kernel(const ops::MaxMinDimGrad& op, const KernelArgs& a) {
  dispatch_storage(op.input().dtype, "max_min_dim_grad", [&](auto tag) {
    using S = decltype(tag);
    const Shape& s = op.input().shape;
    const AxisView v = axis_view(s, op.dim_for(s));
    const std::int64_t* idx = a.in[0].as<std::int64_t>();
    const S* g = a.in[1].as<S>();
    S* dx = a.out[0].as<S>();
    std::memset(static_cast<void*>(dx), 0, std::size_t(s.numel()) * sizeof(S));  // +0 in every float dtype
    parallel_for(v.outer * v.inner, v.n, [&](std::int64_t b, std::int64_t e) {
      for (std::int64_t t = b; t < e; ++t) {
        const std::int64_t o = t / v.inner, i = t % v.inner;
        dx[(o * v.n + idx[t]) * v.inner + i] = g[t];
      }
    });
  });
}

}  // namespace frugal::cpu
