#pragma once
// Gradient clipping by global norm, as torch.nn.utils.clip_grad_norm_, in
// the graph (CompileOptions::clip_grad_norm):
//
//   total_norm = || (g_1, ..., g_n) ||_2           (ClipGradNormCoef)
//   clip_coef  = min(max_norm / (total_norm + 1e-6), 1)
//   g_i       <- g_i * clip_coef                   (Mul, before each update)
//
// The norm needs every gradient complete, so every update waits for the
// last gradient: all gradients are live together at the end of the
// backward, where without clipping each update frees its gradient as soon
// as it is complete. The planner sees this like any other dependence.
#include <cmath>
#include <memory>

#include "checks.hpp"
#include "loss_scaling.hpp"

namespace frugal::ops {

// Inputs (g_1, ..., g_n) -> (total_norm, clip_coef), both f32 scalars. The
// sum of squares is accumulated in f64 over every element in order (the
// same bits wherever and however many threads it runs on); the norm and the
// coefficient are computed in f64 and rounded to f32 once. A non-finite
// gradient gives a non-finite norm and coefficient, as in PyTorch (whose
// error_if_nonfinite is off by default).
class ClipGradNormCoef final : public Op {
 public:
  ~ClipGradNormCoef() override;
  explicit ClipGradNormCoef(double max_norm) : max_norm_(max_norm) {
    if (!(max_norm > 0) || !std::isfinite(max_norm))
      fail("clip_grad_norm: max_norm must be finite and > 0, got ", max_norm);
  }
  double max_norm() const { return max_norm_; }
  // torch.nn.utils.clip_grad_norm_'s eps in the divisor.
  static constexpr double kEps = 1e-6;
  std::string name() const override { return "clip_grad_norm_coef"; }
  std::vector<TensorMeta> infer(std::span<const TensorMeta> in) const override {
    if (in.empty()) fail<ShapeError>(name(), ": expects at least one gradient");
    for (auto& m : in)
      if (!is_floating(m.dtype)) fail<ShapeError>(name(), ": gradient ", m.str(), " is not floating");
    return {{DType::f32, Shape{}}, {DType::f32, Shape{}}};
  }

 private:
  double max_norm_;
};

}  // namespace frugal::ops
