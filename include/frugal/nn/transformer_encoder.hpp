#pragma once
// PyTorch's nn.TransformerEncoderLayer (batch_first=True): non-causal
// self-attention and a feed-forward block, each with a residual connection
// and a LayerNorm, after (norm_first = false, PyTorch's default) or before
// (norm_first = true) the block:
//   post-norm: x = norm1(x + dropout1(self_attn(x)))
//              x = norm2(x + dropout2(linear2(dropout(activation(linear1(x))))))
//   pre-norm:  x = x + dropout1(self_attn(norm1(x)))
//              x = x + dropout2(linear2(dropout(activation(linear1(norm2(x))))))
// Parameter names follow PyTorch's (self_attn, linear1, linear2, norm1,
// norm2) except inside self_attn, which is frugal's MultiHeadAttention:
// "qkv" for PyTorch's in_proj_weight/in_proj_bias and "proj" for out_proj.
// Deviations, both documented: only batch_first = True ([B, T, d]); the
// fused attention has no dropout on the attention probabilities, so
// `dropout` applies at the three other places PyTorch applies it.
#include <string>

#include "../ops/gelu.hpp"
#include "attention.hpp"
#include "dropout.hpp"
#include "layer_norm.hpp"
#include "linear.hpp"

namespace frugal::nn {

struct TransformerEncoderLayerOptions {
  std::int64_t dim_feedforward = 2048;
  double dropout = 0.1;
  std::string activation = "relu";  // "relu" or "gelu" (exact, erf)
  double layer_norm_eps = 1e-5;
  bool norm_first = false;
  bool bias = true;
  DType dtype = DType::f32;
};

class TransformerEncoderLayer : public Layer {
 public:
  ~TransformerEncoderLayer() override;
  TransformerEncoderLayer(std::int64_t d_model, std::int64_t nhead, TransformerEncoderLayerOptions o = {})
      : self_attn(d_model, nhead, {.bias = o.bias, .dropout = 0, .dtype = o.dtype, .causal = false}),
        linear1(d_model, o.dim_feedforward, {.bias = o.bias, .dtype = o.dtype}),
        linear2(o.dim_feedforward, d_model, {.bias = o.bias, .dtype = o.dtype}),
        norm1(d_model, {.eps = o.layer_norm_eps, .dtype = o.dtype}),
        norm2(d_model, {.eps = o.layer_norm_eps, .dtype = o.dtype}),
        o_(o) {
    ops::check_dropout_p(o.dropout);
    if (o.activation != "relu" && o.activation != "gelu")
      fail<ShapeError>("nn::TransformerEncoderLayer: activation must be \"relu\" or \"gelu\", got \"", o.activation,
                       "\"");
    register_module("self_attn", self_attn);
    register_module("linear1", linear1);
    register_module("linear2", linear2);
    register_module("norm1", norm1);
    register_module("norm2", norm2);
  }
  // src [B, T, d_model] -> [B, T, d_model]. src_mask and
  // src_key_padding_mask as nn.MultiheadAttention takes them (u8, true = not
  // allowed); is_causal adds the causal mask (PyTorch takes it as a hint
  // that src_mask is causal; here it is the mask itself).
  Var forward(Var src) override { return forward(src, std::nullopt, std::nullopt); }
  Var forward(Var src, std::optional<Var> src_mask, std::optional<Var> src_key_padding_mask, bool is_causal = false) {
    const MultiHeadAttentionMasks m{src_key_padding_mask, src_mask};
    auto sa = [&](Var x) { return dropout(attention(x, m, is_causal), o_.dropout, is_training()); };
    auto ff = [&](Var x) {
      Var h = linear1(x);
      h = o_.activation == "relu" ? relu(h) : gelu(h, false);
      return dropout(linear2(dropout(h, o_.dropout, is_training())), o_.dropout, is_training());
    };
    Var x = src;
    if (o_.norm_first) {
      x = x + sa(norm1(x));
      return x + ff(norm2(x));
    }
    x = norm1(x + sa(x));
    return norm2(x + ff(x));
  }

  MultiHeadAttention self_attn;
  Linear linear1, linear2;
  LayerNorm norm1, norm2;

 private:
  Var attention(Var x, const MultiHeadAttentionMasks& m, bool is_causal) {
    if (!is_causal) return self_attn.forward(x, m);
    if (m.attn_mask) fail<ShapeError>("nn::TransformerEncoderLayer: pass is_causal or src_mask, not both");
    // A causal mask [T, T] (true above the diagonal: not allowed) joins the padding mask.
    const std::int64_t t = x.dim(1);
    if (!causal_mask_.defined() || causal_mask_.shape() != Shape{t, t}) {
      causal_mask_ = Tensor({t, t}, DType::u8);
      for (std::int64_t i = 0; i < t; ++i)
        for (std::int64_t j = 0; j < t; ++j) causal_mask_.data<std::uint8_t>()[i * t + j] = j > i;
    }
    const std::string q = qualified_name();
    Var c = constant(causal_mask_, q.empty() ? "causal_mask" : q + ".causal_mask");
    return self_attn.forward(x, MultiHeadAttentionMasks{m.key_padding_mask, c});
  }

  TransformerEncoderLayerOptions o_;
  Tensor causal_mask_;
};

}  // namespace frugal::nn
