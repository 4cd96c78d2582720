#pragma once
// Upsampling kernels (nearest, bilinear) and their backward. Planes (n, c)
// are split over threads; the index maps are computed in the tensor's
// precision, from ops/upsample.hpp's PyTorch conventions. The
// backward visits a plane's outputs in order, so overlapping reads add their
// gradients in a fixed order: the same bits for any thread count.
#include "../../ops/upsample.hpp"
#include "../../runtime/backend.hpp"
#include "parallel.hpp"

#include "abi.hpp"

namespace frugal::cpu::inline FRUGAL_KERNEL_ABI {

namespace upsample_detail {

// The index maps are computed on the fly (a few operations per output, in a
// memory-bound kernel) rather than tabled: a step allocates nothing while it
// runs, and the planner would otherwise have to place the tables.
struct NearestMap {
  std::int64_t in, out;
  double scale_factor;
  std::int64_t operator[](std::int64_t o) const { return ops::nearest_source(o, in, out, scale_factor); }
};

template <class T>
struct LinearMap {
  std::int64_t in;
  T scale;
  bool align_corners;
  LinearMap(std::int64_t in_size, std::int64_t out, double scale_factor, bool align)
      : in(in_size), scale(ops::upsample_scale<T>(in_size, out, align, scale_factor)), align_corners(align) {}
  ops::LinearTap<T> operator[](std::int64_t o) const { return ops::linear_source<T>(o, in, scale, align_corners); }
};

// forward: y[o] = sum of taps w * x[i]; backward: dx[i] += w * dy[o], same taps.
template <class T, bool Backward>
void nearest(const ops::UpsampleGeometry& g, const T* src, T* dst) {
  const NearestMap mh{g.h, g.ho, g.scale_h}, mw{g.w, g.wo, g.scale_w};
  parallel_for(g.planes(), g.hw_out(), [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t p = b; p < e; ++p) {
      if constexpr (Backward) {
        const T* dy = src + p * g.hw_out();
        T* dx = dst + p * g.hw();
        std::fill(dx, dx + g.hw(), T(0));
        for (std::int64_t oh = 0; oh < g.ho; ++oh)
          for (std::int64_t ow = 0; ow < g.wo; ++ow)
            dx[mh[oh] * g.w + mw[ow]] += dy[oh * g.wo + ow];
      } else {
        const T* x = src + p * g.hw();
        T* y = dst + p * g.hw_out();
        for (std::int64_t oh = 0; oh < g.ho; ++oh) {
          const T* row = x + mh[oh] * g.w;
          for (std::int64_t ow = 0; ow < g.wo; ++ow) y[oh * g.wo + ow] = row[mw[ow]];
        }
      }
    }
  });
}

template <class T, bool Backward>
void bilinear(const ops::UpsampleGeometry& g, bool align_corners, const T* src, T* dst) {
  const LinearMap<T> mh(g.h, g.ho, g.scale_h, align_corners), mw(g.w, g.wo, g.scale_w, align_corners);
  parallel_for(g.planes(), 4 * g.hw_out(), [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t p = b; p < e; ++p) {
      if constexpr (Backward) {
        const T* dy = src + p * g.hw_out();
        T* dx = dst + p * g.hw();
        std::fill(dx, dx + g.hw(), T(0));
        for (std::int64_t oh = 0; oh < g.ho; ++oh) {
          const auto th = mh[oh];
          T* r0 = dx + th.i0 * g.w;
          T* r1 = dx + th.i1 * g.w;
          for (std::int64_t ow = 0; ow < g.wo; ++ow) {
            const auto tw = mw[ow];
            const T d = dy[oh * g.wo + ow];
            r0[tw.i0] += th.l0 * tw.l0 * d;
            r0[tw.i1] += th.l0 * tw.l1 * d;
            r1[tw.i0] += th.l1 * tw.l0 * d;
            r1[tw.i1] += th.l1 * tw.l1 * d;
          }
        }
      } else {
        const T* x = src + p * g.hw();
        T* y = dst + p * g.hw_out();
        for (std::int64_t oh = 0; oh < g.ho; ++oh) {
          const auto th = mh[oh];
          const T* r0 = x + th.i0 * g.w;
          const T* r1 = x + th.i1 * g.w;
          for (std::int64_t ow = 0; ow < g.wo; ++ow) {
            const auto tw = mw[ow];
            y[oh * g.wo + ow] = th.l0 * (tw.l0 * r0[tw.i0] + tw.l1 * r0[tw.i1]) +
                                th.l1 * (tw.l0 * r1[tw.i0] + tw.l1 * r1[tw.i1]);
          }
        }
      }
    }
  });
}

template <class T, bool Backward>
void run(UpsampleMode mode, bool align_corners, const ops::UpsampleGeometry& g, const T* src, T* dst) {
  if (mode == UpsampleMode::nearest) nearest<T, Backward>(g, src, dst);
  else bilinear<T, Backward>(g, align_corners, src, dst);
}

}  // namespace upsample_detail

inline void upsample2d_kernel(const ops::Upsample2d& op, const KernelArgs& a) {
  dispatch_float(a.in[0].dtype, op.name().c_str(), [&](auto tag) {
    using T = decltype(tag);
    upsample_detail::run<T, false>(op.mode(), op.align_corners(), op.geometry(*a.in[0].shape), a.in[0].as<T>(),
                                   a.out[0].as<T>());
  });
}

inline void upsample2d_backward_kernel(const ops::Upsample2dBackward& op, const KernelArgs& a) {
  dispatch_float(a.in[0].dtype, op.name().c_str(), [&](auto tag) {
    using T = decltype(tag);
    upsample_detail::run<T, true>(op.mode(), op.align_corners(), op.geometry(), a.in[0].as<T>(), a.out[0].as<T>());
  });
}

}  // namespace frugal::cpu
