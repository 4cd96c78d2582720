#pragma once
// AdamW and SGD updates through the shared FRUGAL_HD update functors
// (ops/optimizer_updates.hpp): the hyperparameters and bias corrections are
// computed on the host by the op (as for the CPU kernel) and the per-element
// arithmetic is the same code, so with -fmad=false the GPU's update is the
// CPU's, bit for bit. The guarded variants (dynamic loss scaling) are not
// implemented on CUDA yet and say so. bf16/f16 AdamW, with or without f32
// master weights (ops/adamw_master.hpp), reads its 16-bit values into f32
// and rounds on store through the same functors as the CPU.
#include "../../ops/adamw_master.hpp"
#include "../../ops/optimizer_updates.hpp"
#include "launch.cuh"

namespace frugal::cuda {

template <class S, class C>
__global__ void adamw_k(ops::AdamWMath<C> m, S* p, const S* g, S* mo, S* v, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n; i += std::int64_t(gridDim.x) * blockDim.x) {
    C pc = load<C>(p[i]), mc = load<C>(mo[i]), vc = load<C>(v[i]);
    m(pc, load<C>(g[i]), mc, vc);
    p[i] = store<S>(pc), mo[i] = store<S>(mc), v[i] = store<S>(vc);
  }
}
template <class S>
__global__ void adamw16_k(ops::AdamWStorageMath<S> m, S* p, const S* g, S* mo, S* v, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n; i += std::int64_t(gridDim.x) * blockDim.x)
    m(p[i], float(g[i]), mo[i], v[i]);
}
template <class S>
__global__ void adamw_master_k(ops::AdamWMasterMath<S> m, S* p, const S* g, float* w, float* mo, float* v,
                               std::int64_t n) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n; i += std::int64_t(gridDim.x) * blockDim.x)
    m(p[i], float(g[i]), w[i], mo[i], v[i]);
}
template <class S, class C>
__global__ void sgd_k(ops::SgdMomentumMath<C> m, S* p, const S* g, S* buf, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n; i += std::int64_t(gridDim.x) * blockDim.x) {
    C pc = load<C>(p[i]), bc = load<C>(buf[i]);
    m(pc, load<C>(g[i]), bc);
    p[i] = store<S>(pc), buf[i] = store<S>(bc);
  }
}

// Calls fn(S{}) with the storage type of a 16-bit float dtype.
template <class Fn>
void dispatch_16bit(DType t, const std::string& op, Fn&& fn) {
  switch (t) {
    case DType::bf16: fn(BFloat16{}); return;
    case DType::f16: fn(Half{}); return;
    default: fail("cuda: op ", op, " has no kernel for dtype ", dtype_name(t), " (bf16 and f16 are supported)");
  }
}

struct AdamWKernel {
  Context ctx;
  void operator()(const ops::AdamWUpdate& op, const KernelArgs& a) const {
    if (op.guarded()) fail("cuda: ", op.name(), " (dynamic loss scaling) has no CUDA kernel yet; use the cpu backend");
    const std::int64_t n = a.in[0].numel();
    if (n == 0) return;
    if (a.in[0].dtype == DType::bf16 || a.in[0].dtype == DType::f16) {
      dispatch_16bit(a.in[0].dtype, op.name(), [&](auto tag) {
        using S = decltype(tag);
        adamw16_k<<<blocks_for(n), kThreads, 0, ctx.compute>>>(ops::AdamWStorageMath<S>{op.math<float>()}, a.in[0].as<S>(),
                                                               a.in[1].as<const S>(), a.in[2].as<S>(), a.in[3].as<S>(), n);
      });
      check_launch(describe(op, a));
      return;
    }
    dispatch_float(a.in[0].dtype, "adamw_update", [&](auto tag) {
      using T = decltype(tag);
      adamw_k<<<blocks_for(n), kThreads, 0, ctx.compute>>>(op.math<T>(), a.in[0].as<T>(), a.in[1].as<const T>(),
                                                           a.in[2].as<T>(), a.in[3].as<T>(), n);
      check_launch(describe(op, a));
    });
  }
};

struct AdamWMasterKernel {
  Context ctx;
  void operator()(const ops::AdamWMasterUpdate& op, const KernelArgs& a) const {
    if (op.guarded()) fail("cuda: ", op.name(), " (dynamic loss scaling) has no CUDA kernel yet; use the cpu backend");
    const std::int64_t n = a.in[0].numel();
    if (n == 0) return;
    dispatch_16bit(a.in[0].dtype, op.name(), [&](auto tag) {
      using S = decltype(tag);
      adamw_master_k<<<blocks_for(n), kThreads, 0, ctx.compute>>>(op.math<S>(), a.in[0].as<S>(), a.in[1].as<const S>(),
                                                                  a.in[2].as<float>(), a.in[3].as<float>(),
                                                                  a.in[4].as<float>(), n);
    });
    check_launch(describe(op, a));
  }
};

struct SgdKernel {
  Context ctx;
  void operator()(const ops::SgdUpdate& op, const KernelArgs& a) const {
    if (op.guarded()) fail("cuda: ", op.name(), " (dynamic loss scaling) has no CUDA kernel yet; use the cpu backend");
    dispatch_precision(a.in[0].dtype, "sgd_update", [&](auto p) {
      using S = typename decltype(p)::Storage;
      using C = typename decltype(p)::Compute;
      const std::int64_t n = a.in[0].numel();
      if (n == 0) return;
      sgd_k<S, C><<<blocks_for(n), kThreads, 0, ctx.compute>>>(op.math<C>(), a.in[0].as<S>(), a.in[1].as<const S>(),
                                                               a.in[2].as<S>(), n);
      check_launch(describe(op, a));
    });
  }
};

}  // namespace frugal::cuda
