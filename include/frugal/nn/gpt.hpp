#pragma once
// A decoder-only transformer, as the peer's GPT (shared/peer/torch_bench.py):
// token and position embeddings, pre-norm blocks, a final LayerNorm and an
// untied head without bias. Parameter names follow its state_dict:
// tok.weight, pos.weight, blocks.0.ln1.weight, blocks.0.attn.qkv.weight, ...,
// ln_f.weight, head.weight.
#include <memory>

#include "../ops/loss.hpp"
#include "embedding.hpp"
#include "sequential.hpp"
#include "transformer.hpp"

namespace frugal::nn {

struct GptConfig {
  std::int64_t vocab = 512;
  std::int64_t context = 128;
  std::int64_t layers = 4;
  std::int64_t d_model = 256;
  std::int64_t heads = 4;
  std::int64_t mlp_hidden = 0;  // 0: 4 * d_model
  double dropout = 0;           // after the embeddings and in every block
  DType dtype = DType::f32;
  // Memory-centric tiling (LinearTiling) of every Linear: the blocks' four
  // and the head. What lets a layer whose weight or gradient would not fit
  // a device train one tile at a time (ZeRO-Infinity's tens of trillions).
  LinearTiling linear_tiling = {};
};

class Gpt : public Module {
 public:
  ~Gpt() override;
  explicit Gpt(GptConfig c = {})
      : c_(c),
        tok(c.vocab, c.d_model, {c.dtype}),
        pos(c.context, c.d_model, {c.dtype}),
        ln_f(c.d_model, {.dtype = c.dtype}),
        head(c.d_model, c.vocab, {.bias = false, .dtype = c.dtype, .tiling = c.linear_tiling}) {
    ops::check_dropout_p(c.dropout);
    register_module("tok", tok);
    register_module("pos", pos);
    register_module("blocks", blocks);
    for (std::int64_t i = 0; i < c.layers; ++i)
      blocks.push_back(std::make_shared<TransformerBlock>(
          c.d_model, c.heads,
          TransformerBlockOptions{
              .mlp_hidden = c.mlp_hidden, .dropout = c.dropout, .dtype = c.dtype, .linear_tiling = c.linear_tiling}));
    register_module("ln_f", ln_f);
    register_module("head", head);
  }

  // idx [B, T] token ids (i32 or i64), T <= context -> logits [B, T, vocab].
  Var forward(Var idx) {
    if (idx.rank() != 2 || idx.dim(1) > c_.context || idx.dim(1) == 0)
      fail<ShapeError>("nn::Gpt: tokens must be [batch, time] with 1 <= time <= context ", c_.context, ", got ",
                       idx.meta().str());
    Var x = dropout(tok(idx) + pos.range(0, idx.dim(1)), c_.dropout, is_training());
    x = blocks(x);
    return head(ln_f(x));
  }
  Var operator()(Var idx) { return forward(idx); }
  // Mean next-token cross-entropy: targets [B, T].
  Var loss(Var idx, Var targets) { return cross_entropy(forward(idx), targets); }

  const GptConfig& config() const { return c_; }

 private:
  GptConfig c_;

 public:
  Embedding tok, pos;
  Sequential blocks;
  LayerNorm ln_f;
  Linear head;
};

}  // namespace frugal::nn
