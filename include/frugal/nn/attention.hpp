#pragma once
// Multi-head attention, as the GPT peer's CausalSelfAttention: one Linear
// d -> 3d for q, k and v, the fused causal_attention op, and an output
// projection d -> d. Causal by default; non-causal, masked (PyTorch
// nn.MultiheadAttention's key_padding_mask and attn_mask) and cross-attention
// (query against key/value inputs) through the fused scaled-dot-product op.
#include "../ops/attention.hpp"
#include "../ops/indexing.hpp"
#include "../ops/sdpa.hpp"
#include "../ops/shape_ops.hpp"
#include "dropout.hpp"
#include "linear.hpp"

namespace frugal::nn {

// qkv [B, T, 3d] (the q, k, v projections side by side) -> [B, T, d]:
// PyTorch's view(B, T, 3, H, hd).permute(2, 0, 3, 1, 4), causal attention
// per head, transpose(1, 2).reshape(B, T, d). The fused op reads q, k, v
// and writes the result in these layouts directly, without permuted copies.
inline Var causal_attention_from_qkv(Var qkv, std::int64_t heads) {
  if (qkv.rank() != 3)
    fail<ShapeError>("causal_attention_from_qkv: qkv must be [batch, time, 3 * d_model], got ", qkv.meta().str());
  return causal_attention_qkv(qkv, heads);
}

struct MultiHeadAttentionOptions {
  bool bias = true;
  double dropout = 0;  // on the output (after the projection); the fused kernel has no dropout on probabilities
  DType dtype = DType::f32;
  // Query i attends keys j <= i (top-left aligned, PyTorch's is_causal).
  // The default keeps the GPT layer's behaviour; false for an encoder or
  // cross-attention.
  bool causal = true;
  // Memory-centric tiling of the qkv and output projections (LinearTiling).
  LinearTiling tiling = {};
};

// Masks as nn.MultiheadAttention takes them (boolean, stored as u8; true =
// NOT allowed to attend, the opposite of F.scaled_dot_product_attention's):
//   key_padding_mask [B, Tk]: true marks a padding key;
//   attn_mask [Tq, Tk], [B * heads, Tq, Tk], or any shape broadcastable to
//   [B, heads, Tq, Tk].
// Float (additive) masks are not supported. A query that may attend no key
// gets 0 (PyTorch's SDPA path gives 0 too; its need_weights path NaN).
struct MultiHeadAttentionMasks {
  std::optional<Var> key_padding_mask;
  std::optional<Var> attn_mask;
};

class MultiHeadAttention : public Layer {
 public:
  ~MultiHeadAttention() override;
  MultiHeadAttention(std::int64_t d, std::int64_t heads, MultiHeadAttentionOptions o = {})
      : qkv(d, 3 * d, {.bias = o.bias, .dtype = o.dtype, .tiling = o.tiling}),
        proj(d, d, {.bias = o.bias, .dtype = o.dtype, .tiling = o.tiling}),
        heads_(heads),
        dropout_(o.dropout),
        causal_(o.causal) {
    if (heads <= 0 || d % heads != 0)
      fail<ShapeError>("nn::MultiHeadAttention: d_model ", d, " is not a multiple of heads ", heads);
    ops::check_dropout_p(o.dropout);
    register_module("qkv", qkv);
    register_module("proj", proj);
  }
  // Self-attention: x [B, T, d] -> [B, T, d]; causal unless the options say
  // otherwise. (The causal, unmasked case runs the packed fused kernel, as
  // the GPT sample always has.)
  Var forward(Var x) override { return forward(x, MultiHeadAttentionMasks{}); }
  Var forward(Var x, const MultiHeadAttentionMasks& masks) {
    check_input("input", x);
    if (causal_ && !masks.key_padding_mask && !masks.attn_mask)
      return dropout(proj(causal_attention_from_qkv(qkv(x), heads_)), dropout_, is_training());
    const std::int64_t d = qkv.in_features();
    std::vector<Var> parts = split(qkv(x), {d, d, d}, 2);
    return attend(parts[0], parts[1], parts[2], masks);
  }
  // Cross-attention (PyTorch's forward(query, key, value)): query [B, Tq, d],
  // key and value [B, Tk, d] -> [B, Tq, d]. The q, k and v projections are
  // the three row blocks of qkv.weight (and qkv.bias).
  Var forward(Var query, Var key, Var value, const MultiHeadAttentionMasks& masks = {}) {
    check_input("query", query);
    check_input("key", key);
    check_input("value", value);
    if (key.dim(0) != query.dim(0) || value.dim(0) != query.dim(0) || key.dim(1) != value.dim(1))
      fail<ShapeError>("nn::MultiHeadAttention: query ", query.meta().str(), ", key ", key.meta().str(),
                       " and value ", value.meta().str(),
                       " must share the batch, and key and value the number of keys");
    const std::int64_t d = qkv.in_features();
    std::vector<Var> w = split(qkv.weight_value(), {d, d, d}, 0);
    std::vector<std::optional<Var>> b(3);
    if (std::optional<Var> whole = qkv.bias_value()) {
      auto bs = split(*whole, {d, d, d}, 0);
      for (int i = 0; i < 3; ++i) b[std::size_t(i)] = bs[std::size_t(i)];
    }
    return attend(linear(query, w[0], b[0]), linear(key, w[1], b[1]), linear(value, w[2], b[2]), masks);
  }
  std::int64_t heads() const { return heads_; }
  bool causal() const { return causal_; }

  Linear qkv, proj;

 private:
  void check_input(const char* what, Var x) const {
    if (x.rank() != 3 || x.dim(2) != qkv.in_features())
      fail<ShapeError>("nn::MultiHeadAttention: ", what, " must be [batch, time, ", qkv.in_features(), "], got ",
                       x.meta().str());
  }
  // [B, T, d] -> [B, heads, T, d / heads]
  Var split_heads(Var x) const {
    return ops::permute(ops::reshape(x, {x.dim(0), x.dim(1), heads_, x.dim(2) / heads_}), {0, 2, 1, 3});
  }
  // q [B, Tq, d], k and v [B, Tk, d] -> proj(attention) [B, Tq, d].
  Var attend(Var q, Var k, Var v, const MultiHeadAttentionMasks& m) {
    const std::int64_t B = q.dim(0), tq = q.dim(1), tk = k.dim(1), d = q.dim(2);
    std::vector<AttentionMask> masks;
    if (m.key_padding_mask) {
      Var p = *m.key_padding_mask;
      if (p.dtype() != DType::u8 || p.shape() != Shape{B, tk})
        fail<ShapeError>("nn::MultiHeadAttention: key_padding_mask must be a u8 (boolean) [batch, keys] = [", B,
                         ", ", tk, "], got ", p.meta().str());
      masks.push_back({ops::reshape(p, {B, 1, 1, tk}), true});
    }
    if (m.attn_mask) {
      Var a = *m.attn_mask;
      // PyTorch's [B * heads, Tq, Tk] layout, batch-major.
      if (a.rank() == 3 && a.dim(0) == B * heads_ && B * heads_ != 1) a = ops::reshape(a, {B, heads_, tq, tk});
      masks.push_back({a, true});
    }
    Var o = masked_attention(split_heads(q), split_heads(k), split_heads(v), masks, causal_);
    o = ops::reshape(ops::permute(o, {0, 2, 1, 3}), {B, tq, d});
    return dropout(proj(o), dropout_, is_training());
  }

  std::int64_t heads_;
  double dropout_;
  bool causal_;
};

}  // namespace frugal::nn
