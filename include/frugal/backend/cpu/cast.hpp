#pragma once
// cast between f32, f64, bf16 and f16: the shared ConvertTo functor over
// every (from, to) pair.
#include "../../ops/cast.hpp"
#include "../../runtime/backend.hpp"
#include "parallel.hpp"

#include "abi.hpp"

namespace frugal::cpu::inline FRUGAL_KERNEL_ABI {

inline void cast_kernel(const ops::Cast& op, const KernelArgs& a) {
  dispatch_storage(a.in[0].dtype, "cast", [&](auto from) {
    using From = decltype(from);
    dispatch_storage(op.to(), "cast", [&](auto to) {
      using To = decltype(to);
      const From* __restrict x = a.in[0].as<From>();
      To* __restrict y = a.out[0].as<To>();
      const math::ConvertTo<To> f{};
      parallel_for(a.in[0].numel(), 2, [&](std::int64_t b, std::int64_t e) {
        for (std::int64_t i = b; i < e; ++i) y[i] = f(x[i]);
      });
    });
  });
}


}  // namespace frugal::cpu
