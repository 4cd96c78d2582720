#pragma once
#include "../../ops/optimizer_updates.hpp"
#include "../../runtime/backend.hpp"
#include "parallel.hpp"

#include "abi.hpp"

namespace frugal::cpu::inline FRUGAL_KERNEL_ABI {

// A guarded update's guard inputs (ops/optimizer_updates.hpp), read at
// in[first..first+2]: whether to skip, 1/scale, and this step's number.
struct GuardValues {
  bool skip = false;
  double inv_scale = 1;
  std::int64_t step = 0;
};
inline GuardValues read_guard(const KernelArgs& a, std::size_t first) {
  return {a.in[first].as<float>()[0] != 0.0f, 1.0 / double(a.in[first + 1].as<float>()[0]),
          a.in[first + 2].as<std::int64_t>()[0] + 1};
}

inline void sgd_kernel(const ops::SgdUpdate& op, const KernelArgs& a) {
  dispatch_float(a.in[0].dtype, "sgd_update", [&](auto tag) {
    using T = decltype(tag);
    T *p = a.in[0].as<T>(), *buf = a.in[2].as<T>();
    const T* g = a.in[1].as<T>();
    if (!op.guarded()) {
      const auto m = op.math<T>();
      parallel_for(a.in[0].numel(), 4, [&](std::int64_t b, std::int64_t e) {
        for (std::int64_t i = b; i < e; ++i) m(p[i], g[i], buf[i]);
      });
      return;
    }
    GuardValues gv = read_guard(a, 3);
    if (gv.skip) return;  // an overflowed step: nothing changes
    const auto m = op.math<T>(gv.step);
    const T inv = T(gv.inv_scale);
    parallel_for(a.in[0].numel(), 4, [&](std::int64_t b, std::int64_t e) {
      for (std::int64_t i = b; i < e; ++i) m(p[i], g[i] * inv, buf[i]);
    });
  });
}

inline void adamw_kernel(const ops::AdamWUpdate& op, const KernelArgs& a) {
  dispatch_float(a.in[0].dtype, "adamw_update", [&](auto tag) {
    using T = decltype(tag);
    T *p = a.in[0].as<T>(), *mo = a.in[2].as<T>(), *v = a.in[3].as<T>();
    const T* g = a.in[1].as<T>();
    if (!op.guarded()) {
      const auto m = op.math<T>();
      parallel_for(a.in[0].numel(), 8, [&](std::int64_t b, std::int64_t e) {
        for (std::int64_t i = b; i < e; ++i) m(p[i], g[i], mo[i], v[i]);
      });
      return;
    }
    GuardValues gv = read_guard(a, 4);
    if (gv.skip) return;
    const auto m = op.math<T>(gv.step);
    const T inv = T(gv.inv_scale);
    parallel_for(a.in[0].numel(), 8, [&](std::int64_t b, std::int64_t e) {
      for (std::int64_t i = b; i < e; ++i) m(p[i], g[i] * inv, mo[i], v[i]);
    });
  });
}


}  // namespace frugal::cpu
