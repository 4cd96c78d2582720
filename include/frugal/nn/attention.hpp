#pragma once
// Causal multi-head self-attention, as the GPT peer's CausalSelfAttention:
// one Linear d -> 3d for q, k and v, the fused causal_attention op, and an
// output projection d -> d.
#include "../ops/attention.hpp"
#include "../ops/indexing.hpp"
#include "../ops/shape_ops.hpp"
#include "dropout.hpp"
#include "linear.hpp"

namespace frugal::nn {

// qkv [B, T, 3d] (the q, k, v projections side by side) -> [B, T, d]: qkv
// is viewed as [B, T, 3, H, hd] and permuted to [3, B, H, T, hd] (PyTorch's
// view(B, T, 3, H, hd).permute(2, 0, 3, 1, 4)); its three parts are q, k
// and v for causal_attention, whose [B, H, T, hd] result goes back to
// [B, T, d] (transpose(1, 2).reshape(B, T, d)).
inline Var causal_attention_from_qkv(Var qkv, std::int64_t heads) {
  if (qkv.rank() != 3 || qkv.dim(2) % 3 != 0)
    fail<ShapeError>("causal_attention_from_qkv: qkv must be [batch, time, 3 * d_model], got ", qkv.meta().str());
  const std::int64_t B = qkv.dim(0), T = qkv.dim(1), d = qkv.dim(2) / 3;
  if (heads <= 0 || d % heads != 0)
    fail<ShapeError>("causal_attention_from_qkv: d_model ", d, " is not a multiple of heads ", heads, " (qkv ",
                     qkv.meta().str(), ")");
  const std::int64_t hd = d / heads;
  Var t = ops::permute(ops::reshape(qkv, {B, T, 3, heads, hd}), {2, 0, 3, 1, 4});
  std::vector<Var> parts = split(t, {1, 1, 1}, 0);
  auto head_major = [&](Var p) { return ops::reshape(p, {B, heads, T, hd}); };
  Var y = causal_attention(head_major(parts[0]), head_major(parts[1]), head_major(parts[2]));
  return ops::reshape(ops::permute(y, {0, 2, 1, 3}), {B, T, d});
}

struct MultiHeadAttentionOptions {
  bool bias = true;
  double dropout = 0;  // on the output (after the projection); the fused kernel has no dropout on probabilities
  DType dtype = DType::f32;
};

class MultiHeadAttention : public Layer {
 public:
  MultiHeadAttention(std::int64_t d, std::int64_t heads, MultiHeadAttentionOptions o = {})
      : qkv(d, 3 * d, {.bias = o.bias, .dtype = o.dtype}),
        proj(d, d, {.bias = o.bias, .dtype = o.dtype}),
        heads_(heads),
        dropout_(o.dropout) {
    if (heads <= 0 || d % heads != 0)
      fail<ShapeError>("nn::MultiHeadAttention: d_model ", d, " is not a multiple of heads ", heads);
    ops::check_dropout_p(o.dropout);
    register_module("qkv", qkv);
    register_module("proj", proj);
  }
  // x [B, T, d] -> [B, T, d], causal.
  Var forward(Var x) override {
    if (x.rank() != 3 || x.dim(2) != qkv.in_features())
      fail<ShapeError>("nn::MultiHeadAttention: input must be [batch, time, ", qkv.in_features(), "], got ",
                       x.meta().str());
    return dropout(proj(causal_attention_from_qkv(qkv(x), heads_)), dropout_, is_training());
  }
  std::int64_t heads() const { return heads_; }

  Linear qkv, proj;

 private:
  std::int64_t heads_;
  double dropout_;
};

}  // namespace frugal::nn
