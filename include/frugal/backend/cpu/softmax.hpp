#pragma once
// softmax / log_softmax along one axis, viewed as [outer, n, inner]; each
// (outer, inner) line is independent, summed in index order. bf16/f16 lines
// are computed in f32 and rounded once on store.
#include <cmath>

#include "../../ops/softmax.hpp"
#include "../../runtime/backend.hpp"
#include "parallel.hpp"

#include "abi.hpp"

namespace frugal::cpu::inline FRUGAL_KERNEL_ABI {

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

// S is the storage type, C the compute type (f32 for bf16/f16).
template <class S, class C, bool Log>
void softmax_forward(const S* x, S* y, const AxisView& v) {
  for_each_line(v, [&](std::int64_t base, std::int64_t st) {
    const S* xl = x + base;
    S* yl = y + base;
    auto ld = [&](std::int64_t j) { return math::convert<C>(xl[j * st]); };
    C mx = ld(0);
    for (std::int64_t j = 1; j < v.n; ++j) mx = std::max(mx, ld(j));
    C s = 0;
    for (std::int64_t j = 0; j < v.n; ++j) {
      C e = math::exp_(ld(j) - mx);
      if constexpr (!Log && std::is_same_v<S, C>) yl[j * st] = e;
      s += e;
    }
    if constexpr (Log) {
      C lse = mx + math::log_(s);
      for (std::int64_t j = 0; j < v.n; ++j) yl[j * st] = math::convert<S>(ld(j) - lse);
    } else if constexpr (std::is_same_v<S, C>) {
      C inv = C(1) / s;
      for (std::int64_t j = 0; j < v.n; ++j) yl[j * st] *= inv;
    } else {
      // A 16-bit y cannot hold the unnormalised exponentials without a
      // second rounding: recompute them, and round once.
      C inv = C(1) / s;
      for (std::int64_t j = 0; j < v.n; ++j) yl[j * st] = math::convert<S>(math::exp_(ld(j) - mx) * inv);
    }
  });
}

template <class OpT, bool Log>
void softmax_kernel(const OpT& op, const KernelArgs& a) {
  dispatch_precision(a.in[0].dtype, Log ? "log_softmax" : "softmax", [&](auto p) {
    using S = typename decltype(p)::Storage;
    using C = typename decltype(p)::Compute;
    const Shape& s = *a.in[0].shape;
    softmax_forward<S, C, Log>(a.in[0].as<S>(), a.out[0].as<S>(), axis_view(s, op.axis_for(s)));
  });
}

template <class OpT, bool Log>
void softmax_grad_kernel(const OpT& op, const KernelArgs& a) {
  dispatch_precision(a.in[0].dtype, Log ? "log_softmax_grad" : "softmax_grad", [&](auto p) {
    using S = typename decltype(p)::Storage;
    using C = typename decltype(p)::Compute;
    const Shape& s = *a.in[0].shape;
    const S *y = a.in[0].as<S>(), *dy = a.in[1].as<S>();
    S* dx = a.out[0].as<S>();
    AxisView v = axis_view(s, op.axis_for(s));
    for_each_line(v, [&](std::int64_t base, std::int64_t st) {
      const S *yl = y + base, *gl = dy + base;
      S* dl = dx + base;
      auto yv = [&](std::int64_t j) { return math::convert<C>(yl[j * st]); };
      auto gv = [&](std::int64_t j) { return math::convert<C>(gl[j * st]); };
      C dot = 0;
      for (std::int64_t j = 0; j < v.n; ++j) dot += Log ? gv(j) : gv(j) * yv(j);
      for (std::int64_t j = 0; j < v.n; ++j) {
        if constexpr (Log)
          dl[j * st] = math::convert<S>(gv(j) - math::exp_(yv(j)) * dot);
        else
          dl[j * st] = math::convert<S>(yv(j) * (gv(j) - dot));
      }
    });
  });
}


}  // namespace frugal::cpu
