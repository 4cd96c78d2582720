#pragma once
// Linear warm-up (or decay), as torch.optim.lr_scheduler.LinearLR: the
// learning rate is base_lr * factor, the factor going linearly from
// start_factor to end_factor over total_iters epochs and then staying.
#include <algorithm>

#include "lr_scheduler.hpp"

namespace frugal::optim {

struct LinearLROptions {
  double start_factor = 1.0 / 3;
  double end_factor = 1.0;
  std::int64_t total_iters = 5;
};

class LinearLR final : public LRScheduler {
 public:
  ~LinearLR() override;
  LinearLR(ScheduledOptimizer& opt, LinearLROptions o = {}) : LRScheduler(opt), o_(o) {
    if (!(o.start_factor > 0 && o.start_factor <= 1))
      fail("optim::LinearLR: start_factor must lie in (0, 1], got ", o.start_factor);
    if (!(o.end_factor >= 0 && o.end_factor <= 1))
      fail("optim::LinearLR: end_factor must lie in [0, 1], got ", o.end_factor);
    if (o.total_iters < 1) fail("optim::LinearLR: total_iters must be at least 1, got ", o.total_iters);
    start();
  }

 private:
  double lr_at(std::size_t g, std::int64_t epoch) const override {
    const double done = double(std::min(o_.total_iters, epoch)) / double(o_.total_iters);
    return base_lrs_[g] * (o_.start_factor + (o_.end_factor - o_.start_factor) * done);
  }
  LinearLROptions o_;
};

}  // namespace frugal::optim
