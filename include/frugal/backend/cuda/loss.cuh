#pragma once
// Cross-entropy with integer labels: one warp per position (max, sum of
// exponentials, each in a fixed shuffle tree), the per-position losses in
// the op's planned workspace, then one block sums them in a fixed order. A
// label outside [0, C) is flagged to the host (Context::status_device) and
// reported by the next synchronize(), naming the position and the value.
#include "../../ops/loss.hpp"
#include "kernel_ops.hpp"
#include "launch.cuh"

namespace frugal::cuda {

inline constexpr int kWarp = 32;
inline constexpr int kRowsPerBlock = kThreads / kWarp;

__device__ inline void flag_bad_label(long long* status, long long pos, long long value) {
  volatile long long* s = status;
  if (s[0] != 0) return;  // the first one reported is enough
  s[1] = pos;
  s[2] = value;
  __threadfence_system();
  s[0] = kBadLabel;
}

template <class T>
__device__ inline T warp_max(T v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
template <class T>
__device__ inline T warp_sum(T v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Row q's max and sum of exp(x - max), in the compute type T.
template <class S, class T>
__device__ inline void row_stats(const S* row, std::int64_t C, T& mx, T& z) {
  const int lane = threadIdx.x % kWarp;
  mx = load<T>(row[0]);
  for (std::int64_t c = lane; c < C; c += kWarp) mx = max(mx, load<T>(row[c]));
  mx = warp_max(mx);
  z = 0;
  for (std::int64_t c = lane; c < C; c += kWarp) z += math::exp_(load<T>(row[c]) - mx);
  z = warp_sum(z);
}

template <class S, class T, class L>
__global__ void ce_rows_k(const S* x, const L* lab, double* row_loss, std::int64_t P, std::int64_t C, long long* status) {
  const std::int64_t q = blockIdx.x * std::int64_t(kRowsPerBlock) + threadIdx.x / kWarp;
  if (q >= P) return;
  const S* row = x + q * C;
  T mx, z;
  row_stats<S, T>(row, C, mx, z);
  if (threadIdx.x % kWarp == 0) {
    const L l = lab[q];
    if (l < 0 || l >= C) {
      flag_bad_label(status, q, (long long)l);
      row_loss[q] = 0;
    } else {
      row_loss[q] = double(mx + math::log_(z) - load<T>(row[l]));
    }
  }
}

template <class T>
__global__ void ce_mean_k(const double* row_loss, std::int64_t P, T* out) {
  __shared__ double part[kThreads];
  double acc = 0;
  for (std::int64_t q = threadIdx.x; q < P; q += kThreads) acc += row_loss[q];
  part[threadIdx.x] = acc;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (int(threadIdx.x) < half) part[threadIdx.x] += part[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[0] = T(P ? part[0] / double(P) : 0.0);
}

template <class S, class T, class L>
__global__ void ce_grad_k(const S* x, const L* lab, const T* dloss, S* dx, std::int64_t P, std::int64_t C) {
  const std::int64_t q = blockIdx.x * std::int64_t(kRowsPerBlock) + threadIdx.x / kWarp;
  if (q >= P) return;
  const S* row = x + q * C;
  S* drow = dx + q * C;
  T mx, z;
  row_stats<S, T>(row, C, mx, z);
  const T scale = dloss[0] / T(P > 1 ? P : 1);
  const T inv = scale / z;
  const L l = lab[q];  // out of range: flagged by the forward, which ran first; no -scale written
  for (std::int64_t c = threadIdx.x % kWarp; c < C; c += kWarp) {
    const T d = math::exp_(load<T>(row[c]) - mx) * inv;
    drow[c] = store<S>(c == l ? d - scale : d);
  }
}

template <class Fn>
void dispatch_label(DType t, Fn&& fn) {
  if (t == DType::i32) fn(std::int32_t{});
  else if (t == DType::i64) fn(std::int64_t{});
  else fail("cuda: cross_entropy: labels must be i32 or i64, got ", dtype_name(t));
}

struct CrossEntropyKernel {
  Context ctx;
  void operator()(const ops::CrossEntropy& op, const KernelArgs& a) const {
    const std::string what = describe(op, a);
    const std::int64_t C = a.in[0].shape->dim(-1), P = a.in[1].numel();
    if (P > 0 && a.workspace_bytes < std::size_t(P) * sizeof(double))
      fail("internal: ", what, " needs ", P * 8, " bytes of workspace, got ", a.workspace_bytes);
    dispatch_precision(a.in[0].dtype, "cross_entropy", [&](auto p) {
      using S = typename decltype(p)::Storage;
      using T = typename decltype(p)::Compute;
      dispatch_label(a.in[1].dtype, [&](auto ltag) {
        using L = decltype(ltag);
        auto* rows = static_cast<double*>(a.workspace);
        if (P > 0) {
          ce_rows_k<S, T, L><<<unsigned((P + kRowsPerBlock - 1) / kRowsPerBlock), kThreads, 0, ctx.compute>>>(
              a.in[0].as<const S>(), a.in[1].as<const L>(), rows, P, C, ctx.status_device);
          check_launch(what);
        }
        ce_mean_k<T><<<1, kThreads, 0, ctx.compute>>>(rows, P, a.out[0].as<T>());
        check_launch(what);
      });
    });
  }
};

struct CrossEntropyGradKernel {
  Context ctx;
  void operator()(const ops::CrossEntropyGrad& op, const KernelArgs& a) const {
    const std::string what = describe(op, a);
    const std::int64_t C = a.in[0].shape->dim(-1), P = a.in[1].numel();
    if (P == 0) return;
    dispatch_precision(a.in[0].dtype, "cross_entropy_grad", [&](auto p) {
      using S = typename decltype(p)::Storage;
      using T = typename decltype(p)::Compute;
      dispatch_label(a.in[1].dtype, [&](auto ltag) {
        using L = decltype(ltag);
        ce_grad_k<S, T, L><<<unsigned((P + kRowsPerBlock - 1) / kRowsPerBlock), kThreads, 0, ctx.compute>>>(
            a.in[0].as<const S>(), a.in[1].as<const L>(), a.in[2].as<const T>(), a.out[0].as<S>(), P, C);
        check_launch(what);
      });
    });
  }
};

}  // namespace frugal::cuda
