#pragma once
#include <cmath>

#include "../ops/conv.hpp"
#include "init.hpp"
#include "module.hpp"

namespace frugal::nn {

struct Conv2dLayerOptions {
  Size2 stride = 1;
  Size2 padding = 0;
  Size2 dilation = 1;
  std::int64_t groups = 1;
  bool bias = true;
  DType dtype = DType::f32;  // f32, f64, or bf16/f16 storage
};

// PyTorch's default initialisation of a convolution: kaiming_uniform_(a=sqrt(5))
// on the weight, which is U(-1/sqrt(fan_in), 1/sqrt(fan_in)), and the same
// bound for the bias; fan_in = in_channels/groups * kH * kW. bf16/f16 draw in
// f32 and round.
inline void conv_default_init(Tensor& weight, Tensor* bias, std::int64_t fan_in) {
  if (weight.is_meta()) return;
  // bf16/f16: the f32 draws rounded (uniform_ does it), so the same seed
  // gives the f32 model's weights rounded.
  linear_default_init(weight, bias, fan_in);
}

// 2-D convolution over NCHW input, as torch.nn.Conv2d: weight
// [out, in/groups, kH, kW], optional bias [out].
class Conv2d : public Layer {
 public:
  ~Conv2d() override;
  Conv2d(std::int64_t in_channels, std::int64_t out_channels, Size2 kernel_size, Conv2dLayerOptions o = {})
      : in_(in_channels), out_(out_channels), conv_{o.stride, o.padding, o.dilation, o.groups} {
    if (in_channels <= 0 || out_channels <= 0 || kernel_size.h <= 0 || kernel_size.w <= 0 || o.groups <= 0)
      fail<ShapeError>("nn::Conv2d: channels, kernel size and groups must be positive, got in=", in_channels,
                       " out=", out_channels, " kernel=", kernel_size.str(), " groups=", o.groups);
    if (in_channels % o.groups != 0 || out_channels % o.groups != 0)
      fail<ShapeError>("nn::Conv2d: in_channels ", in_channels, " and out_channels ", out_channels,
                       " must both be divisible by groups ", o.groups);
    if (!is_floating(o.dtype)) fail<ShapeError>("nn::Conv2d: dtype must be floating, got ", dtype_name(o.dtype));
    weight = register_parameter(
        "weight", Tensor({out_channels, in_channels / o.groups, kernel_size.h, kernel_size.w}, o.dtype));
    if (o.bias) bias = register_parameter("bias", Tensor({out_channels}, o.dtype));
    conv_default_init(weight, o.bias ? &bias : nullptr, in_channels / o.groups * kernel_size.h * kernel_size.w);
  }
  Var forward(Var x) override {
    if (bias.defined()) return conv2d(x, var(weight), var(bias), conv_);
    return conv2d(x, var(weight), std::nullopt, conv_);
  }
  std::int64_t in_channels() const { return in_; }
  std::int64_t out_channels() const { return out_; }
  const Conv2dOptions& options() const { return conv_; }

  Tensor weight, bias;

 private:
  std::int64_t in_, out_;
  Conv2dOptions conv_;
};

}  // namespace frugal::nn
