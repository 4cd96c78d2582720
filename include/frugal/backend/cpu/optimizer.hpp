#pragma once
#include "../../ops/optimizer_updates.hpp"
#include "kernel_table.hpp"
#include "parallel.hpp"

namespace frugal::cpu {

inline void sgd_kernel(const ops::SgdUpdate& op, const KernelArgs& a) {
  dispatch_float(a.in[0].dtype, "sgd_update", [&](auto tag) {
    using T = decltype(tag);
    T *p = a.in[0].as<T>(), *buf = a.in[2].as<T>();
    const T* g = a.in[1].as<T>();
    const auto m = op.math<T>();
    parallel_for(a.in[0].numel(), 4, [&](std::int64_t b, std::int64_t e) {
      for (std::int64_t i = b; i < e; ++i) m(p[i], g[i], buf[i]);
    });
  });
}

inline void adamw_kernel(const ops::AdamWUpdate& op, const KernelArgs& a) {
  dispatch_float(a.in[0].dtype, "adamw_update", [&](auto tag) {
    using T = decltype(tag);
    T *p = a.in[0].as<T>(), *mo = a.in[2].as<T>(), *v = a.in[3].as<T>();
    const T* g = a.in[1].as<T>();
    const auto m = op.math<T>();
    parallel_for(a.in[0].numel(), 8, [&](std::int64_t b, std::int64_t e) {
      for (std::int64_t i = b; i < e; ++i) m(p[i], g[i], mo[i], v[i]);
    });
  });
}

inline const bool optimizer_registered =
    kernels().add<ops::SgdUpdate>(sgd_kernel) && kernels().add<ops::AdamWUpdate>(adamw_kernel);

}  // namespace frugal::cpu
