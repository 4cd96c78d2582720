#pragma once
// Step decay, as torch.optim.lr_scheduler.StepLR: the learning rate is
// base_lr * gamma^(epoch / step_size), rounded down.
#include <cmath>

#include "lr_scheduler.hpp"

namespace frugal::optim {

struct StepLROptions {
  std::int64_t step_size = 1;
  double gamma = 0.1;
};

class StepLR final : public LRScheduler {
 public:
  ~StepLR() override;
  StepLR(ScheduledOptimizer& opt, StepLROptions o) : LRScheduler(opt), o_(o) {
    if (o.step_size < 1) fail("optim::StepLR: step_size must be at least 1, got ", o.step_size);
    if (!(o.gamma >= 0) || !std::isfinite(o.gamma)) fail("optim::StepLR: gamma must be finite and >= 0, got ", o.gamma);
    start();
  }

 private:
  double lr_at(std::size_t g, std::int64_t epoch) const override {
    return base_lrs_[g] * std::pow(o_.gamma, double(epoch / o_.step_size));
  }
  StepLROptions o_;
};

}  // namespace frugal::optim
