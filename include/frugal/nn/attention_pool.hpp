#pragma once
// Spatial attention pooling, the "visual attention" module of an attention
// CNN: a 1x1 convolution scores every position of a feature map, a softmax
// over the H*W positions turns the scores into weights that sum to 1, and
// the output is the features' weighted mean [N, C]. Where global average
// pooling weighs every region alike, this learns which regions to look at
// (a lesion rather than the tissue around it); the weights are the
// attention map, returned by pool() for inspection.
#include <utility>

#include "../ops/reduce.hpp"
#include "../ops/shape_ops.hpp"
#include "../ops/binary.hpp"
#include "../ops/softmax.hpp"
#include "conv.hpp"

namespace frugal::nn {

class SpatialAttentionPool : public Layer {
 public:
  ~SpatialAttentionPool() override;
  // The score convolution has no bias: a constant added to every position
  // cancels in the softmax.
  explicit SpatialAttentionPool(std::int64_t channels, DType dtype = DType::f32)
      : channels_(channels), score_(channels, 1, 1, {.bias = false, .dtype = dtype}) {
    register_module("score", score_);
  }
  // x [N, C, H, W] -> pooled features [N, C].
  Var forward(Var x) override { return pool(x).first; }
  // x [N, C, H, W] -> (pooled features [N, C], attention weights [N, 1, H, W]).
  std::pair<Var, Var> pool(Var x) {
    if (x.rank() != 4 || x.dim(1) != channels_)
      fail<ShapeError>("nn::SpatialAttentionPool: expects [N, ", channels_, ", H, W], got ", x.shape().str());
    const std::int64_t n = x.dim(0), c = x.dim(1), h = x.dim(2), w = x.dim(3);
    Var weights = softmax(ops::reshape(score_(x), {n, 1, h * w}), -1);
    Var pooled = sum(ops::reshape(x, {n, c, h * w}) * weights, {2});
    return {pooled, ops::reshape(weights, {n, 1, h, w})};
  }

 private:
  std::int64_t channels_;
  Conv2d score_;
};

}  // namespace frugal::nn
