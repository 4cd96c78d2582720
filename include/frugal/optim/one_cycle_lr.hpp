#pragma once
// The one-cycle policy, as torch.optim.lr_scheduler.OneCycleLR with its
// defaults: the learning rate climbs from max_lr / div_factor to max_lr over
// the first pct_start of total_steps, then anneals to
// max_lr / (div_factor * final_div_factor); momentum (SGD's momentum,
// AdamW's beta1) moves the other way, max_momentum -> base_momentum ->
// max_momentum. Each phase anneals by cosine (or linearly) from its start
// to its end step, as PyTorch's phase table does; three_phase adds a
// symmetric descent back to the initial rate before the final anneal.
// Stepping past total_steps is an error, as in PyTorch.
#include <cmath>
#include <numbers>

#include "lr_scheduler.hpp"

namespace frugal::optim {

enum class AnnealStrategy { cos, linear };

struct OneCycleLROptions {
  double max_lr = 0;
  std::int64_t total_steps = 0;
  double pct_start = 0.3;
  AnnealStrategy anneal_strategy = AnnealStrategy::cos;
  bool cycle_momentum = true;
  double base_momentum = 0.85;
  double max_momentum = 0.95;
  double div_factor = 25;
  double final_div_factor = 1e4;
  bool three_phase = false;
};

class OneCycleLR final : public LRScheduler {
 public:
  ~OneCycleLR() override;
  OneCycleLR(ScheduledOptimizer& opt, OneCycleLROptions o) : LRScheduler(opt), o_(o) {
    if (o.total_steps < 1) fail("optim::OneCycleLR: total_steps must be at least 1, got ", o.total_steps);
    if (!(o.max_lr > 0) || !std::isfinite(o.max_lr)) fail("optim::OneCycleLR: max_lr must be finite and > 0, got ", o.max_lr);
    if (!(o.pct_start >= 0 && o.pct_start <= 1)) fail("optim::OneCycleLR: pct_start must lie in [0, 1], got ", o.pct_start);
    if (!(o.div_factor > 0) || !(o.final_div_factor > 0))
      fail("optim::OneCycleLR: div_factor and final_div_factor must be > 0, got ", o.div_factor, " and ",
           o.final_div_factor);
    const double initial = o.max_lr / o.div_factor, min_lr = initial / o.final_div_factor;
    const double total = double(o.total_steps), pct = o.pct_start;
    // PyTorch's phase table: {end step, lr from/to, momentum from/to}.
    if (o.three_phase)
      phases_ = {{pct * total - 1, initial, o.max_lr, o.max_momentum, o.base_momentum},
                 {2 * pct * total - 2, o.max_lr, initial, o.base_momentum, o.max_momentum},
                 {total - 1, initial, min_lr, o.max_momentum, o.max_momentum}};
    else
      phases_ = {{pct * total - 1, initial, o.max_lr, o.max_momentum, o.base_momentum},
                 {total - 1, o.max_lr, min_lr, o.base_momentum, o.max_momentum}};
    double begin = 0;
    for (const Phase& p : phases_) {
      if (!(p.end > begin))
        fail("optim::OneCycleLR: total_steps ", o.total_steps, " with pct_start ", o.pct_start,
             " leaves a phase with no steps");
      begin = p.end;
    }
    start();
  }
  // The momentum (beta1) the last step set, if cycle_momentum.
  double last_momentum() const { return momentum_; }

 private:
  struct Phase {
    double end, lr_from, lr_to, m_from, m_to;
  };
  double anneal(double from, double to, double pct) const {
    if (o_.anneal_strategy == AnnealStrategy::linear) return (to - from) * pct + from;
    return to + (from - to) / 2 * (std::cos(std::numbers::pi * pct) + 1);
  }
  // The phase `step` falls in, and how far into it.
  std::pair<const Phase*, double> locate(std::int64_t step) const {
    if (step > o_.total_steps)
      fail("optim::OneCycleLR: tried to step ", step, " times; total_steps is ", o_.total_steps);
    double begin = 0;
    for (std::size_t i = 0; i < phases_.size(); ++i) {
      const Phase& p = phases_[i];
      if (double(step) <= p.end || i + 1 == phases_.size()) return {&p, (double(step) - begin) / (p.end - begin)};
      begin = p.end;
    }
    return {nullptr, 0};  // unreachable: the last phase takes every step
  }
  double lr_at(std::size_t, std::int64_t step) const override {
    auto [p, pct] = locate(step);
    return anneal(p->lr_from, p->lr_to, pct);
  }
  void after_step(std::int64_t step) override {
    if (!o_.cycle_momentum) return;
    auto [p, pct] = locate(step);
    momentum_ = anneal(p->m_from, p->m_to, pct);
    for (std::size_t g = 0; g < opt_.num_groups(); ++g) opt_.set_group_momentum(g, momentum_);
  }

  OneCycleLROptions o_;
  std::vector<Phase> phases_;
  double momentum_ = 0;
};

}  // namespace frugal::optim
