#pragma once
// Dropout and its backward: one kernel, the mask regenerated from
// (key, step, element) by Philox, one block per four elements.
#include "../../ops/cast.hpp"
#include "../../ops/dropout.hpp"
#include "../../runtime/backend.hpp"
#include "parallel.hpp"

#include "abi.hpp"

namespace frugal::cpu::inline FRUGAL_KERNEL_ABI {

// y may be x (in place): element i is read before it is written. bf16/f16
// are scaled in f32 and rounded once on store, so a kept element is
// round(x / (1 - p)), as PyTorch's bf16 dropout computes it.
inline void dropout_kernel(const ops::DropoutOp& op, const KernelArgs& a) {
  dispatch_precision(a.in[0].dtype, op.name().c_str(), [&](auto prec) {
    using S = typename decltype(prec)::Storage;
    using T = typename decltype(prec)::Compute;
    const S* x = a.in[0].as<S>();
    S* y = a.out[0].as<S>();
    const std::int64_t n = a.in[0].numel();
    // A dropped element is x * 0, not 0, as PyTorch's input * mask * scale:
    // a NaN stays NaN (and -x gives -0), so dropout never hides a NaN.
    if (op.p() >= 1) {  // everything dropped; 1 / (1 - p) would be infinite
      parallel_for(n, 1, [&](std::int64_t b, std::int64_t e) {
        for (std::int64_t i = b; i < e; ++i) y[i] = math::convert<S>(math::convert<T>(x[i]) * T(0));
      });
      return;
    }
    const ops::DropoutMask mask(op.key(), op.p());
    const T scale = T(1.0 / (1.0 - op.p()));
    const std::uint64_t step = a.step;
    parallel_for((n + 3) / 4, 64, [&](std::int64_t g0, std::int64_t g1) {
      for (std::int64_t g = g0; g < g1; ++g) {
        const Philox::Block bits = mask.bits(step, std::uint64_t(g));
        const std::int64_t i0 = 4 * g, w = std::min<std::int64_t>(4, n - i0);
        for (std::int64_t l = 0; l < w; ++l)
          y[i0 + l] = math::convert<S>(math::convert<T>(x[i0 + l]) * (mask.keep(bits.v[l]) ? scale : T(0)));
      }
    });
  });
}

}  // namespace frugal::cpu
