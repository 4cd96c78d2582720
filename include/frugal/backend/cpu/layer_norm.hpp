#pragma once
// Fused layer-norm kernels. Forward: one pass per row for the mean, one for
// the (biased) variance of the centred row, one to write y; rows split over
// threads. Backward: dx row by row from the saved mean and rstd; dweight and
// dbias column block by column block, each block summing over all rows in
// row order, so the sums are deterministic and independent of the thread
// count without any per-thread partial buffers. bf16/f16 are read into f32
// and every output rounded once on store; mean and rstd are f32.
#include <cmath>

#include "../../ops/cast.hpp"
#include "../../ops/layer_norm.hpp"
#include "../../runtime/backend.hpp"
#include "parallel.hpp"
#include "row_math.hpp"

#include "abi.hpp"

namespace frugal::cpu::inline FRUGAL_KERNEL_ABI {

// Element j of a row in the compute type C (bf16/f16 read into f32; f32 and
// f64 as they are).
template <class C, class S>
inline C in_c(const S* p, std::int64_t j) {
  return math::convert<C>(p[j]);
}

// y may be x (in place): each y[j] is written from x[j] alone, after the
// row statistics have been read. S is the storage type of x, w, b and y; C
// the compute type, that of mean and rstd.
template <class S, class C>
void layer_norm_rows(const S* x, const S* __restrict w, const S* __restrict b, S* y, C* __restrict mean,
                     C* __restrict rstd, std::int64_t rows, std::int64_t d, C eps) {
  parallel_for(rows, 4 * d, [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      const S* xr = x + r * d;
      S* yr = y + r * d;
      const C mu = lane_sum<C>(d, [xr](std::int64_t j) { return in_c<C>(xr, j); }) / C(d);
      const C var = lane_sum<C>(d,
                                [xr, mu](std::int64_t j) {
                                  C c = in_c<C>(xr, j) - mu;
                                  return c * c;
                                }) /
                    C(d);
      const C rs = C(1) / std::sqrt(var + eps);
      mean[r] = mu;
      rstd[r] = rs;
      auto put = [yr](std::int64_t j, C v) { yr[j] = math::convert<S>(v); };
      if (w && b)
        for (std::int64_t j = 0; j < d; ++j) put(j, (in_c<C>(xr, j) - mu) * rs * in_c<C>(w, j) + in_c<C>(b, j));
      else if (w)
        for (std::int64_t j = 0; j < d; ++j) put(j, (in_c<C>(xr, j) - mu) * rs * in_c<C>(w, j));
      else if (b)
        for (std::int64_t j = 0; j < d; ++j) put(j, (in_c<C>(xr, j) - mu) * rs + in_c<C>(b, j));
      else
        for (std::int64_t j = 0; j < d; ++j) put(j, (in_c<C>(xr, j) - mu) * rs);
    }
  });
}

inline void layer_norm_kernel(const ops::LayerNorm& op, const KernelArgs& a) {
  dispatch_precision(a.in[0].dtype, "layer_norm", [&](auto p) {
    using S = typename decltype(p)::Storage;
    using C = typename decltype(p)::Compute;
    const std::int64_t d = a.in[0].shape->dim(-1), rows = a.in[0].numel() / d;
    const S* w = op.has_weight() ? a.in[1].as<S>() : nullptr;
    const S* b = op.has_bias() ? a.in[1 + std::size_t(op.has_weight())].as<S>() : nullptr;
    layer_norm_rows<S, C>(a.in[0].as<S>(), w, b, a.out[0].as<S>(), a.out[1].as<C>(), a.out[2].as<C>(), rows, d,
                          C(op.eps()));
  });
}

// dweight[j] = sum_r dy[r, j] * xhat[r, j] and dbias[j] = sum_r dy[r, j], in
// blocks of kCols columns; f64 accumulators, summed in row order, rounded
// once on store.
template <class S, class C>
void layer_norm_param_grads(const S* __restrict x, const C* __restrict mean, const C* __restrict rstd,
                            const S* __restrict dy, S* __restrict dw, S* __restrict db, std::int64_t rows,
                            std::int64_t d) {
  constexpr std::int64_t kCols = 32;
  const std::int64_t blocks = (d + kCols - 1) / kCols;
  parallel_for(blocks, rows * kCols, [&](std::int64_t k0, std::int64_t k1) {
    for (std::int64_t k = k0; k < k1; ++k) {
      const std::int64_t j0 = k * kCols, n = std::min(kCols, d - j0);
      double aw[kCols] = {}, ab[kCols] = {};
      for (std::int64_t r = 0; r < rows; ++r) {
        const S* xr = x + r * d + j0;
        const S* gr = dy + r * d + j0;
        const C mu = mean[r], rs = rstd[r];
        if (dw)
          for (std::int64_t j = 0; j < n; ++j) aw[j] += double(in_c<C>(gr, j) * ((in_c<C>(xr, j) - mu) * rs));
        if (db)
          for (std::int64_t j = 0; j < n; ++j) ab[j] += double(in_c<C>(gr, j));
      }
      if (dw)
        for (std::int64_t j = 0; j < n; ++j) dw[j0 + j] = math::convert<S>(aw[j]);  // from f64: one rounding, also to 16 bits
      if (db)
        for (std::int64_t j = 0; j < n; ++j) db[j0 + j] = math::convert<S>(ab[j]);
    }
  });
}

// dx = rstd * (g - mean_j(g) - xhat * mean_j(g * xhat)), g = dy * weight.
template <class S, class C>
void layer_norm_input_grad(const S* __restrict x, const C* __restrict mean, const C* __restrict rstd,
                           const S* __restrict dy, const S* __restrict w, S* __restrict dx, std::int64_t rows,
                           std::int64_t d) {
  parallel_for(rows, 6 * d, [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      const S* xr = x + r * d;
      const S* gr = dy + r * d;
      S* dr = dx + r * d;
      const C mu = mean[r], rs = rstd[r];
      C s1, s2;
      if (w) {
        s1 = lane_sum<C>(d, [gr, w](std::int64_t j) { return in_c<C>(gr, j) * in_c<C>(w, j); });
        s2 = lane_sum<C>(d, [=](std::int64_t j) { return in_c<C>(gr, j) * in_c<C>(w, j) * ((in_c<C>(xr, j) - mu) * rs); });
      } else {
        s1 = lane_sum<C>(d, [gr](std::int64_t j) { return in_c<C>(gr, j); });
        s2 = lane_sum<C>(d, [=](std::int64_t j) { return in_c<C>(gr, j) * ((in_c<C>(xr, j) - mu) * rs); });
      }
      const C m1 = s1 / C(d), m2 = s2 / C(d);
      if (w)
        for (std::int64_t j = 0; j < d; ++j)
          dr[j] = math::convert<S>(rs * (in_c<C>(gr, j) * in_c<C>(w, j) - m1 - (in_c<C>(xr, j) - mu) * rs * m2));
      else
        for (std::int64_t j = 0; j < d; ++j)
          dr[j] = math::convert<S>(rs * (in_c<C>(gr, j) - m1 - (in_c<C>(xr, j) - mu) * rs * m2));
    }
  });
}

inline void layer_norm_grad_kernel(const ops::LayerNormGrad& op, const KernelArgs& a) {
  dispatch_precision(a.in[0].dtype, "layer_norm_grad", [&](auto p) {
    using S = typename decltype(p)::Storage;
    using C = typename decltype(p)::Compute;
    const std::int64_t d = a.in[0].shape->dim(-1), rows = a.in[0].numel() / d;
    const S *x = a.in[0].as<S>(), *dy = a.in[3].as<S>();
    const C *mean = a.in[1].as<C>(), *rstd = a.in[2].as<C>();
    const S* w = op.has_weight() ? a.in[4].as<S>() : nullptr;
    S* dw = op.has_weight() ? a.out[1].as<S>() : nullptr;
    S* db = op.has_bias() ? a.out[1 + std::size_t(op.has_weight())].as<S>() : nullptr;
    if (dw || db) layer_norm_param_grads<S, C>(x, mean, rstd, dy, dw, db, rows, d);
    layer_norm_input_grad<S, C>(x, mean, rstd, dy, w, a.out[0].as<S>(), rows, d);
  });
}

}  // namespace frugal::cpu
