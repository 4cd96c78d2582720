#pragma once
// Fused layer-norm kernels. Forward: one pass per row for the mean, one for
// the (biased) variance of the centred row, one to write y; rows split over
// threads. Backward: dx row by row from the saved mean and rstd; dweight and
// dbias column block by column block, each block summing over all rows in
// row order, so the sums are deterministic and independent of the thread
// count without any per-thread partial buffers.
#include <cmath>

#include "../../ops/layer_norm.hpp"
#include "../../runtime/backend.hpp"
#include "parallel.hpp"
#include "row_math.hpp"

#include "abi.hpp"

namespace frugal::cpu::inline FRUGAL_KERNEL_ABI {

// y may be x (in place): each y[j] is written from x[j] alone, after the
// row statistics have been read.
template <class T>
void layer_norm_rows(const T* x, const T* __restrict w, const T* __restrict b, T* y, T* __restrict mean,
                     T* __restrict rstd, std::int64_t rows, std::int64_t d, T eps) {
  parallel_for(rows, 4 * d, [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      const T* xr = x + r * d;
      T* yr = y + r * d;
      const T mu = row_sum(xr, d) / T(d);
      const T var = lane_sum<T>(d,
                                [xr, mu](std::int64_t j) {
                                  T c = xr[j] - mu;
                                  return c * c;
                                }) /
                    T(d);
      const T rs = T(1) / std::sqrt(var + eps);
      mean[r] = mu;
      rstd[r] = rs;
      if (w && b)
        for (std::int64_t j = 0; j < d; ++j) yr[j] = (xr[j] - mu) * rs * w[j] + b[j];
      else if (w)
        for (std::int64_t j = 0; j < d; ++j) yr[j] = (xr[j] - mu) * rs * w[j];
      else if (b)
        for (std::int64_t j = 0; j < d; ++j) yr[j] = (xr[j] - mu) * rs + b[j];
      else
        for (std::int64_t j = 0; j < d; ++j) yr[j] = (xr[j] - mu) * rs;
    }
  });
}

inline void layer_norm_kernel(const ops::LayerNorm& op, const KernelArgs& a) {
  dispatch_float(a.in[0].dtype, "layer_norm", [&](auto tag) {
    using T = decltype(tag);
    const std::int64_t d = a.in[0].shape->dim(-1), rows = a.in[0].numel() / d;
    const T* w = op.has_weight() ? a.in[1].as<T>() : nullptr;
    const T* b = op.has_bias() ? a.in[1 + std::size_t(op.has_weight())].as<T>() : nullptr;
    layer_norm_rows<T>(a.in[0].as<T>(), w, b, a.out[0].as<T>(), a.out[1].as<T>(), a.out[2].as<T>(), rows, d,
                       T(op.eps()));
  });
}

// dweight[j] = sum_r dy[r, j] * xhat[r, j] and dbias[j] = sum_r dy[r, j], in
// blocks of kCols columns; f64 accumulators, summed in row order.
template <class T>
void layer_norm_param_grads(const T* __restrict x, const T* __restrict mean, const T* __restrict rstd,
                            const T* __restrict dy, T* __restrict dw, T* __restrict db, std::int64_t rows,
                            std::int64_t d) {
  constexpr std::int64_t kCols = 32;
  const std::int64_t blocks = (d + kCols - 1) / kCols;
  parallel_for(blocks, rows * kCols, [&](std::int64_t k0, std::int64_t k1) {
    for (std::int64_t k = k0; k < k1; ++k) {
      const std::int64_t j0 = k * kCols, n = std::min(kCols, d - j0);
      double aw[kCols] = {}, ab[kCols] = {};
      for (std::int64_t r = 0; r < rows; ++r) {
        const T* xr = x + r * d + j0;
        const T* gr = dy + r * d + j0;
        const T mu = mean[r], rs = rstd[r];
        if (dw)
          for (std::int64_t j = 0; j < n; ++j) aw[j] += double(gr[j] * ((xr[j] - mu) * rs));
        if (db)
          for (std::int64_t j = 0; j < n; ++j) ab[j] += double(gr[j]);
      }
      if (dw)
        for (std::int64_t j = 0; j < n; ++j) dw[j0 + j] = T(aw[j]);
      if (db)
        for (std::int64_t j = 0; j < n; ++j) db[j0 + j] = T(ab[j]);
    }
  });
}

// dx = rstd * (g - mean_j(g) - xhat * mean_j(g * xhat)), g = dy * weight.
template <class T>
void layer_norm_input_grad(const T* __restrict x, const T* __restrict mean, const T* __restrict rstd,
                           const T* __restrict dy, const T* __restrict w, T* __restrict dx, std::int64_t rows,
                           std::int64_t d) {
  parallel_for(rows, 6 * d, [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      const T* xr = x + r * d;
      const T* gr = dy + r * d;
      T* dr = dx + r * d;
      const T mu = mean[r], rs = rstd[r];
      T s1, s2;
      if (w) {
        s1 = lane_sum<T>(d, [gr, w](std::int64_t j) { return gr[j] * w[j]; });
        s2 = lane_sum<T>(d, [=](std::int64_t j) { return gr[j] * w[j] * ((xr[j] - mu) * rs); });
      } else {
        s1 = row_sum(gr, d);
        s2 = lane_sum<T>(d, [=](std::int64_t j) { return gr[j] * ((xr[j] - mu) * rs); });
      }
      const T m1 = s1 / T(d), m2 = s2 / T(d);
      if (w)
        for (std::int64_t j = 0; j < d; ++j) dr[j] = rs * (gr[j] * w[j] - m1 - (xr[j] - mu) * rs * m2);
      else
        for (std::int64_t j = 0; j < d; ++j) dr[j] = rs * (gr[j] - m1 - (xr[j] - mu) * rs * m2);
    }
  });
}

inline void layer_norm_grad_kernel(const ops::LayerNormGrad& op, const KernelArgs& a) {
  dispatch_float(a.in[0].dtype, "layer_norm_grad", [&](auto tag) {
    using T = decltype(tag);
    const std::int64_t d = a.in[0].shape->dim(-1), rows = a.in[0].numel() / d;
    const T *x = a.in[0].as<T>(), *mean = a.in[1].as<T>(), *rstd = a.in[2].as<T>(), *dy = a.in[3].as<T>();
    const T* w = op.has_weight() ? a.in[4].as<T>() : nullptr;
    T* dw = op.has_weight() ? a.out[1].as<T>() : nullptr;
    T* db = op.has_bias() ? a.out[1 + std::size_t(op.has_weight())].as<T>() : nullptr;
    if (dw || db) layer_norm_param_grads<T>(x, mean, rstd, dy, dw, db, rows, d);
    layer_norm_input_grad<T>(x, mean, rstd, dy, w, a.out[0].as<T>(), rows, d);
  });
}


}  // namespace frugal::cpu
