#pragma once
#include "../ops/embedding.hpp"
#include "../ops/indexing.hpp"
#include "init.hpp"
#include "module.hpp"

namespace frugal::nn {

// torch.nn.Embedding's default initialisation: N(0, 1) (bf16/f16: the f32
// draws rounded, nn/init.hpp's fill_drawn_).
inline void embedding_default_init(Tensor& weight) {
  if (weight.is_meta()) return;
  fill_drawn_(weight, [] { return init_rng().normal(); });
}

struct EmbeddingOptions {
  DType dtype = DType::f32;
};

// A table of `num` vectors of size `dim`; forward(ids) looks them up.
class Embedding : public Layer {
 public:
  ~Embedding() override;
  Embedding(std::int64_t num, std::int64_t dim, EmbeddingOptions o = {}) : num_(num), dim_(dim) {
    if (num <= 0 || dim <= 0) fail<ShapeError>("nn::Embedding: sizes must be positive, got num=", num, " dim=", dim);
    weight = register_parameter("weight", Tensor({num, dim}, o.dtype));
    embedding_default_init(weight);
  }
  // ids (i32 or i64) of any shape -> [..., dim].
  Var forward(Var ids) override { return embedding(ids, var(weight)); }
  // The vectors of ids begin, ..., end - 1: forward(arange(begin, end))
  // without an ids tensor (position embeddings).
  Var range(std::int64_t begin, std::int64_t end) {
    if (begin < 0 || end > num_ || begin > end)
      fail<ShapeError>("nn::Embedding: rows [", begin, ", ", end, ") are outside the table's ", num_, " rows");
    return slice(var(weight), 0, begin, end);
  }
  std::int64_t num_embeddings() const { return num_; }
  std::int64_t embedding_dim() const { return dim_; }

  Tensor weight;

 private:
  std::int64_t num_, dim_;
};

}  // namespace frugal::nn
