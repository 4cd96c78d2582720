#pragma once
// nll_loss(input, target, reduction, ignore_index), PyTorch's
// F.nll_loss without class weights: input holds log-probabilities with the
// class axis at dim 1 ([C], [N, C] or [N, C, d1, ...], as PyTorch, unlike
// frugal's cross_entropy, which takes the classes last), target the class
// indices ([], [N] or [N, d1, ...]). loss = -input[n, target[n, ...], ...];
// positions whose target is ignore_index (-100 by default) add nothing and
// are not counted, so 'mean' divides by the positions kept (and is NaN when
// none is, 0/0, as PyTorch). A target outside [0, C) that is not
// ignore_index stops the step with a DataError naming it.
#include <string_view>

#include "cast.hpp"

namespace frugal {
enum class Reduction : std::uint8_t { none, mean, sum };
// PyTorch's reduction strings: 'none', 'mean' or 'sum'.
inline Reduction reduction_from(const std::string& op, std::string_view r) {
  if (r == "mean") return Reduction::mean;
  if (r == "sum") return Reduction::sum;
  if (r == "none") return Reduction::none;
  fail<ShapeError>(op, ": reduction must be 'mean', 'sum' or 'none', got '", std::string(r), "'");
}
}  // namespace frugal

namespace frugal::ops {

// The target's shape for an input shape: the input without dim 1 (or [] for [C]).
inline Shape nll_target_shape(const Shape& in) {
  std::vector<std::int64_t> d;
  for (int i = 0; i < in.rank(); ++i)
    if (i != (in.rank() == 1 ? 0 : 1)) d.push_back(in[i]);
  return Shape(d);
}

inline void check_nll(const std::string& op, const TensorMeta& input, const TensorMeta& target) {
  expect_float_storage(op, input);
  if (!is_integer(target.dtype)) fail<ShapeError>(op, ": target must be i32 or i64 class indices, got ", target.str());
  if (input.shape.rank() < 1 || nll_target_shape(input.shape) != target.shape)
    fail<ShapeError>(op, ": input ", input.shape.str(), " and target ", target.shape.str(),
                     " do not match: target must have the input's shape without dim 1 (the classes)");
}

class NllLossBase : public Op {
 public:
  ~NllLossBase() override;
  NllLossBase(Reduction reduction, std::int64_t ignore_index) : reduction_(reduction), ignore_index_(ignore_index) {}
  Reduction reduction() const { return reduction_; }
  std::int64_t ignore_index() const { return ignore_index_; }

 protected:
  Reduction reduction_;
  std::int64_t ignore_index_;
};

// Inputs (target, dloss) -> dinput of meta `input`: -dloss (divided by the
// kept count for 'mean') at each kept target, 0 elsewhere.
class NllLossGrad final : public NllLossBase {
 public:
  ~NllLossGrad() override;
  NllLossGrad(Reduction r, std::int64_t ignore, TensorMeta input) : NllLossBase(r, ignore), input_(std::move(input)) {}
  const TensorMeta& input() const { return input_; }
  std::string name() const override { return "nll_loss_grad"; }
  std::vector<TensorMeta> infer(std::span<const TensorMeta> in) const override {
    expect_arity(name(), in, 2);
    check_nll(name(), input_, in[0]);
    const Shape want = reduction_ == Reduction::none ? in[0].shape : Shape{};
    if (in[1].shape != want || in[1].dtype != input_.dtype)
      fail<ShapeError>(name(), ": the loss gradient ", in[1].str(), " does not fit input ", input_.str());
    return {input_};
  }

 private:
  TensorMeta input_;
};

// Inputs (input, target) -> the loss: target's shape for 'none', else one number.
class NllLoss final : public NllLossBase {
 public:
  ~NllLoss() override;
  using NllLossBase::NllLossBase;
  std::string name() const override { return "nll_loss"; }
  std::vector<TensorMeta> infer(std::span<const TensorMeta> in) const override {
    expect_arity(name(), in, 2);
    check_nll(name(), in[0], in[1]);
    return {{in[0].dtype, reduction_ == Reduction::none ? in[1].shape : Shape{}}};
  }
  std::vector<std::optional<Var>> backward(const BackwardArgs& a) const override {
    return {apply1<NllLossGrad>({a.inputs[1], *a.grad_outputs[0]}, reduction_, ignore_index_, a.inputs[0].meta()),
            std::nullopt};
  }
};

}  // namespace frugal::ops

namespace frugal {
inline Var nll_loss(Var input, Var target, std::string_view reduction = "mean", std::int64_t ignore_index = -100) {
  return apply1<ops::NllLoss>({input, target}, reduction_from("nll_loss", reduction), ignore_index);
}
}  // namespace frugal
