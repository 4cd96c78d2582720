#pragma once
// Elementwise kernels over the shared FRUGAL_HD functors
// (ops/elementwise_math.hpp): the arithmetic is the CPU's, one definition
// for both backends. Each output element is computed by one thread from its
// own inputs only, so results do not depend on the launch shape.
#include "../../ops/binary.hpp"
#include "../../ops/fill.hpp"
#include "../../ops/pointwise.hpp"
#include "../../ops/shape_ops.hpp"
#include "../../ops/unary.hpp"
#include "launch.cuh"

namespace frugal::cuda {

template <class S, class C, class F>
__global__ void unary_k(F f, const S* x, S* y, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n; i += std::int64_t(gridDim.x) * blockDim.x)
    y[i] = store<S>(f(load<C>(x[i])));
}

// dx = f.grad(x, y, dy); an input F does not read is passed as dy (as on the CPU).
template <class S, class C, class F>
__global__ void unary_grad_k(F f, const S* x, const S* y, const S* dy, S* dx, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n; i += std::int64_t(gridDim.x) * blockDim.x) {
    const C d = load<C>(dy[i]);
    const C xv = F::uses_x ? load<C>(x[i]) : d, yv = F::uses_y ? load<C>(y[i]) : d;
    dx[i] = store<S>(f.grad(xv, yv, d));
  }
}

template <class F>
struct UnaryKernel {
  Context ctx;
  void operator()(const ops::Unary<F>& op, const KernelArgs& a) const {
    dispatch_precision(a.in[0].dtype, F::name, [&](auto p) {
      using S = typename decltype(p)::Storage;
      using C = typename decltype(p)::Compute;
      const std::int64_t n = a.in[0].numel();
      if (n == 0) return;
      unary_k<S, C><<<blocks_for(n), kThreads, 0, ctx.compute>>>(op.functor(), a.in[0].as<const S>(), a.out[0].as<S>(), n);
      check_launch(describe(op, a));
    });
  }
};

template <class F>
struct UnaryGradKernel {
  Context ctx;
  void operator()(const ops::UnaryGrad<F>& op, const KernelArgs& a) const {
    dispatch_precision(a.in[0].dtype, F::name, [&](auto p) {
      using S = typename decltype(p)::Storage;
      using C = typename decltype(p)::Compute;
      const std::int64_t n = a.in[0].numel();
      if (n == 0) return;
      unary_grad_k<S, C><<<blocks_for(n), kThreads, 0, ctx.compute>>>(
          op.functor(), a.in[0].as<const S>(), a.in[1].as<const S>(), a.in[2].as<const S>(), a.out[0].as<S>(), n);
      check_launch(describe(op, a));
    });
  }
};

// Strides of an operand broadcast to the output's shape (0 along stretched
// axes), for up to kMaxRank axes, passed by value to the kernel.
inline constexpr int kMaxRank = 8;
struct Broadcast {
  int rank = 0;
  std::int64_t out[kMaxRank] = {}, sx[kMaxRank] = {}, sz[kMaxRank] = {};
};
inline Broadcast broadcast_of(const Shape& x, const Shape& z, const Shape& out, const std::string& op) {
  if (out.rank() > kMaxRank) fail("cuda: ", op, ": rank ", out.rank(), " is above the ", kMaxRank, " this kernel takes");
  Broadcast b;
  b.rank = out.rank();
  auto strides = [&](const Shape& s, std::int64_t* st) {
    std::int64_t stride = 1;
    for (int d = out.rank() - 1; d >= 0; --d) {
      const int sd = d - (out.rank() - s.rank());
      if (sd < 0) continue;
      st[d] = s[sd] == 1 ? 0 : stride;
      stride *= s[sd];
    }
  };
  for (int d = 0; d < out.rank(); ++d) b.out[d] = out[d];
  strides(x, b.sx);
  strides(z, b.sz);
  return b;
}

template <class S, class C, class F>
__global__ void binary_k(F f, Broadcast b, const S* x, const S* z, S* y, std::int64_t n, bool same) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n; i += std::int64_t(gridDim.x) * blockDim.x) {
    std::int64_t ix = i, iz = i;
    if (!same) {
      ix = iz = 0;
      std::int64_t rest = i;
      for (int d = b.rank - 1; d >= 0; --d) {
        const std::int64_t k = rest % b.out[d];
        rest /= b.out[d];
        ix += k * b.sx[d];
        iz += k * b.sz[d];
      }
    }
    y[i] = store<S>(f(load<C>(x[ix]), load<C>(z[iz])));
  }
}

template <class F>
struct BinaryKernel {
  Context ctx;
  void operator()(const ops::Binary<F>& op, const KernelArgs& a) const {
    dispatch_precision(a.in[0].dtype, F::name, [&](auto p) {
      using S = typename decltype(p)::Storage;
      using C = typename decltype(p)::Compute;
      const Shape& out = *a.out[0].shape;
      const std::int64_t n = out.numel();
      if (n == 0) return;
      const bool same = *a.in[0].shape == out && *a.in[1].shape == out;
      const Broadcast b = same ? Broadcast{} : broadcast_of(*a.in[0].shape, *a.in[1].shape, out, op.name());
      binary_k<S, C><<<blocks_for(n), kThreads, 0, ctx.compute>>>(F{}, b, a.in[0].as<const S>(), a.in[1].as<const S>(),
                                                                   a.out[0].as<S>(), n, same);
      check_launch(describe(op, a));
    });
  }
};

template <class S>
__global__ void fill_k(S v, S* y, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n; i += std::int64_t(gridDim.x) * blockDim.x)
    y[i] = v;
}

struct FillKernel {
  Context ctx;
  void operator()(const ops::FillLike& op, const KernelArgs& a) const {
    dispatch_precision(a.out[0].dtype, "fill_like", [&](auto p) {
      using S = typename decltype(p)::Storage;
      using C = typename decltype(p)::Compute;
      const std::int64_t n = a.out[0].numel();
      if (n == 0) return;
      // Rounded on the host as the CPU rounds it (once, to nearest even).
      const S v = math::convert<S>(op.value());
      fill_k<<<blocks_for(n), kThreads, 0, ctx.compute>>>(v, a.out[0].as<S>(), n);
      check_launch(describe(op, a));
    });
  }
};

// A reshape moves no element: a device-to-device copy unless it runs in place.
struct ReshapeKernel {
  Context ctx;
  void operator()(const ops::Reshape& op, const KernelArgs& a) const {
    const std::size_t bytes = std::size_t(a.in[0].numel()) * dtype_size(a.in[0].dtype);
    if (a.out[0].data == a.in[0].data || bytes == 0) return;
    check(cudaMemcpyAsync(a.out[0].data, a.in[0].data, bytes, cudaMemcpyDeviceToDevice, ctx.compute),
          "cudaMemcpyAsync (" + describe(op, a) + ")");
  }
};

template <class... F>
void add_unary_kernels(KernelTable& t, const Context& ctx, ops::FunctorList<F...>) {
  (t.add<ops::Unary<F>>(UnaryKernel<F>{ctx}), ...);
  (t.add<ops::UnaryGrad<F>>(UnaryGradKernel<F>{ctx}), ...);
}
template <class... F>
void add_binary_kernels(KernelTable& t, const Context& ctx, ops::FunctorList<F...>) {
  (t.add<ops::Binary<F>>(BinaryKernel<F>{ctx}), ...);
}

}  // namespace frugal::cuda

namespace frugal::cuda {

template <class From, class To>
__global__ void cast_k(const From* x, To* y, std::int64_t n) {
  const math::ConvertTo<To> f{};
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n; i += std::int64_t(gridDim.x) * blockDim.x)
    y[i] = f(x[i]);
}

// The CPU's conversion functor (ops/cast.hpp), so both round alike.
struct CastKernel {
  Context ctx;
  void operator()(const ops::Cast& op, const KernelArgs& a) const {
    dispatch_precision(a.in[0].dtype, "cast", [&](auto from) {
      dispatch_precision(op.to(), "cast", [&](auto to) {
        using From = typename decltype(from)::Storage;
        using To = typename decltype(to)::Storage;
        const std::int64_t n = a.in[0].numel();
        if (n == 0) return;
        cast_k<<<blocks_for(n), kThreads, 0, ctx.compute>>>(a.in[0].as<const From>(), a.out[0].as<To>(), n);
        check_launch(describe(op, a));
      });
    });
  }
};

}  // namespace frugal::cuda
