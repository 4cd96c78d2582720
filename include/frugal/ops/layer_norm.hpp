#pragma once
// Layer normalisation over the last dimension, as torch.nn.functional.layer_norm
// with normalized_shape = [D]: y = (x - mean) / sqrt(var + eps) * weight + bias,
// var the biased (divide-by-D) variance.
//
// The forward is one fused op with three outputs: y, and the per-row mean and
// rstd = 1/sqrt(var + eps) (shape: x's without its last axis). The backward
// reads those instead of recomputing the row statistics, and is one fused op
// too (dx, and dweight/dbias summed over rows).
//
// bf16/f16 inputs are normalised in f32 (each element read into f32, y
// rounded once on store), and mean and rstd are kept in f32
// (compute_dtype), as PyTorch keeps them: a 16-bit rstd would put a
// rounding error of up to 2^-8 into every element of the backward's dx.
#include "checks.hpp"

namespace frugal::ops {

inline Shape layer_norm_rows_shape(const Shape& x) {
  return Shape(std::vector<std::int64_t>(x.dims().begin(), x.dims().end() - 1));
}

// Shared checks: x [..., D] floating with D > 0, and each affine parameter [D].
inline void check_layer_norm(const std::string& op, const TensorMeta& x, const TensorMeta* weight,
                             const TensorMeta* bias) {
  expect_any_floating(op, x);
  if (x.shape.rank() < 1) fail<ShapeError>(op, ": needs at least one dimension, got the scalar ", x.str());
  const std::int64_t d = x.shape.dim(-1);
  if (d == 0) fail<ShapeError>(op, ": the normalized (last) dimension of ", x.str(), " is empty");
  for (const TensorMeta* p : {weight, bias}) {
    if (!p) continue;
    expect_same_dtype(op, x, *p);
    if (p->shape != Shape{d})
      fail<ShapeError>(op, ": ", p == weight ? "weight " : "bias ", p->shape.str(), " does not match input ",
                       x.shape.str(), " (expected [", d, "], the input's last dimension)");
  }
}

// Inputs (x, mean, rstd, dy[, weight]) -> (dx[, dweight][, dbias]).
class LayerNormGrad final : public Op {
 public:
  ~LayerNormGrad() override;
  LayerNormGrad(bool has_weight, bool has_bias) : has_weight_(has_weight), has_bias_(has_bias) {}
  bool has_weight() const { return has_weight_; }
  bool has_bias() const { return has_bias_; }
  std::string name() const override { return "layer_norm_grad"; }
  std::vector<TensorMeta> infer(std::span<const TensorMeta> in) const override {
    expect_arity(name(), in, has_weight_ ? 5 : 4);
    check_layer_norm(name(), in[0], has_weight_ ? &in[4] : nullptr, nullptr);
    const Shape rows = layer_norm_rows_shape(in[0].shape);
    for (int i : {1, 2})
      if (in[std::size_t(i)].shape != rows || in[std::size_t(i)].dtype != compute_dtype(in[0].dtype))
        fail<ShapeError>(name(), ": row statistics ", in[std::size_t(i)].str(), " do not match input ", in[0].str());
    if (in[3].shape != in[0].shape || in[3].dtype != in[0].dtype)
      fail<ShapeError>(name(), ": gradient ", in[3].str(), " does not match input ", in[0].str());
    std::vector<TensorMeta> out{in[0]};
    const TensorMeta param{in[0].dtype, Shape{in[0].shape.dim(-1)}};
    if (has_weight_) out.push_back(param);
    if (has_bias_) out.push_back(param);
    return out;
  }
  Cost cost(std::span<const TensorMeta> in, std::span<const TensorMeta> out) const override {
    double bytes = 0;
    for (auto& m : in) bytes += double(m.nbytes());
    for (auto& m : out) bytes += double(m.nbytes());
    return {10.0 * double(in[0].shape.numel()), bytes};
  }

 private:
  bool has_weight_, has_bias_;
};

// Inputs (x[, weight][, bias]) -> (y, mean, rstd).
class LayerNorm final : public Op {
 public:
  ~LayerNorm() override;
  LayerNorm(double eps, bool has_weight, bool has_bias) : eps_(eps), has_weight_(has_weight), has_bias_(has_bias) {
    if (!(eps >= 0)) fail<ShapeError>("layer_norm: eps must be >= 0, got ", eps);
  }
  double eps() const { return eps_; }
  bool has_weight() const { return has_weight_; }
  bool has_bias() const { return has_bias_; }
  std::string name() const override { return "layer_norm"; }
  std::vector<TensorMeta> infer(std::span<const TensorMeta> in) const override {
    expect_arity(name(), in, 1 + std::size_t(has_weight_) + std::size_t(has_bias_));
    const TensorMeta* w = has_weight_ ? &in[1] : nullptr;
    const TensorMeta* b = has_bias_ ? &in[1 + std::size_t(has_weight_)] : nullptr;
    check_layer_norm(name(), in[0], w, b);
    const TensorMeta stats{compute_dtype(in[0].dtype), layer_norm_rows_shape(in[0].shape)};
    return {in[0], stats, stats};
  }
  std::vector<std::optional<Var>> backward(const BackwardArgs& a) const override {
    if (!a.grad_outputs[0]) return std::vector<std::optional<Var>>(a.inputs.size());
    std::vector<Var> ins{a.inputs[0], a.outputs[1], a.outputs[2], *a.grad_outputs[0]};
    if (has_weight_) ins.push_back(a.inputs[1]);
    std::vector<Var> g = frugal::apply(std::make_shared<LayerNormGrad>(has_weight_, has_bias_), ins);
    return std::vector<std::optional<Var>>(g.begin(), g.end());
  }
  Cost cost(std::span<const TensorMeta> in, std::span<const TensorMeta> out) const override {
    return {8.0 * double(in[0].shape.numel()), double(in[0].nbytes() + out[0].nbytes())};
  }
  // y[r, j] is written after row r of x has been read for its statistics,
  // and from x[r, j] alone.
  std::vector<int> inplace_inputs() const override { return {0}; }

 private:
  double eps_;
  bool has_weight_, has_bias_;
};

}  // namespace frugal::ops

namespace frugal {

// Layer norm over the last dimension with an affine weight and bias [D].
inline Var layer_norm(Var x, Var weight, Var bias, double eps = 1e-5) {
  return frugal::apply(std::make_shared<ops::LayerNorm>(eps, true, true), {x, weight, bias}).at(0);
}
// Without the affine part (elementwise_affine=False).
inline Var layer_norm(Var x, double eps = 1e-5) {
  return frugal::apply(std::make_shared<ops::LayerNorm>(eps, false, false), {x}).at(0);
}
// Either affine part may be absent (PyTorch's bias=False).
inline Var layer_norm(Var x, std::optional<Var> weight, std::optional<Var> bias, double eps = 1e-5) {
  std::vector<Var> ins{x};
  if (weight) ins.push_back(*weight);
  if (bias) ins.push_back(*bias);
  return frugal::apply(std::make_shared<ops::LayerNorm>(eps, bool(weight), bool(bias)), ins).at(0);
}

}  // namespace frugal
