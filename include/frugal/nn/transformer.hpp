#pragma once
// The MLP and the pre-norm transformer block of a GPT.
#include "../ops/gelu.hpp"
#include "attention.hpp"
#include "dropout.hpp"
#include "layer_norm.hpp"
#include "linear.hpp"

namespace frugal::nn {

// GELU, exact (erf) or the tanh form; the exact one through the vectorised
// gelu_erf_poly.
inline Var mlp_activation(Var x, bool approximate_gelu) { return approximate_gelu ? gelu(x, true) : gelu_erf_poly(x); }

struct MlpOptions {
  bool approximate_gelu = false;  // false: exact erf GELU (PyTorch's default); true: the tanh form
  double dropout = 0;             // after the second Linear
  DType dtype = DType::f32;
  LinearTiling linear_tiling = {};  // of both Linears (memory-centric tiling)
};

// Linear(d, hidden) - GELU - Linear(hidden, d); submodules "fc" and "fc_proj".
class Mlp : public Layer {
 public:
  ~Mlp() override;
  Mlp(std::int64_t d, std::int64_t hidden, MlpOptions o = {})
      : fc(d, hidden, {.dtype = o.dtype, .tiling = o.linear_tiling}),
        fc_proj(hidden, d, {.dtype = o.dtype, .tiling = o.linear_tiling}),
        o_(o) {
    ops::check_dropout_p(o.dropout);
    register_module("fc", fc);
    register_module("fc_proj", fc_proj);
  }
  Var forward(Var x) override {
    return dropout(fc_proj(mlp_activation(fc(x), o_.approximate_gelu)), o_.dropout, is_training());
  }

  Linear fc, fc_proj;

 private:
  MlpOptions o_;
};

struct TransformerBlockOptions {
  std::int64_t mlp_hidden = 0;  // 0: 4 * d
  double dropout = 0;           // after the attention projection and after the MLP
  double eps = 1e-5;
  bool approximate_gelu = false;
  DType dtype = DType::f32;
  // Memory-centric tiling of the block's four Linears (LinearTiling).
  LinearTiling linear_tiling = {};
};

// Pre-norm: x + attn(ln1(x)), then x + mlp(ln2(x)). The MLP's Linears sit
// directly in the block ("fc", "fc_proj"), as in the GPT peer, so parameter
// names match its state_dict: ln1, attn.qkv, attn.proj, ln2, fc, fc_proj.
class TransformerBlock : public Layer {
 public:
  ~TransformerBlock() override;
  TransformerBlock(std::int64_t d, std::int64_t heads, TransformerBlockOptions o = {})
      : ln1(d, {.eps = o.eps, .dtype = o.dtype}),
        attn(d, heads, {.dropout = o.dropout, .dtype = o.dtype, .tiling = o.linear_tiling}),
        ln2(d, {.eps = o.eps, .dtype = o.dtype}),
        fc(d, o.mlp_hidden > 0 ? o.mlp_hidden : 4 * d, {.dtype = o.dtype, .tiling = o.linear_tiling}),
        fc_proj(o.mlp_hidden > 0 ? o.mlp_hidden : 4 * d, d, {.dtype = o.dtype, .tiling = o.linear_tiling}),
        o_(o) {
    ops::check_dropout_p(o.dropout);
    register_module("ln1", ln1);
    register_module("attn", attn);
    register_module("ln2", ln2);
    register_module("fc", fc);
    register_module("fc_proj", fc_proj);
  }
  // x [B, T, d] -> [B, T, d]
  Var forward(Var x) override {
    x = x + attn(ln1(x));
    return x + dropout(fc_proj(mlp_activation(fc(ln2(x)), o_.approximate_gelu)), o_.dropout, is_training());
  }

  LayerNorm ln1;
  MultiHeadAttention attn;
  LayerNorm ln2;
  Linear fc, fc_proj;

 private:
  TransformerBlockOptions o_;
};

}  // namespace frugal::nn
