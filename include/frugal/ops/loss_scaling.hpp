#pragma once
// The graph ops of dynamic loss scaling (torch.cuda.amp.GradScaler's
// algorithm, inside the static graph: no value goes back to the host during
// a step). With a scale s held as persistent state:
//
//   forward    loss_s = loss * s                       (Mul)
//   backward   gradients of loss_s: s times too large, so small f16
//              gradients do not flush to zero
//   found_inf  = any gradient g with g / s not finite  (NonFiniteCheck)
//   update     each optimizer update reads found_inf and s: it unscales its
//              gradient (g / s) and, when found_inf is set, writes nothing
//              at all (parameters, moments, step counter), as PyTorch skips
//              optimizer.step()                       (guarded updates, see
//              ops/optimizer_updates.hpp; AdvanceStepCount)
//   scale      s *= backoff after an overflow; s *= growth after
//              growth_interval overflow-free steps    (UpdateLossScale)
#include <cmath>
#include <memory>

#include "checks.hpp"

namespace frugal::ops {

// What a guarded optimizer update reads besides its parameter and gradient:
// the step's overflow flag (f32 scalar, 1 = skip) and the loss scale (f32
// scalar) its gradient carries.
struct UpdateGuard {
  Var found_inf;
  Var scale;
};

inline void expect_scalar(const std::string& op, const char* what, const TensorMeta& m, DType dt) {
  if (m.dtype != dt || m.shape.numel() != 1)
    fail<ShapeError>(op, ": ", what, " must be one ", dtype_name(dt), " value, got ", m.str());
}

// Inputs (scale, g_1, ..., g_n) -> found_inf: f32 scalar, 1 when some
// g_i / scale is infinite or NaN, else 0.
class NonFiniteCheck final : public Op {
 public:
  ~NonFiniteCheck() override;
  std::string name() const override { return "non_finite_check"; }
  std::vector<TensorMeta> infer(std::span<const TensorMeta> in) const override {
    if (in.size() < 2) fail<ShapeError>(name(), ": expects the loss scale and at least one gradient, got ", in.size(),
                                        " inputs");
    expect_scalar(name(), "the loss scale", in[0], DType::f32);
    for (std::size_t i = 1; i < in.size(); ++i)
      if (!is_floating(in[i].dtype)) fail<ShapeError>(name(), ": gradient ", in[i].str(), " is not floating");
    return {{DType::f32, Shape{}}};
  }
};

struct LossScaleHyper {
  double growth_factor = 2.0, backoff_factor = 0.5;
  std::int64_t growth_interval = 2000;
};

// Inputs (scale f32[], growth_tracker i32[], stats i64[2], found_inf f32[]);
// writes scale, growth_tracker and stats = {steps skipped so far, whether
// this step was skipped}. As torch's _amp_update_scale_: an overflow
// multiplies the scale by backoff and restarts the count of good steps;
// growth_interval good steps in a row multiply it by growth (unless that
// would overflow f32).
class UpdateLossScale final : public Op {
 public:
  ~UpdateLossScale() override;
  explicit UpdateLossScale(std::shared_ptr<const LossScaleHyper> h) : h_(std::move(h)) {}
  const LossScaleHyper& hyper() const { return *h_; }
  std::string name() const override { return "update_loss_scale"; }
  std::vector<TensorMeta> infer(std::span<const TensorMeta> in) const override {
    expect_arity(name(), in, 4);
    expect_scalar(name(), "the loss scale", in[0], DType::f32);
    expect_scalar(name(), "the growth tracker", in[1], DType::i32);
    if (in[2].dtype != DType::i64 || in[2].shape.numel() != 2)
      fail<ShapeError>(name(), ": the skip statistics must be i64[2], got ", in[2].str());
    expect_scalar(name(), "found_inf", in[3], DType::f32);
    return {};
  }
  std::vector<int> mutated_inputs() const override { return {0, 1, 2}; }

 private:
  std::shared_ptr<const LossScaleHyper> h_;
};

// Inputs (steps_taken i64[], found_inf f32[]): steps_taken += 1 unless
// found_inf. An optimizer whose updates may be skipped counts its steps on
// the device with this, so bias corrections (AdamW) and first-step rules
// (SGD's momentum) see only the steps that were taken.
class AdvanceStepCount final : public Op {
 public:
  ~AdvanceStepCount() override;
  std::string name() const override { return "advance_step_count"; }
  std::vector<TensorMeta> infer(std::span<const TensorMeta> in) const override {
    expect_arity(name(), in, 2);
    expect_scalar(name(), "the step count", in[0], DType::i64);
    expect_scalar(name(), "found_inf", in[1], DType::f32);
    return {};
  }
  std::vector<int> mutated_inputs() const override { return {0}; }
};

}  // namespace frugal::ops
