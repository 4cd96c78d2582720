#pragma once
// Pooling kernels: planes (n, c) are split over threads; inside a plane
// windows are visited in order, so overlapping windows add their gradients
// in a fixed order.
#include <cmath>
#include <limits>

#include "../../ops/cast.hpp"
#include "../../ops/pool.hpp"
#include "../../runtime/backend.hpp"
#include "parallel.hpp"

#include "abi.hpp"

namespace frugal::cpu::inline FRUGAL_KERNEL_ABI {

namespace pool_detail {

struct Window {
  std::int64_t hs, he, ws, we, divisor_with_pad;
};

// The window of output (oh, ow) clipped to the input, and its size counting
// the padding (PyTorch's pool_size with count_include_pad).
inline Window window(const ops::PoolGeometry& g, std::int64_t oh, std::int64_t ow) {
  const std::int64_t h0 = oh * g.sh - g.ph, w0 = ow * g.sw - g.pw;
  const std::int64_t h1 = std::min(h0 + g.kh, g.h + g.ph), w1 = std::min(w0 + g.kw, g.w + g.pw);
  return {std::max<std::int64_t>(h0, 0), std::min(h0 + g.kh, g.h), std::max<std::int64_t>(w0, 0),
          std::min(w0 + g.kw, g.w), (h1 - h0) * (w1 - w0)};
}

// PyTorch's rule: start at the window's first input position with -inf, and
// take a value when it is larger or NaN, so the first maximum wins.
template <class T>
inline std::int64_t argmax(const T* plane, const ops::PoolGeometry& g, const Window& win) {
  std::int64_t best_i = win.hs * g.w + win.ws;
  T best = -std::numeric_limits<T>::infinity();
  for (std::int64_t y = win.hs; y < win.he; ++y)
    for (std::int64_t x = win.ws; x < win.we; ++x) {
      const T v = plane[y * g.w + x];
      if (v > best || std::isnan(v)) {
        best = v;
        best_i = y * g.w + x;
      }
    }
  return best_i;
}

}  // namespace pool_detail

inline void max_pool2d_kernel(const ops::MaxPool2d& op, const KernelArgs& a) {
  dispatch_float(a.in[0].dtype, "max_pool2d", [&](auto tag) {
    using T = decltype(tag);
    const auto g = op.geometry(*a.in[0].shape);
    const T* x = a.in[0].as<T>();
    T* y = a.out[0].as<T>();
    parallel_for(g.planes(), g.hw_out() * g.kh * g.kw, [&](std::int64_t b, std::int64_t e) {
      for (std::int64_t p = b; p < e; ++p) {
        const T* plane = x + p * g.hw();
        T* out = y + p * g.hw_out();
        for (std::int64_t oh = 0; oh < g.ho; ++oh)
          for (std::int64_t ow = 0; ow < g.wo; ++ow)
            out[oh * g.wo + ow] = plane[pool_detail::argmax(plane, g, pool_detail::window(g, oh, ow))];
      }
    });
  });
}

inline void max_pool2d_backward_kernel(const ops::MaxPool2dBackward& op, const KernelArgs& a) {
  dispatch_float(a.in[0].dtype, "max_pool2d_backward", [&](auto tag) {
    using T = decltype(tag);
    const auto g = op.geometry(*a.in[0].shape);
    const T *x = a.in[0].as<T>(), *dy = a.in[1].as<T>();
    T* dx = a.out[0].as<T>();
    parallel_for(g.planes(), g.hw() + g.hw_out() * g.kh * g.kw, [&](std::int64_t b, std::int64_t e) {
      for (std::int64_t p = b; p < e; ++p) {
        const T* plane = x + p * g.hw();
        const T* gp = dy + p * g.hw_out();
        T* dp = dx + p * g.hw();
        std::fill(dp, dp + g.hw(), T(0));
        for (std::int64_t oh = 0; oh < g.ho; ++oh)
          for (std::int64_t ow = 0; ow < g.wo; ++ow)
            dp[pool_detail::argmax(plane, g, pool_detail::window(g, oh, ow))] += gp[oh * g.wo + ow];
      }
    });
  });
}

inline void avg_pool2d_kernel(const ops::AvgPool2d& op, const KernelArgs& a) {
  dispatch_float(a.in[0].dtype, "avg_pool2d", [&](auto tag) {
    using T = decltype(tag);
    const auto g = op.geometry(*a.in[0].shape);
    const T* x = a.in[0].as<T>();
    T* y = a.out[0].as<T>();
    const bool include_pad = op.count_include_pad();
    parallel_for(g.planes(), g.hw_out() * g.kh * g.kw, [&](std::int64_t b, std::int64_t e) {
      for (std::int64_t p = b; p < e; ++p) {
        const T* plane = x + p * g.hw();
        for (std::int64_t oh = 0; oh < g.ho; ++oh)
          for (std::int64_t ow = 0; ow < g.wo; ++ow) {
            const auto w = pool_detail::window(g, oh, ow);
            T s = 0;
            for (std::int64_t yy = w.hs; yy < w.he; ++yy)
              for (std::int64_t xx = w.ws; xx < w.we; ++xx) s += plane[yy * g.w + xx];
            const std::int64_t div = include_pad ? w.divisor_with_pad : (w.he - w.hs) * (w.we - w.ws);
            y[p * g.hw_out() + oh * g.wo + ow] = s / T(div);
          }
      }
    });
  });
}

inline void avg_pool2d_backward_kernel(const ops::AvgPool2dBackward& op, const KernelArgs& a) {
  dispatch_float(a.in[0].dtype, "avg_pool2d_backward", [&](auto tag) {
    using T = decltype(tag);
    const auto g = op.geometry();
    const T* dy = a.in[0].as<T>();
    T* dx = a.out[0].as<T>();
    const bool include_pad = op.count_include_pad();
    parallel_for(g.planes(), g.hw() + g.hw_out() * g.kh * g.kw, [&](std::int64_t b, std::int64_t e) {
      for (std::int64_t p = b; p < e; ++p) {
        T* dp = dx + p * g.hw();
        std::fill(dp, dp + g.hw(), T(0));
        for (std::int64_t oh = 0; oh < g.ho; ++oh)
          for (std::int64_t ow = 0; ow < g.wo; ++ow) {
            const auto w = pool_detail::window(g, oh, ow);
            const std::int64_t div = include_pad ? w.divisor_with_pad : (w.he - w.hs) * (w.we - w.ws);
            const T v = dy[p * g.hw_out() + oh * g.wo + ow] / T(div);
            for (std::int64_t yy = w.hs; yy < w.he; ++yy)
              for (std::int64_t xx = w.ws; xx < w.we; ++xx) dp[yy * g.w + xx] += v;
          }
      }
    });
  });
}

// bf16/f16 too: each plane summed in double and the mean rounded once.
inline void global_avg_pool2d_kernel(const ops::GlobalAvgPool2d&, const KernelArgs& a) {
  dispatch_storage(a.in[0].dtype, "global_avg_pool2d", [&](auto tag) {
    using T = decltype(tag);
    const Shape& s = *a.in[0].shape;
    const std::int64_t planes = s[0] * s[1], hw = s[2] * s[3];
    const T* x = a.in[0].as<T>();
    T* y = a.out[0].as<T>();
    parallel_for(planes, hw, [&](std::int64_t b, std::int64_t e) {
      for (std::int64_t p = b; p < e; ++p) {
        double acc = 0;
        for (std::int64_t q = 0; q < hw; ++q) acc += math::convert<double>(x[p * hw + q]);
        y[p] = math::convert<T>(acc / double(hw));
      }
    });
  });
}

inline void global_avg_pool2d_backward_kernel(const ops::GlobalAvgPool2dBackward&, const KernelArgs& a) {
  dispatch_storage(a.in[0].dtype, "global_avg_pool2d_backward", [&](auto tag) {
    using T = decltype(tag);
    const Shape& s = *a.out[0].shape;
    const std::int64_t planes = s[0] * s[1], hw = s[2] * s[3];
    const T* dy = a.in[0].as<T>();
    T* dx = a.out[0].as<T>();
    parallel_for(planes, hw, [&](std::int64_t b, std::int64_t e) {
      for (std::int64_t p = b; p < e; ++p)
        std::fill(dx + p * hw, dx + (p + 1) * hw, math::convert<T>(math::convert<double>(dy[p]) / double(hw)));
    });
  });
}


}  // namespace frugal::cpu
