#pragma once
// softmax / log_softmax along one axis and their gradients, viewed as
// [outer, n, inner]: one thread per (outer, inner) line, summing in index
// order as the CPU does, so the two differ only in the last bits of
// expf/logf. bf16/f16 lines are computed in f32 and rounded once on store.
// (A warp or block per long line is left for the attention work.)
#include "../../ops/softmax.hpp"
#include "launch.cuh"

namespace frugal::cuda {

template <class S, class C, bool Log>
__global__ void softmax_k(const S* x, S* y, AxisView v) {
  const std::int64_t lines = v.outer * v.inner;
  for (std::int64_t t = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; t < lines; t += std::int64_t(gridDim.x) * blockDim.x) {
    const std::int64_t base = (t / v.inner) * v.n * v.inner + t % v.inner, st = v.inner;
    const S* xl = x + base;
    S* yl = y + base;
    C mx = load<C>(xl[0]);
    for (std::int64_t j = 1; j < v.n; ++j) mx = max(mx, load<C>(xl[j * st]));
    C s = 0;
    for (std::int64_t j = 0; j < v.n; ++j) s += math::exp_(load<C>(xl[j * st]) - mx);
    if constexpr (Log) {
      const C lse = mx + math::log_(s);
      for (std::int64_t j = 0; j < v.n; ++j) yl[j * st] = store<S>(C(load<C>(xl[j * st]) - lse));
    } else {
      const C inv = C(1) / s;
      for (std::int64_t j = 0; j < v.n; ++j) yl[j * st] = store<S>(C(math::exp_(load<C>(xl[j * st]) - mx) * inv));
    }
  }
}

template <class S, class C, bool Log>
__global__ void softmax_grad_k(const S* y, const S* dy, S* dx, AxisView v) {
  const std::int64_t lines = v.outer * v.inner;
  for (std::int64_t t = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; t < lines; t += std::int64_t(gridDim.x) * blockDim.x) {
    const std::int64_t base = (t / v.inner) * v.n * v.inner + t % v.inner, st = v.inner;
    C dot = 0;
    for (std::int64_t j = 0; j < v.n; ++j) dot += Log ? load<C>(dy[base + j * st]) : load<C>(dy[base + j * st]) * load<C>(y[base + j * st]);
    for (std::int64_t j = 0; j < v.n; ++j) {
      const C yv = load<C>(y[base + j * st]), gv = load<C>(dy[base + j * st]);
      dx[base + j * st] = store<S>(Log ? C(gv - math::exp_(yv) * dot) : C(yv * (gv - dot)));
    }
  }
}

template <class OpT, bool Log>
struct SoftmaxKernel {
  Context ctx;
  void operator()(const OpT& op, const KernelArgs& a) const {
    dispatch_precision(a.in[0].dtype, Log ? "log_softmax" : "softmax", [&](auto p) {
      using S = typename decltype(p)::Storage;
      using C = typename decltype(p)::Compute;
      const Shape& s = *a.in[0].shape;
      if (s.numel() == 0) return;
      const AxisView v = axis_view(s, op.axis_for(s));
      softmax_k<S, C, Log><<<blocks_for(v.outer * v.inner), kThreads, 0, ctx.compute>>>(a.in[0].as<const S>(), a.out[0].as<S>(), v);
      check_launch(describe(op, a));
    });
  }
};

template <class OpT, bool Log>
struct SoftmaxGradKernel {
  Context ctx;
  void operator()(const OpT& op, const KernelArgs& a) const {
    dispatch_precision(a.in[0].dtype, Log ? "log_softmax_grad" : "softmax_grad", [&](auto p) {
      using S = typename decltype(p)::Storage;
      using C = typename decltype(p)::Compute;
      const Shape& s = *a.in[0].shape;
      if (s.numel() == 0) return;
      const AxisView v = axis_view(s, op.axis_for(s));
      softmax_grad_k<S, C, Log><<<blocks_for(v.outer * v.inner), kThreads, 0, ctx.compute>>>(
          a.in[0].as<const S>(), a.in[1].as<const S>(), a.out[0].as<S>(), v);
      check_launch(describe(op, a));
    });
  }
};

// out[i] = in[the input index of output i]; data movement by element size.
struct PermuteAxes {
  int rank = 0;
  std::int64_t out[8] = {}, src[8] = {};  // src[d]: input stride of output axis d
};
template <class T>
__global__ void permute_k(const T* x, T* y, PermuteAxes p, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n; i += std::int64_t(gridDim.x) * blockDim.x) {
    std::int64_t off = 0, rest = i;
    for (int d = p.rank - 1; d >= 0; --d) {
      off += (rest % p.out[d]) * p.src[d];
      rest /= p.out[d];
    }
    y[i] = x[off];
  }
}

struct PermuteKernel {
  Context ctx;
  void operator()(const ops::Permute& op, const KernelArgs& a) const {
    const std::string what = describe(op, a);
    const Shape &in = *a.in[0].shape, &out = *a.out[0].shape;
    if (in.rank() > 8) fail("cuda: ", what, ": rank above 8");
    const std::int64_t n = out.numel();
    if (n == 0) return;
    PermuteAxes p;
    p.rank = out.rank();
    std::int64_t ist[8] = {}, stride = 1;
    for (int d = in.rank() - 1; d >= 0; --d) ist[d] = stride, stride *= in[d];
    for (int d = 0; d < out.rank(); ++d) p.out[d] = out[d], p.src[d] = ist[op.perm()[std::size_t(d)]];
    auto launch = [&](auto tag) {
      using T = decltype(tag);
      permute_k<T><<<blocks_for(n), kThreads, 0, ctx.compute>>>(a.in[0].as<const T>(), a.out[0].as<T>(), p, n);
    };
    switch (dtype_size(a.in[0].dtype)) {
      case 1: launch(std::uint8_t{}); break;
      case 2: launch(std::uint16_t{}); break;
      case 4: launch(std::uint32_t{}); break;
      case 8: launch(std::uint64_t{}); break;
      default: fail("cuda: permute cannot move elements of dtype ", dtype_name(a.in[0].dtype));
    }
    check_launch(what);
  }
};

}  // namespace frugal::cuda
