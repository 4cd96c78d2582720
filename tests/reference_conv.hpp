#pragma once
// Naive float64 references for convolution, batch normalisation and
// pooling over NCHW arrays, written from the definitions (PyTorch's
// semantics) with plain loops. Nothing here calls frugal.
#include <algorithm>
#include <cmath>
#include <limits>

#include "reference.hpp"

namespace ref {

struct Conv2dParams {
  std::int64_t sh = 1, sw = 1, ph = 0, pw = 0, dh = 1, dw = 1, groups = 1;
};

// y[n, co, oh, ow] = b[co] + sum_{ci in co's group, i, j}
//     w[co, ci - group start, i, j] * x[n, ci, oh*sh - ph + i*dh, ow*sw - pw + j*dw]
// with x = 0 outside the input.
inline Array conv2d(const Array& x, const Array& w, const Array* b, const Conv2dParams& p) {
  require(x.shape.size() == 4 && w.shape.size() == 4, "conv2d: rank 4 input and weight");
  const std::int64_t N = x.shape[0], Cin = x.shape[1], H = x.shape[2], W = x.shape[3];
  const std::int64_t Cout = w.shape[0], Cg = w.shape[1], KH = w.shape[2], KW = w.shape[3];
  require(Cg * p.groups == Cin && Cout % p.groups == 0, "conv2d: groups");
  const std::int64_t Ho = (H + 2 * p.ph - (KH - 1) * p.dh - 1) / p.sh + 1;
  const std::int64_t Wo = (W + 2 * p.pw - (KW - 1) * p.dw - 1) / p.sw + 1;
  const std::int64_t out_per_group = Cout / p.groups;
  Array y = zeros({N, Cout, Ho, Wo});
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t co = 0; co < Cout; ++co) {
      const std::int64_t g = co / out_per_group;
      for (std::int64_t oh = 0; oh < Ho; ++oh)
        for (std::int64_t ow = 0; ow < Wo; ++ow) {
          double s = b ? b->v[std::size_t(co)] : 0.0;
          for (std::int64_t c = 0; c < Cg; ++c)
            for (std::int64_t i = 0; i < KH; ++i)
              for (std::int64_t j = 0; j < KW; ++j) {
                const std::int64_t iy = oh * p.sh - p.ph + i * p.dh, ix = ow * p.sw - p.pw + j * p.dw;
                if (iy < 0 || iy >= H || ix < 0 || ix >= W) continue;
                s += w.v[std::size_t(((co * Cg + c) * KH + i) * KW + j)] *
                     x.v[std::size_t(((n * Cin + g * Cg + c) * H + iy) * W + ix)];
              }
          y.v[std::size_t(((n * Cout + co) * Ho + oh) * Wo + ow)] = s;
        }
    }
  return y;
}

// The convolution's adjoints, from the same sum: for y = conv2d(x, w),
//   dx[n, ci, iy, ix] = sum of w[co, c, i, j] * dy[n, co, oh, ow]
//   dw[co, c, i, j]   = sum of x[n, ci, iy, ix] * dy[n, co, oh, ow]
// over every term of the forward sum that pairs them.
inline void conv2d_backward(const Array& x, const Array& w, const Array& dy, const Conv2dParams& p, Array& dx,
                            Array& dw) {
  const std::int64_t N = x.shape[0], Cin = x.shape[1], H = x.shape[2], W = x.shape[3];
  const std::int64_t Cout = w.shape[0], Cg = w.shape[1], KH = w.shape[2], KW = w.shape[3];
  const std::int64_t Ho = dy.shape[2], Wo = dy.shape[3], out_per_group = Cout / p.groups;
  dx = zeros(x.shape);
  dw = zeros(w.shape);
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t co = 0; co < Cout; ++co) {
      const std::int64_t g = co / out_per_group;
      for (std::int64_t oh = 0; oh < Ho; ++oh)
        for (std::int64_t ow = 0; ow < Wo; ++ow) {
          const double d = dy.v[std::size_t(((n * Cout + co) * Ho + oh) * Wo + ow)];
          for (std::int64_t c = 0; c < Cg; ++c)
            for (std::int64_t i = 0; i < KH; ++i)
              for (std::int64_t j = 0; j < KW; ++j) {
                const std::int64_t iy = oh * p.sh - p.ph + i * p.dh, ix = ow * p.sw - p.pw + j * p.dw;
                if (iy < 0 || iy >= H || ix < 0 || ix >= W) continue;
                const std::size_t wi = std::size_t(((co * Cg + c) * KH + i) * KW + j);
                const std::size_t xi = std::size_t(((n * Cin + g * Cg + c) * H + iy) * W + ix);
                dx.v[xi] += w.v[wi] * d;
                dw.v[wi] += x.v[xi] * d;
              }
        }
    }
}

// Sum over the same terms of |w| * |x| (the scale of a convolution's
// rounding error), shaped like conv2d's output.
inline Array conv2d_abs(const Array& x, const Array& w, const Conv2dParams& p) {
  Array ax = x, aw = w;
  for (auto& e : ax.v) e = std::abs(e);
  for (auto& e : aw.v) e = std::abs(e);
  return conv2d(ax, aw, nullptr, p);
}

// Per channel statistics over (N, H, W): mean and biased variance.
inline void channel_stats(const Array& x, std::vector<double>& mean, std::vector<double>& var) {
  const std::int64_t N = x.shape[0], C = x.shape[1], HW = x.shape[2] * x.shape[3];
  mean.assign(std::size_t(C), 0.0);
  var.assign(std::size_t(C), 0.0);
  for (std::int64_t c = 0; c < C; ++c) {
    double s = 0;
    for (std::int64_t n = 0; n < N; ++n)
      for (std::int64_t q = 0; q < HW; ++q) s += x.v[std::size_t((n * C + c) * HW + q)];
    const double m = s / double(N * HW);
    double ss = 0;
    for (std::int64_t n = 0; n < N; ++n)
      for (std::int64_t q = 0; q < HW; ++q) {
        const double d = x.v[std::size_t((n * C + c) * HW + q)] - m;
        ss += d * d;
      }
    mean[std::size_t(c)] = m;
    var[std::size_t(c)] = ss / double(N * HW);
  }
}

// y = (x - mean[c]) / sqrt(var[c] + eps) * gamma[c] + beta[c]
inline Array batch_norm_with(const Array& x, const std::vector<double>& mean, const std::vector<double>& var,
                             const Array& gamma, const Array& beta, double eps) {
  const std::int64_t N = x.shape[0], C = x.shape[1], HW = x.shape[2] * x.shape[3];
  Array y = zeros(x.shape);
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t c = 0; c < C; ++c)
      for (std::int64_t q = 0; q < HW; ++q) {
        const std::size_t i = std::size_t((n * C + c) * HW + q);
        y.v[i] = (x.v[i] - mean[std::size_t(c)]) / std::sqrt(var[std::size_t(c)] + eps) * gamma.v[std::size_t(c)] +
                 beta.v[std::size_t(c)];
      }
  return y;
}

// Training mode: normalise with the batch's own statistics.
inline Array batch_norm_train(const Array& x, const Array& gamma, const Array& beta, double eps = 1e-5) {
  std::vector<double> mean, var;
  channel_stats(x, mean, var);
  return batch_norm_with(x, mean, var, gamma, beta, eps);
}

// Eval mode: normalise with given running statistics.
inline Array batch_norm_eval(const Array& x, const Array& gamma, const Array& beta, const Array& rmean,
                             const Array& rvar, double eps = 1e-5) {
  return batch_norm_with(x, rmean.v, rvar.v, gamma, beta, eps);
}

struct Pool2dParams {
  std::int64_t kh = 1, kw = 1, sh = 1, sw = 1, ph = 0, pw = 0;
};

inline Dims pool_out(const Array& x, const Pool2dParams& p) {
  return {x.shape[0], x.shape[1], (x.shape[2] + 2 * p.ph - p.kh) / p.sh + 1, (x.shape[3] + 2 * p.pw - p.kw) / p.sw + 1};
}

// The maximum over each window; padding is -inf.
inline Array max_pool2d(const Array& x, const Pool2dParams& p) {
  const std::int64_t H = x.shape[2], W = x.shape[3];
  Array y = zeros(pool_out(x, p));
  const std::int64_t planes = y.shape[0] * y.shape[1], Ho = y.shape[2], Wo = y.shape[3];
  for (std::int64_t pl = 0; pl < planes; ++pl)
    for (std::int64_t oh = 0; oh < Ho; ++oh)
      for (std::int64_t ow = 0; ow < Wo; ++ow) {
        double m = -std::numeric_limits<double>::infinity();
        for (std::int64_t i = 0; i < p.kh; ++i)
          for (std::int64_t j = 0; j < p.kw; ++j) {
            const std::int64_t iy = oh * p.sh - p.ph + i, ix = ow * p.sw - p.pw + j;
            if (iy >= 0 && iy < H && ix >= 0 && ix < W) m = std::max(m, x.v[std::size_t((pl * H + iy) * W + ix)]);
          }
        y.v[std::size_t((pl * Ho + oh) * Wo + ow)] = m;
      }
  return y;
}

// The mean over each window. count_include_pad: divide by kh*kw (the window
// always lies inside the padded input in floor mode); else by the number of
// input positions it covers.
inline Array avg_pool2d(const Array& x, const Pool2dParams& p, bool count_include_pad) {
  const std::int64_t H = x.shape[2], W = x.shape[3];
  Array y = zeros(pool_out(x, p));
  const std::int64_t planes = y.shape[0] * y.shape[1], Ho = y.shape[2], Wo = y.shape[3];
  for (std::int64_t pl = 0; pl < planes; ++pl)
    for (std::int64_t oh = 0; oh < Ho; ++oh)
      for (std::int64_t ow = 0; ow < Wo; ++ow) {
        double s = 0;
        std::int64_t inside = 0;
        for (std::int64_t i = 0; i < p.kh; ++i)
          for (std::int64_t j = 0; j < p.kw; ++j) {
            const std::int64_t iy = oh * p.sh - p.ph + i, ix = ow * p.sw - p.pw + j;
            if (iy >= 0 && iy < H && ix >= 0 && ix < W) {
              s += x.v[std::size_t((pl * H + iy) * W + ix)];
              ++inside;
            }
          }
        y.v[std::size_t((pl * Ho + oh) * Wo + ow)] = s / double(count_include_pad ? p.kh * p.kw : inside);
      }
  return y;
}

// [N, C, H, W] -> [N, C], the mean of each plane.
inline Array global_avg_pool2d(const Array& x) {
  const std::int64_t N = x.shape[0], C = x.shape[1], HW = x.shape[2] * x.shape[3];
  Array y = zeros({N, C});
  for (std::int64_t i = 0; i < N * C; ++i) {
    double s = 0;
    for (std::int64_t q = 0; q < HW; ++q) s += x.v[std::size_t(i * HW + q)];
    y.v[std::size_t(i)] = s / double(HW);
  }
  return y;
}

}  // namespace ref
