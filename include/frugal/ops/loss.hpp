#pragma once
// Cross-entropy with integer class labels, averaged over all positions.
// The loss has the logits' dtype, except for bf16/f16 logits, whose loss is
// f32 (computed in f32, as PyTorch's autocast does): see loss_dtype.
#include "cast.hpp"

namespace frugal::ops {

inline void check_cross_entropy(const std::string& op, const TensorMeta& logits, const TensorMeta& labels) {
  expect_float_storage(op, logits);
  if (!is_integer(labels.dtype))
    fail<ShapeError>(op, ": labels must be i32 or i64 class indices, got ", labels.str());
  const Shape& l = logits.shape;
  if (l.rank() < 1 || labels.shape.rank() != l.rank() - 1 ||
      !std::equal(labels.shape.dims().begin(), labels.shape.dims().end(), l.dims().begin()))
    fail<ShapeError>(op, ": logits ", l.str(), " and labels ", labels.shape.str(),
                     " do not match: labels must have the logits' shape without its last (class) axis");
}

// The dtype of the loss of these logits: f32 for bf16/f16, else their own.
inline DType loss_dtype(DType logits) { return is_half(logits) ? DType::f32 : logits; }

// Inputs (logits, labels, dloss) -> dlogits = (softmax(logits) - onehot) * dloss / N.
class CrossEntropyGrad final : public Op {
 public:
  ~CrossEntropyGrad() override;
  std::string name() const override { return "cross_entropy_grad"; }
  Cost cost(std::span<const TensorMeta> in, std::span<const TensorMeta> out) const override {
    Cost c = Op::cost(in, out);
    c.transcendentals = double(in[0].shape.numel());  // softmax again: an exp per logit
    return c;
  }
  std::vector<TensorMeta> infer(std::span<const TensorMeta> in) const override {
    expect_arity(name(), in, 3);
    check_cross_entropy(name(), in[0], in[1]);
    if (in[2].dtype != loss_dtype(in[0].dtype) || in[2].shape.numel() != 1)
      fail<ShapeError>(name(), ": the loss gradient ", in[2].str(), " must be one ", dtype_name(loss_dtype(in[0].dtype)),
                       " number for logits ", in[0].str());
    return {in[0]};
  }
};

// Inputs (logits [..., C], labels [...]) -> mean over positions of
// -log softmax(logits)[label]. A label outside [0, C) stops the step with an
// error naming the position and the value.
class CrossEntropy final : public Op {
 public:
  ~CrossEntropy() override;
  std::string name() const override { return "cross_entropy"; }
  Cost cost(std::span<const TensorMeta> in, std::span<const TensorMeta> out) const override {
    Cost c = Op::cost(in, out);
    c.transcendentals = double(in[0].shape.numel() + in[1].shape.numel());  // an exp per logit, a log per position
    return c;
  }
  std::vector<TensorMeta> infer(std::span<const TensorMeta> in) const override {
    expect_arity(name(), in, 2);
    check_cross_entropy(name(), in[0], in[1]);
    return {{loss_dtype(in[0].dtype), Shape{}}};
  }
  std::vector<std::optional<Var>> backward(const BackwardArgs& a) const override {
    return {apply1<CrossEntropyGrad>({a.inputs[0], a.inputs[1], *a.grad_outputs[0]}), std::nullopt};
  }
};

}  // namespace frugal::ops

namespace frugal {
inline Var cross_entropy(Var logits, Var labels) { return apply1<ops::CrossEntropy>({logits, labels}); }
}  // namespace frugal
