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
// before any lane writes, and then each y[j] from x[j] alone. S is the
// storage type of x, w, b and y; C the compute type, that of mean and rstd
// (f32 for bf16/f16, read into f32 and rounded once on store, as on the CPU).
template <class S, class C>
__global__ void layer_norm_k(const S* x, const S* w, const S* b, S* y, C* mean, C* rstd, std::int64_t rows,
                             std::int64_t d, C eps) {
  const std::int64_t r = blockIdx.x * std::int64_t(kRowsPerBlock) + threadIdx.x / kWarp;
  if (r >= rows) return;
  const int lane = threadIdx.x % kWarp;
  const S* xr = x + r * d;
  S* yr = y + r * d;
  C s = 0;
  for (std::int64_t j = lane; j < d; j += kWarp) s += load<C>(xr[j]);
  const C mu = warp_sum(s) / C(d);
  C v = 0;
  for (std::int64_t j = lane; j < d; j += kWarp) {
    const C c = load<C>(xr[j]) - mu;
    v += c * c;
  }
  const C var = warp_sum(v) / C(d);
  const C rs = C(1) / math::sqrt_(var + eps);
  __syncwarp();  // every lane has read its x before any lane writes y
  if (lane == 0) mean[r] = mu, rstd[r] = rs;
  for (std::int64_t j = lane; j < d; j += kWarp) {
    C o = (load<C>(xr[j]) - mu) * rs;
    if (w) o = o * load<C>(w[j]);
    if (b) o = o + load<C>(b[j]);
    yr[j] = store<S>(o);
  }
}

// dx = rstd · (g - mean_j(g) - xhat · mean_j(g · xhat)), g = dy · weight.
template <class S, class C>
__global__ void layer_norm_dx_k(const S* x, const C* mean, const C* rstd, const S* dy, const S* w, S* dx,
                                std::int64_t rows, std::int64_t d) {
  const std::int64_t r = blockIdx.x * std::int64_t(kRowsPerBlock) + threadIdx.x / kWarp;
  if (r >= rows) return;
  const int lane = threadIdx.x % kWarp;
  const S *xr = x + r * d, *gr = dy + r * d;
  S* dr = dx + r * d;
  const C mu = mean[r], rs = rstd[r];
  C s1 = 0, s2 = 0;
  for (std::int64_t j = lane; j < d; j += kWarp) {
    const C g = w ? load<C>(gr[j]) * load<C>(w[j]) : load<C>(gr[j]);
    s1 += g;
    s2 += g * ((load<C>(xr[j]) - mu) * rs);
  }
  const C m1 = warp_sum(s1) / C(d), m2 = warp_sum(s2) / C(d);
  for (std::int64_t j = lane; j < d; j += kWarp) {
    const C g = w ? load<C>(gr[j]) * load<C>(w[j]) : load<C>(gr[j]);
    dr[j] = store<S>(rs * (g - m1 - (load<C>(xr[j]) - mu) * rs * m2));
  }
}

// dweight[j] = Σ_r dy[r, j] · xhat[r, j], dbias[j] = Σ_r dy[r, j]: f64
// accumulators, rows in order (the CPU's sums, term for term), rounded once
// (math::convert: from f64 straight to bf16/f16, not through f32).
template <class S, class C>
__global__ void layer_norm_params_k(const S* x, const C* mean, const C* rstd, const S* dy, S* dw, S* db,
                                    std::int64_t rows, std::int64_t d) {
  for (std::int64_t j = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; j < d; j += std::int64_t(gridDim.x) * blockDim.x) {
    double aw = 0, ab = 0;
    for (std::int64_t r = 0; r < rows; ++r) {
      const C g = load<C>(dy[r * d + j]);
      if (dw) aw += double(g * ((load<C>(x[r * d + j]) - mean[r]) * rstd[r]));
      if (db) ab += double(g);
    }
    if (dw) dw[j] = math::convert<S>(aw);
    if (db) db[j] = math::convert<S>(ab);
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
    dispatch_precision(a.in[0].dtype, "layer_norm", [&](auto p) {
      using S = typename decltype(p)::Storage;
      using C = typename decltype(p)::Compute;
      const S* w = op.has_weight() ? a.in[1].as<const S>() : nullptr;
      const S* b = op.has_bias() ? a.in[1 + std::size_t(op.has_weight())].as<const S>() : nullptr;
      layer_norm_k<S, C><<<row_blocks(rows, what), kThreads, 0, ctx.compute>>>(
          a.in[0].as<const S>(), w, b, a.out[0].as<S>(), a.out[1].as<C>(), a.out[2].as<C>(), rows, d, C(op.eps()));
    });
    check_launch(what);
  }
};

struct LayerNormGradKernel {
  Context ctx;
  void operator()(const ops::LayerNormGrad& op, const KernelArgs& a) const {
    const std::string what = describe(op, a);
    const std::int64_t d = a.in[0].shape->dim(-1), rows = a.in[0].numel() / d;
    dispatch_precision(a.in[0].dtype, "layer_norm_grad", [&](auto p) {
      using S = typename decltype(p)::Storage;
      using C = typename decltype(p)::Compute;
      const S *x = a.in[0].as<const S>(), *dy = a.in[3].as<const S>();
      const C *mean = a.in[1].as<const C>(), *rstd = a.in[2].as<const C>();
      const S* w = op.has_weight() ? a.in[4].as<const S>() : nullptr;
      S* dw = op.has_weight() ? a.out[1].as<S>() : nullptr;
      S* db = op.has_bias() ? a.out[1 + std::size_t(op.has_weight())].as<S>() : nullptr;
      if (dw || db) {
        layer_norm_params_k<S, C><<<blocks_for(d), kThreads, 0, ctx.compute>>>(x, mean, rstd, dy, dw, db, rows, d);
        check_launch(what);
      }
      if (rows > 0) {
        layer_norm_dx_k<S, C><<<row_blocks(rows, what), kThreads, 0, ctx.compute>>>(x, mean, rstd, dy, w,
                                                                                    a.out[0].as<S>(), rows, d);
        check_launch(what);
      }
    });
  }
};

}  // namespace frugal::cuda
