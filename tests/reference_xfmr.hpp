#pragma once
// Naive float64 references for the transformer ops and the indexing ops,
// written from their definitions (PyTorch's semantics) with plain loops.
// Nothing here calls frugal; see reference.hpp for the Array type.
#include <cstdint>
#include <limits>

#include "reference.hpp"

namespace ref {

// ---- layer norm ---------------------------------------------------------

// Over the last axis; the variance is the biased one (divide by D).
inline Array layer_norm(const Array& x, const Array* w, const Array* b, double eps = 1e-5) {
  require(!x.shape.empty(), "layer_norm needs a dimension");
  const std::int64_t d = x.shape.back(), rows = numel(x.shape) / d;
  Array y = zeros(x.shape);
  for (std::int64_t r = 0; r < rows; ++r) {
    double mean = 0, var = 0;
    for (std::int64_t j = 0; j < d; ++j) mean += x.v[std::size_t(r * d + j)];
    mean /= double(d);
    for (std::int64_t j = 0; j < d; ++j) {
      double c = x.v[std::size_t(r * d + j)] - mean;
      var += c * c;
    }
    var /= double(d);
    for (std::int64_t j = 0; j < d; ++j) {
      double v = (x.v[std::size_t(r * d + j)] - mean) / std::sqrt(var + eps);
      if (w) v *= w->v[std::size_t(j)];
      if (b) v += b->v[std::size_t(j)];
      y.v[std::size_t(r * d + j)] = v;
    }
  }
  return y;
}

// ---- embedding ----------------------------------------------------------

// out[i..., :] = table[ids[i...], :]
inline Array embedding(const Array& ids, const Array& table) {
  require(table.shape.size() == 2, "embedding table must be 2-D");
  const std::int64_t d = table.shape[1];
  Dims os = ids.shape;
  os.push_back(d);
  Array y = zeros(os);
  for (std::size_t i = 0; i < ids.v.size(); ++i) {
    auto row = std::int64_t(ids.v[i]);
    require(row >= 0 && row < table.shape[0], "embedding id out of range");
    for (std::int64_t j = 0; j < d; ++j) y.v[i * std::size_t(d) + std::size_t(j)] = table.v[std::size_t(row * d + j)];
  }
  return y;
}

// ---- dropout ------------------------------------------------------------

// Philox4x32-10 (Salmon, Moraes, Dror, Shaw: "Parallel random numbers: as
// easy as 1, 2, 3", SC'11), written from the paper: 10 rounds of
// (c0, c1, c2, c3) -> (hi(M1 c2) ^ c1 ^ k0, lo(M1 c2), hi(M0 c0) ^ c3 ^ k1,
// lo(M0 c0)), the key bumped by the Weyl constants after each round.
struct Philox4 {
  std::uint32_t v[4];
};
inline Philox4 philox4x32_10(Philox4 c, std::uint32_t k0, std::uint32_t k1) {
  const std::uint64_t m0 = 0xD2511F53u, m1 = 0xCD9E8D57u;
  for (int round = 0; round < 10; ++round) {
    const std::uint64_t p0 = m0 * c.v[0], p1 = m1 * c.v[2];
    c = {{std::uint32_t(p1 >> 32) ^ c.v[1] ^ k0, std::uint32_t(p1), std::uint32_t(p0 >> 32) ^ c.v[3] ^ k1,
          std::uint32_t(p0)}};
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return c;
}

// The keep flag of element i at step `step` under `key`, as the dropout
// contract states it: word i % 4 of the block at counter (words, low first)
// (lo32(i/4), hi32(i/4), lo32(step), hi32(step)) under key (lo32, hi32) is
// compared with floor(p * 2^32).
inline bool dropout_keep(std::uint64_t key, std::uint64_t step, std::uint64_t i, double p) {
  const std::uint64_t g = i / 4;
  Philox4 b =
      philox4x32_10({{std::uint32_t(g), std::uint32_t(g >> 32), std::uint32_t(step), std::uint32_t(step >> 32)}},
                    std::uint32_t(key), std::uint32_t(key >> 32));
  return double(b.v[i % 4]) >= std::floor(p * 4294967296.0);
}

inline Array dropout(const Array& x, double p, std::uint64_t key, std::uint64_t step) {
  Array y = zeros(x.shape);
  for (std::size_t i = 0; i < x.v.size(); ++i) y.v[i] = p < 1 && dropout_keep(key, step, i, p) ? x.v[i] / (1 - p) : 0.0;
  return y;
}

// ---- causal attention -----------------------------------------------------

// softmax(scale q k^T + mask) v over the last two axes, q [..., Tq, hd],
// k [..., Tk, hd], v [..., Tk, hdv]; query i sees keys j <= i + Tk - Tq.
inline Array causal_attention(const Array& q, const Array& k, const Array& v, double scale = 0) {
  const std::size_t r = q.shape.size();
  require(r >= 2 && k.shape.size() == r && v.shape.size() == r, "attention ranks");
  const std::int64_t tq = q.shape[r - 2], hd = q.shape[r - 1], tk = k.shape[r - 2], hdv = v.shape[r - 1];
  require(k.shape[r - 1] == hd && v.shape[r - 2] == tk && tq <= tk, "attention shapes");
  if (scale <= 0) scale = 1.0 / std::sqrt(double(hd));
  const std::int64_t batch = numel(Dims(q.shape.begin(), q.shape.end() - 2));
  Dims os = q.shape;
  os.back() = hdv;
  Array o = zeros(os);
  for (std::int64_t b = 0; b < batch; ++b)
    for (std::int64_t i = 0; i < tq; ++i) {
      const std::int64_t last = i + tk - tq;
      std::vector<double> s(std::size_t(last + 1));
      double mx = -std::numeric_limits<double>::infinity();
      for (std::int64_t j = 0; j <= last; ++j) {
        double dot = 0;
        for (std::int64_t c = 0; c < hd; ++c)
          dot += q.v[std::size_t((b * tq + i) * hd + c)] * k.v[std::size_t((b * tk + j) * hd + c)];
        s[std::size_t(j)] = scale * dot;
        mx = std::max(mx, s[std::size_t(j)]);
      }
      double z = 0;
      for (auto& e : s) z += (e = std::exp(e - mx));
      for (std::int64_t j = 0; j <= last; ++j)
        for (std::int64_t c = 0; c < hdv; ++c)
          o.v[std::size_t((b * tq + i) * hdv + c)] += s[std::size_t(j)] / z * v.v[std::size_t((b * tk + j) * hdv + c)];
    }
  return o;
}

// ---- indexing -------------------------------------------------------------

inline Array concat(const std::vector<Array>& xs, int axis) {
  const std::size_t a = std::size_t(norm_axis(axis, int(xs.at(0).shape.size())));
  Dims os = xs[0].shape;
  os[a] = 0;
  for (auto& x : xs) os[a] += x.shape[a];
  Array y = zeros(os);
  std::int64_t at = 0;
  for (auto& x : xs) {
    for (std::int64_t i = 0; i < numel(x.shape); ++i) {
      Dims idx = unravel(i, x.shape);
      idx[a] += at;
      y.v[std::size_t(ravel(idx, os))] = x.v[std::size_t(i)];
    }
    at += x.shape[a];
  }
  return y;
}

// Python slicing of one axis: x[..., start:end:step, ...].
inline Array slice(const Array& x, int axis, std::int64_t start, std::int64_t end, std::int64_t step = 1) {
  const std::size_t a = std::size_t(norm_axis(axis, int(x.shape.size())));
  const std::int64_t n = x.shape[a];
  auto norm = [n](std::int64_t i) { return std::min(std::max(i < 0 ? i + n : i, std::int64_t(0)), n); };
  std::vector<std::int64_t> picked;
  for (std::int64_t i = norm(start); i < norm(end); i += step) picked.push_back(i);
  Dims os = x.shape;
  os[a] = std::int64_t(picked.size());
  Array y = zeros(os);
  for (std::int64_t i = 0; i < numel(os); ++i) {
    Dims idx = unravel(i, os);
    idx[a] = picked[std::size_t(idx[a])];
    y.v[std::size_t(i)] = x.v[std::size_t(ravel(idx, x.shape))];
  }
  return y;
}

inline std::vector<Array> split(const Array& x, const std::vector<std::int64_t>& sizes, int axis) {
  std::vector<Array> out;
  std::int64_t at = 0;
  for (std::int64_t s : sizes) {
    out.push_back(slice(x, axis, at, at + s));
    at += s;
  }
  return out;
}

inline Array index_select(const Array& x, int axis, const Array& ids) {
  const std::size_t a = std::size_t(norm_axis(axis, int(x.shape.size())));
  Dims os = x.shape;
  os[a] = std::int64_t(ids.v.size());
  Array y = zeros(os);
  for (std::int64_t i = 0; i < numel(os); ++i) {
    Dims idx = unravel(i, os);
    idx[a] = std::int64_t(ids.v[std::size_t(idx[a])]);
    y.v[std::size_t(i)] = x.v[std::size_t(ravel(idx, x.shape))];
  }
  return y;
}

inline Array index_add(const Array& base, int axis, const Array& ids, const Array& src) {
  const std::size_t a = std::size_t(norm_axis(axis, int(base.shape.size())));
  Array y = base;
  for (std::int64_t i = 0; i < numel(src.shape); ++i) {
    Dims idx = unravel(i, src.shape);
    idx[a] = std::int64_t(ids.v[std::size_t(idx[a])]);
    y.v[std::size_t(ravel(idx, base.shape))] += src.v[std::size_t(i)];
  }
  return y;
}

// out[idx] = x[idx with idx[axis] = ids[idx]]
inline Array gather(const Array& x, int axis, const Array& ids) {
  const std::size_t a = std::size_t(norm_axis(axis, int(x.shape.size())));
  Array y = zeros(ids.shape);
  for (std::int64_t i = 0; i < numel(ids.shape); ++i) {
    Dims idx = unravel(i, ids.shape);
    idx[a] = std::int64_t(ids.v[std::size_t(i)]);
    y.v[std::size_t(i)] = x.v[std::size_t(ravel(idx, x.shape))];
  }
  return y;
}

// out = base; out[idx with idx[axis] = ids[idx]] += src[idx]
inline Array scatter_add(const Array& base, int axis, const Array& ids, const Array& src) {
  const std::size_t a = std::size_t(norm_axis(axis, int(base.shape.size())));
  Array y = base;
  for (std::int64_t i = 0; i < numel(ids.shape); ++i) {
    Dims idx = unravel(i, ids.shape);
    idx[a] = std::int64_t(ids.v[std::size_t(i)]);
    y.v[std::size_t(ravel(idx, base.shape))] += src.v[std::size_t(i)];
  }
  return y;
}

// ---- attention from a packed qkv -------------------------------------------

// qkv [B, T, 3d] -> [B, T, d], as the GPT peer: view(B, T, 3, H, hd),
// permute(2, 0, 3, 1, 4), attention per head, transpose back.
inline Array causal_attention_from_qkv(const Array& qkv, std::int64_t heads) {
  const std::int64_t B = qkv.shape[0], T = qkv.shape[1], d = qkv.shape[2] / 3, hd = d / heads;
  Array t = permute(reshape(qkv, {B, T, 3, heads, hd}), {2, 0, 3, 1, 4});
  const std::size_t part = std::size_t(B * heads * T * hd);
  auto piece = [&](std::size_t i) {
    Array p = zeros({B, heads, T, hd});
    std::copy(t.v.begin() + std::ptrdiff_t(i * part), t.v.begin() + std::ptrdiff_t((i + 1) * part), p.v.begin());
    return p;
  };
  Array y = causal_attention(piece(0), piece(1), piece(2));
  return reshape(permute(y, {0, 2, 1, 3}), {B, T, d});
}

}  // namespace ref
