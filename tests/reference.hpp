#pragma once
// Naive float64 reference implementations of frugal's ops, written from the
// math definitions with plain loops over explicit shapes. Nothing here calls
// frugal: the op tests compare frugal's kernels against this code, so it must
// stay independent of them (and slow and obvious is the point).
#include <cmath>
#include <cstdint>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

namespace ref {

using Dims = std::vector<std::int64_t>;

// A dense row-major array: shape plus values.
struct Array {
  Dims shape;
  std::vector<double> v;
};

inline std::int64_t numel(const Dims& s) {
  std::int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

inline std::string str(const Dims& s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

inline void require(bool ok, const std::string& why) {
  if (!ok) throw std::invalid_argument("ref: " + why);
}

inline Array zeros(Dims shape) {
  Array a{std::move(shape), {}};
  a.v.assign(std::size_t(numel(a.shape)), 0.0);
  return a;
}

// Multi-index <-> flat offset, row-major.
inline Dims unravel(std::int64_t flat, const Dims& shape) {
  Dims idx(shape.size(), 0);
  for (int d = int(shape.size()) - 1; d >= 0; --d) {
    idx[std::size_t(d)] = flat % shape[std::size_t(d)];
    flat /= shape[std::size_t(d)];
  }
  return idx;
}
inline std::int64_t ravel(const Dims& idx, const Dims& shape) {
  std::int64_t flat = 0;
  for (std::size_t d = 0; d < shape.size(); ++d) flat = flat * shape[d] + idx[d];
  return flat;
}

inline int norm_axis(int axis, int rank) {
  int a = axis < 0 ? axis + rank : axis;
  require(a >= 0 && a < rank, "axis out of range");
  return a;
}

// ---- elementwise unary -------------------------------------------------

template <class F>
Array map(const Array& x, F f) {
  Array y{x.shape, x.v};
  for (auto& e : y.v) e = f(e);
  return y;
}

inline Array relu(const Array& x) {
  return map(x, [](double t) { return t > 0 ? t : 0.0; });
}
// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
inline Array gelu_tanh(const Array& x) {
  const double pi = std::acos(-1.0);
  return map(x, [pi](double t) { return 0.5 * t * (1.0 + std::tanh(std::sqrt(2.0 / pi) * (t + 0.044715 * t * t * t))); });
}
// 0.5 x (1 + erf(x / sqrt 2))
inline Array gelu_erf(const Array& x) {
  return map(x, [](double t) { return 0.5 * t * (1.0 + std::erf(t / std::sqrt(2.0))); });
}
inline Array tanh(const Array& x) {
  return map(x, [](double t) { return std::tanh(t); });
}
inline Array sigmoid(const Array& x) {
  return map(x, [](double t) { return 1.0 / (1.0 + std::exp(-t)); });
}
inline Array exp(const Array& x) {
  return map(x, [](double t) { return std::exp(t); });
}
inline Array log(const Array& x) {
  return map(x, [](double t) { return std::log(t); });
}
inline Array rsqrt(const Array& x) {
  return map(x, [](double v) { return 1.0 / std::sqrt(v); });
}
inline Array affine(const Array& x, double a, double b) {
  return map(x, [a, b](double t) { return a * t + b; });
}

// ---- numpy broadcasting ------------------------------------------------

inline Dims broadcast_shape(const Dims& a, const Dims& b) {
  std::size_t r = std::max(a.size(), b.size());
  Dims out(r);
  for (std::size_t i = 0; i < r; ++i) {
    std::int64_t da = i + a.size() >= r ? a[i + a.size() - r] : 1;
    std::int64_t db = i + b.size() >= r ? b[i + b.size() - r] : 1;
    require(da == db || da == 1 || db == 1, "shapes " + str(a) + " and " + str(b) + " do not broadcast");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

// Flat offset in an array of shape `in` of the element that output index
// `out_idx` (of a larger broadcast shape) reads.
inline std::int64_t broadcast_source(const Dims& out_idx, const Dims& in) {
  std::size_t lead = out_idx.size() - in.size();
  Dims idx(in.size());
  for (std::size_t d = 0; d < in.size(); ++d) idx[d] = in[d] == 1 ? 0 : out_idx[d + lead];
  return ravel(idx, in);
}

template <class F>
Array binary(const Array& a, const Array& b, F f) {
  Array y = zeros(broadcast_shape(a.shape, b.shape));
  for (std::int64_t i = 0; i < numel(y.shape); ++i) {
    Dims idx = unravel(i, y.shape);
    y.v[std::size_t(i)] = f(a.v[std::size_t(broadcast_source(idx, a.shape))], b.v[std::size_t(broadcast_source(idx, b.shape))]);
  }
  return y;
}
inline Array add(const Array& a, const Array& b) {
  return binary(a, b, [](double p, double q) { return p + q; });
}
inline Array sub(const Array& a, const Array& b) {
  return binary(a, b, [](double p, double q) { return p - q; });
}
inline Array mul(const Array& a, const Array& b) {
  return binary(a, b, [](double p, double q) { return p * q; });
}
inline Array div(const Array& a, const Array& b) {
  return binary(a, b, [](double p, double q) { return p / q; });
}

inline Array broadcast_to(const Array& x, const Dims& shape) {
  require(broadcast_shape(x.shape, shape) == shape, "cannot broadcast " + str(x.shape) + " to " + str(shape));
  Array y = zeros(shape);
  for (std::int64_t i = 0; i < numel(shape); ++i)
    y.v[std::size_t(i)] = x.v[std::size_t(broadcast_source(unravel(i, shape), x.shape))];
  return y;
}

// ---- matrix products ---------------------------------------------------

// C = op(A) op(B) over the last two axes, op(X) = X or X^T. Batch axes are
// equal, or one operand is a plain matrix shared over the other's batch.
inline Array matmul(const Array& a, const Array& b, bool ta = false, bool tb = false) {
  const Dims &as = a.shape, &bs = b.shape;
  require(as.size() >= 2 && bs.size() >= 2, "matmul needs matrices");
  const std::int64_t ar = as[as.size() - 2], ac = as[as.size() - 1];
  const std::int64_t br = bs[bs.size() - 2], bc = bs[bs.size() - 1];
  const std::int64_t m = ta ? ac : ar, k = ta ? ar : ac, kb = tb ? bc : br, n = tb ? br : bc;
  require(k == kb, "matmul inner dimensions differ");
  Dims abatch(as.begin(), as.end() - 2), bbatch(bs.begin(), bs.end() - 2);
  require(abatch.empty() || bbatch.empty() || abatch == bbatch, "matmul batch dimensions differ");
  Dims batch = abatch.empty() ? bbatch : abatch;
  const std::int64_t nb = numel(batch);
  Dims out_shape = batch;
  out_shape.push_back(m);
  out_shape.push_back(n);
  Array c = zeros(out_shape);
  for (std::int64_t t = 0; t < nb; ++t) {
    const double* A = a.v.data() + (abatch.empty() ? 0 : t * ar * ac);
    const double* B = b.v.data() + (bbatch.empty() ? 0 : t * br * bc);
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (std::int64_t p = 0; p < k; ++p) {
          double aip = ta ? A[p * ac + i] : A[i * ac + p];
          double bpj = tb ? B[j * bc + p] : B[p * bc + j];
          s += aip * bpj;
        }
        c.v[std::size_t((t * m + i) * n + j)] = s;
      }
  }
  return c;
}

// y = x W^T + b, x [..., in], W [out, in], b [out] (b may be null).
inline Array linear(const Array& x, const Array& w, const Array* b = nullptr) {
  require(w.shape.size() == 2 && !x.shape.empty() && x.shape.back() == w.shape[1], "linear shapes");
  const std::int64_t out = w.shape[0], in = w.shape[1], rows = numel(x.shape) / in;
  Dims ys = x.shape;
  ys.back() = out;
  Array y = zeros(ys);
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t o = 0; o < out; ++o) {
      double s = b ? b->v[std::size_t(o)] : 0.0;
      for (std::int64_t i = 0; i < in; ++i) s += x.v[std::size_t(r * in + i)] * w.v[std::size_t(o * in + i)];
      y.v[std::size_t(r * out + o)] = s;
    }
  return y;
}

// ---- reductions --------------------------------------------------------

// Which axes `axes` names (empty = all), as flags.
inline std::vector<bool> axis_flags(const std::vector<int>& axes, int rank) {
  std::vector<bool> f(std::size_t(rank), axes.empty());
  for (int a : axes) {
    int n = norm_axis(a, rank);
    require(!f[std::size_t(n)], "repeated axis");
    f[std::size_t(n)] = true;
  }
  return f;
}

inline Array sum(const Array& x, const std::vector<int>& axes = {}, bool keepdim = false) {
  const int rank = int(x.shape.size());
  std::vector<bool> red = axis_flags(axes, rank);
  Dims kept_shape, out_shape;  // kept_shape: reduced axes as 1
  for (int d = 0; d < rank; ++d) {
    kept_shape.push_back(red[std::size_t(d)] ? 1 : x.shape[std::size_t(d)]);
    if (!red[std::size_t(d)] || keepdim) out_shape.push_back(kept_shape.back());
  }
  Array y = zeros(out_shape);
  for (std::int64_t i = 0; i < numel(x.shape); ++i) {
    Dims idx = unravel(i, x.shape);
    for (int d = 0; d < rank; ++d)
      if (red[std::size_t(d)]) idx[std::size_t(d)] = 0;
    y.v[std::size_t(ravel(idx, kept_shape))] += x.v[std::size_t(i)];
  }
  return y;
}

inline Array mean(const Array& x, const std::vector<int>& axes = {}, bool keepdim = false) {
  std::vector<bool> red = axis_flags(axes, int(x.shape.size()));
  double count = 1;
  for (std::size_t d = 0; d < red.size(); ++d)
    if (red[d]) count *= double(x.shape[d]);
  Array y = sum(x, axes, keepdim);
  for (auto& e : y.v) e /= count;
  return y;
}

// ---- data movement -----------------------------------------------------

inline Array reshape(const Array& x, Dims dims) {
  std::int64_t known = 1;
  int infer = -1;
  for (std::size_t i = 0; i < dims.size(); ++i)
    if (dims[i] == -1) {
      require(infer < 0, "two -1 in reshape");
      infer = int(i);
    } else {
      known *= dims[i];
    }
  if (infer >= 0) dims[std::size_t(infer)] = numel(x.shape) / known;
  require(numel(dims) == numel(x.shape), "reshape changes the element count");
  return {dims, x.v};
}

// out.shape[i] = in.shape[perm[i]]; out[idx] = in[j] with j[perm[i]] = idx[i].
inline Array permute(const Array& x, const std::vector<int>& perm) {
  require(perm.size() == x.shape.size(), "permute rank");
  Dims out_shape;
  for (int p : perm) out_shape.push_back(x.shape[std::size_t(p)]);
  Array y = zeros(out_shape);
  for (std::int64_t i = 0; i < numel(out_shape); ++i) {
    Dims idx = unravel(i, out_shape), src(x.shape.size());
    for (std::size_t d = 0; d < perm.size(); ++d) src[std::size_t(perm[d])] = idx[d];
    y.v[std::size_t(i)] = x.v[std::size_t(ravel(src, x.shape))];
  }
  return y;
}

inline Array transpose(const Array& x, int a, int b) {
  const int rank = int(x.shape.size());
  std::vector<int> perm(static_cast<std::size_t>(rank), 0);
  std::iota(perm.begin(), perm.end(), 0);
  std::swap(perm[std::size_t(norm_axis(a, rank))], perm[std::size_t(norm_axis(b, rank))]);
  return permute(x, perm);
}

// ---- softmax family ----------------------------------------------------

// softmax_i = exp(x_i) / sum_j exp(x_j) along `axis`; log_softmax = its log,
// computed as x_i - log sum_j exp(x_j) (shifted by the line's max, which
// changes nothing mathematically and keeps exp finite).
inline Array softmax_impl(const Array& x, int axis, bool log_form) {
  const int rank = int(x.shape.size());
  const int ax = norm_axis(axis, rank);
  const std::int64_t n = x.shape[std::size_t(ax)];
  Array y = zeros(x.shape);
  for (std::int64_t i = 0; i < numel(x.shape); ++i) {
    Dims idx = unravel(i, x.shape);
    if (idx[std::size_t(ax)] != 0) continue;  // i is the start of one line
    std::vector<std::int64_t> at(static_cast<std::size_t>(n), 0);
    for (std::int64_t j = 0; j < n; ++j) {
      idx[std::size_t(ax)] = j;
      at[std::size_t(j)] = ravel(idx, x.shape);
    }
    double mx = x.v[std::size_t(at[0])];
    for (auto p : at) mx = std::max(mx, x.v[std::size_t(p)]);
    double z = 0;
    for (auto p : at) z += std::exp(x.v[std::size_t(p)] - mx);
    for (auto p : at)
      y.v[std::size_t(p)] = log_form ? x.v[std::size_t(p)] - mx - std::log(z) : std::exp(x.v[std::size_t(p)] - mx) / z;
  }
  return y;
}
inline Array softmax(const Array& x, int axis = -1) { return softmax_impl(x, axis, false); }
inline Array log_softmax(const Array& x, int axis = -1) { return softmax_impl(x, axis, true); }

// mean over positions p of -log softmax(logits[p, :])[label[p]], logits
// [..., C], labels [...] (label values held as exact integers in doubles).
inline Array cross_entropy(const Array& logits, const Array& labels) {
  require(!logits.shape.empty(), "cross_entropy: logits need a class axis");
  const std::int64_t C = logits.shape.back(), P = numel(logits.shape) / C;
  require(numel(labels.shape) == P, "cross_entropy: one label per position");
  double total = 0;
  for (std::int64_t p = 0; p < P; ++p) {
    const double* row = logits.v.data() + p * C;
    const auto label = std::int64_t(labels.v[std::size_t(p)]);
    require(label >= 0 && label < C, "cross_entropy: label out of range");
    double mx = row[0];
    for (std::int64_t c = 1; c < C; ++c) mx = std::max(mx, row[c]);
    double z = 0;
    for (std::int64_t c = 0; c < C; ++c) z += std::exp(row[c] - mx);
    total += mx + std::log(z) - row[label];
  }
  return {{}, {total / double(P)}};
}

}  // namespace ref
