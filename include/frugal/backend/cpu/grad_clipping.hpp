#pragma once
// Gradient clipping's global norm and coefficient (ops/grad_clipping.hpp),
// and the non-finite guard's skip count (ops/skip_count.hpp).
#include <algorithm>
#include <cmath>

#include "../../ops/grad_clipping.hpp"
#include "../../ops/skip_count.hpp"
#include "../../runtime/backend.hpp"
#include "parallel.hpp"

#include "abi.hpp"

namespace frugal::cpu::inline FRUGAL_KERNEL_ABI {

// One f64 sum of squares in element order, serial: its bits cannot depend
// on the thread count, and it is a small part of a step (one read of every
// gradient, beside the optimizer's own).
inline void clip_grad_norm_coef_kernel(const ops::ClipGradNormCoef& op, const KernelArgs& a) {
  double squares = 0;
  for (const TensorRef& g : a.in)
    dispatch_precision(g.dtype, "clip_grad_norm_coef", [&](auto p) {
      using S = typename decltype(p)::Storage;
      using C = typename decltype(p)::Compute;
      const S* x = g.as<S>();
      for (std::int64_t i = 0, n = g.numel(); i < n; ++i) {
        const double v = double(math::convert<C>(x[i]));
        squares += v * v;
      }
    });
  const double total = std::sqrt(squares);
  const double coef = std::min(op.max_norm() / (total + ops::ClipGradNormCoef::kEps), 1.0);  // NaN stays NaN
  a.out[0].as<float>()[0] = float(total);
  a.out[1].as<float>()[0] = float(coef);
}

inline void count_skipped_step_kernel(const ops::CountSkippedStep&, const KernelArgs& a) {
  std::int64_t* stats = a.in[0].as<std::int64_t>();
  const bool skipped = a.in[1].as<float>()[0] != 0.0f;
  stats[1] = skipped ? 1 : 0;
  if (skipped) ++stats[0];
}

}  // namespace frugal::cpu
