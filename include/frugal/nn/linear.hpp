#pragma once
#include "../ops/matmul.hpp"
#include "init.hpp"
#include "module.hpp"

namespace frugal::nn {

struct LinearOptions {
  bool bias = true;
  DType dtype = DType::f32;
};

// y = x Wᵀ + b, W of shape [out, in], initialised as PyTorch does.
class Linear : public Layer {
 public:
  ~Linear() override;
  Linear(std::int64_t in_features, std::int64_t out_features, LinearOptions o = {})
      : in_(in_features), out_(out_features) {
    if (in_features <= 0 || out_features <= 0)
      fail<ShapeError>("nn::Linear: features must be positive, got in=", in_features, " out=", out_features);
    weight = register_parameter("weight", Tensor({out_features, in_features}, o.dtype));
    if (o.bias) bias = register_parameter("bias", Tensor({out_features}, o.dtype));
    linear_default_init(weight, o.bias ? &bias : nullptr, in_features);
  }
  Var forward(Var x) override {
    if (bias.defined()) return linear(x, var(weight), var(bias));
    return linear(x, var(weight));
  }
  std::int64_t in_features() const { return in_; }
  std::int64_t out_features() const { return out_; }

  Tensor weight, bias;

 private:
  std::int64_t in_, out_;
};

}  // namespace frugal::nn
