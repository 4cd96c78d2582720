#pragma once
// Naive float64 references for transposed convolution, upsampling, group
// normalisation and 1-D batch normalisation, written from PyTorch's
// definitions with plain loops. Nothing here calls frugal.
#include <algorithm>
#include <cmath>

#include "reference.hpp"

namespace ref {

struct ConvTranspose2dParams {
  std::int64_t sh = 1, sw = 1, ph = 0, pw = 0, oph = 0, opw = 0, dh = 1, dw = 1, groups = 1;
};

// The scatter form of the definition: every input x[n, ci, ih, iw] adds
// x * w[ci, co, i, j] to y[n, g * Cout/g + co, ih*sh - ph + i*dh, iw*sw - pw + j*dw]
// (when inside the output), g = ci's group; y starts at the bias.
inline Array conv_transpose2d(const Array& x, const Array& w, const Array* b, const ConvTranspose2dParams& p) {
  require(x.shape.size() == 4 && w.shape.size() == 4, "conv_transpose2d: rank 4 input and weight");
  const std::int64_t N = x.shape[0], Cin = x.shape[1], H = x.shape[2], W = x.shape[3];
  const std::int64_t Cog = w.shape[1], KH = w.shape[2], KW = w.shape[3];
  require(w.shape[0] == Cin && Cin % p.groups == 0, "conv_transpose2d: groups");
  const std::int64_t Cout = Cog * p.groups, Cig = Cin / p.groups;
  const std::int64_t Ho = (H - 1) * p.sh - 2 * p.ph + p.dh * (KH - 1) + p.oph + 1;
  const std::int64_t Wo = (W - 1) * p.sw - 2 * p.pw + p.dw * (KW - 1) + p.opw + 1;
  Array y = zeros({N, Cout, Ho, Wo});
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t co = 0; co < Cout; ++co)
      for (std::int64_t q = 0; q < Ho * Wo; ++q) y.v[std::size_t((n * Cout + co) * Ho * Wo + q)] = b ? b->v[std::size_t(co)] : 0.0;
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t ci = 0; ci < Cin; ++ci) {
      const std::int64_t g = ci / Cig;
      for (std::int64_t ih = 0; ih < H; ++ih)
        for (std::int64_t iw = 0; iw < W; ++iw) {
          const double xv = x.v[std::size_t(((n * Cin + ci) * H + ih) * W + iw)];
          for (std::int64_t co = 0; co < Cog; ++co)
            for (std::int64_t i = 0; i < KH; ++i)
              for (std::int64_t j = 0; j < KW; ++j) {
                const std::int64_t oh = ih * p.sh - p.ph + i * p.dh, ow = iw * p.sw - p.pw + j * p.dw;
                if (oh < 0 || oh >= Ho || ow < 0 || ow >= Wo) continue;
                y.v[std::size_t(((n * Cout + g * Cog + co) * Ho + oh) * Wo + ow)] +=
                    xv * w.v[std::size_t(((ci * Cog + co) * KH + i) * KW + j)];
              }
        }
    }
  return y;
}

// ---- upsampling ---------------------------------------------------------------------

struct UpsampleParams {
  std::int64_t ho = 0, wo = 0;          // the output size
  double scale_h = 0, scale_w = 0;      // the given scale factors, 0 when a size was given
  bool align_corners = false;
};

// F.interpolate's output size: the given size, or floor(in * scale_factor).
inline UpsampleParams upsample_size(const Array& x, std::int64_t ho, std::int64_t wo, double sh, double sw,
                                    bool align) {
  if (sh > 0) return {std::int64_t(std::floor(double(x.shape[2]) * sh)), std::int64_t(std::floor(double(x.shape[3]) * sw)), sh, sw, align};
  return {ho, wo, 0, 0, align};
}

// PyTorch's nearest: src = min(floor(dst * scale), in - 1), scale in float,
// 1/scale_factor when one was given, else in/out.
inline std::int64_t nearest_index(std::int64_t dst, std::int64_t in, std::int64_t out, double scale_factor) {
  const float scale = scale_factor > 0 ? float(1.0 / scale_factor) : float(in) / float(out);
  return std::min(std::int64_t(std::floor(float(dst) * scale)), in - 1);
}

inline Array upsample_nearest2d(const Array& x, const UpsampleParams& p) {
  const std::int64_t P = x.shape[0] * x.shape[1], H = x.shape[2], W = x.shape[3];
  Array y = zeros({x.shape[0], x.shape[1], p.ho, p.wo});
  for (std::int64_t pl = 0; pl < P; ++pl)
    for (std::int64_t oh = 0; oh < p.ho; ++oh)
      for (std::int64_t ow = 0; ow < p.wo; ++ow) {
        const std::int64_t ih = nearest_index(oh, H, p.ho, p.scale_h), iw = nearest_index(ow, W, p.wo, p.scale_w);
        y.v[std::size_t((pl * p.ho + oh) * p.wo + ow)] = x.v[std::size_t((pl * H + ih) * W + iw)];
      }
  return y;
}

// The source coordinate of bilinear (PyTorch's area_pixel_compute_source_index).
inline double linear_coordinate(std::int64_t dst, std::int64_t in, std::int64_t out, double scale_factor, bool align) {
  if (align) return out > 1 ? double(in - 1) / double(out - 1) * double(dst) : 0.0;
  const double scale = scale_factor > 0 ? 1.0 / scale_factor : double(in) / double(out);
  return std::max(0.0, scale * (double(dst) + 0.5) - 0.5);
}

// y = sum over the 2x2 neighbours (i0, i0 + 1 clamped to the input) of
// x * (1 - |src - i|) per axis.
inline Array upsample_bilinear2d(const Array& x, const UpsampleParams& p) {
  const std::int64_t P = x.shape[0] * x.shape[1], H = x.shape[2], W = x.shape[3];
  Array y = zeros({x.shape[0], x.shape[1], p.ho, p.wo});
  for (std::int64_t pl = 0; pl < P; ++pl)
    for (std::int64_t oh = 0; oh < p.ho; ++oh)
      for (std::int64_t ow = 0; ow < p.wo; ++ow) {
        const double sy = linear_coordinate(oh, H, p.ho, p.scale_h, p.align_corners);
        const double sx = linear_coordinate(ow, W, p.wo, p.scale_w, p.align_corners);
        const std::int64_t y0 = std::min(std::int64_t(std::floor(sy)), H - 1), x0 = std::min(std::int64_t(std::floor(sx)), W - 1);
        const std::int64_t y1 = std::min(y0 + 1, H - 1), x1 = std::min(x0 + 1, W - 1);
        const double ly = std::clamp(sy - double(y0), 0.0, 1.0), lx = std::clamp(sx - double(x0), 0.0, 1.0);
        auto at = [&](std::int64_t iy, std::int64_t ix) { return x.v[std::size_t((pl * H + iy) * W + ix)]; };
        y.v[std::size_t((pl * p.ho + oh) * p.wo + ow)] = (1 - ly) * ((1 - lx) * at(y0, x0) + lx * at(y0, x1)) +
                                                          ly * ((1 - lx) * at(y1, x0) + lx * at(y1, x1));
      }
  return y;
}

// ---- normalisation ------------------------------------------------------------------

// F.group_norm over [N, C, *]: each (n, group) block normalised by its mean
// and biased variance, then weight[c], bias[c] when given.
inline Array group_norm(const Array& x, std::int64_t groups, const Array* weight, const Array* bias,
                        double eps = 1e-5) {
  const std::int64_t N = x.shape[0], C = x.shape[1];
  std::int64_t S = 1;
  for (std::size_t d = 2; d < x.shape.size(); ++d) S *= x.shape[d];
  const std::int64_t Cg = C / groups;
  Array y = zeros(x.shape);
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t g = 0; g < groups; ++g) {
      double s = 0;
      for (std::int64_t c = g * Cg; c < (g + 1) * Cg; ++c)
        for (std::int64_t q = 0; q < S; ++q) s += x.v[std::size_t((n * C + c) * S + q)];
      const double m = s / double(Cg * S);
      double ss = 0;
      for (std::int64_t c = g * Cg; c < (g + 1) * Cg; ++c)
        for (std::int64_t q = 0; q < S; ++q) {
          const double d = x.v[std::size_t((n * C + c) * S + q)] - m;
          ss += d * d;
        }
      const double var = ss / double(Cg * S);
      for (std::int64_t c = g * Cg; c < (g + 1) * Cg; ++c)
        for (std::int64_t q = 0; q < S; ++q) {
          const std::size_t i = std::size_t((n * C + c) * S + q);
          double v = (x.v[i] - m) / std::sqrt(var + eps);
          if (weight) v = v * weight->v[std::size_t(c)] + bias->v[std::size_t(c)];
          y.v[i] = v;
        }
    }
  return y;
}

// BatchNorm1d over [N, C] or [N, C, L]: per channel c over n (and l),
// with the batch's biased variance (training) or the given statistics.
inline Array batch_norm1d(const Array& x, const Array& gamma, const Array& beta, const Array* rmean,
                          const Array* rvar, double eps = 1e-5) {
  const std::int64_t N = x.shape[0], C = x.shape[1], L = x.shape.size() == 3 ? x.shape[2] : 1;
  Array y = zeros(x.shape);
  for (std::int64_t c = 0; c < C; ++c) {
    double m = 0, var = 0;
    if (rmean) {
      m = rmean->v[std::size_t(c)];
      var = rvar->v[std::size_t(c)];
    } else {
      for (std::int64_t n = 0; n < N; ++n)
        for (std::int64_t l = 0; l < L; ++l) m += x.v[std::size_t((n * C + c) * L + l)];
      m /= double(N * L);
      for (std::int64_t n = 0; n < N; ++n)
        for (std::int64_t l = 0; l < L; ++l) {
          const double d = x.v[std::size_t((n * C + c) * L + l)] - m;
          var += d * d;
        }
      var /= double(N * L);
    }
    for (std::int64_t n = 0; n < N; ++n)
      for (std::int64_t l = 0; l < L; ++l) {
        const std::size_t i = std::size_t((n * C + c) * L + l);
        y.v[i] = (x.v[i] - m) / std::sqrt(var + eps) * gamma.v[std::size_t(c)] + beta.v[std::size_t(c)];
      }
  }
  return y;
}

}  // namespace ref
