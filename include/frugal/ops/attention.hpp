#pragma once
// Causal scaled-dot-product attention as one fused op:
//   o = softmax(scale * q kᵀ + causal mask) v,   scale = 1/sqrt(hd) by default,
// q [..., Tq, hd], k [..., Tk, hd], v [..., Tk, hdv] -> o [..., Tq, hdv]
// (usually [B, H, T, hd]). The leading (batch) axes of q, k and v are equal.
//
// The mask is aligned to the end: query i attends keys j <= i + (Tk - Tq),
// so with a KV cache the last query sees every key. With Tq == Tk this is
// the usual lower-triangular mask (PyTorch's is_causal=True; for Tq != Tk,
// PyTorch's is_causal aligns the mask to the top-left instead, and its
// causal_lower_right bias matches this op, as does flash-attn >= 2.1).
// Tq > Tk is refused: the first Tq - Tk queries would see no key at all.
//
// The op never forms the Tq x Tk score matrix. Its second output is the
// row-wise logsumexp of the scaled, masked scores, [..., Tq]: the backward
// recomputes the probabilities block by block from it.
//
// bf16/f16 q, k, v: scores, the softmax and the output's running sums are
// computed in f32, o is rounded once on store, and the logsumexp is kept in
// f32 (compute_dtype): the backward's P = exp(s - lse) would otherwise carry
// lse's 16-bit rounding error into every probability.
#include <cmath>

#include "checks.hpp"

namespace frugal::ops {

struct AttentionDims {
  std::int64_t batch, tq, tk, hd, hdv;
  std::int64_t offset() const { return tk - tq; }  // query i attends keys <= i + offset
};

// The dimensions of shapes already checked; allocates nothing (for kernels).
inline AttentionDims attention_shape_dims(const Shape& q, const Shape& k, const Shape& v) {
  std::int64_t batch = 1;
  for (int d = 0; d < q.rank() - 2; ++d) batch *= q[d];
  return {batch, q.dim(-2), k.dim(-2), q.dim(-1), v.dim(-1)};
}

// Checks q, k, v and returns their dimensions.
inline AttentionDims attention_dims(const std::string& op, const TensorMeta& q, const TensorMeta& k,
                                    const TensorMeta& v) {
  expect_any_floating(op, q);
  expect_same_dtype(op, q, k);
  expect_same_dtype(op, q, v);
  const Shape &qs = q.shape, &ks = k.shape, &vs = v.shape;
  auto bad = [&](const std::string& why) {
    fail<ShapeError>(op, ": q ", qs.str(), ", k ", ks.str(), " and v ", vs.str(), " are incompatible: ", why);
  };
  if (qs.rank() < 2 || ks.rank() != qs.rank() || vs.rank() != qs.rank())
    bad("all three need the same rank, at least 2 ([..., T, head_dim])");
  for (int d = 0; d < qs.rank() - 2; ++d)
    if (qs[d] != ks[d] || qs[d] != vs[d]) bad("the leading (batch, head) dimensions differ");
  const std::int64_t tq = qs.dim(-2), tk = ks.dim(-2), hd = qs.dim(-1);
  if (ks.dim(-1) != hd) bad("q and k head dimensions differ");
  if (vs.dim(-2) != tk) bad("k and v hold different numbers of keys");
  if (hd == 0 || vs.dim(-1) == 0) bad("a head dimension is 0");
  if (tq > tk)
    bad(cat("more queries (", tq, ") than keys (", tk,
            "): the causal mask is aligned to the end (query i sees keys <= i + Tk - Tq), so the first ", tq - tk,
            " queries would attend nothing"));
  return attention_shape_dims(qs, ks, vs);
}

// Pairs (query, key) the mask lets through, for the cost model.
inline double attention_pairs(const AttentionDims& d) {
  // Query i sees i + offset + 1 keys.
  return double(d.batch) * (double(d.tq) * double(d.offset() + 1) + double(d.tq) * double(d.tq - 1) / 2);
}

inline std::vector<std::int64_t> attention_lse_dims(const Shape& q) {
  return std::vector<std::int64_t>(q.dims().begin(), q.dims().end() - 1);
}

// Inputs (q, k, v, o, lse, do) -> (dq, dk, dv).
class CausalAttentionGrad final : public Op {
 public:
  ~CausalAttentionGrad() override;
  explicit CausalAttentionGrad(double scale) : scale_(scale) {}
  double scale() const { return scale_; }
  std::string name() const override { return "causal_attention_grad"; }
  std::vector<TensorMeta> infer(std::span<const TensorMeta> in) const override {
    expect_arity(name(), in, 6);
    attention_dims(name(), in[0], in[1], in[2]);
    std::vector<std::int64_t> od = in[0].shape.dims();
    od.back() = in[2].shape.dim(-1);
    const TensorMeta o{in[0].dtype, Shape(od)},
        lse{compute_dtype(in[0].dtype), Shape(attention_lse_dims(in[0].shape))};
    if (in[3].shape != o.shape || in[5].shape != o.shape || in[4].shape != lse.shape || in[3].dtype != o.dtype ||
        in[4].dtype != lse.dtype || in[5].dtype != o.dtype)
      fail<ShapeError>(name(), ": o ", in[3].str(), ", lse ", in[4].str(), " and do ", in[5].str(), " do not match q ",
                       in[0].str(), " and v ", in[2].str());
    return {in[0], in[1], in[2]};
  }
  Cost cost(std::span<const TensorMeta> in, std::span<const TensorMeta> out) const override {
    AttentionDims d = attention_dims(name(), in[0], in[1], in[2]);
    double bytes = 0;
    for (auto& m : in) bytes += double(m.nbytes());
    for (auto& m : out) bytes += double(m.nbytes());
    // Recomputed scores, dv, dp, dq, dk: five products over the unmasked pairs.
    // p = exp(s - lse) again: an exp per pair.
    return {0, bytes, attention_pairs(d), 2.0 * attention_pairs(d) * double(3 * d.hd + 2 * d.hdv)};
  }

 private:
  double scale_;
};

class CausalAttention final : public Op {
 public:
  ~CausalAttention() override;
  // scale <= 0 means 1/sqrt(head_dim).
  explicit CausalAttention(double scale = 0) : scale_(scale) {}
  double scale_for(std::int64_t hd) const { return scale_ > 0 ? scale_ : 1.0 / std::sqrt(double(hd)); }
  std::string name() const override { return "causal_attention"; }
  std::vector<TensorMeta> infer(std::span<const TensorMeta> in) const override {
    expect_arity(name(), in, 3);
    attention_dims(name(), in[0], in[1], in[2]);
    std::vector<std::int64_t> od = in[0].shape.dims();
    od.back() = in[2].shape.dim(-1);
    return {{in[0].dtype, Shape(od)}, {compute_dtype(in[0].dtype), Shape(attention_lse_dims(in[0].shape))}};
  }
  std::vector<std::optional<Var>> backward(const BackwardArgs& a) const override {
    if (!a.grad_outputs[0]) return {std::nullopt, std::nullopt, std::nullopt};
    auto g = frugal::apply(std::make_shared<CausalAttentionGrad>(scale_for(a.inputs[0].dim(-1))),
                           {a.inputs[0], a.inputs[1], a.inputs[2], a.outputs[0], a.outputs[1], *a.grad_outputs[0]});
    return {g[0], g[1], g[2]};
  }
  Cost cost(std::span<const TensorMeta> in, std::span<const TensorMeta> out) const override {
    AttentionDims d = attention_dims(name(), in[0], in[1], in[2]);
    return {0, double(in[0].nbytes() + in[1].nbytes() + in[2].nbytes() + out[0].nbytes() + out[1].nbytes()),
            attention_pairs(d), 2.0 * attention_pairs(d) * double(d.hd + d.hdv)};  // an exp per pair
  }

 private:
  double scale_;
};

// ---- the same attention on a packed qkv projection ----------------------------

// qkv [..., T, 3d] holds q, k and v side by side, each split into `heads`
// heads of hd = d / heads: the GPT layout, read as [..., T, 3, H, hd]. The
// op is causal_attention over q, k, v of [..., H, T, hd] taken from that
// view, with the output written back as [..., T, H * hd] = [..., T, d]
// (PyTorch: view(B, T, 3, H, hd).permute(2, 0, 3, 1, 4), attention,
// transpose(1, 2).reshape(B, T, d)). The kernel reads and writes those
// layouts in place, through strides: no permuted copies of q, k, v or o.
struct QkvDims {
  std::int64_t batch, heads, t, hd;
  std::int64_t d() const { return heads * hd; }
};

inline QkvDims qkv_shape_dims(const Shape& qkv, std::int64_t heads) {
  std::int64_t batch = 1;
  for (int d = 0; d < qkv.rank() - 2; ++d) batch *= qkv[d];
  return {batch, heads, qkv.dim(-2), qkv.dim(-1) / 3 / heads};
}

inline QkvDims qkv_dims(const std::string& op, const TensorMeta& qkv, std::int64_t heads) {
  expect_any_floating(op, qkv);
  if (qkv.shape.rank() < 2) fail<ShapeError>(op, ": qkv must be [..., T, 3 * d_model], got ", qkv.str());
  const std::int64_t w = qkv.shape.dim(-1);
  if (heads <= 0 || w == 0 || w % (3 * heads) != 0)
    fail<ShapeError>(op, ": the last dimension of qkv ", qkv.str(), " must be 3 * heads * head_dim with ", heads,
                     " heads and head_dim >= 1");
  return qkv_shape_dims(qkv.shape, heads);
}

inline std::vector<TensorMeta> qkv_outputs(const TensorMeta& qkv, const QkvDims& d) {
  std::vector<std::int64_t> od = qkv.shape.dims(), ld(qkv.shape.dims().begin(), qkv.shape.dims().end() - 2);
  od.back() = d.d();
  ld.push_back(d.heads);
  ld.push_back(d.t);
  return {{qkv.dtype, Shape(od)}, {compute_dtype(qkv.dtype), Shape(ld)}};
}

// Inputs (qkv, o, lse, do) -> dqkv.
class CausalAttentionQkvGrad final : public Op {
 public:
  ~CausalAttentionQkvGrad() override;
  CausalAttentionQkvGrad(std::int64_t heads, double scale) : heads_(heads), scale_(scale) {}
  std::int64_t heads() const { return heads_; }
  double scale() const { return scale_; }
  std::string name() const override { return "causal_attention_qkv_grad"; }
  std::vector<TensorMeta> infer(std::span<const TensorMeta> in) const override {
    expect_arity(name(), in, 4);
    const QkvDims d = qkv_dims(name(), in[0], heads_);
    const auto want = qkv_outputs(in[0], d);
    if (in[1].shape != want[0].shape || in[3].shape != want[0].shape || in[2].shape != want[1].shape ||
        in[1].dtype != in[0].dtype || in[2].dtype != want[1].dtype || in[3].dtype != in[0].dtype)
      fail<ShapeError>(name(), ": o ", in[1].str(), ", lse ", in[2].str(), " and do ", in[3].str(),
                       " do not match qkv ", in[0].str(), " with ", heads_, " heads");
    return {in[0]};
  }
  Cost cost(std::span<const TensorMeta> in, std::span<const TensorMeta> out) const override {
    const QkvDims d = qkv_dims(name(), in[0], heads_);
    const AttentionDims a{d.batch * d.heads, d.t, d.t, d.hd, d.hd};
    return {0, double(in[0].nbytes() + in[1].nbytes() + in[2].nbytes() + in[3].nbytes() + out[0].nbytes()),
            attention_pairs(a), 2.0 * attention_pairs(a) * double(5 * d.hd)};  // p = exp(s - lse) again
  }

 private:
  std::int64_t heads_;
  double scale_;
};

// Inputs (qkv [..., T, 3d]) -> (o [..., T, d], lse [..., H, T]).
class CausalAttentionQkv final : public Op {
 public:
  ~CausalAttentionQkv() override;
  // scale <= 0 means 1/sqrt(head_dim).
  explicit CausalAttentionQkv(std::int64_t heads, double scale = 0) : heads_(heads), scale_(scale) {}
  std::int64_t heads() const { return heads_; }
  double scale_for(std::int64_t hd) const { return scale_ > 0 ? scale_ : 1.0 / std::sqrt(double(hd)); }
  std::string name() const override { return "causal_attention_qkv"; }
  std::vector<TensorMeta> infer(std::span<const TensorMeta> in) const override {
    expect_arity(name(), in, 1);
    return qkv_outputs(in[0], qkv_dims(name(), in[0], heads_));
  }
  std::vector<std::optional<Var>> backward(const BackwardArgs& a) const override {
    if (!a.grad_outputs[0]) return {std::nullopt};
    const std::int64_t hd = a.inputs[0].dim(-1) / 3 / heads_;
    return {apply1<CausalAttentionQkvGrad>({a.inputs[0], a.outputs[0], a.outputs[1], *a.grad_outputs[0]}, heads_,
                                           scale_for(hd))};
  }
  Cost cost(std::span<const TensorMeta> in, std::span<const TensorMeta> out) const override {
    const QkvDims d = qkv_dims(name(), in[0], heads_);
    const AttentionDims a{d.batch * d.heads, d.t, d.t, d.hd, d.hd};
    return {0, double(in[0].nbytes() + out[0].nbytes() + out[1].nbytes()), attention_pairs(a),
            2.0 * attention_pairs(a) * double(2 * d.hd)};  // an exp per pair
  }

 private:
  std::int64_t heads_;
  double scale_;
};

}  // namespace frugal::ops

namespace frugal {
// Causal self-attention over a packed projection: qkv [..., T, 3d] (q, k, v
// side by side, each `heads` heads of d / heads) -> [..., T, d].
inline Var causal_attention_qkv(Var qkv, std::int64_t heads, double scale = 0) {
  return frugal::apply(std::make_shared<ops::CausalAttentionQkv>(heads, scale), {qkv}).at(0);
}
}  // namespace frugal

namespace frugal {
// Causal self-attention, fused: q [..., Tq, hd], k [..., Tk, hd],
// v [..., Tk, hdv] -> [..., Tq, hdv]; Tq <= Tk, mask aligned to the end.
// scale <= 0 means 1/sqrt(hd).
inline Var causal_attention(Var q, Var k, Var v, double scale = 0) {
  return frugal::apply(std::make_shared<ops::CausalAttention>(scale), {q, k, v}).at(0);
}
}  // namespace frugal
