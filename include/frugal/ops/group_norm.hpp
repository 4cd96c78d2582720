#pragma once
// Group normalisation, as PyTorch's F.group_norm: x [N, C, *] is split into
// num_groups groups of C / num_groups channels; each (sample, group) is
// normalised by its own mean and biased variance over its channels and all
// positions, then, when affine, scaled and shifted per channel:
//   y = (x - mean[n, g]) / sqrt(var[n, g] + eps) * weight[c] + bias[c].
// The statistics do not depend on the batch, so train and eval are the same
// op, and there are no running statistics.
//
// The forward also outputs mean and rstd = 1/sqrt(var + eps) [N, G] (as
// PyTorch's native_group_norm): the backward reads them instead of
// recomputing, and they are tiny next to x.
#include "checks.hpp"

namespace frugal::ops {

struct GroupNormDims {
  std::int64_t n, c, groups, spatial;  // spatial: the product of the dims after C
  std::int64_t channels_per_group() const { return c / groups; }
  std::int64_t group_size() const { return channels_per_group() * spatial; }
};

inline GroupNormDims group_norm_dims(const std::string& op, const Shape& x, std::int64_t groups) {
  if (x.rank() < 2) fail<ShapeError>(op, ": expects an input [N, C, *], got ", x.str());
  if (groups < 1) fail<ShapeError>(op, ": num_groups must be at least 1, got ", groups);
  if (x[1] % groups != 0)
    fail<ShapeError>(op, ": num_channels ", x[1], " of input ", x.str(), " is not divisible by num_groups ", groups);
  std::int64_t spatial = 1;
  for (int d = 2; d < x.rank(); ++d) spatial *= x[d];
  return {x[0], x[1], groups, spatial};
}

inline void check_group_norm_affine(const std::string& op, const TensorMeta& x, std::span<const TensorMeta> per_channel,
                                    std::span<const char* const> names) {
  for (std::size_t i = 0; i < per_channel.size(); ++i) {
    expect_same_dtype(op, x, per_channel[i]);
    if (per_channel[i].shape != Shape{x.shape[1]})
      fail<ShapeError>(op, ": ", names[i], " ", per_channel[i].shape.str(), " does not match input ", x.shape.str(),
                       " (expected [", x.shape[1], "], one per channel)");
  }
}

// Inputs (x, dy, mean, rstd[, weight]) -> dx[, dweight, dbias].
class GroupNormGrad final : public Op {
 public:
  ~GroupNormGrad() override;
  GroupNormGrad(std::int64_t groups, bool affine) : groups_(groups), affine_(affine) {}
  std::int64_t num_groups() const { return groups_; }
  bool affine() const { return affine_; }
  std::string name() const override { return "group_norm_backward"; }
  GroupNormDims dims(const Shape& x) const { return group_norm_dims(name(), x, groups_); }
  std::vector<TensorMeta> infer(std::span<const TensorMeta> in) const override {
    expect_arity(name(), in, affine_ ? 5 : 4);
    expect_floating(name(), in[0]);
    const GroupNormDims d = dims(in[0].shape);
    if (in[1].shape != in[0].shape || in[1].dtype != in[0].dtype)
      fail<ShapeError>(name(), ": output gradient ", in[1].str(), " does not match input ", in[0].str());
    for (int i : {2, 3})
      if (in[std::size_t(i)].shape != Shape{d.n, d.groups} || in[std::size_t(i)].dtype != in[0].dtype)
        fail<ShapeError>(name(), ": statistics ", in[std::size_t(i)].str(), " must be [", d.n, ", ", d.groups, "] of ",
                         dtype_name(in[0].dtype));
    if (!affine_) return {in[0]};
    static constexpr const char* names[] = {"weight"};
    check_group_norm_affine(name(), in[0], in.subspan(4, 1), names);
    return {in[0], in[4], in[4]};
  }
  Cost cost(std::span<const TensorMeta> in, std::span<const TensorMeta> out) const override {
    return {10.0 * double(in[0].shape.numel()), double(2 * in[0].nbytes() + out[0].nbytes())};
  }

 private:
  std::int64_t groups_;
  bool affine_;
};

// Inputs (x[, weight, bias]) -> (y, mean, rstd).
class GroupNorm final : public Op {
 public:
  ~GroupNorm() override;
  GroupNorm(std::int64_t groups, double eps, bool affine) : groups_(groups), eps_(eps), affine_(affine) {}
  std::int64_t num_groups() const { return groups_; }
  double eps() const { return eps_; }
  bool affine() const { return affine_; }
  std::string name() const override { return "group_norm"; }
  GroupNormDims dims(const Shape& x) const { return group_norm_dims(name(), x, groups_); }
  std::vector<TensorMeta> infer(std::span<const TensorMeta> in) const override {
    expect_arity(name(), in, affine_ ? 3 : 1);
    expect_floating(name(), in[0]);
    const GroupNormDims d = dims(in[0].shape);
    if (!(eps_ >= 0)) fail<ShapeError>(name(), ": eps must be non-negative, got ", eps_);
    if (affine_) {
      static constexpr const char* names[] = {"weight", "bias"};
      check_group_norm_affine(name(), in[0], in.subspan(1, 2), names);
    }
    const TensorMeta stats{in[0].dtype, Shape{d.n, d.groups}};
    return {in[0], stats, stats};
  }
  std::vector<std::optional<Var>> backward(const BackwardArgs& a) const override {
    if (a.grad_outputs[1] || a.grad_outputs[2])
      fail("group_norm: the mean and rstd it outputs are statistics, not differentiable outputs; "
           "the loss must not depend on them");
    if (!a.grad_outputs[0]) return std::vector<std::optional<Var>>(a.inputs.size());
    std::vector<Var> in{a.inputs[0], *a.grad_outputs[0], a.outputs[1], a.outputs[2]};
    if (affine_) in.push_back(a.inputs[1]);
    auto g = frugal::apply(std::make_shared<GroupNormGrad>(groups_, affine_), in);
    if (!affine_) return {g[0]};
    return {g[0], g[1], g[2]};
  }
  Cost cost(std::span<const TensorMeta> in, std::span<const TensorMeta> out) const override {
    return {8.0 * double(in[0].shape.numel()), double(2 * in[0].nbytes() + out[0].nbytes())};
  }

 private:
  std::int64_t groups_;
  double eps_;
  bool affine_;
};

}  // namespace frugal::ops

namespace frugal {

// PyTorch's F.group_norm(input, num_groups, weight, bias, eps): weight and
// bias both given (affine) or both absent.
inline Var group_norm(Var x, std::int64_t num_groups, std::optional<Var> weight = std::nullopt,
                      std::optional<Var> bias = std::nullopt, double eps = 1e-5) {
  if (bool(weight) != bool(bias))
    fail<ShapeError>("group_norm: give both weight and bias, or neither (frugal does not take one alone)");
  if (weight) return frugal::apply(std::make_shared<ops::GroupNorm>(num_groups, eps, true), {x, *weight, *bias})[0];
  return frugal::apply(std::make_shared<ops::GroupNorm>(num_groups, eps, false), {x})[0];
}

}  // namespace frugal
