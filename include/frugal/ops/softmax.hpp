#pragma once
// softmax and log_softmax along one axis, with fused backward kernels.
#include <algorithm>

#include "cast.hpp"

namespace frugal::ops {

// The shared shape logic: one axis, viewed as [outer, n, inner].
class AlongAxis : public Op {
 public:
  ~AlongAxis() override;
  explicit AlongAxis(int axis) : axis_(axis) {}
  int axis_for(const Shape& s) const { return s.normalize_axis(axis_); }
  std::vector<TensorMeta> infer(std::span<const TensorMeta> in) const override {
    for (auto& m : in) {
      expect_float_storage(name(), m);
      if (m.shape != in[0].shape) fail<ShapeError>(name(), ": inputs ", in[0].str(), " and ", m.str(), " differ");
    }
    if (in[0].shape.rank() == 0) fail<ShapeError>(name(), ": needs at least one dimension, got a scalar");
    axis_for(in[0].shape);
    return {in[0]};
  }

 protected:
  int axis_;
};

// Inputs (y, dy) where y = softmax(x): dx = y * (dy - sum(dy * y)).
class SoftmaxGrad final : public AlongAxis {
 public:
  ~SoftmaxGrad() override;
  using AlongAxis::AlongAxis;
  std::string name() const override { return "softmax_grad"; }
  std::vector<int> inplace_inputs() const override { return {1}; }  // dx over dy
};
// Inputs (y, dy) where y = log_softmax(x): dx = dy - exp(y) * sum(dy).
class LogSoftmaxGrad final : public AlongAxis {
 public:
  ~LogSoftmaxGrad() override;
  using AlongAxis::AlongAxis;
  std::string name() const override { return "log_softmax_grad"; }
  Cost cost(std::span<const TensorMeta> in, std::span<const TensorMeta> out) const override {
    Cost c = Op::cost(in, out);
    c.transcendentals = double(in[0].shape.numel());  // exp(y)
    return c;
  }
  std::vector<int> inplace_inputs() const override { return {1}; }  // dx over dy
};

class Softmax final : public AlongAxis {
 public:
  ~Softmax() override;
  using AlongAxis::AlongAxis;
  std::string name() const override { return "softmax"; }
  Cost cost(std::span<const TensorMeta> in, std::span<const TensorMeta> out) const override {
    Cost c = Op::cost(in, out);
    c.transcendentals = double(in[0].shape.numel());  // an exp per element
    return c;
  }
  std::vector<std::optional<Var>> backward(const BackwardArgs& a) const override {
    return {apply1<SoftmaxGrad>({a.outputs[0], *a.grad_outputs[0]}, axis_)};
  }
};

class LogSoftmax final : public AlongAxis {
 public:
  ~LogSoftmax() override;
  using AlongAxis::AlongAxis;
  std::string name() const override { return "log_softmax"; }
  Cost cost(std::span<const TensorMeta> in, std::span<const TensorMeta> out) const override {
    Cost c = Op::cost(in, out);
    // An exp per element, a log per row.
    const std::int64_t n = in[0].shape.numel();
    const std::int64_t along = std::max<std::int64_t>(1, in[0].shape.dim(axis_for(in[0].shape)));
    c.transcendentals = double(n) + double(n / along);
    return c;
  }
  std::vector<std::optional<Var>> backward(const BackwardArgs& a) const override {
    return {apply1<LogSoftmaxGrad>({a.outputs[0], *a.grad_outputs[0]}, axis_)};
  }
};

}  // namespace frugal::ops

namespace frugal {
inline Var softmax(Var x, int axis = -1) { return apply1<ops::Softmax>({x}, axis); }
inline Var log_softmax(Var x, int axis = -1) { return apply1<ops::LogSoftmax>({x}, axis); }
}  // namespace frugal
