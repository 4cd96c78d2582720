#pragma once
// torch.where(condition, input, other): input where the condition holds,
// other elsewhere, all three broadcast together (numpy rules). The
// condition may be u8 (a bool mask), i32/i64 or floating: nonzero is true.
// (PyTorch wants a bool tensor; frugal has no bool dtype, so u8 plays it,
// and any other dtype is read as "!= 0", NaN counting as true like C++.)
// NaN in the branch not taken does not reach the output, as in PyTorch.
#include "reduce.hpp"

namespace frugal::ops {

inline Shape where_shape(const std::string& op, const TensorMeta& m, const TensorMeta& a, const TensorMeta& b) {
  auto ab = broadcast_shapes(a.shape, b.shape);
  auto out = ab ? broadcast_shapes(m.shape, *ab) : std::nullopt;
  if (!out)
    fail<ShapeError>(op, ": condition ", m.shape.str(), ", input ", a.shape.str(), " and other ", b.shape.str(),
                     " do not broadcast (trailing dimensions must match or be 1)");
  return *out;
}

// Inputs (condition, g) -> g where the condition holds (take_true) or where
// it does not (!take_true), 0 elsewhere: the backward of where.
class WhereGrad final : public Op {
 public:
  ~WhereGrad() override;
  explicit WhereGrad(bool take_true) : take_true_(take_true) {}
  bool take_true() const { return take_true_; }
  std::string name() const override { return "where_grad"; }
  std::vector<TensorMeta> infer(std::span<const TensorMeta> in) const override {
    expect_arity(name(), in, 2);
    expect_float_storage(name(), in[1]);
    auto b = broadcast_shapes(in[0].shape, in[1].shape);
    if (!b || *b != in[1].shape)
      fail<ShapeError>(name(), ": condition ", in[0].shape.str(), " does not broadcast to the gradient ",
                       in[1].shape.str());
    return {in[1]};
  }
  std::vector<int> inplace_inputs() const override { return {1}; }

 private:
  bool take_true_;
};

class Where final : public Op {
 public:
  ~Where() override;
  std::string name() const override { return "where"; }
  std::vector<TensorMeta> infer(std::span<const TensorMeta> in) const override {
    expect_arity(name(), in, 3);
    expect_float_storage(name(), in[1]);
    expect_same_dtype(name(), in[1], in[2]);
    return {{in[1].dtype, where_shape(name(), in[0], in[1], in[2])}};
  }
  std::vector<std::optional<Var>> backward(const BackwardArgs& a) const override {
    Var g = *a.grad_outputs[0];
    return {std::nullopt, sum_to(apply1<WhereGrad>({a.inputs[0], g}, true), a.inputs[1].shape()),
            sum_to(apply1<WhereGrad>({a.inputs[0], g}, false), a.inputs[2].shape())};
  }
  Cost cost(std::span<const TensorMeta>, std::span<const TensorMeta> out) const override {
    return {double(out[0].shape.numel()), 4.0 * double(out[0].nbytes())};
  }
  // An input of the output's shape (the planner checks the shapes).
  std::vector<int> inplace_inputs() const override { return {1, 2}; }
};

}  // namespace frugal::ops

namespace frugal {
inline Var where(Var condition, Var input, Var other) { return apply1<ops::Where>({condition, input, other}); }
}  // namespace frugal
