#pragma once
// Batch normalisation kernels. Channels are split over threads; a channel's
// values (N rows of H*W) are summed row by row in a fixed order, each row in
// eight lanes of the compute type C (so the compiler can vectorise without
// reassociating), the rows in double. The mean is rounded to C once, and
// the forward, the variance and the backward all use that rounded mean, so
// they agree.
//
// bf16/f16 (storage S) are widened to f32 (C) as they are read and every
// 16-bit output is rounded once as it is stored, in registers; the
// statistics stay f32 (ops/batch_norm.hpp). Each element sees the f32
// kernel's operations in the f32 kernel's order, so a 16-bit result is the
// f32 kernel's result on the same values, rounded once. The loops run in
// the widest instruction set the CPU has (run_widest: the same bits, wider
// vectors).
#include <cmath>
#include <type_traits>

#include "../../ops/batch_norm.hpp"
#include "../../runtime/backend.hpp"
#include "convert.hpp"
#include "isa.hpp"
#include "parallel.hpp"

#include "abi.hpp"

namespace frugal::cpu::inline FRUGAL_KERNEL_ABI {

namespace bn_detail {

constexpr int kLanes = 8;

// Element i of a row in the compute type C, and a value of C stored as S:
// the f32/f64 kernels read and write their type itself; bf16/f16 are
// widened exactly and rounded once, in registers (convert.hpp's widen_as,
// narrow_as: integer operations that vectorise inside run_widest's copies).
template <class C, class S>
inline C ld(const S* x, std::int64_t i) {
  return widen_as<C>(x[i]);
}
template <class S, class C>
inline void st(S* y, std::int64_t i, C v) {
  y[i] = narrow_as<S>(v);
}

// Sums of term(i) over a row: whole groups of kLanes in kLanes
// accumulators of C, summed in double, then the last n % kLanes terms in
// double. K sums at once (term(i, k)).
template <class C, int K, class Term>
inline void lane_sums(std::int64_t n, Term&& term, double (&s)[K]) {
  C acc[K][kLanes] = {};
  std::int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int k = 0; k < K; ++k)
      for (int j = 0; j < kLanes; ++j) acc[k][j] += term(i + j, k);
  for (int k = 0; k < K; ++k)
    for (int j = 0; j < kLanes; ++j) s[k] += double(acc[k][j]);
  for (; i < n; ++i)
    for (int k = 0; k < K; ++k) s[k] += double(term(i, k));
}

template <class C, class S>
inline double row_sum(const S* __restrict x, std::int64_t n) {
  double s[1] = {0};
  lane_sums<C, 1>(n, [x](std::int64_t i, int) { return ld<C>(x, i); }, s);
  return s[0];
}

// sum (x - m)^2
template <class C, class S>
inline double row_sq_dev(const S* __restrict x, std::int64_t n, C mean) {
  double s[1] = {0};
  lane_sums<C, 1>(n,
                  [x, mean](std::int64_t i, int) {
                    C d = ld<C>(x, i) - mean;
                    return d * d;
                  },
                  s);
  return s[0];
}

// sums[0] += sum dy, sums[1] += sum dy * (x - m)
template <class C, class S>
inline void row_grad_sums(const S* __restrict x, const S* __restrict dy, std::int64_t n, C mean, double (&sums)[2]) {
  lane_sums<C, 2>(n,
                  [x, dy, mean](std::int64_t i, int k) {
                    const C g = ld<C>(dy, i);
                    return k == 0 ? g : g * (ld<C>(x, i) - mean);
                  },
                  sums);
}

struct Dims {
  std::int64_t n, c, hw;
  std::int64_t count() const { return n * hw; }
};
inline Dims dims_of(const Shape& s) { return {s[0], s[1], s[2] * s[3]}; }

template <class T>
inline T inv_std(T var, double eps) {
  return T(1.0 / std::sqrt(double(var) + eps));
}

// y[q] = (x[q] - mean) * scale + shift over one row, then math::Relu with
// a fused ReLU epilogue: the bits the unfused relu kernel makes of what
// the normalisation would have stored (relu commutes with the rounding to
// 16 bits).
template <class C, class S>
inline void normalise_row(const S* __restrict x, S* __restrict y, std::int64_t n, C mean, C scale, C shift, bool relu) {
  if (relu) {
    const math::Relu f;
    for (std::int64_t q = 0; q < n; ++q) st(y, q, f((ld<C>(x, q) - mean) * scale + shift));
  } else {
    for (std::int64_t q = 0; q < n; ++q) st(y, q, (ld<C>(x, q) - mean) * scale + shift);
  }
}

}  // namespace bn_detail

// (bn_detail's functions are called qualified: a unity build puts
// row_math.hpp's row_sum beside them.)
inline void batch_norm2d_train_kernel(const ops::BatchNorm2dTrain& op, const KernelArgs& a) {
  dispatch_precision(a.in[0].dtype, "batch_norm2d", [&](auto p) {
    using S = typename decltype(p)::Storage;
    using C = typename decltype(p)::Compute;
    using namespace bn_detail;
    const Dims d = dims_of(*a.in[0].shape);
    const S *x = a.in[0].as<S>(), *gamma = a.in[1].as<S>(), *beta = a.in[2].as<S>();
    S* y = a.out[0].as<S>();
    C *mean_out = a.out[1].as<C>(), *var_out = a.out[2].as<C>();
    const double eps = op.eps(), inv_count = 1.0 / double(d.count());
    parallel_for(d.c, 4 * d.count(), [&](std::int64_t b, std::int64_t e) {
      run_widest([&] {
        for (std::int64_t c = b; c < e; ++c) {
          double s = 0;
          for (std::int64_t i = 0; i < d.n; ++i) s += bn_detail::row_sum<C>(x + (i * d.c + c) * d.hw, d.hw);
          const C mean = C(s * inv_count);
          double ss = 0;
          for (std::int64_t i = 0; i < d.n; ++i) ss += bn_detail::row_sq_dev<C>(x + (i * d.c + c) * d.hw, d.hw, mean);
          const C var = C(ss * inv_count);
          const C scale = bn_detail::inv_std(var, eps) * math::convert<C>(gamma[c]), shift = math::convert<C>(beta[c]);
          for (std::int64_t i = 0; i < d.n; ++i)
            bn_detail::normalise_row(x + (i * d.c + c) * d.hw, y + (i * d.c + c) * d.hw, d.hw, mean, scale, shift, op.relu());
          mean_out[c] = mean;
          var_out[c] = var;
        }
      });
    });
  });
}

inline void batch_norm2d_eval_kernel(const ops::BatchNorm2dEval& op, const KernelArgs& a) {
  dispatch_precision(a.in[0].dtype, "batch_norm2d_eval", [&](auto p) {
    using S = typename decltype(p)::Storage;
    using C = typename decltype(p)::Compute;
    using namespace bn_detail;
    const Dims d = dims_of(*a.in[0].shape);
    const S *x = a.in[0].as<S>(), *gamma = a.in[1].as<S>(), *beta = a.in[2].as<S>();
    const C *rm = a.in[3].as<C>(), *rv = a.in[4].as<C>();
    S* y = a.out[0].as<S>();
    parallel_for(d.n * d.c, d.hw, [&](std::int64_t b, std::int64_t e) {
      run_widest([&] {
        for (std::int64_t row = b; row < e; ++row) {
          const std::int64_t c = row % d.c;
          const C mean = rm[c], scale = bn_detail::inv_std(rv[c], op.eps()) * math::convert<C>(gamma[c]),
                  shift = math::convert<C>(beta[c]);
          bn_detail::normalise_row(x + row * d.hw, y + row * d.hw, d.hw, mean, scale, shift, op.relu());
        }
      });
    });
  });
}

// Training: dx = gamma/sigma * (dy - mean(dy) - (x - mean) / sigma^2 * mean(dy * (x - mean)))
// Eval:     dx = gamma/sigma * dy
// Both:     dgamma = sum(dy * (x - mean)) / sigma, dbeta = sum(dy)
// (dgamma and dbeta are rounded once from double, also to 16 bits).
inline void batch_norm2d_backward_kernel(const ops::BatchNorm2dBackward& op, const KernelArgs& a) {
  dispatch_precision(a.in[0].dtype, op.training() ? "batch_norm2d_backward" : "batch_norm2d_eval_backward", [&](auto p) {
    using S = typename decltype(p)::Storage;
    using C = typename decltype(p)::Compute;
    using namespace bn_detail;
    const Dims d = dims_of(*a.in[0].shape);
    const S *x = a.in[0].as<S>(), *dy = a.in[1].as<S>(), *gamma = a.in[2].as<S>();
    const C *mean_in = a.in[3].as<C>(), *var_in = a.in[4].as<C>();
    S *dx = a.out[0].as<S>(), *dgamma = a.out[1].as<S>(), *dbeta = a.out[2].as<S>();
    const double inv_count = 1.0 / double(std::max<std::int64_t>(d.count(), 1));
    const bool training = op.training();
    parallel_for(d.c, 5 * d.count(), [&](std::int64_t b, std::int64_t e) {
      run_widest([&] {
        for (std::int64_t c = b; c < e; ++c) {
          const C mean = mean_in[c], istd = bn_detail::inv_std(var_in[c], op.eps());
          double sums[2] = {0, 0};  // sum dy, sum dy (x - mean)
          for (std::int64_t i = 0; i < d.n; ++i)
            bn_detail::row_grad_sums(x + (i * d.c + c) * d.hw, dy + (i * d.c + c) * d.hw, d.hw, mean, sums);
          const double sdy = sums[0], sdyx = sums[1];
          const C scale = math::convert<C>(gamma[c]) * istd;
          const C mdy = training ? C(sdy * inv_count) : C(0);
          const C k = training ? C(double(istd) * double(istd) * sdyx * inv_count) : C(0);
          for (std::int64_t i = 0; i < d.n; ++i) {
            const std::int64_t row = (i * d.c + c) * d.hw;
            const S* __restrict xr = x + row;
            const S* __restrict gr = dy + row;
            S* __restrict dr = dx + row;
            for (std::int64_t q = 0; q < d.hw; ++q) st(dr, q, scale * (ld<C>(gr, q) - mdy - (ld<C>(xr, q) - mean) * k));
          }
          dgamma[c] = math::convert<S>(sdyx * double(istd));
          dbeta[c] = math::convert<S>(sdy);
        }
      });
    });
  });
}

inline void batch_norm_update_stats_kernel(const ops::BatchNormUpdateStats& op, const KernelArgs& a) {
  dispatch_float(a.in[0].dtype, "batch_norm_update_stats", [&](auto tag) {
    using T = decltype(tag);
    T *rm = a.in[0].as<T>(), *rv = a.in[1].as<T>();
    const T *mean = a.in[2].as<T>(), *var = a.in[3].as<T>();
    const double m = op.momentum(), n = double(op.count()), unbias = n / (n - 1);
    for (std::int64_t c = 0; c < a.in[0].numel(); ++c) {
      rm[c] = T(m * double(mean[c]) + (1 - m) * double(rm[c]));
      rv[c] = T(m * double(var[c]) * unbias + (1 - m) * double(rv[c]));
    }
    if (op.with_counter()) ++*a.in[4].as<std::int64_t>();
  });
}


}  // namespace frugal::cpu
