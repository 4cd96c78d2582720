#pragma once
// torch.max / torch.min over one dimension (values and the indices they came
// from) and torch.argmax / torch.argmin. PyTorch's choices: the first
// maximum (minimum) wins a tie; a NaN counts as larger (smaller) than
// anything, so a slice holding one gives NaN and the index of its first
// NaN. The gradient of the values flows to the returned index only, as
// torch.max(dim)'s does; indices carry none.
#include "cast.hpp"

namespace frugal::ops {

// The shared shape logic: reduce one dim of x, keepdim or not.
class AlongDimReduction : public Op {
 public:
  ~AlongDimReduction() override;
  AlongDimReduction(bool is_max, int dim, bool keepdim) : is_max_(is_max), dim_(dim), keepdim_(keepdim) {}
  bool is_max() const { return is_max_; }
  bool keepdim() const { return keepdim_; }
  int dim_for(const Shape& s) const { return s.normalize_axis(dim_); }
  // The output shape for input shape s.
  Shape reduced(const std::string& op, const Shape& s) const {
    if (s.rank() == 0) fail<ShapeError>(op, ": needs at least one dimension, got a scalar");
    const int d = dim_for(s);
    if (s[d] == 0) fail<ShapeError>(op, ": dim ", d, " of ", s.str(), " is empty (no maximum to take)");
    std::vector<std::int64_t> out;
    for (int i = 0; i < s.rank(); ++i)
      if (i != d) out.push_back(s[i]);
      else if (keepdim_) out.push_back(1);
    return Shape(out);
  }

 protected:
  bool is_max_;
  int dim_;
  bool keepdim_;
};

// Inputs (indices, dvalues) -> dx of shape `input`: dvalues scattered to
// the indices along the dim, zero elsewhere.
class MaxMinDimGrad final : public AlongDimReduction {
 public:
  ~MaxMinDimGrad() override;
  MaxMinDimGrad(int dim, bool keepdim, TensorMeta input) : AlongDimReduction(true, dim, keepdim), input_(std::move(input)) {}
  const TensorMeta& input() const { return input_; }
  std::string name() const override { return "max_min_dim_grad"; }
  std::vector<TensorMeta> infer(std::span<const TensorMeta> in) const override {
    expect_arity(name(), in, 2);
    const Shape r = reduced(name(), input_.shape);
    if (in[0].dtype != DType::i64 || in[0].shape != r || in[1].shape != r || in[1].dtype != input_.dtype)
      fail<ShapeError>(name(), ": indices ", in[0].str(), " and gradient ", in[1].str(), " do not fit input ",
                       input_.str());
    return {input_};
  }

 private:
  TensorMeta input_;
};

// Input x -> (values, indices i64) of its maximum (or minimum) along dim.
class MaxMinDim final : public AlongDimReduction {
 public:
  ~MaxMinDim() override;
  using AlongDimReduction::AlongDimReduction;
  std::string name() const override { return is_max_ ? "max" : "min"; }
  std::vector<TensorMeta> infer(std::span<const TensorMeta> in) const override {
    expect_arity(name(), in, 1);
    expect_float_storage(name(), in[0]);
    Shape r = reduced(name(), in[0].shape);
    return {{in[0].dtype, r}, {DType::i64, r}};
  }
  std::vector<std::optional<Var>> backward(const BackwardArgs& a) const override {
    if (!a.grad_outputs[0]) return {std::nullopt};
    return {apply1<MaxMinDimGrad>({a.outputs[1], *a.grad_outputs[0]}, dim_, keepdim_, a.inputs[0].meta())};
  }
  Cost cost(std::span<const TensorMeta> in, std::span<const TensorMeta> out) const override {
    return {double(in[0].shape.numel()), double(in[0].nbytes() + out[0].nbytes() + out[1].nbytes())};
  }
};

// Input x -> the index (i32 or i64) of its maximum (or minimum) along dim.
class ArgMaxMin final : public AlongDimReduction {
 public:
  ~ArgMaxMin() override;
  ArgMaxMin(bool is_max, int dim, bool keepdim, DType index) : AlongDimReduction(is_max, dim, keepdim), index_(index) {}
  std::string name() const override { return is_max_ ? "argmax" : "argmin"; }
  std::vector<TensorMeta> infer(std::span<const TensorMeta> in) const override {
    expect_arity(name(), in, 1);
    expect_float_storage(name(), in[0]);
    if (!is_integer(index_)) fail<ShapeError>(name(), ": the index dtype must be i32 or i64, got ", dtype_name(index_));
    return {{index_, reduced(name(), in[0].shape)}};
  }
  std::vector<std::optional<Var>> backward(const BackwardArgs&) const override { return {std::nullopt}; }

 private:
  DType index_;
};

}  // namespace frugal::ops

namespace frugal {

// torch.max(x, dim, keepdim): the values and their indices (i64).
inline std::pair<Var, Var> max_with_indices(Var x, int dim, bool keepdim = false) {
  auto out = frugal::apply(std::make_shared<ops::MaxMinDim>(true, dim, keepdim), {x});
  return {out[0], out[1]};
}
inline std::pair<Var, Var> min_with_indices(Var x, int dim, bool keepdim = false) {
  auto out = frugal::apply(std::make_shared<ops::MaxMinDim>(false, dim, keepdim), {x});
  return {out[0], out[1]};
}
// torch.max(x, dim, keepdim).values (and min).
inline Var max(Var x, int dim, bool keepdim = false) { return max_with_indices(x, dim, keepdim).first; }
inline Var min(Var x, int dim, bool keepdim = false) { return min_with_indices(x, dim, keepdim).first; }
// torch.argmax(x, dim, keepdim); the index dtype is i64 as PyTorch's, or i32.
inline Var argmax(Var x, int dim, bool keepdim = false, DType index = DType::i64) {
  return apply1<ops::ArgMaxMin>({x}, true, dim, keepdim, index);
}
inline Var argmin(Var x, int dim, bool keepdim = false, DType index = DType::i64) {
  return apply1<ops::ArgMaxMin>({x}, false, dim, keepdim, index);
}

}  // namespace frugal
