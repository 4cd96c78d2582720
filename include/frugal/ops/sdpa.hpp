#pragma once
// Scaled-dot-product attention, non-causal or masked, as one fused op:
//   o = softmax(scale * q kᵀ  where allowed, -inf elsewhere) v,
// q [..., Tq, hd], k [..., Tk, hd], v [..., Tk, hdv] -> o [..., Tq, hdv],
// Tq and Tk independent (cross-attention). A (query, key) pair takes part
// when the causal flag allows it (key j <= query i, top-left aligned as
// PyTorch's is_causal; causal_attention in attention.hpp aligns to the end)
// and every boolean mask allows it.
//
// Masks are u8 tensors (frugal's bool: 0 false, anything else true)
// broadcastable to [..., Tq, Tk] (numpy rules, aligned to the right). Each
// mask carries its sense, because PyTorch's APIs disagree:
//   F.scaled_dot_product_attention(attn_mask=bool): true = takes part;
//   nn.MultiheadAttention's attn_mask and key_padding_mask: true = masked out.
// A float (additive) attn_mask is not supported: use a bool one.
//
// A query whose every key is masked out (a fully masked row) gets an output
// of 0 and a gradient of 0, as PyTorch's math backend does since 2.5
// (_safe_softmax) and its flash and memory-efficient kernels do; its
// logsumexp is -inf.
//
// Like causal_attention the op never forms the Tq x Tk matrix: its second
// output is the row-wise logsumexp [..., Tq], from which the backward
// recomputes the probabilities tile by tile.
#include <cmath>

#include "attention.hpp"

namespace frugal::ops {

// At most this many masks per op (an attn_mask and a key_padding_mask): the
// kernels keep them on the stack.
inline constexpr int kMaxAttentionMasks = 2;

// Checks q, k, v and the masks (inputs from `first_mask` on) of an SDPA op.
inline AttentionDims sdpa_dims(const std::string& op, std::span<const TensorMeta> in, int first_mask) {
  const TensorMeta &q = in[0], &k = in[1], &v = in[2];
  expect_floating(op, q);
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
  if (ks.dim(-1) != qs.dim(-1)) bad("q and k head dimensions differ");
  if (vs.dim(-2) != ks.dim(-2)) bad("k and v hold different numbers of keys");
  if (qs.dim(-1) == 0 || vs.dim(-1) == 0) bad("a head dimension is 0");
  // Every mask must broadcast to [..., Tq, Tk].
  std::vector<std::int64_t> target(qs.dims().begin(), qs.dims().end() - 1);
  target.push_back(ks.dim(-2));
  for (std::size_t i = std::size_t(first_mask); i < in.size(); ++i) {
    const TensorMeta& m = in[i];
    if (m.dtype != DType::u8)
      fail<ShapeError>(op, ": mask ", m.str(), " must be a boolean mask stored as u8, got ", dtype_name(m.dtype));
    bool ok = m.shape.rank() <= int(target.size());
    for (int d = 0; ok && d < m.shape.rank(); ++d) {
      const std::int64_t md = m.shape[m.shape.rank() - 1 - d], td = target[target.size() - 1 - std::size_t(d)];
      ok = md == td || md == 1;
    }
    if (!ok)
      fail<ShapeError>(op, ": mask ", m.shape.str(), " does not broadcast to [..., Tq, Tk] = ", Shape(target).str(),
                       " (q ", qs.str(), ", k ", ks.str(), ")");
  }
  return attention_shape_dims(qs, ks, vs);
}

// (query, key) pairs computed, for the cost model: all of them, or the
// lower triangle when causal (masks are data; their pairs still cost).
inline double sdpa_pairs(const AttentionDims& d, bool causal) {
  if (!causal) return double(d.batch) * double(d.tq) * double(d.tk);
  const double n = double(std::min(d.tq, d.tk));  // query i sees min(i + 1, Tk) keys
  return double(d.batch) * (n * (n + 1) / 2 + double(d.tq - std::min(d.tq, d.tk)) * double(d.tk));
}

inline void check_mask_count(std::size_t n) {
  if (n > std::size_t(kMaxAttentionMasks))
    fail<ShapeError>("scaled_dot_product_attention: at most ", kMaxAttentionMasks, " masks, got ", n);
}

// Inputs (q, k, v, o, lse, do, masks...) -> (dq, dk, dv).
class ScaledDotProductAttentionGrad final : public Op {
 public:
  ~ScaledDotProductAttentionGrad() override;
  ScaledDotProductAttentionGrad(bool causal, double scale, std::vector<bool> mask_drops)
      : causal_(causal), scale_(scale), drops_(std::move(mask_drops)) {
    check_mask_count(drops_.size());
  }
  bool causal() const { return causal_; }
  double scale() const { return scale_; }
  // Per mask: true when a true element masks the pair out (PyTorch's
  // nn.MultiheadAttention sense), false when it lets it take part (F.sdpa's).
  const std::vector<bool>& mask_drops() const { return drops_; }
  std::string name() const override { return "scaled_dot_product_attention_grad"; }
  std::vector<TensorMeta> infer(std::span<const TensorMeta> in) const override {
    expect_arity(name(), in, 6 + drops_.size());
    std::vector<TensorMeta> masks(in.begin() + 6, in.end());
    std::vector<TensorMeta> qkvm{in[0], in[1], in[2]};
    qkvm.insert(qkvm.end(), masks.begin(), masks.end());
    sdpa_dims(name(), qkvm, 3);
    std::vector<std::int64_t> od = in[0].shape.dims();
    od.back() = in[2].shape.dim(-1);
    const TensorMeta o{in[0].dtype, Shape(od)}, lse{in[0].dtype, Shape(attention_lse_dims(in[0].shape))};
    if (in[3].shape != o.shape || in[5].shape != o.shape || in[4].shape != lse.shape || in[3].dtype != o.dtype ||
        in[4].dtype != o.dtype || in[5].dtype != o.dtype)
      fail<ShapeError>(name(), ": o ", in[3].str(), ", lse ", in[4].str(), " and do ", in[5].str(), " do not match q ",
                       in[0].str(), " and v ", in[2].str());
    return {in[0], in[1], in[2]};
  }
  Cost cost(std::span<const TensorMeta> in, std::span<const TensorMeta> out) const override {
    const AttentionDims d = attention_shape_dims(in[0].shape, in[1].shape, in[2].shape);
    double bytes = 0;
    for (auto& m : in) bytes += double(m.nbytes());
    for (auto& m : out) bytes += double(m.nbytes());
    return {0, bytes, sdpa_pairs(d, causal_), 2.0 * sdpa_pairs(d, causal_) * double(3 * d.hd + 2 * d.hdv)};  // p again
  }

 private:
  bool causal_;
  double scale_;
  std::vector<bool> drops_;
};

// Inputs (q, k, v, masks...) -> (o [..., Tq, hdv], lse [..., Tq]).
class ScaledDotProductAttention final : public Op {
 public:
  ~ScaledDotProductAttention() override;
  // scale <= 0 means 1/sqrt(head_dim).
  ScaledDotProductAttention(bool causal, double scale, std::vector<bool> mask_drops)
      : causal_(causal), scale_(scale), drops_(std::move(mask_drops)) {
    check_mask_count(drops_.size());
  }
  bool causal() const { return causal_; }
  double scale_for(std::int64_t hd) const { return scale_ > 0 ? scale_ : 1.0 / std::sqrt(double(hd)); }
  const std::vector<bool>& mask_drops() const { return drops_; }
  std::string name() const override { return "scaled_dot_product_attention"; }
  std::vector<TensorMeta> infer(std::span<const TensorMeta> in) const override {
    expect_arity(name(), in, 3 + drops_.size());
    sdpa_dims(name(), in, 3);
    std::vector<std::int64_t> od = in[0].shape.dims();
    od.back() = in[2].shape.dim(-1);
    return {{in[0].dtype, Shape(od)}, {in[0].dtype, Shape(attention_lse_dims(in[0].shape))}};
  }
  std::vector<std::optional<Var>> backward(const BackwardArgs& a) const override {
    std::vector<std::optional<Var>> none(a.inputs.size());
    if (!a.grad_outputs[0]) return none;
    std::vector<Var> in{a.inputs[0], a.inputs[1], a.inputs[2], a.outputs[0], a.outputs[1], *a.grad_outputs[0]};
    for (std::size_t i = 3; i < a.inputs.size(); ++i) in.push_back(a.inputs[i]);
    auto g = frugal::apply(
        std::make_shared<ScaledDotProductAttentionGrad>(causal_, scale_for(a.inputs[0].dim(-1)), drops_), in);
    none[0] = g[0], none[1] = g[1], none[2] = g[2];  // the masks get none
    return none;
  }
  Cost cost(std::span<const TensorMeta> in, std::span<const TensorMeta> out) const override {
    const AttentionDims d = attention_shape_dims(in[0].shape, in[1].shape, in[2].shape);
    double bytes = double(out[0].nbytes() + out[1].nbytes());
    for (auto& m : in) bytes += double(m.nbytes());
    return {0, bytes, sdpa_pairs(d, causal_), 2.0 * sdpa_pairs(d, causal_) * double(d.hd + d.hdv)};  // an exp per pair
  }

 private:
  bool causal_;
  double scale_;
  std::vector<bool> drops_;
};

}  // namespace frugal::ops

namespace frugal {

// A boolean mask and its sense (see the header comment).
struct AttentionMask {
  Var mask;                 // u8, broadcastable to [..., Tq, Tk]
  bool true_masks_out;      // true: PyTorch nn.MultiheadAttention's sense; false: F.sdpa's
};

// Fused attention with any number (<= 2) of boolean masks and an optional
// causal (top-left) mask; scale <= 0 means 1/sqrt(hd).
inline Var masked_attention(Var q, Var k, Var v, const std::vector<AttentionMask>& masks, bool is_causal = false,
                            double scale = 0) {
  std::vector<Var> in{q, k, v};
  std::vector<bool> drops;
  for (auto& m : masks) in.push_back(m.mask), drops.push_back(m.true_masks_out);
  return frugal::apply(std::make_shared<ops::ScaledDotProductAttention>(is_causal, scale, drops), in).at(0);
}

// torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask,
// is_causal, scale) for a boolean attn_mask (u8, true = takes part) or none.
// PyTorch refuses attn_mask together with is_causal; this applies both.
// No dropout_p (the fused kernel has no dropout on probabilities).
inline Var scaled_dot_product_attention(Var q, Var k, Var v, std::optional<Var> attn_mask = std::nullopt,
                                        bool is_causal = false, double scale = 0) {
  std::vector<AttentionMask> masks;
  if (attn_mask) masks.push_back({*attn_mask, false});
  return masked_attention(q, k, v, masks, is_causal, scale);
}

}  // namespace frugal
