#pragma once
#include <type_traits>

#include "../../ops/adamw_master.hpp"
#include "../../ops/cast.hpp"
#include "../../ops/optimizer_updates.hpp"
#include "../../runtime/backend.hpp"
#include "convert.hpp"
#include "isa.hpp"
#include "parallel.hpp"

#include "abi.hpp"

namespace frugal::cpu::inline FRUGAL_KERNEL_ABI {

// A guarded update's guard inputs (ops/optimizer_updates.hpp), read at
// in[first..first+2]: whether to skip, 1/scale, and this step's number.
struct GuardValues {
  bool skip = false;
  double inv_scale = 1;
  std::int64_t step = 0;
};
inline GuardValues read_guard(const KernelArgs& a, std::size_t first) {
  return {a.in[first].as<float>()[0] != 0.0f, 1.0 / double(a.in[first + 1].as<float>()[0]),
          a.in[first + 2].as<std::int64_t>()[0] + 1};
}

namespace detail {

// One update over n elements: op(p[i], g[i] (times inv when scaled),
// state...). __restrict: the planner never aliases a parameter with its
// gradient or state, and saying so lets the loop vectorise.
template <class T, class Math>
[[gnu::always_inline]] inline void sgd_loop(const Math& m, T* __restrict p, const T* __restrict g, T* __restrict buf,
                                            std::int64_t n, bool scaled, T inv) {
  if (scaled)
    for (std::int64_t i = 0; i < n; ++i) m(p[i], g[i] * inv, buf[i]);
  else
    for (std::int64_t i = 0; i < n; ++i) m(p[i], g[i], buf[i]);
}
template <class T, class Math>
[[gnu::always_inline]] inline void adamw_loop(const Math& m, T* __restrict p, const T* __restrict g, T* __restrict mo,
                                              T* __restrict v, std::int64_t n, bool scaled, T inv) {
  if (scaled)
    for (std::int64_t i = 0; i < n; ++i) m(p[i], g[i] * inv, mo[i], v[i]);
  else
    for (std::int64_t i = 0; i < n; ++i) m(p[i], g[i], mo[i], v[i]);
}

// 16-bit storage S: the gradient widened to f32 (exactly) before the scale.
template <class S, class Math>
[[gnu::always_inline]] inline void adamw16_loop(const Math& m, S* __restrict p, const S* __restrict g, S* __restrict mo,
                                                S* __restrict v, std::int64_t n, bool scaled, float inv) {
  if (scaled)
    for (std::int64_t i = 0; i < n; ++i) m(p[i], float(g[i]) * inv, mo[i], v[i]);
  else
    for (std::int64_t i = 0; i < n; ++i) m(p[i], float(g[i]), mo[i], v[i]);
}
template <class S, class Math>
[[gnu::always_inline]] inline void adamw_master_loop(const Math& m, S* __restrict p, const S* __restrict g,
                                                     float* __restrict w, float* __restrict mo, float* __restrict v,
                                                     std::int64_t n, bool scaled, float inv) {
  if (scaled)
    for (std::int64_t i = 0; i < n; ++i) m(p[i], float(g[i]) * inv, w[i], mo[i], v[i]);
  else
    for (std::int64_t i = 0; i < n; ++i) m(p[i], float(g[i]), w[i], mo[i], v[i]);
}

// Each loop compiled for plain x86-64, AVX2 and AVX-512 (isa.hpp).
#define FRUGAL_UPDATE_LOOPS(suffix, attr)                                                                        \
  template <class T, class Math>                                                                                 \
  attr void sgd_##suffix(const Math& m, T* p, const T* g, T* buf, std::int64_t n, bool scaled, T inv) {          \
    sgd_loop(m, p, g, buf, n, scaled, inv);                                                                      \
  }                                                                                                              \
  template <class T, class Math>                                                                                 \
  attr void adamw_##suffix(const Math& m, T* p, const T* g, T* mo, T* v, std::int64_t n, bool scaled, T inv) {   \
    adamw_loop(m, p, g, mo, v, n, scaled, inv);                                                                  \
  }                                                                                                              \
  template <class S, class Math>                                                                                 \
  attr void adamw16_##suffix(const Math& m, S* p, const S* g, S* mo, S* v, std::int64_t n, bool scaled, float inv) { \
    adamw16_loop(m, p, g, mo, v, n, scaled, inv);                                                                \
  }                                                                                                              \
  template <class S, class Math>                                                                                 \
  attr void adamw_master_##suffix(const Math& m, S* p, const S* g, float* w, float* mo, float* v, std::int64_t n, \
                                  bool scaled, float inv) {                                                      \
    adamw_master_loop(m, p, g, w, mo, v, n, scaled, inv);                                                        \
  }
FRUGAL_UPDATE_LOOPS(base, )
#if FRUGAL_CPU_ISA_DISPATCH
FRUGAL_UPDATE_LOOPS(avx2, [[gnu::target("avx2")]])
#endif
#if FRUGAL_CPU_ISA_AVX512
FRUGAL_UPDATE_LOOPS(avx512, [[gnu::target("avx512f")]])
#endif
#undef FRUGAL_UPDATE_LOOPS

template <class T, class Math>
void sgd_span(CpuIsa isa, const Math& m, T* p, const T* g, T* buf, std::int64_t n, bool scaled, T inv) {
#if FRUGAL_CPU_ISA_AVX512
  if (isa >= CpuIsa::avx512) return sgd_avx512(m, p, g, buf, n, scaled, inv);
#endif
#if FRUGAL_CPU_ISA_DISPATCH
  if (isa >= CpuIsa::avx2) return sgd_avx2(m, p, g, buf, n, scaled, inv);
#endif
  (void)isa;
  sgd_base(m, p, g, buf, n, scaled, inv);
}
template <class T, class Math>
void adamw_span(CpuIsa isa, const Math& m, T* p, const T* g, T* mo, T* v, std::int64_t n, bool scaled, T inv) {
#if FRUGAL_CPU_ISA_AVX512
  if (isa >= CpuIsa::avx512) return adamw_avx512(m, p, g, mo, v, n, scaled, inv);
#endif
#if FRUGAL_CPU_ISA_DISPATCH
  if (isa >= CpuIsa::avx2) return adamw_avx2(m, p, g, mo, v, n, scaled, inv);
#endif
  (void)isa;
  adamw_base(m, p, g, mo, v, n, scaled, inv);
}

template <class S, class Math>
void adamw16_span(CpuIsa isa, const Math& m, S* p, const S* g, S* mo, S* v, std::int64_t n, bool scaled, float inv) {
#if FRUGAL_CPU_ISA_AVX512
  if (isa >= CpuIsa::avx512) return adamw16_avx512(m, p, g, mo, v, n, scaled, inv);
#endif
#if FRUGAL_CPU_ISA_DISPATCH
  if (isa >= CpuIsa::avx2) return adamw16_avx2(m, p, g, mo, v, n, scaled, inv);
#endif
  (void)isa;
  adamw16_base(m, p, g, mo, v, n, scaled, inv);
}
template <class S, class Math>
void adamw_master_span(CpuIsa isa, const Math& m, S* p, const S* g, float* w, float* mo, float* v, std::int64_t n,
                       bool scaled, float inv) {
#if FRUGAL_CPU_ISA_AVX512
  if (isa >= CpuIsa::avx512) return adamw_master_avx512(m, p, g, w, mo, v, n, scaled, inv);
#endif
#if FRUGAL_CPU_ISA_DISPATCH
  if (isa >= CpuIsa::avx2) return adamw_master_avx2(m, p, g, w, mo, v, n, scaled, inv);
#endif
  (void)isa;
  adamw_master_base(m, p, g, w, mo, v, n, scaled, inv);
}

// bf16/f16 parameters and state: a block at a time read into f32 (the
// bulk conversions), stepped by the f32 loop with the same functor, every
// result rounded once on store. (Element by element, with the scalar
// conversions, the bf16 ResNet-18's update took 8x the f32 one's time.)
template <class S, class Math>
void sgd_half(CpuIsa isa, const Math& m, S* p, const S* g, S* buf, std::int64_t n, bool scaled, float inv) {
  float pf[bulk::kBlock], gf[bulk::kBlock], bf[bulk::kBlock];
  for (std::int64_t i = 0; i < n; i += bulk::kBlock) {
    const int k = int(std::min<std::int64_t>(bulk::kBlock, n - i));
    convert_block(p + i, pf, k);
    convert_block(g + i, gf, k);
    convert_block(buf + i, bf, k);
    sgd_span(isa, m, pf, static_cast<const float*>(gf), bf, k, scaled, inv);
    convert_block(static_cast<const float*>(pf), p + i, k);
    convert_block(static_cast<const float*>(bf), buf + i, k);
  }
}

}  // namespace detail

// The fused updates: one pass over the parameter, its gradient and its
// state, vectorised for the widest instruction set the CPU has (isa.hpp),
// split over the step's threads in fixed chunks.
inline void sgd_kernel(const ops::SgdUpdate& op, const KernelArgs& a) {
  dispatch_precision(a.in[0].dtype, "sgd_update", [&](auto prec) {
    using S = typename decltype(prec)::Storage;
    using T = typename decltype(prec)::Compute;
    S *p = a.in[0].as<S>(), *buf = a.in[2].as<S>();
    const S* g = a.in[1].as<S>();
    GuardValues gv;
    if (op.guarded()) {
      gv = read_guard(a, 3);
      if (gv.skip) return;  // an overflowed step: nothing changes
    }
    const auto m = op.guarded() ? op.math<T>(gv.step) : op.math<T>();
    const CpuIsa isa = cpu_isa();
    parallel_for(a.in[0].numel(), 4, [&](std::int64_t b, std::int64_t e) {
      if constexpr (std::is_same_v<S, T>)
        detail::sgd_span(isa, m, p + b, g + b, buf + b, e - b, op.guarded(), T(gv.inv_scale));
      else
        detail::sgd_half(isa, m, p + b, g + b, buf + b, e - b, op.guarded(), T(gv.inv_scale));
    });
  });
}

// bf16/f16 parameters and moments step in f32 (ops::AdamWStorageMath).
inline void adamw_kernel(const ops::AdamWUpdate& op, const KernelArgs& a) {
  dispatch_precision(a.in[0].dtype, "adamw_update", [&](auto prec) {
    using P = decltype(prec);
    using T = typename P::Storage;
    T *p = a.in[0].as<T>(), *mo = a.in[2].as<T>(), *v = a.in[3].as<T>();
    const T* g = a.in[1].as<T>();
    GuardValues gv;
    if (op.guarded()) {
      gv = read_guard(a, 4);
      if (gv.skip) return;
    }
    const auto f = op.guarded() ? op.math<typename P::Compute>(gv.step) : op.math<typename P::Compute>();
    const CpuIsa isa = cpu_isa();
    if constexpr (std::is_same_v<T, typename P::Compute>) {
      const auto& m = f;
      parallel_for(a.in[0].numel(), 8, [&](std::int64_t b, std::int64_t e) {
        detail::adamw_span(isa, m, p + b, g + b, mo + b, v + b, e - b, op.guarded(), T(gv.inv_scale));
      });
    } else {
      const ops::AdamWStorageMath<T> m{f};
      parallel_for(a.in[0].numel(), 8, [&](std::int64_t b, std::int64_t e) {
        detail::adamw16_span(isa, m, p + b, g + b, mo + b, v + b, e - b, op.guarded(), float(gv.inv_scale));
      });
    }
  });
}

// The master's update (ops/adamw_master.hpp): S the parameter's storage,
// the master and moments f32.
inline void adamw_master_kernel(const ops::AdamWMasterUpdate& op, const KernelArgs& a) {
  auto run = [&](auto tag) {
    using S = decltype(tag);
    S* p = a.in[0].as<S>();
    const S* g = a.in[1].as<S>();
    float *w = a.in[2].as<float>(), *mo = a.in[3].as<float>(), *v = a.in[4].as<float>();
    GuardValues gv;
    if (op.guarded()) {
      gv = read_guard(a, 5);
      if (gv.skip) return;  // an overflowed step: nothing changes
    }
    const auto m = op.guarded() ? op.math<S>(gv.step) : op.math<S>();
    const CpuIsa isa = cpu_isa();
    parallel_for(a.in[0].numel(), 8, [&](std::int64_t b, std::int64_t e) {
      detail::adamw_master_span(isa, m, p + b, g + b, w + b, mo + b, v + b, e - b, op.guarded(), float(gv.inv_scale));
    });
  };
  switch (a.in[0].dtype) {
    case DType::bf16: return run(BFloat16{});
    case DType::f16: return run(Half{});
    default: fail("cpu: ", op.name(), " steps a bf16 or f16 parameter, not ", dtype_name(a.in[0].dtype));
  }
}

}  // namespace frugal::cpu
