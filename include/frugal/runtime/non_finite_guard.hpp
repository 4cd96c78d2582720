#pragma once
// The opt-in guard CompileOptions::skip_non_finite adds to a training step:
// when the loss or any gradient is infinite or NaN, the optimizer writes
// nothing (parameters, moments and its device-side count of steps taken stay
// bitwise as they were) and the step counts a skip. It is dynamic loss
// scaling's machinery (ops/loss_scaling.hpp) with the scale fixed at 1 and
// the loss not multiplied: the overflow check over the loss and every
// gradient, and the guarded updates, whose g / 1 is g exactly.
#include <span>

#include "../graph/capture.hpp"
#include "../ops/skip_count.hpp"
#include "loss_scaling.hpp"

namespace frugal {

class NonFiniteGuard final : public LossScalerBase {
 public:
  NonFiniteGuard() : one_(Shape{}, DType::f32), stats_(Shape{2}, DType::i64) { one_.data<float>()[0] = 1.0f; }

  // The loss is checked with the gradients; it is not scaled.
  Var scale_loss(Var loss) override {
    if (!is_floating(loss.dtype()))
      fail("CompileOptions::skip_non_finite: the loss has integer dtype ", dtype_name(loss.dtype()));
    loss_ = loss;
    return loss;
  }
  ops::UpdateGuard check_gradients(std::span<const Var> grads) override {
    Var one = constant(one_, "non_finite_guard.one");
    std::vector<Var> in{one, loss_};
    in.insert(in.end(), grads.begin(), grads.end());
    return {apply1<ops::NonFiniteCheck>(std::move(in)), one};
  }
  void append_scale_update(const ops::UpdateGuard& guard) override {
    frugal::apply(std::make_shared<ops::CountSkippedStep>(),
                  {persistent_var(stats_, ValueKind::state, "non_finite_guard.skip_stats"), guard.found_inf});
  }
  // i64[2]: {steps skipped so far, whether the last step was skipped}.
  const Tensor& skip_stats() const { return stats_; }

 private:
  Tensor one_, stats_;
  Var loss_;
};

}  // namespace frugal
