#pragma once
// Naive float64 references for the issue-14 ops (elementwise math, where,
// max/min along a dim, the losses), written from PyTorch's definitions with
// plain loops. Like reference.hpp, nothing here calls frugal.
#include <algorithm>

#include "reference.hpp"

namespace ref {

inline Array abs(const Array& x) { return map(x, [](double t) { return std::fabs(t); }); }
inline Array sqrt(const Array& x) { return map(x, [](double t) { return std::sqrt(t); }); }
inline Array square(const Array& x) { return map(x, [](double t) { return t * t; }); }
inline Array sin(const Array& x) { return map(x, [](double t) { return std::sin(t); }); }
inline Array cos(const Array& x) { return map(x, [](double t) { return std::cos(t); }); }
inline Array pow(const Array& x, double p) { return map(x, [p](double t) { return std::pow(t, p); }); }
inline Array clamp(const Array& x, double lo, double hi) {
  return map(x, [=](double t) { return std::min(std::max(t, lo), hi); });
}
inline Array maximum(const Array& a, const Array& b) {
  return binary(a, b, [](double p, double q) { return p > q ? p : q; });
}
inline Array minimum(const Array& a, const Array& b) {
  return binary(a, b, [](double p, double q) { return p < q ? p : q; });
}

// torch.where over three broadcast arrays; the condition is nonzero-is-true.
inline Array where(const Array& c, const Array& a, const Array& b) {
  Array y = zeros(broadcast_shape(c.shape, broadcast_shape(a.shape, b.shape)));
  for (std::int64_t i = 0; i < numel(y.shape); ++i) {
    Dims idx = unravel(i, y.shape);
    const bool take = c.v[std::size_t(broadcast_source(idx, c.shape))] != 0;
    y.v[std::size_t(i)] = take ? a.v[std::size_t(broadcast_source(idx, a.shape))]
                               : b.v[std::size_t(broadcast_source(idx, b.shape))];
  }
  return y;
}

// torch.max(x, dim, keepdim) (is_max) or torch.min: values, or with
// want_index the indices (first extreme wins), as doubles.
inline Array extreme_along(const Array& x, int dim, bool keepdim, bool is_max, bool want_index) {
  const int d = norm_axis(dim, int(x.shape.size()));
  Dims out;
  for (int i = 0; i < int(x.shape.size()); ++i)
    if (i != d) out.push_back(x.shape[std::size_t(i)]);
    else if (keepdim) out.push_back(1);
  Array y = zeros(out);
  const std::int64_t n = x.shape[std::size_t(d)];
  for (std::int64_t i = 0; i < numel(out); ++i) {
    Dims idx = unravel(i, out);
    if (!keepdim) idx.insert(idx.begin() + d, 0);
    std::int64_t best = 0;
    for (std::int64_t j = 0; j < n; ++j) {
      idx[std::size_t(d)] = j;
      const double v = x.v[std::size_t(ravel(idx, x.shape))];
      idx[std::size_t(d)] = best;
      const double b = x.v[std::size_t(ravel(idx, x.shape))];
      if (is_max ? v > b : v < b) best = j;
    }
    idx[std::size_t(d)] = best;
    y.v[std::size_t(i)] = want_index ? double(best) : x.v[std::size_t(ravel(idx, x.shape))];
  }
  return y;
}

// ---- losses (PyTorch's formulas) ----------------------------------------

inline Array reduce(const Array& l, const std::string& reduction) {
  if (reduction == "none") return l;
  double s = 0;
  for (double e : l.v) s += e;
  return {{}, {reduction == "sum" ? s : s / double(l.v.size())}};
}
inline Array mse(const Array& a, const Array& b, const std::string& r) {
  return reduce(binary(a, b, [](double p, double q) { return (p - q) * (p - q); }), r);
}
inline Array l1(const Array& a, const Array& b, const std::string& r) {
  return reduce(binary(a, b, [](double p, double q) { return std::fabs(p - q); }), r);
}
inline Array smooth_l1(const Array& a, const Array& b, const std::string& r, double beta) {
  return reduce(binary(a, b,
                       [beta](double p, double q) {
                         const double z = std::fabs(p - q);
                         return z < beta ? 0.5 * z * z / beta : z - 0.5 * beta;
                       }),
                r);
}
inline Array huber(const Array& a, const Array& b, const std::string& r, double delta) {
  return reduce(binary(a, b,
                       [delta](double p, double q) {
                         const double z = std::fabs(p - q);
                         return z < delta ? 0.5 * z * z : delta * (z - 0.5 * delta);
                       }),
                r);
}
// -[pw y log sigmoid(x) + (1 - y) log(1 - sigmoid(x))] * w, written plainly
// (the inputs in the tests are small enough for the naive form).
inline Array bce_with_logits(const Array& x, const Array& y, const Array* w, const Array* pw, const std::string& r) {
  Array l = zeros(x.shape);
  for (std::int64_t i = 0; i < numel(x.shape); ++i) {
    Dims idx = unravel(i, x.shape);
    const double xi = x.v[std::size_t(i)], yi = y.v[std::size_t(i)];
    const double s = 1.0 / (1.0 + std::exp(-xi));
    const double p = pw ? pw->v[std::size_t(broadcast_source(idx, pw->shape))] : 1.0;
    double li = -(p * yi * std::log(s) + (1 - yi) * std::log(1 - s));
    if (w) li *= w->v[std::size_t(broadcast_source(idx, w->shape))];
    l.v[std::size_t(i)] = li;
  }
  return reduce(l, r);
}
// F.nll_loss: input [C], [N, C] or [N, C, d...]; target without dim 1.
inline Array nll(const Array& in, const Array& target, const std::string& r, std::int64_t ignore) {
  const bool flat = in.shape.size() == 1;
  const std::int64_t N = flat ? 1 : in.shape[0], C = flat ? in.shape[0] : in.shape[1];
  const std::int64_t R = flat ? 1 : numel(in.shape) / (N * C);
  Array l = zeros(target.shape);
  double total = 0, kept = 0;
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t k = 0; k < R; ++k) {
      const auto t = std::int64_t(target.v[std::size_t(n * R + k)]);
      if (t == ignore) continue;
      require(t >= 0 && t < C, "nll: target out of range");
      const double li = -in.v[std::size_t((n * C + t) * R + k)];
      l.v[std::size_t(n * R + k)] = li;
      total += li, kept += 1;
    }
  if (r == "none") return l;
  return {{}, {r == "sum" ? total : total / kept}};
}

}  // namespace ref
