#pragma once
// Group normalisation kernels. The forward and the data gradient split the
// (sample, group) blocks over threads; each block's sums run in a fixed
// order in double (its channels' rows one after another). The weight and
// bias gradients sum over samples, so they split channels instead, each
// summing its samples in order. The mean and rstd are rounded to T once, and
// the forward and the backward both use those rounded values.
#include <cmath>

#include "../../ops/group_norm.hpp"
#include "../../runtime/backend.hpp"
#include "parallel.hpp"

#include "abi.hpp"

namespace frugal::cpu::inline FRUGAL_KERNEL_ABI {

inline void group_norm_kernel(const ops::GroupNorm& op, const KernelArgs& a) {
  dispatch_float(a.in[0].dtype, "group_norm", [&](auto tag) {
    using T = decltype(tag);
    const ops::GroupNormDims d = op.dims(*a.in[0].shape);
    const T* x = a.in[0].as<T>();
    const T* gamma = op.affine() ? a.in[1].as<T>() : nullptr;
    const T* beta = op.affine() ? a.in[2].as<T>() : nullptr;
    T *y = a.out[0].as<T>(), *mean_out = a.out[1].as<T>(), *rstd_out = a.out[2].as<T>();
    const std::int64_t cg = d.channels_per_group(), size = d.group_size();
    const double inv = size > 0 ? 1.0 / double(size) : 0.0;
    parallel_for(d.n * d.groups, 4 * size, [&](std::int64_t b, std::int64_t e) {
      for (std::int64_t blk = b; blk < e; ++blk) {
        const T* xb = x + blk * size;  // a group's channels are contiguous in [N, C, *]
        double s = 0;
        for (std::int64_t i = 0; i < size; ++i) s += double(xb[i]);
        const T mean = T(s * inv);
        double ss = 0;
        for (std::int64_t i = 0; i < size; ++i) {
          const double dv = double(xb[i] - mean);
          ss += dv * dv;
        }
        const T rstd = T(1.0 / std::sqrt(ss * inv + op.eps()));
        const std::int64_t c0 = (blk % d.groups) * cg;
        T* yb = y + blk * size;
        for (std::int64_t ci = 0; ci < cg; ++ci) {
          const T scale = gamma ? rstd * gamma[c0 + ci] : rstd, shift = beta ? beta[c0 + ci] : T(0);
          const T* __restrict xr = xb + ci * d.spatial;
          T* __restrict yr = yb + ci * d.spatial;
          for (std::int64_t q = 0; q < d.spatial; ++q) yr[q] = (xr[q] - mean) * scale + shift;
        }
        mean_out[blk] = mean;
        rstd_out[blk] = rstd;
      }
    });
  });
}

// With xhat = (x - mean) rstd and g = dy * weight[c] (dy without affine),
// over each (sample, group) block of M values:
//   dx = rstd * (g - mean(g) - xhat * mean(g * xhat))
//   dweight[c] = sum over samples and positions of dy * xhat, dbias[c] = sum of dy.
inline void group_norm_grad_kernel(const ops::GroupNormGrad& op, const KernelArgs& a) {
  dispatch_float(a.in[0].dtype, "group_norm_backward", [&](auto tag) {
    using T = decltype(tag);
    const ops::GroupNormDims d = op.dims(*a.in[0].shape);
    const T *x = a.in[0].as<T>(), *dy = a.in[1].as<T>(), *mean = a.in[2].as<T>(), *rstd = a.in[3].as<T>();
    const T* gamma = op.affine() ? a.in[4].as<T>() : nullptr;
    T* dx = a.out[0].as<T>();
    const std::int64_t cg = d.channels_per_group(), size = d.group_size();
    const double inv = size > 0 ? 1.0 / double(size) : 0.0;
    parallel_for(d.n * d.groups, 6 * size, [&](std::int64_t b, std::int64_t e) {
      for (std::int64_t blk = b; blk < e; ++blk) {
        const std::int64_t c0 = (blk % d.groups) * cg;
        const T m = mean[blk], r = rstd[blk];
        const T* xb = x + blk * size;
        const T* gb = dy + blk * size;
        double sg = 0, sgx = 0;
        for (std::int64_t ci = 0; ci < cg; ++ci) {
          const T w = gamma ? gamma[c0 + ci] : T(1);
          for (std::int64_t q = 0; q < d.spatial; ++q) {
            const std::int64_t i = ci * d.spatial + q;
            const T g = gb[i] * w;
            sg += double(g);
            sgx += double(g * ((xb[i] - m) * r));
          }
        }
        const T mg = T(sg * inv), mgx = T(sgx * inv);
        T* db = dx + blk * size;
        for (std::int64_t ci = 0; ci < cg; ++ci) {
          const T w = gamma ? gamma[c0 + ci] : T(1);
          for (std::int64_t q = 0; q < d.spatial; ++q) {
            const std::int64_t i = ci * d.spatial + q;
            db[i] = r * (gb[i] * w - mg - (xb[i] - m) * r * mgx);
          }
        }
      }
    });
    if (!op.affine()) return;
    T *dgamma = a.out[1].as<T>(), *dbeta = a.out[2].as<T>();
    parallel_for(d.c, 2 * d.n * d.spatial, [&](std::int64_t b, std::int64_t e) {
      for (std::int64_t c = b; c < e; ++c) {
        const std::int64_t grp = c / cg;
        double sdx = 0, sd = 0;
        for (std::int64_t n = 0; n < d.n; ++n) {
          const T m = mean[n * d.groups + grp], r = rstd[n * d.groups + grp];
          const T* xr = x + (n * d.c + c) * d.spatial;
          const T* gr = dy + (n * d.c + c) * d.spatial;
          for (std::int64_t q = 0; q < d.spatial; ++q) {
            sdx += double(gr[q] * ((xr[q] - m) * r));
            sd += double(gr[q]);
          }
        }
        dgamma[c] = T(sdx);
        dbeta[c] = T(sd);
      }
    });
  });
}

}  // namespace frugal::cpu
