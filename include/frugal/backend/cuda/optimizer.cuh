#pragma once
// AdamW and SGD updates through the shared FRUGAL_HD update functors
// (ops/optimizer_updates.hpp): the hyperparameters and bias corrections are
// computed on the host by the op (as for the CPU kernel) and the per-element
// arithmetic is the same code, so with -fmad=false the GPU's update is the
// CPU's, bit for bit. The guarded variants (dynamic loss scaling) are not
// implemented on CUDA yet and say so.
#include "../../ops/optimizer_updates.hpp"
#include "launch.cuh"

namespace frugal::cuda {

template <class T>
__global__ void adamw_k(ops::AdamWMath<T> m, T* p, const T* g, T* mo, T* v, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n; i += std::int64_t(gridDim.x) * blockDim.x)
    m(p[i], g[i], mo[i], v[i]);
}
template <class T>
__global__ void sgd_k(ops::SgdMomentumMath<T> m, T* p, const T* g, T* buf, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n; i += std::int64_t(gridDim.x) * blockDim.x)
    m(p[i], g[i], buf[i]);
}

struct AdamWKernel {
  Context ctx;
  void operator()(const ops::AdamWUpdate& op, const KernelArgs& a) const {
    if (op.guarded()) fail("cuda: ", op.name(), " (dynamic loss scaling) has no CUDA kernel yet; use the cpu backend");
    dispatch_float(a.in[0].dtype, "adamw_update", [&](auto tag) {
      using T = decltype(tag);
      const std::int64_t n = a.in[0].numel();
      if (n == 0) return;
      adamw_k<<<blocks_for(n), kThreads, 0, ctx.compute>>>(op.math<T>(), a.in[0].as<T>(), a.in[1].as<const T>(),
                                                           a.in[2].as<T>(), a.in[3].as<T>(), n);
      check_launch(describe(op, a));
    });
  }
};

struct SgdKernel {
  Context ctx;
  void operator()(const ops::SgdUpdate& op, const KernelArgs& a) const {
    if (op.guarded()) fail("cuda: ", op.name(), " (dynamic loss scaling) has no CUDA kernel yet; use the cpu backend");
    dispatch_float(a.in[0].dtype, "sgd_update", [&](auto tag) {
      using T = decltype(tag);
      const std::int64_t n = a.in[0].numel();
      if (n == 0) return;
      sgd_k<<<blocks_for(n), kThreads, 0, ctx.compute>>>(op.math<T>(), a.in[0].as<T>(), a.in[1].as<const T>(),
                                                         a.in[2].as<T>(), n);
      check_launch(describe(op, a));
    });
  }
};

}  // namespace frugal::cuda
