#pragma once
// softmax / log_softmax along one axis, viewed as [outer, n, inner]; each
// (outer, inner) line is independent, summed in index order.
#include <cmath>

#include "../../ops/softmax.hpp"
#include "kernel_table.hpp"
#include "parallel.hpp"

namespace frugal::cpu {

struct AxisView {
  std::int64_t outer = 1, n = 1, inner = 1;
};

inline AxisView axis_view(const Shape& s, int axis) {
  AxisView v;
  for (int d = 0; d < s.rank(); ++d) (d < axis ? v.outer : d == axis ? v.n : v.inner) *= s[d];
  return v;
}

// Calls line(x, y, ...) with pointers to the start of each line and its stride.
template <class Fn>
void for_each_line(const AxisView& v, Fn&& line) {
  parallel_for(v.outer * v.inner, v.n, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t t = b; t < e; ++t) {
      std::int64_t o = t / v.inner, i = t % v.inner;
      line(o * v.n * v.inner + i, v.inner);
    }
  });
}

template <class T, bool Log>
void softmax_forward(const T* x, T* y, const AxisView& v) {
  for_each_line(v, [&](std::int64_t base, std::int64_t st) {
    const T* xl = x + base;
    T* yl = y + base;
    T mx = xl[0];
    for (std::int64_t j = 1; j < v.n; ++j) mx = std::max(mx, xl[j * st]);
    T s = 0;
    for (std::int64_t j = 0; j < v.n; ++j) {
      T e = math::exp_(xl[j * st] - mx);
      if (!Log) yl[j * st] = e;
      s += e;
    }
    if constexpr (Log) {
      T lse = mx + math::log_(s);
      for (std::int64_t j = 0; j < v.n; ++j) yl[j * st] = xl[j * st] - lse;
    } else {
      T inv = T(1) / s;
      for (std::int64_t j = 0; j < v.n; ++j) yl[j * st] *= inv;
    }
  });
}

template <class OpT, bool Log>
void softmax_kernel(const OpT& op, const KernelArgs& a) {
  dispatch_float(a.in[0].dtype, Log ? "log_softmax" : "softmax", [&](auto tag) {
    using T = decltype(tag);
    const Shape& s = *a.in[0].shape;
    softmax_forward<T, Log>(a.in[0].as<T>(), a.out[0].as<T>(), axis_view(s, op.axis_for(s)));
  });
}

template <class OpT, bool Log>
void softmax_grad_kernel(const OpT& op, const KernelArgs& a) {
  dispatch_float(a.in[0].dtype, Log ? "log_softmax_grad" : "softmax_grad", [&](auto tag) {
    using T = decltype(tag);
    const Shape& s = *a.in[0].shape;
    const T *y = a.in[0].as<T>(), *dy = a.in[1].as<T>();
    T* dx = a.out[0].as<T>();
    AxisView v = axis_view(s, op.axis_for(s));
    for_each_line(v, [&](std::int64_t base, std::int64_t st) {
      const T *yl = y + base, *gl = dy + base;
      T* dl = dx + base;
      T dot = 0;
      for (std::int64_t j = 0; j < v.n; ++j) dot += Log ? gl[j * st] : gl[j * st] * yl[j * st];
      for (std::int64_t j = 0; j < v.n; ++j) {
        if constexpr (Log)
          dl[j * st] = gl[j * st] - math::exp_(yl[j * st]) * dot;
        else
          dl[j * st] = yl[j * st] * (gl[j * st] - dot);
      }
    });
  });
}

inline const bool softmax_registered = kernels().add<ops::Softmax>(softmax_kernel<ops::Softmax, false>) &&
                                       kernels().add<ops::LogSoftmax>(softmax_kernel<ops::LogSoftmax, true>) &&
                                       kernels().add<ops::SoftmaxGrad>(softmax_grad_kernel<ops::SoftmaxGrad, false>) &&
                                       kernels().add<ops::LogSoftmaxGrad>(
                                           softmax_grad_kernel<ops::LogSoftmaxGrad, true>);

}  // namespace frugal::cpu
