#pragma once
// What compile() needs for dynamic loss scaling (f16 training), as
// interfaces: optim::LossScaler implements the first, optim::AdamW and
// optim::SGD the second (runtime/ sits above optim/ and cannot name them).
//
// Usage, the same shape as PyTorch's GradScaler:
//
//   optim::LossScaler scaler;   // init 2^16, growth 2, backoff 0.5, every 2000 steps
//   Step step = compile(fn, specs, opt, budget, {.loss_scaler = &scaler});
//   float loss = step.run(x, y);  // the unscaled loss
//   scaler.scale(); scaler.last_step_skipped(); scaler.skipped_steps();
//
// Everything happens inside the one captured step; see ops/loss_scaling.hpp
// for the graph it adds.
#include <span>

#include "../ops/loss_scaling.hpp"

namespace frugal {

class LossScalerBase {
 public:
  virtual ~LossScalerBase() = default;
  // Appends loss * scale to the capture; gradients are taken of the result.
  virtual Var scale_loss(Var loss) = 0;
  // Appends the overflow check over every gradient (scaled as they come
  // from the backward) and returns what the guarded updates read.
  virtual ops::UpdateGuard check_gradients(std::span<const Var> grads) = 0;
  // Appends the scale update; compile() calls it after every optimizer
  // update, so it runs after everything that reads the scale.
  virtual void append_scale_update(const ops::UpdateGuard& guard) = 0;
};

// An optimizer whose updates a flag computed in the graph can skip.
class SkippableOptimizer {
 public:
  virtual ~SkippableOptimizer() = default;
  // Appends the update of params()[index] from a gradient scaled by
  // guard.scale, skipped (nothing written) when guard.found_inf is set.
  virtual void append_guarded_update(Var param, Var grad, std::size_t index, const ops::UpdateGuard& guard) = 0;
  // Appended after all guarded updates: advances the optimizer's
  // device-side count of steps taken, unless the step was skipped.
  virtual void append_guarded_step_end(const ops::UpdateGuard& guard) = 0;
};

}  // namespace frugal
