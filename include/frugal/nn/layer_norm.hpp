#pragma once
#include "../ops/layer_norm.hpp"
#include "init.hpp"
#include "module.hpp"

namespace frugal::nn {

struct LayerNormOptions {
  double eps = 1e-5;
  bool elementwise_affine = true;  // learn weight (and bias)
  bool bias = true;                // with elementwise_affine: learn a bias too
  DType dtype = DType::f32;
};

// torch.nn.LayerNorm(d) over the last dimension: weight 1, bias 0.
class LayerNorm : public Layer {
 public:
  ~LayerNorm() override;
  explicit LayerNorm(std::int64_t d, LayerNormOptions o = {}) : d_(d), eps_(o.eps) {
    if (d <= 0) fail<ShapeError>("nn::LayerNorm: the normalized dimension must be positive, got ", d);
    if (o.elementwise_affine) {
      weight = register_parameter("weight", Tensor({d}, o.dtype));
      if (!weight.is_meta()) constant_(weight, 1);  // a meta weight is shapes only
      if (o.bias) bias = register_parameter("bias", Tensor({d}, o.dtype));  // zeros
    }
  }
  Var forward(Var x) override {
    std::optional<Var> w, b;
    if (weight.defined()) w = var(weight);
    if (bias.defined()) b = var(bias);
    return layer_norm(x, w, b, eps_);
  }
  std::int64_t normalized_dim() const { return d_; }

  Tensor weight, bias;

 private:
  std::int64_t d_;
  double eps_;
};

}  // namespace frugal::nn
