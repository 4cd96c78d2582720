#pragma once
#include "../ops/conv_transpose.hpp"
#include "conv.hpp"

namespace frugal::nn {

struct ConvTranspose2dLayerOptions {
  Size2 stride = 1;
  Size2 padding = 0;
  Size2 output_padding = 0;
  std::int64_t groups = 1;
  bool bias = true;
  Size2 dilation = 1;
  DType dtype = DType::f32;  // f32 or f64
};

// 2-D transposed convolution over NCHW input, as torch.nn.ConvTranspose2d:
// weight [in, out/groups, kH, kW], optional bias [out]. PyTorch's default
// initialisation: kaiming_uniform_(a=sqrt(5)) with the fan_in PyTorch
// computes from the weight's layout (weight.size(1) * kH * kW =
// out/groups * kH * kW), so U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for the
// weight and the bias alike. (forward takes no output_size: give
// output_padding instead.)
class ConvTranspose2d : public Layer {
 public:
  ~ConvTranspose2d() override;
  ConvTranspose2d(std::int64_t in_channels, std::int64_t out_channels, Size2 kernel_size,
                  ConvTranspose2dLayerOptions o = {})
      : in_(in_channels), out_(out_channels), conv_{o.stride, o.padding, o.output_padding, o.groups, o.dilation} {
    if (in_channels <= 0 || out_channels <= 0 || kernel_size.h <= 0 || kernel_size.w <= 0 || o.groups <= 0)
      fail<ShapeError>("nn::ConvTranspose2d: channels, kernel size and groups must be positive, got in=", in_channels,
                       " out=", out_channels, " kernel=", kernel_size.str(), " groups=", o.groups);
    if (in_channels % o.groups != 0 || out_channels % o.groups != 0)
      fail<ShapeError>("nn::ConvTranspose2d: in_channels ", in_channels, " and out_channels ", out_channels,
                       " must both be divisible by groups ", o.groups);
    if (o.dtype != DType::f32 && o.dtype != DType::f64)
      fail<ShapeError>("nn::ConvTranspose2d: dtype must be f32 or f64, got ", dtype_name(o.dtype));
    weight = register_parameter(
        "weight", Tensor({in_channels, out_channels / o.groups, kernel_size.h, kernel_size.w}, o.dtype));
    if (o.bias) bias = register_parameter("bias", Tensor({out_channels}, o.dtype));
    conv_default_init(weight, o.bias ? &bias : nullptr, out_channels / o.groups * kernel_size.h * kernel_size.w);
  }
  Var forward(Var x) override {
    if (bias.defined()) return conv_transpose2d(x, var(weight), var(bias), conv_);
    return conv_transpose2d(x, var(weight), std::nullopt, conv_);
  }
  std::int64_t in_channels() const { return in_; }
  std::int64_t out_channels() const { return out_; }
  const ConvTranspose2dOptions& options() const { return conv_; }

  Tensor weight, bias;

 private:
  std::int64_t in_, out_;
  ConvTranspose2dOptions conv_;
};

}  // namespace frugal::nn
