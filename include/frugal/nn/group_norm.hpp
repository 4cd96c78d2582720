#pragma once
#include "../ops/group_norm.hpp"
#include "module.hpp"

namespace frugal::nn {

struct GroupNormOptions {
  double eps = 1e-5;
  bool affine = true;
  DType dtype = DType::f32;  // f32 or f64
};

// torch.nn.GroupNorm(num_groups, num_channels): over [N, C, *] input, with
// weight = 1 and bias = 0 (per channel) when affine. No buffers: the same
// in training and evaluation.
class GroupNorm : public Layer {
 public:
  ~GroupNorm() override;
  GroupNorm(std::int64_t num_groups, std::int64_t num_channels, GroupNormOptions o = {})
      : groups_(num_groups), c_(num_channels), o_(o) {
    if (num_groups <= 0 || num_channels <= 0)
      fail<ShapeError>("nn::GroupNorm: num_groups and num_channels must be positive, got ", num_groups, " and ",
                       num_channels);
    if (num_channels % num_groups != 0)
      fail<ShapeError>("nn::GroupNorm: num_channels ", num_channels, " must be divisible by num_groups ", num_groups);
    if (o.dtype != DType::f32 && o.dtype != DType::f64)
      fail<ShapeError>("nn::GroupNorm: dtype must be f32 or f64, got ", dtype_name(o.dtype));
    if (o.affine) {
      weight = register_parameter("weight", filled(1.0));
      bias = register_parameter("bias", filled(0.0));
    }
  }
  Var forward(Var x) override {
    if (x.rank() < 2 || x.dim(1) != c_)
      fail<ShapeError>("nn::GroupNorm '", qualified_name(), "': expects [N, ", c_, ", *], got ", x.shape().str());
    if (o_.affine) return group_norm(x, groups_, var(weight), var(bias), o_.eps);
    return group_norm(x, groups_, std::nullopt, std::nullopt, o_.eps);
  }
  std::int64_t num_groups() const { return groups_; }
  std::int64_t num_channels() const { return c_; }
  const GroupNormOptions& options() const { return o_; }

  Tensor weight, bias;

 private:
  Tensor filled(double v) const {
    Tensor t({c_}, o_.dtype);
    if (t.is_meta()) return t;
    for (std::int64_t i = 0; i < c_; ++i) {
      if (o_.dtype == DType::f64) t.data<double>()[i] = v;
      else t.data<float>()[i] = float(v);
    }
    return t;
  }
  std::int64_t groups_, c_;
  GroupNormOptions o_;
};

}  // namespace frugal::nn
