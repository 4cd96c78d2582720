#pragma once
// Fused layer norm over the last axis and its backward. One warp per row
// for the row statistics and dx (partial sums per lane, met in a fixed
// shuffle tree: the same bits every run, within a few ulp of the CPU's
// lane order); dweight and dbias one thread per column, summing the rows in
// row order in f64 exactly as the CPU kernel does (bitwise equal to it).
#include "../../ops/layer_norm.hpp"
#include "loss.cuh"

namespace frugal::cuda {

// y may be x (in place): a warp reads its whole row for the statistics
// before any lane writes, and then each y[j] from x[j] alone.
template <class T>
__global__ void layer_norm_k(const T* x, const T* w, const T* b, T* y, T* mean, T* rstd, std::int64_t rows,
                             std::int64_t d, T eps) {
  const std::int64_t r = blockIdx.x * std::int64_t(kRowsPerBlock) + threadIdx.x / kWarp;
  if (r >= rows) return;
  const int lane = threadIdx.x % kWarp;
  const T* xr = x + r * d;
  T* yr = y + r * d;
  T s = 0;
  for (std::int64_t j = lane; j < d; j += kWarp) s += xr[j];
  const T mu = warp_sum(s) / T(d);
  T v = 0;
  for (std::int64_t j = lane; j < d; j += kWarp) {
    const T c = xr[j] - mu;
    v += c * c;
  }
  const T var = warp_sum(v) / T(d);
  const T rs = T(1) / math::sqrt_(var + eps);
  __syncwarp();  // every lane has read its x before any lane writes y
  if (lane == 0) mean[r] = mu, rstd[r] = rs;
  for (std::int64_t j = lane; j < d; j += kWarp) {
    T o = (xr[j] - mu) * rs;
    if (w) o = o * w[j];
    if (b) o = o + b[j];
    yr[j] = o;
  }
}

// dx = rstd · (g - mean_j(g) - xhat · mean_j(g · xhat)), g = dy · weight.
template <class T>
__global__ void layer_norm_dx_k(const T* x, const T* mean, const T* rstd, const T* dy, const T* w, T* dx,
                                std::int64_t rows, std::int64_t d) {
  const std::int64_t r = blockIdx.x * std::int64_t(kRowsPerBlock) + threadIdx.x / kWarp;
  if (r >= rows) return;
  const int lane = threadIdx.x % kWarp;
  const T *xr = x + r * d, *gr = dy + r * d;
  T* dr = dx + r * d;
  const T mu = mean[r], rs = rstd[r];
  T s1 = 0, s2 = 0;
  for (std::int64_t j = lane; j < d; j += kWarp) {
    const T g = w ? gr[j] * w[j] : gr[j];
    s1 += g;
    s2 += g * ((xr[j] - mu) * rs);
  }
  const T m1 = warp_sum(s1) / T(d), m2 = warp_sum(s2) / T(d);
  for (std::int64_t j = lane; j < d; j += kWarp) {
    const T g = w ? gr[j] * w[j] : gr[j];
    dr[j] = rs * (g - m1 - (xr[j] - mu) * rs * m2);
  }
}

// dweight[j] = Σ_r dy[r, j] · xhat[r, j], dbias[j] = Σ_r dy[r, j]: f64
// accumulators, rows in order (the CPU's sums, term for term).
template <class T>
__global__ void layer_norm_params_k(const T* x, const T* mean, const T* rstd, const T* dy, T* dw, T* db,
                                    std::int64_t rows, std::int64_t d) {
  for (std::int64_t j = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; j < d; j += std::int64_t(gridDim.x) * blockDim.x) {
    double aw = 0, ab = 0;
    for (std::int64_t r = 0; r < rows; ++r) {
      const T g = dy[r * d + j];
      if (dw) aw += double(g * ((x[r * d + j] - mean[r]) * rstd[r]));
      if (db) ab += double(g);
    }
    if (dw) dw[j] = T(aw);
    if (db) db[j] = T(ab);
  }
}

inline unsigned row_blocks(std::int64_t rows, const std::string& what) {
  const std::int64_t b = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  if (b > 2147483647) fail("cuda: ", what, ": too many rows for one grid");
  return unsigned(b);
}

struct LayerNormKernel {
  Context ctx;
  void operator()(const ops::LayerNorm& op, const KernelArgs& a) const {
    const std::string what = describe(op, a);
    const std::int64_t d = a.in[0].shape->dim(-1), rows = a.in[0].numel() / d;
    if (rows == 0) return;
    dispatch_float(a.in[0].dtype, "layer_norm", [&](auto tag) {
      using T = decltype(tag);
      const T* w = op.has_weight() ? a.in[1].as<const T>() : nullptr;
      const T* b = op.has_bias() ? a.in[1 + std::size_t(op.has_weight())].as<const T>() : nullptr;
      layer_norm_k<T><<<row_blocks(rows, what), kThreads, 0, ctx.compute>>>(
          a.in[0].as<const T>(), w, b, a.out[0].as<T>(), a.out[1].as<T>(), a.out[2].as<T>(), rows, d, T(op.eps()));
    });
    check_launch(what);
  }
};

struct LayerNormGradKernel {
  Context ctx;
  void operator()(const ops::LayerNormGrad& op, const KernelArgs& a) const {
    const std::string what = describe(op, a);
    const std::int64_t d = a.in[0].shape->dim(-1), rows = a.in[0].numel() / d;
    dispatch_float(a.in[0].dtype, "layer_norm_grad", [&](auto tag) {
      using T = decltype(tag);
      const T *x = a.in[0].as<const T>(), *mean = a.in[1].as<const T>(), *rstd = a.in[2].as<const T>(),
              *dy = a.in[3].as<const T>();
      const T* w = op.has_weight() ? a.in[4].as<const T>() : nullptr;
      T* dw = op.has_weight() ? a.out[1].as<T>() : nullptr;
      T* db = op.has_bias() ? a.out[1 + std::size_t(op.has_weight())].as<T>() : nullptr;
      if (dw || db) {
        layer_norm_params_k<T><<<blocks_for(d), kThreads, 0, ctx.compute>>>(x, mean, rstd, dy, dw, db, rows, d);
        check_launch(what);
      }
      if (rows > 0) {
        layer_norm_dx_k<T><<<row_blocks(rows, what), kThreads, 0, ctx.compute>>>(x, mean, rstd, dy, w, a.out[0].as<T>(),
                                                                                 rows, d);
        check_launch(what);
      }
    });
  }
};

}  // namespace frugal::cuda
