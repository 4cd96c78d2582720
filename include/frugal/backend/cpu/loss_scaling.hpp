#pragma once
// Dynamic loss scaling: the overflow check over all gradients, the scale
// update and the guarded optimizers' step count (ops/loss_scaling.hpp).
#include <cmath>

#include "../../ops/loss_scaling.hpp"
#include "../../runtime/backend.hpp"
#include "parallel.hpp"

#include "abi.hpp"

namespace frugal::cpu::inline FRUGAL_KERNEL_ABI {

inline void non_finite_check_kernel(const ops::NonFiniteCheck&, const KernelArgs& a) {
  const double inv = 1.0 / double(a.in[0].as<float>()[0]);
  bool found = false;
  for (std::size_t k = 1; k < a.in.size() && !found; ++k) {
    dispatch_precision(a.in[k].dtype, "non_finite_check", [&](auto p) {
      using S = typename decltype(p)::Storage;
      using C = typename decltype(p)::Compute;
      const S* g = a.in[k].as<S>();
      const C s = C(inv), zero = C(0);
      // (g / scale) * 0 is 0 for a finite quotient and NaN otherwise, so one
      // branch-free sum per chunk tells whether any element overflowed.
      double flag = parallel_sum(a.in[k].numel(), 1, [&](std::int64_t b, std::int64_t e) {
        C acc = 0;
        for (std::int64_t i = b; i < e; ++i) acc += math::convert<C>(g[i]) * s * zero;
        return double(acc);
      });
      found = flag != 0.0;  // NaN != 0
    });
  }
  a.out[0].as<float>()[0] = found ? 1.0f : 0.0f;
}

inline void update_loss_scale_kernel(const ops::UpdateLossScale& op, const KernelArgs& a) {
  float& scale = a.in[0].as<float>()[0];
  std::int32_t& good_steps = a.in[1].as<std::int32_t>()[0];
  std::int64_t* stats = a.in[2].as<std::int64_t>();
  const bool found = a.in[3].as<float>()[0] != 0.0f;
  const ops::LossScaleHyper& h = op.hyper();
  stats[1] = found ? 1 : 0;
  if (found) {
    scale = float(double(scale) * h.backoff_factor);
    good_steps = 0;
    ++stats[0];
    return;
  }
  if (std::int64_t(good_steps) + 1 >= h.growth_interval) {
    float grown = float(double(scale) * h.growth_factor);
    if (std::isfinite(grown)) scale = grown;
    good_steps = 0;
  } else {
    ++good_steps;
  }
}

inline void advance_step_count_kernel(const ops::AdvanceStepCount&, const KernelArgs& a) {
  if (a.in[1].as<float>()[0] == 0.0f) ++a.in[0].as<std::int64_t>()[0];
}


}  // namespace frugal::cpu
