#pragma once
// Gradient accumulation's kernels (ops/accumulation.hpp).
#include <cstring>

#include "../../ops/accumulation.hpp"
#include "../../runtime/backend.hpp"

#include "abi.hpp"
#include "parallel.hpp"

namespace frugal::cpu::inline FRUGAL_KERNEL_ABI {

inline void micro_step_skip_kernel(const ops::MicroStepSkip& op, const KernelArgs& a) {
  const auto k = std::uint64_t(op.micro_steps());
  a.out[0].as<float>()[0] = a.step % k == k - 1 ? 0.0f : 1.0f;
}

// Summed in the gradient's dtype, micro-step by micro-step, then divided by
// k once: the same arithmetic on every rank and in every run.
inline void accumulate_gradient_kernel(const ops::AccumulateGradient& op, const KernelArgs& a) {
  const bool skip = a.in[2].as<float>()[0] != 0.0f;
  dispatch_float(a.in[0].dtype, "accumulate_gradient", [&](auto tag) {
    using T = decltype(tag);
    const T* g = a.in[0].as<T>();
    T* acc = a.in[1].as<T>();
    T* total = a.out[0].as<T>();
    const T k = T(op.micro_steps());
    parallel_for(a.in[0].numel(), 2, [&](std::int64_t b, std::int64_t e) {
      if (skip) {
        for (std::int64_t i = b; i < e; ++i) acc[i] = acc[i] + g[i];
        std::memset(total + b, 0, std::size_t(e - b) * sizeof(T));
      } else {
        for (std::int64_t i = b; i < e; ++i) {
          total[i] = (acc[i] + g[i]) / k;
          acc[i] = T(0);
        }
      }
    });
  });
}

}  // namespace frugal::cpu
