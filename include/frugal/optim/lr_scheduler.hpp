#pragma once
// Learning-rate schedulers as objects, as torch.optim.lr_scheduler: made
// over an optimizer, they set each parameter group's learning rate (and,
// for OneCycleLR, its momentum) through the optimizer's setters. The update
// ops read hyperparameters when they run, so a schedule needs no
// recompilation:
//
//   optim::CosineAnnealingLR sched(opt, {.T_max = 1000, .warmup_iters = 100});
//   for (...) { step.run(x, y); sched.step(); }
//
// As in PyTorch, constructing a scheduler sets the epoch-0 value, and
// step() moves to the next epoch. Each value is the schedule's closed form
// at that epoch (PyTorch's _get_closed_form_lr), so resuming at epoch n
// gives the same learning rate as stepping there.
#include <cmath>
#include <cstdint>
#include <vector>

#include "../core/error.hpp"
#include "param_groups.hpp"

namespace frugal::optim {

class LRScheduler {
 public:
  virtual ~LRScheduler() = default;
  LRScheduler(const LRScheduler&) = delete;
  LRScheduler& operator=(const LRScheduler&) = delete;

  // Moves to the next epoch and sets its learning rates.
  void step() { set_epoch(last_epoch_ + 1); }
  // Sets epoch n's learning rates (resuming a run).
  void set_epoch(std::int64_t n) {
    if (n < 0) fail("optim::LRScheduler: the epoch cannot be negative (got ", n, ")");
    // Every rate is computed and checked before any is set: a failing epoch
    // (past OneCycleLR's end, a negative rate) changes nothing.
    std::vector<double> lrs;
    for (std::size_t g = 0; g < opt_.num_groups(); ++g) {
      lrs.push_back(lr_at(g, n));
      if (!(lrs.back() >= 0) || !std::isfinite(lrs.back()))
        fail("optim::LRScheduler: epoch ", n, " gives group ", g, " the learning rate ", lrs.back(),
             ", which is not finite and >= 0");
    }
    for (std::size_t g = 0; g < lrs.size(); ++g) opt_.set_group_lr(g, lrs[g]);
    last_epoch_ = n;
    last_lr_ = std::move(lrs);
    after_step(n);
  }
  // The learning rate of each group the last step set.
  const std::vector<double>& get_last_lr() const { return last_lr_; }
  std::int64_t last_epoch() const { return last_epoch_; }
  // Each group's learning rate when the scheduler was made.
  const std::vector<double>& base_lrs() const { return base_lrs_; }

 protected:
  explicit LRScheduler(ScheduledOptimizer& opt) : opt_(opt) {
    for (std::size_t g = 0; g < opt.num_groups(); ++g) base_lrs_.push_back(opt.group_lr(g));
  }
  // The learning rate of `group` at `epoch` (0 at construction).
  virtual double lr_at(std::size_t group, std::int64_t epoch) const = 0;
  // Other hyperparameters a schedule sets (OneCycleLR's momentum).
  virtual void after_step(std::int64_t) {}
  // Called by each scheduler's constructor, once it can answer lr_at:
  // PyTorch's constructor takes the initial step to epoch 0.
  void start() { set_epoch(0); }

  ScheduledOptimizer& opt_;
  std::vector<double> base_lrs_;

 private:
  std::int64_t last_epoch_ = -1;
  std::vector<double> last_lr_;
};

}  // namespace frugal::optim
