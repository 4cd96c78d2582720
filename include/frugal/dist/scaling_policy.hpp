#pragma once
// How an elastic job (dist/elastic.hpp) batches at each rank count: the
// global batch stays the same and each rank's share changes with the rank
// count, as long as the count divides it within the most a rank's step
// takes; otherwise the global batch becomes the nearest multiple of the
// rank count, and the learning rate is scaled by the square-root rule for
// Adam-type optimizers (Malladi et al., "On the SDEs and Scaling Rules for
// Adaptive Gradient Algorithms", 2022) or the linear rule for SGD (Goyal
// et al., "Accurate, Large Minibatch SGD", 2017).
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "../core/error.hpp"

namespace frugal::dist {

struct ScalingPolicy {
  std::int64_t global_batch = 0;             // samples per step, kept while the rank count allows
  std::int64_t max_rank_batch = 0;           // most samples one rank's step takes (0: no limit)
  enum class LrRule { sqrt, linear, none };  // none: the same learning rate at any global batch
  LrRule lr_rule = LrRule::sqrt;

  struct At {
    std::int64_t rank_batch = 0, global_batch = 0;
    double lr_scale = 1;  // the learning rate's factor against the one for global_batch
  };
  At at(int ranks) const {
    if (global_batch <= 0) fail("ScalingPolicy: global_batch must be positive, got ", global_batch);
    if (ranks < 1) fail("ScalingPolicy: ", ranks, " ranks");
    const std::int64_t most = max_rank_batch > 0 ? max_rank_batch : global_batch;
    if (global_batch % ranks == 0 && global_batch / ranks <= most) return {global_batch / ranks, global_batch, 1.0};
    const std::int64_t b = std::clamp<std::int64_t>(std::llround(double(global_batch) / double(ranks)), 1, most);
    const double ratio = double(b * ranks) / double(global_batch);
    return {b, b * ranks, lr_rule == LrRule::linear ? ratio : lr_rule == LrRule::sqrt ? std::sqrt(ratio) : 1.0};
  }
};

}  // namespace frugal::dist
