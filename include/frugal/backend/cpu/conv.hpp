#pragma once
// conv2d and its two backward ops on the CPU: im2col into the op's planned
// scratch space, OpenBLAS GEMM, then scatter (forward) or col2im (data
// gradient). Work runs a chunk of images at a time (see ops::conv_scratch):
// inside a chunk the copies are split over threads with parallel_for and the
// GEMM runs on OpenBLAS's threads. Every output element is written by one
// thread with a fixed summation order, so results are reproducible for a
// given thread count; the weight gradient sums the images chunk by chunk in
// image order.
//
// Storage dtypes: f32 (sgemm), f64 (dgemm), and bf16/f16, which are widened
// to f32 while packing the columns, multiplied with sgemm and rounded once
// on the final store.
#include <cstring>
#include <type_traits>

#include "../../ops/conv.hpp"
#include "blas.hpp"
#include "kernel_table.hpp"
#include "parallel.hpp"

namespace frugal::cpu {

namespace conv_detail {

template <class T>
using compute_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

template <class T>
inline constexpr bool is_half_v = std::is_same_v<T, BFloat16> || std::is_same_v<T, Half>;

// Calls fn(T{}) for the storage types the convolution kernels take.
template <class Fn>
void dispatch_storage(DType t, const char* op, Fn&& fn) {
  switch (t) {
    case DType::f32: fn(float{}); return;
    case DType::f64: fn(double{}); return;
    case DType::bf16: fn(BFloat16{}); return;
    case DType::f16: fn(Half{}); return;
    default: fail("cpu: op ", op, " has no kernel for dtype ", dtype_name(t), " (f32, f64, bf16 and f16 are supported)");
  }
}

template <class C, class T>
inline C widen(T v) {
  return static_cast<C>(v);
}

// The scratch regions of one op, carved out of KernelArgs::workspace.
template <class C>
struct Scratch {
  C *col = nullptr, *weight = nullptr, *rows = nullptr, *acc = nullptr;
};

template <class C>
Scratch<C> carve(const ops::ConvScratch& s, const KernelArgs& a, const char* op) {
  if (s.bytes() > 0 && (!a.workspace || a.workspace_bytes < s.bytes()))
    fail("internal: ", op, " was given ", a.workspace_bytes, " bytes of scratch space but needs ", s.bytes());
  auto* base = static_cast<std::byte*>(a.workspace);
  auto at = [&](std::size_t n, std::size_t off) { return n ? reinterpret_cast<C*>(base + off) : nullptr; };
  return {at(s.col, s.col_offset()), at(s.weight, s.weight_offset()), at(s.rows, s.rows_offset()),
          at(s.acc, s.acc_offset())};
}

// The valid output columns [lo, hi) for a kernel tap at input offset `off`:
// those ow with 0 <= ow * stride + off < size.
inline void tap_range(std::int64_t off, std::int64_t stride, std::int64_t size, std::int64_t out, std::int64_t& lo,
                      std::int64_t& hi) {
  lo = off >= 0 ? 0 : (-off + stride - 1) / stride;
  hi = size - off <= 0 ? 0 : std::min(out, (size - off - 1) / stride + 1);
  lo = std::min(lo, out);
  if (hi < lo) hi = lo;
}

// [begin, end) of n items for thread t of nt: equal contiguous shares.
struct Share {
  std::int64_t begin, end;
};
inline Share share(std::int64_t n, int t, int nt) { return {n * t / nt, n * (t + 1) / nt}; }

// Runs fn(t, nt) on every thread of one parallel region (BLAS called inside
// runs single-threaded), or fn(0, 1) alone when the work is too small to
// split. The split is static, so a thread count always gives the same bits.
template <class Fn>
void in_parallel(double flops, Fn&& fn) {
  const int nt = omp_get_max_threads();
  if (nt == 1 || flops < 4e6) {
    fn(0, 1);
    return;
  }
#pragma omp parallel num_threads(nt)
  fn(omp_get_thread_num(), omp_get_num_threads());
}

// One output row (Wo values) of column row r: input row iy seen through the
// tap, zeros in the padding.
template <class T, class C>
inline void im2col_line(const T* __restrict in_row, C* __restrict d, const ops::ConvGeometry& g, std::int64_t offw,
                        std::int64_t lo, std::int64_t hi) {
  for (std::int64_t ow = 0; ow < lo; ++ow) d[ow] = C(0);
  if (g.sw == 1) {
    const T* s = in_row + (lo + offw);
    C* dd = d + lo;
    for (std::int64_t q = 0; q < hi - lo; ++q) dd[q] = widen<C>(s[q]);
  } else {
    for (std::int64_t ow = lo; ow < hi; ++ow) d[ow] = widen<C>(in_row[ow * g.sw + offw]);
  }
  for (std::int64_t ow = hi; ow < g.wo; ++ow) d[ow] = C(0);
}

// The block of the column matrix col [k, p] (p = images * Ho*Wo, images from
// b0, group gi) made of rows [r0, r1) and output lines [u0, u1), where line
// u is output row u % Ho of image u / Ho.
template <class T, class C>
void im2col(const T* x, C* col, const ops::ConvGeometry& g, std::int64_t b0, std::int64_t p, std::int64_t gi,
            std::int64_t r0, std::int64_t r1, std::int64_t u0, std::int64_t u1) {
  const std::int64_t khw = g.kh * g.kw, hwo = g.hw_out();
  for (std::int64_t r = r0; r < r1; ++r) {
    const std::int64_t ci = r / khw, i = (r / g.kw) % g.kh, j = r % g.kw;
    const std::int64_t offh = i * g.dh - g.ph, offw = j * g.dw - g.pw;
    std::int64_t lo, hi;
    tap_range(offw, g.sw, g.w, g.wo, lo, hi);
    for (std::int64_t u = u0; u < u1; ++u) {
      const std::int64_t img = u / g.ho, oh = u % g.ho, iy = oh * g.sh + offh;
      C* d = col + r * p + img * hwo + oh * g.wo;
      if (iy < 0 || iy >= g.h) {
        for (std::int64_t ow = 0; ow < g.wo; ++ow) d[ow] = C(0);
        continue;
      }
      const T* in_row = x + (((b0 + img) * g.cin + gi * g.cin_g() + ci) * g.h + iy) * g.w;
      im2col_line(in_row, d, g, offw, lo, hi);
    }
  }
}

// The adjoint of im2col for planes [q0, q1) (plane q is channel q % Cin/g of
// image q / (Cin/g)): each is the sum over kernel taps of its column rows,
// added tap by tap in a fixed order. plane(img, ci) says where it goes; it
// is overwritten.
template <class C, class PlaneFn>
void col2im(const C* col, const ops::ConvGeometry& g, std::int64_t p, std::int64_t q0, std::int64_t q1,
            PlaneFn plane) {
  const std::int64_t hwo = g.hw_out(), cin_g = g.cin_g();
  for (std::int64_t q = q0; q < q1; ++q) {
    const std::int64_t img = q / cin_g, ci = q % cin_g;
    C* __restrict out = plane(img, ci);
    for (std::int64_t e = 0; e < g.hw(); ++e) out[e] = C(0);
    for (std::int64_t i = 0; i < g.kh; ++i)
      for (std::int64_t j = 0; j < g.kw; ++j) {
        const C* __restrict src = col + ((ci * g.kh + i) * g.kw + j) * p + img * hwo;
        const std::int64_t offh = i * g.dh - g.ph, offw = j * g.dw - g.pw;
        std::int64_t lo, hi;
        tap_range(offw, g.sw, g.w, g.wo, lo, hi);
        for (std::int64_t oh = 0; oh < g.ho; ++oh) {
          const std::int64_t iy = oh * g.sh + offh;
          if (iy < 0 || iy >= g.h) continue;
          C* orow = out + iy * g.w;
          const C* s = src + oh * g.wo;
          if (g.sw == 1) {
            C* o = orow + (lo + offw);
            const C* ss = s + lo;
            for (std::int64_t c = 0; c < hi - lo; ++c) o[c] += ss[c];
          } else {
            for (std::int64_t ow = lo; ow < hi; ++ow) orow[ow * g.sw + offw] += s[ow];
          }
        }
      }
  }
}

// rows[co, img * Ho*Wo + oh * Wo + ow] = dy[b0 + img, gi * Cout/g + co, oh, ow]
// for output lines [u0, u1), widened.
template <class T, class C>
void gather_rows(const T* dy, C* rows, const ops::ConvGeometry& g, std::int64_t b0, std::int64_t p, std::int64_t gi,
                 std::int64_t u0, std::int64_t u1) {
  const std::int64_t hwo = g.hw_out(), cg = g.cout_g();
  for (std::int64_t co = 0; co < cg; ++co)
    for (std::int64_t u = u0; u < u1; ++u) {
      const std::int64_t img = u / g.ho, oh = u % g.ho;
      const T* __restrict s = dy + ((b0 + img) * g.cout + gi * cg + co) * hwo + oh * g.wo;
      C* __restrict d = rows + co * p + img * hwo + oh * g.wo;
      for (std::int64_t c = 0; c < g.wo; ++c) d[c] = widen<C>(s[c]);
    }
}

// y[b0 + img, gi * Cout/g + co, oh, ow] = rows[co, ...] + bias, rounded to
// T, for output lines [u0, u1).
template <class T, class C>
void scatter_rows(const C* rows, T* y, const T* bias, const ops::ConvGeometry& g, std::int64_t b0, std::int64_t p,
                  std::int64_t gi, std::int64_t u0, std::int64_t u1) {
  const std::int64_t hwo = g.hw_out(), cg = g.cout_g();
  for (std::int64_t co = 0; co < cg; ++co) {
    const C bv = bias ? widen<C>(bias[gi * cg + co]) : C(0);
    for (std::int64_t u = u0; u < u1; ++u) {
      const std::int64_t img = u / g.ho, oh = u % g.ho;
      const C* __restrict s = rows + co * p + img * hwo + oh * g.wo;
      T* __restrict d = y + ((b0 + img) * g.cout + gi * cg + co) * hwo + oh * g.wo;
      for (std::int64_t c = 0; c < g.wo; ++c) d[c] = T(s[c] + bv);
    }
  }
}

template <class T, class C>
void widen_all(const T* src, C* dst, std::int64_t n) {
  parallel_for(n, 1, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t i = b; i < e; ++i) dst[i] = widen<C>(src[i]);
  });
}

template <class C, class T>
void narrow_all(const C* src, T* dst, std::int64_t n) {
  parallel_for(n, 1, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t i = b; i < e; ++i) dst[i] = T(src[i]);
  });
}

}  // namespace conv_detail

// ---- forward -------------------------------------------------------------------
// Each thread owns a block of output lines (columns of the GEMM) of the
// chunk: it packs their columns, multiplies them and stores them, touching
// nothing another thread reads, so a chunk needs no barrier inside.

template <class T>
void conv2d_forward(const ops::ConvGeometry& g, const ops::ConvScratch& s,
                    const conv_detail::Scratch<conv_detail::compute_t<T>>& ws, const T* x, const T* w, const T* bias,
                    T* y) {
  using namespace conv_detail;
  using C = compute_t<T>;
  const std::int64_t hwo = g.hw_out(), k = g.k(), cg = g.cout_g();
  const C* wc = nullptr;
  if constexpr (is_half_v<T>) {
    widen_all(w, ws.weight, g.cout * k);
    wc = ws.weight;
  } else {
    wc = w;
  }
  in_parallel(g.flops(), [&](int t, int nt) {
    for (std::int64_t b0 = 0; b0 < g.n; b0 += s.images) {
      const std::int64_t nb = std::min(s.images, g.n - b0), p = nb * hwo;
      const Share u = share(nb * g.ho, t, nt);
      const std::int64_t c0 = u.begin * g.wo, nc = (u.end - u.begin) * g.wo;
      for (std::int64_t gi = 0; gi < g.groups && nc > 0; ++gi) {
        const C* cols = ws.col;
        std::int64_t ldc = p;
        if (ws.col) {
          im2col(x, ws.col, g, b0, p, gi, 0, k, u.begin, u.end);
        } else if constexpr (std::is_same_v<T, C>) {  // pointwise, one image: the planes are the columns
          cols = x + (b0 * g.cin + gi * g.cin_g()) * g.hw();
          ldc = hwo;
        }
        const C* wg = wc + gi * cg * k;
        if (ws.rows) {
          gemm(false, false, cg, nc, k, C(1), wg, k, cols + c0, ldc, C(0), ws.rows + c0, p);
          scatter_rows(ws.rows, y, bias, g, b0, p, gi, u.begin, u.end);
        } else if constexpr (std::is_same_v<T, C>) {  // one image: straight into y
          C* yg = y + (b0 * g.cout + gi * cg) * hwo + c0;
          C beta = C(0);
          if (bias) {
            for (std::int64_t co = 0; co < cg; ++co) std::fill(yg + co * hwo, yg + co * hwo + nc, bias[gi * cg + co]);
            beta = C(1);
          }
          gemm(false, false, cg, nc, k, C(1), wg, k, cols + c0, ldc, beta, yg, hwo);
        }
      }
      // The next chunk reuses the scratch with the same split, except a
      // shorter last chunk: wait before it.
      if (nt > 1 && b0 + s.images < g.n && g.n - (b0 + s.images) < s.images) {
#pragma omp barrier
      }
    }
  });
}

// ---- data gradient -------------------------------------------------------------
// Each thread multiplies its block of columns (wᵀ·dy); then, after a
// barrier, col2im of its share of the input planes.

template <class T>
void conv2d_backward_data(const ops::ConvGeometry& g, const ops::ConvScratch& s,
                          const conv_detail::Scratch<conv_detail::compute_t<T>>& ws, const T* dy, const T* w, T* dx) {
  using namespace conv_detail;
  using C = compute_t<T>;
  const std::int64_t hwo = g.hw_out(), k = g.k(), cg = g.cout_g(), cin_g = g.cin_g();
  const C* wc = nullptr;
  if constexpr (is_half_v<T>) {
    widen_all(w, ws.weight, g.cout * k);
    wc = ws.weight;
  } else {
    wc = w;
  }
  in_parallel(g.flops(), [&](int t, int nt) {
    for (std::int64_t b0 = 0; b0 < g.n; b0 += s.images) {
      const std::int64_t nb = std::min(s.images, g.n - b0), p = nb * hwo;
      const Share u = share(nb * g.ho, t, nt);
      const std::int64_t c0 = u.begin * g.wo, nc = (u.end - u.begin) * g.wo;
      for (std::int64_t gi = 0; gi < g.groups; ++gi) {
        const C* dyg = ws.rows;
        std::int64_t lddy = p;
        if (ws.rows) {
          gather_rows(dy, ws.rows, g, b0, p, gi, u.begin, u.end);
        } else if constexpr (std::is_same_v<T, C>) {
          dyg = dy + (b0 * g.cout + gi * cg) * hwo;
          lddy = hwo;
        }
        const C* wg = wc + gi * cg * k;
        if (!ws.col) {
          // Pointwise, one image, native dtype: the column gradient is dx.
          if constexpr (std::is_same_v<T, C>) {
            if (nc > 0)
              gemm(true, false, k, nc, cg, C(1), wg, k, dyg + c0, lddy, C(0),
                   dx + (b0 * g.cin + gi * cin_g) * g.hw() + c0, hwo);
          }
          continue;
        }
        if (nc > 0) gemm(true, false, k, nc, cg, C(1), wg, k, dyg + c0, lddy, C(0), ws.col + c0, p);
        if (nt > 1) {
#pragma omp barrier
        }
        const Share q = share(nb * cin_g, t, nt);
        if constexpr (is_half_v<T>) {
          C* acc = ws.acc;
          col2im(ws.col, g, p, q.begin, q.end,
                 [&](std::int64_t img, std::int64_t ci) { return acc + (img * cin_g + ci) * g.hw(); });
          for (std::int64_t pl = q.begin; pl < q.end; ++pl) {
            const C* src = acc + pl * g.hw();
            T* d = dx + ((b0 + pl / cin_g) * g.cin + gi * cin_g + pl % cin_g) * g.hw();
            for (std::int64_t e = 0; e < g.hw(); ++e) d[e] = T(src[e]);
          }
        } else {
          col2im(ws.col, g, p, q.begin, q.end, [&](std::int64_t img, std::int64_t ci) {
            return dx + ((b0 + img) * g.cin + gi * cin_g + ci) * g.hw();
          });
        }
        if (nt > 1) {  // the next group or chunk overwrites the columns
#pragma omp barrier
        }
      }
    }
  });
}

// ---- weight (and bias) gradient -----------------------------------------------------
// Each thread owns a block of the weight gradient's columns (rows r of the
// column matrix): it packs those rows of the columns and multiplies them by
// all of dy, accumulating chunk after chunk in image order. Only a gathered
// dy is shared, behind a barrier.

template <class T>
void conv2d_backward_weight(const ops::ConvGeometry& g, const ops::ConvScratch& s,
                            const conv_detail::Scratch<conv_detail::compute_t<T>>& ws, const T* x, const T* dy, T* dw,
                            T* db) {
  using namespace conv_detail;
  using C = compute_t<T>;
  const std::int64_t hwo = g.hw_out(), k = g.k(), cg = g.cout_g();
  C* dwc = nullptr;
  if constexpr (is_half_v<T>) {
    dwc = ws.acc;
  } else {
    dwc = dw;
  }
  if (g.n == 0) std::fill(dwc, dwc + g.cout * k, C(0));
  in_parallel(g.flops(), [&](int t, int nt) {
    const Share r = share(k, t, nt);
    for (std::int64_t b0 = 0; b0 < g.n; b0 += s.images) {
      const std::int64_t nb = std::min(s.images, g.n - b0), p = nb * hwo;
      for (std::int64_t gi = 0; gi < g.groups; ++gi) {
        const C* dyg = ws.rows;
        std::int64_t lddy = p;
        if (ws.rows) {
          const Share u = share(nb * g.ho, t, nt);
          gather_rows(dy, ws.rows, g, b0, p, gi, u.begin, u.end);
          if (nt > 1) {
#pragma omp barrier
          }
        } else if constexpr (std::is_same_v<T, C>) {
          dyg = dy + (b0 * g.cout + gi * cg) * hwo;
          lddy = hwo;
        }
        const C* cols = ws.col;
        std::int64_t ldc = p;
        if (ws.col) {
          im2col(x, ws.col, g, b0, p, gi, r.begin, r.end, 0, nb * g.ho);
        } else if constexpr (std::is_same_v<T, C>) {
          cols = x + (b0 * g.cin + gi * g.cin_g()) * g.hw();
          ldc = hwo;
        }
        if (r.end > r.begin)
          gemm(false, true, cg, r.end - r.begin, p, C(1), dyg, lddy, cols + r.begin * ldc, ldc, b0 == 0 ? C(0) : C(1),
               dwc + gi * cg * k + r.begin, k);
        if (nt > 1 && ws.rows) {  // the next group or chunk overwrites the gathered dy
#pragma omp barrier
        }
      }
      // Without a gathered dy, only a shorter last chunk moves the rows.
      if (nt > 1 && !ws.rows && b0 + s.images < g.n && g.n - (b0 + s.images) < s.images) {
#pragma omp barrier
      }
    }
  });
  if constexpr (is_half_v<T>) narrow_all(dwc, dw, g.cout * k);
  if (db) {
    // Summed per channel in image order, in double.
    parallel_for(g.cout, g.n * hwo, [&](std::int64_t b, std::int64_t e) {
      for (std::int64_t co = b; co < e; ++co) {
        double acc = 0;
        for (std::int64_t img = 0; img < g.n; ++img) {
          const T* row = dy + (img * g.cout + co) * hwo;
          for (std::int64_t q = 0; q < hwo; ++q) acc += double(widen<C>(row[q]));
        }
        db[co] = T(C(acc));
      }
    });
  }
}

// ---- kernels ---------------------------------------------------------------------------

inline void conv2d_kernel(const ops::Conv2d& op, const KernelArgs& a) {
  conv_detail::dispatch_storage(a.in[0].dtype, "conv2d", [&](auto tag) {
    using T = decltype(tag);
    using C = conv_detail::compute_t<T>;
    auto g = op.geometry(*a.in[0].shape, *a.in[1].shape);
    auto s = ops::conv_scratch(g, a.in[0].dtype, ops::ConvPass::forward);
    conv2d_forward<T>(g, s, conv_detail::carve<C>(s, a, "conv2d"), a.in[0].as<T>(), a.in[1].as<T>(),
                      op.has_bias() ? a.in[2].as<T>() : nullptr, a.out[0].as<T>());
  });
}

inline void conv2d_backward_data_kernel(const ops::Conv2dBackwardData& op, const KernelArgs& a) {
  conv_detail::dispatch_storage(a.in[0].dtype, "conv2d_backward_data", [&](auto tag) {
    using T = decltype(tag);
    using C = conv_detail::compute_t<T>;
    auto g = op.geometry(*a.in[1].shape);
    auto s = ops::conv_scratch(g, a.in[0].dtype, ops::ConvPass::backward_data);
    conv2d_backward_data<T>(g, s, conv_detail::carve<C>(s, a, "conv2d_backward_data"), a.in[0].as<T>(),
                            a.in[1].as<T>(), a.out[0].as<T>());
  });
}

inline void conv2d_backward_weight_kernel(const ops::Conv2dBackwardWeight& op, const KernelArgs& a) {
  conv_detail::dispatch_storage(a.in[0].dtype, "conv2d_backward_weight", [&](auto tag) {
    using T = decltype(tag);
    using C = conv_detail::compute_t<T>;
    auto g = op.geometry(*a.in[0].shape);
    auto s = ops::conv_scratch(g, a.in[0].dtype, ops::ConvPass::backward_weight);
    conv2d_backward_weight<T>(g, s, conv_detail::carve<C>(s, a, "conv2d_backward_weight"), a.in[0].as<T>(),
                              a.in[1].as<T>(), a.out[0].as<T>(), op.with_bias() ? a.out[1].as<T>() : nullptr);
  });
}

inline const bool conv_registered = kernels().add<ops::Conv2d>(conv2d_kernel) &&
                                    kernels().add<ops::Conv2dBackwardData>(conv2d_backward_data_kernel) &&
                                    kernels().add<ops::Conv2dBackwardWeight>(conv2d_backward_weight_kernel);

}  // namespace frugal::cpu
