#pragma once
// Sum over axes and broadcast_to. Sums accumulate in f64 in a fixed order
// (no atomics): per output, the reduced elements are added one after another
// as on the CPU, or, for long rows, by a fixed set of threads whose partial
// sums meet in a fixed tree. Either way every run gives the same bits.
#include "../../ops/reduce.hpp"
#include "elementwise.cuh"

namespace frugal::cuda {

// The input viewed as [O, R, I] (the reduced axes one contiguous block).
template <class S>
__global__ void sum_columns_k(const S* x, S* y, std::int64_t O, std::int64_t R, std::int64_t I) {
  const std::int64_t n = O * I;
  for (std::int64_t t = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; t < n; t += std::int64_t(gridDim.x) * blockDim.x) {
    const std::int64_t o = t / I, i = t % I;
    double acc = 0;
    for (std::int64_t r = 0; r < R; ++r) acc += math::convert<double>(x[(o * R + r) * I + i]);
    y[t] = math::convert<S>(acc);
  }
}

// I == 1 and long rows: one block per output row, kThreads partial sums.
template <class S>
__global__ void sum_rows_k(const S* x, S* y, std::int64_t R) {
  __shared__ double part[kThreads];
  const S* row = x + blockIdx.x * R;
  double acc = 0;
  for (std::int64_t r = threadIdx.x; r < R; r += kThreads) acc += math::convert<double>(row[r]);
  part[threadIdx.x] = acc;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (int(threadIdx.x) < half) part[threadIdx.x] += part[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) y[blockIdx.x] = math::convert<S>(part[0]);
}

// Scattered axes: each output walks its reduced sub-box (as on the CPU).
struct SumAxes {
  int rank = 0;
  std::uint32_t mask = 0;
  std::int64_t dims[kMaxRank] = {}, strides[kMaxRank] = {};
};
template <class S>
__global__ void sum_scattered_k(const S* x, S* y, SumAxes s, std::int64_t kept_n, std::int64_t red_n) {
  for (std::int64_t o = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; o < kept_n; o += std::int64_t(gridDim.x) * blockDim.x) {
    std::int64_t base = 0, rem = o;
    for (int d = s.rank - 1; d >= 0; --d)
      if (!((s.mask >> d) & 1)) {
        base += (rem % s.dims[d]) * s.strides[d];
        rem /= s.dims[d];
      }
    double acc = 0;
    for (std::int64_t r = 0; r < red_n; ++r) {
      std::int64_t off = 0, q = r;
      for (int d = s.rank - 1; d >= 0; --d)
        if ((s.mask >> d) & 1) {
          off += (q % s.dims[d]) * s.strides[d];
          q /= s.dims[d];
        }
      acc += math::convert<double>(x[base + off]);
    }
    y[o] = math::convert<S>(acc);
  }
}

struct SumKernel {
  Context ctx;
  // Rows longer than this get a block each; shorter ones a thread each.
  static constexpr std::int64_t kLongRow = 2048;
  void operator()(const ops::Sum& op, const KernelArgs& a) const {
    const std::string what = describe(op, a);
    dispatch_precision(a.in[0].dtype, "sum", [&](auto p) {
      using S = typename decltype(p)::Storage;
      const Shape& s = *a.in[0].shape;
      if (s.rank() > kMaxRank) fail("cuda: ", what, ": rank above ", kMaxRank);
      const S* x = a.in[0].as<const S>();
      S* y = a.out[0].as<S>();
      const std::uint32_t mask = op.axes_mask(s);
      const std::int64_t n_out = a.out[0].numel();
      if (n_out == 0) return;
      if (mask == 0 || s.numel() == 0) {
        if (mask == 0) {
          check(cudaMemcpyAsync(y, x, std::size_t(s.numel()) * sizeof(S), cudaMemcpyDeviceToDevice, ctx.compute),
                "cudaMemcpyAsync (" + what + ")");
        } else {
          check(cudaMemsetAsync(y, 0, std::size_t(n_out) * sizeof(S), ctx.compute), "cudaMemsetAsync (" + what + ")");
        }
        return;
      }
      int lo = 0, hi = 0;
      for (int d = 0; d < 32; ++d)
        if ((mask >> d) & 1) hi = d;
      for (int d = 31; d >= 0; --d)
        if ((mask >> d) & 1) lo = d;
      int bits = 0;
      for (int d = 0; d < 32; ++d) bits += (mask >> d) & 1;
      if (bits == hi - lo + 1) {
        std::int64_t O = 1, R = 1, I = 1;
        for (int d = 0; d < s.rank(); ++d) (d < lo ? O : d <= hi ? R : I) *= s[d];
        if (I == 1 && R > kLongRow) {
          if (O > 2147483647) fail("cuda: ", what, ": too many rows for one grid");
          sum_rows_k<<<unsigned(O), kThreads, 0, ctx.compute>>>(x, y, R);
        } else {
          sum_columns_k<<<blocks_for(O * I), kThreads, 0, ctx.compute>>>(x, y, O, R, I);
        }
        check_launch(what);
        return;
      }
      SumAxes ax;
      ax.rank = s.rank();
      ax.mask = mask;
      std::int64_t stride = 1, kept_n = 1, red_n = 1;
      for (int d = s.rank() - 1; d >= 0; --d) {
        ax.dims[d] = s[d];
        ax.strides[d] = stride;
        stride *= s[d];
        ((mask >> d) & 1 ? red_n : kept_n) *= s[d];
      }
      sum_scattered_k<<<blocks_for(kept_n), kThreads, 0, ctx.compute>>>(x, y, ax, kept_n, red_n);
      check_launch(what);
    });
  }
};

template <class S>
__global__ void broadcast_k(Broadcast b, const S* x, S* y, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n; i += std::int64_t(gridDim.x) * blockDim.x) {
    std::int64_t ix = 0, rest = i;
    for (int d = b.rank - 1; d >= 0; --d) {
      ix += (rest % b.out[d]) * b.sx[d];
      rest /= b.out[d];
    }
    y[i] = x[ix];
  }
}

struct BroadcastKernel {
  Context ctx;
  void operator()(const ops::BroadcastTo& op, const KernelArgs& a) const {
    const std::string what = describe(op, a);
    dispatch_precision(a.in[0].dtype, "broadcast_to", [&](auto p) {
      using S = typename decltype(p)::Storage;
      const Shape& out = *a.out[0].shape;
      const std::int64_t n = out.numel();
      if (n == 0) return;
      const Broadcast b = broadcast_of(*a.in[0].shape, *a.in[0].shape, out, what);
      broadcast_k<<<blocks_for(n), kThreads, 0, ctx.compute>>>(b, a.in[0].as<const S>(), a.out[0].as<S>(), n);
      check_launch(what);
    });
  }
};

}  // namespace frugal::cuda
