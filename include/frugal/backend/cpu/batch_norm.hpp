#pragma once
// Batch normalisation kernels. Channels are split over threads; a channel's
// values (N rows of H*W) are summed row by row in a fixed order, each row in
// eight lanes of T (so the compiler can vectorise without reassociating),
// the rows in double. The mean is rounded to T once, and the forward, the
// variance and the backward all use that rounded mean, so they agree.
#include <cmath>

#include "../../ops/batch_norm.hpp"
#include "../../runtime/backend.hpp"
#include "parallel.hpp"

#include "abi.hpp"

namespace frugal::cpu::inline FRUGAL_KERNEL_ABI {

namespace bn_detail {

constexpr int kLanes = 8;

template <class T>
inline double row_sum(const T* __restrict x, std::int64_t n) {
  T acc[kLanes] = {};
  std::int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) acc[j] += x[i + j];
  double s = 0;
  for (int j = 0; j < kLanes; ++j) s += double(acc[j]);
  for (; i < n; ++i) s += double(x[i]);
  return s;
}

// sum (x - m)^2
template <class T>
inline double row_sq_dev(const T* __restrict x, std::int64_t n, T m) {
  T acc[kLanes] = {};
  std::int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) {
      T d = x[i + j] - m;
      acc[j] += d * d;
    }
  double s = 0;
  for (int j = 0; j < kLanes; ++j) s += double(acc[j]);
  for (; i < n; ++i) {
    T d = x[i] - m;
    s += double(d * d);
  }
  return s;
}

// sum dy and sum dy * (x - m)
template <class T>
inline void row_grad_sums(const T* __restrict x, const T* __restrict dy, std::int64_t n, T m, double& sdy,
                          double& sdyx) {
  T a[kLanes] = {}, b[kLanes] = {};
  std::int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) {
      a[j] += dy[i + j];
      b[j] += dy[i + j] * (x[i + j] - m);
    }
  for (int j = 0; j < kLanes; ++j) {
    sdy += double(a[j]);
    sdyx += double(b[j]);
  }
  for (; i < n; ++i) {
    sdy += double(dy[i]);
    sdyx += double(dy[i] * (x[i] - m));
  }
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
// the normalisation would have stored.
template <class T>
inline void normalise_row(const T* __restrict x, T* __restrict y, std::int64_t n, T mean, T scale, T shift, bool relu) {
  if (relu) {
    const math::Relu f;
    for (std::int64_t q = 0; q < n; ++q) y[q] = f((x[q] - mean) * scale + shift);
  } else {
    for (std::int64_t q = 0; q < n; ++q) y[q] = (x[q] - mean) * scale + shift;
  }
}

}  // namespace bn_detail

inline void batch_norm2d_train_kernel(const ops::BatchNorm2dTrain& op, const KernelArgs& a) {
  dispatch_float(a.in[0].dtype, "batch_norm2d", [&](auto tag) {
    using T = decltype(tag);
    using namespace bn_detail;
    const Dims d = dims_of(*a.in[0].shape);
    const T *x = a.in[0].as<T>(), *gamma = a.in[1].as<T>(), *beta = a.in[2].as<T>();
    T *y = a.out[0].as<T>(), *mean_out = a.out[1].as<T>(), *var_out = a.out[2].as<T>();
    const double eps = op.eps(), inv_count = 1.0 / double(d.count());
    parallel_for(d.c, 4 * d.count(), [&](std::int64_t b, std::int64_t e) {
      for (std::int64_t c = b; c < e; ++c) {
        double s = 0;
        for (std::int64_t i = 0; i < d.n; ++i) s += bn_detail::row_sum(x + (i * d.c + c) * d.hw, d.hw);
        const T mean = T(s * inv_count);
        double ss = 0;
        for (std::int64_t i = 0; i < d.n; ++i) ss += row_sq_dev(x + (i * d.c + c) * d.hw, d.hw, mean);
        const T var = T(ss * inv_count);
        const T scale = inv_std(var, eps) * gamma[c], shift = beta[c];
        for (std::int64_t i = 0; i < d.n; ++i)
          normalise_row(x + (i * d.c + c) * d.hw, y + (i * d.c + c) * d.hw, d.hw, mean, scale, shift, op.relu());
        mean_out[c] = mean;
        var_out[c] = var;
      }
    });
  });
}

inline void batch_norm2d_eval_kernel(const ops::BatchNorm2dEval& op, const KernelArgs& a) {
  dispatch_float(a.in[0].dtype, "batch_norm2d_eval", [&](auto tag) {
    using T = decltype(tag);
    using namespace bn_detail;
    const Dims d = dims_of(*a.in[0].shape);
    const T *x = a.in[0].as<T>(), *gamma = a.in[1].as<T>(), *beta = a.in[2].as<T>();
    const T *rm = a.in[3].as<T>(), *rv = a.in[4].as<T>();
    T* y = a.out[0].as<T>();
    parallel_for(d.n * d.c, d.hw, [&](std::int64_t b, std::int64_t e) {
      for (std::int64_t row = b; row < e; ++row) {
        const std::int64_t c = row % d.c;
        const T mean = rm[c], scale = inv_std(rv[c], op.eps()) * gamma[c], shift = beta[c];
        normalise_row(x + row * d.hw, y + row * d.hw, d.hw, mean, scale, shift, op.relu());
      }
    });
  });
}

// Training: dx = gamma/sigma * (dy - mean(dy) - (x - mean) / sigma^2 * mean(dy * (x - mean)))
// Eval:     dx = gamma/sigma * dy
// Both:     dgamma = sum(dy * (x - mean)) / sigma, dbeta = sum(dy)
inline void batch_norm2d_backward_kernel(const ops::BatchNorm2dBackward& op, const KernelArgs& a) {
  dispatch_float(a.in[0].dtype, op.training() ? "batch_norm2d_backward" : "batch_norm2d_eval_backward", [&](auto tag) {
    using T = decltype(tag);
    using namespace bn_detail;
    const Dims d = dims_of(*a.in[0].shape);
    const T *x = a.in[0].as<T>(), *dy = a.in[1].as<T>(), *gamma = a.in[2].as<T>();
    const T *mean_in = a.in[3].as<T>(), *var_in = a.in[4].as<T>();
    T *dx = a.out[0].as<T>(), *dgamma = a.out[1].as<T>(), *dbeta = a.out[2].as<T>();
    const double inv_count = 1.0 / double(std::max<std::int64_t>(d.count(), 1));
    const bool training = op.training();
    parallel_for(d.c, 5 * d.count(), [&](std::int64_t b, std::int64_t e) {
      for (std::int64_t c = b; c < e; ++c) {
        const T mean = mean_in[c], istd = inv_std(var_in[c], op.eps());
        double sdy = 0, sdyx = 0;
        for (std::int64_t i = 0; i < d.n; ++i)
          row_grad_sums(x + (i * d.c + c) * d.hw, dy + (i * d.c + c) * d.hw, d.hw, mean, sdy, sdyx);
        const T scale = gamma[c] * istd;
        const T mdy = training ? T(sdy * inv_count) : T(0);
        const T k = training ? T(double(istd) * double(istd) * sdyx * inv_count) : T(0);
        for (std::int64_t i = 0; i < d.n; ++i) {
          const T* __restrict xr = x + (i * d.c + c) * d.hw;
          const T* __restrict gr = dy + (i * d.c + c) * d.hw;
          T* __restrict dr = dx + (i * d.c + c) * d.hw;
          for (std::int64_t q = 0; q < d.hw; ++q) dr[q] = scale * (gr[q] - mdy - (xr[q] - mean) * k);
        }
        dgamma[c] = T(sdyx * double(istd));
        dbeta[c] = T(sdy);
      }
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
