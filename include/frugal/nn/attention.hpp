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
};

class MultiHeadAttention : public Layer {
 public:
  ~MultiHeadAttention() override;
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
