#pragma once
// Cosine annealing, as torch.optim.lr_scheduler.CosineAnnealingLR (the
// closed form, no restarts): eta_min + (base_lr - eta_min) * (1 + cos(pi *
// epoch / T_max)) / 2. With warmup_iters > 0 it is PyTorch's
//
//   SequentialLR(opt, [LinearLR(opt, start_factor = warmup_start_factor,
//                               total_iters = warmup_iters),
//                      CosineAnnealingLR(opt, T_max, eta_min)],
//                milestones = [warmup_iters])
//
// a linear warm-up from base_lr * warmup_start_factor, then the cosine
// counted from the end of the warm-up (T_max epochs after it).
#include <cmath>
#include <numbers>

#include "lr_scheduler.hpp"

namespace frugal::optim {

struct CosineAnnealingLROptions {
  std::int64_t T_max = 0;  // epochs from base_lr down to eta_min (after any warm-up)
  double eta_min = 0;
  std::int64_t warmup_iters = 0;
  double warmup_start_factor = 1.0 / 3;
};

class CosineAnnealingLR final : public LRScheduler {
 public:
  ~CosineAnnealingLR() override;
  CosineAnnealingLR(ScheduledOptimizer& opt, CosineAnnealingLROptions o) : LRScheduler(opt), o_(o) {
    if (o.T_max < 1) fail("optim::CosineAnnealingLR: T_max must be at least 1, got ", o.T_max);
    if (!(o.eta_min >= 0) || !std::isfinite(o.eta_min))
      fail("optim::CosineAnnealingLR: eta_min must be finite and >= 0, got ", o.eta_min);
    if (o.warmup_iters < 0) fail("optim::CosineAnnealingLR: warmup_iters cannot be negative, got ", o.warmup_iters);
    if (!(o.warmup_start_factor > 0 && o.warmup_start_factor <= 1))
      fail("optim::CosineAnnealingLR: warmup_start_factor must lie in (0, 1], got ", o.warmup_start_factor);
    start();
  }

 private:
  double lr_at(std::size_t g, std::int64_t epoch) const override {
    const double base = base_lrs_[g];
    if (epoch < o_.warmup_iters)
      return base * (o_.warmup_start_factor + (1 - o_.warmup_start_factor) * double(epoch) / double(o_.warmup_iters));
    const double t = double(epoch - o_.warmup_iters);
    return o_.eta_min + (base - o_.eta_min) * (1 + std::cos(std::numbers::pi * t / double(o_.T_max))) / 2;
  }
  CosineAnnealingLROptions o_;
};

}  // namespace frugal::optim
