#pragma once
// conv2d and its two backward ops on the CPU, in two engines over the same
// planned scratch (conv_scratch; the layout depends on shapes only):
//
// - AVX-512 (conv_avx512.hpp), chosen at run time where the CPU has it, for
//   f32/bf16/f16: im2col packed straight into 32-column panels, an 8x32 FMA
//   micro-kernel, results stored straight into the output. A stride-1 data
//   gradient runs as a convolution of dy by the flipped weight.
// - BLAS: im2col into the scratch, OpenBLAS GEMM, then scatter (forward) or
//   col2im (data gradient). Runs f64 always, and everything on CPUs without
//   AVX-512.
//
// Either engine runs a 3x3 stride-1 pass as Winograd F(2x2,3x3) or F(4x4,3x3) instead
// (conv_winograd.hpp) where its planned scratch says so (conv_scratch.hpp).
//
// Both work a chunk of images at a time inside one parallel region, each
// thread owning a static share of columns (or, for the weight gradient, of
// the weight's columns), with BLAS single-threaded inside. Every output
// element is summed by one thread in a fixed order, so the same inputs and
// thread count give the same bits; the weight gradient adds the chunks in
// image order.
//
// bf16/f16 are storage only: widened to f32 while packing, multiplied in
// f32, rounded once on the final store. Where the CPU has AVX512-BF16, a
// bf16 forward (or stride-1 data gradient) of even depth on the AVX-512
// engine packs bf16 pairs instead and multiplies them with VDPBF16PS
// (conv_avx512.hpp, micro_kernel_bf16): the same exact products, summed in
// f32 in another order.
#include <cstring>
#include <type_traits>

#include "../../ops/conv.hpp"
#include "../../runtime/backend.hpp"
#include "blas.hpp"
#include "conv_avx512.hpp"
#include "isa.hpp"
#include "conv_scratch.hpp"
#include "conv_winograd.hpp"
#include "convert.hpp"
#include "parallel.hpp"

#include "abi.hpp"

namespace frugal::cpu::inline FRUGAL_KERNEL_ABI {

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

// A value read into the compute type, and one rounded once to the storage
// type: convert.hpp's widen_as and narrow_as (branch-free for bf16/f16, so
// the packing and storing loops vectorise).
template <class C, class T>
inline C widen(T v) {
  return widen_as<C>(v);
}
template <class T, class C>
inline T narrow(C v) {
  return narrow_as<T>(v);
}
// fn() in the widest instruction set for 16-bit storage T (its packing and
// storing loops convert every element), as compiled for f32 and f64.
template <class T, class Fn>
inline void widest_if_half(Fn&& fn) {
  if constexpr (is_half_v<T>) run_widest(fn);
  else fn();
}

// The scratch regions of one op, carved out of KernelArgs::workspace.
template <class C>
struct Scratch {
  C *col = nullptr, *weight = nullptr, *rows = nullptr, *acc = nullptr;
  C *wu = nullptr, *wv = nullptr, *wm = nullptr;  // Winograd's regions
};

template <class C>
Scratch<C> carve(const ConvScratch& s, const KernelArgs& a, const char* op) {
  if (s.bytes() > 0 && (!a.workspace || a.workspace_bytes < s.bytes()))
    fail("internal: ", op, " was given ", a.workspace_bytes, " bytes of scratch space but needs ", s.bytes());
  auto* base = static_cast<std::byte*>(a.workspace);
  auto at = [&](std::size_t n, std::size_t off) { return n ? reinterpret_cast<C*>(base + off) : nullptr; };
  return {at(s.col, s.col_offset()), at(s.weight, s.weight_offset()), at(s.rows, s.rows_offset()),
          at(s.acc, s.acc_offset()), at(s.wu, s.wu_offset()), at(s.wv, s.wv_offset()), at(s.wm, s.wm_offset())};
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

// [begin, end) of n items for chunk t of nt: equal contiguous shares.
struct Share {
  std::int64_t begin, end;
};
inline Share share(std::int64_t n, std::int64_t t, std::int64_t nt) { return {n * t / nt, n * (t + 1) / nt}; }

// The chunks of a convolution's parallel phases (worker_team.hpp). The
// AVX-512 engine computes every element the same way however its panels
// and row blocks are shared (each is one micro-kernel call over the full
// depth), so its split may follow the team: one chunk per thread, as before
// the team; two per thread cost 27% of a 2-thread ResNet step on an idle
// machine (each chunk regathers the weight blocks), and one per thread is
// still 1.3-1.5x faster than 1 thread when every core also runs a busy
// process (a helper that has not started its chunk leaves it to the
// caller). The BLAS engine's
// split sets each GEMM's columns, and so its bits: it depends on the sizes
// alone.
inline std::int64_t fast_chunks(double flops) {
  const int nt = team_threads();
  return nt == 1 || flops < 4e6 ? 1 : std::int64_t(nt);
}
inline std::int64_t blas_chunks(double flops) {
  return flops < 4e6 ? 1 : std::clamp<std::int64_t>(std::llround(flops / 64e6), 2, 16);
}

// fn(c) for every chunk c; one call per phase, so each call's return is a
// barrier between phases.
template <class Fn>
void each_chunk(std::int64_t chunks, Fn&& fn) {
  if (chunks == 1) fn(std::int64_t(0));
  else run_chunks(chunks, fn);
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
    std::int64_t img = u0 / g.ho, oh = u0 % g.ho;
    for (std::int64_t u = u0; u < u1; ++u, ++oh) {
      if (oh == g.ho) oh = 0, ++img;
      const std::int64_t iy = oh * g.sh + offh;
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

// The column gradient of images [b0, b0 + ...) in group gi, planes [q.begin,
// q.end) of this thread's share, summed into dx. 16-bit dx is summed in the
// f32 scratch `acc` first and rounded once on store.
template <class T, class C>
void col2im_into_dx(const C* col, C* acc, const ops::ConvGeometry& g, std::int64_t p, Share q, std::int64_t b0,
                    std::int64_t gi, T* dx) {
  const std::int64_t cin_g = g.cin_g();
  if constexpr (is_half_v<T>) {
    // Plane by plane, each rounded while its sums are still in cache.
    for (std::int64_t pl = q.begin; pl < q.end; ++pl) {
      col2im(col, g, p, pl, pl + 1,
             [&](std::int64_t img, std::int64_t ci) { return acc + (img * cin_g + ci) * g.hw(); });
      const C* src = acc + pl * g.hw();
      T* d = dx + ((b0 + pl / cin_g) * g.cin + gi * cin_g + pl % cin_g) * g.hw();
      for (std::int64_t e = 0; e < g.hw(); ++e) d[e] = narrow<T>(src[e]);
    }
  } else {
    col2im(col, g, p, q.begin, q.end, [&](std::int64_t img, std::int64_t ci) {
      return dx + ((b0 + img) * g.cin + gi * cin_g + ci) * g.hw();
    });
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
      for (std::int64_t c = 0; c < g.wo; ++c) d[c] = narrow<T>(s[c] + bv);
    }
  }
}

// A 16-bit tensor widened into f32 scratch, and f32 scratch rounded into
// one: the bulk conversions (convert.hpp, the widest instruction set).
template <class T, class C>
void widen_all(const T* src, C* dst, std::int64_t n) {
  parallel_for(n, 1, [&](std::int64_t b, std::int64_t e) { bulk::convert_span(src + b, dst + b, e - b); });
}

template <class C, class T>
void narrow_all(const C* src, T* dst, std::int64_t n) {
  parallel_for(n, 1, [&](std::int64_t b, std::int64_t e) { bulk::convert_span(src + b, dst + b, e - b); });
}

}  // namespace conv_detail

// ---- the BLAS engine: forward ------------------------------------------------------
// Each chunk owns a block of output lines (columns of the GEMM) of the
// images: it packs their columns, multiplies them and stores them, touching
// nothing another chunk reads.

template <class T>
void conv2d_forward_blas(const ops::ConvGeometry& g, const ConvScratch& s,
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
  const std::int64_t nt = blas_chunks(g.flops());
  for (std::int64_t b0 = 0; b0 < g.n; b0 += s.images) {
    each_chunk(nt, [&](std::int64_t t) {
      const std::int64_t nb = std::min(s.images, g.n - b0), p = nb * hwo;
      const Share u = share(nb * g.ho, t, nt);
      const std::int64_t c0 = u.begin * g.wo, nc = (u.end - u.begin) * g.wo;
      for (std::int64_t gi = 0; gi < g.groups && nc > 0; ++gi) {
        const C* cols = ws.col;
        std::int64_t ldc = p;
        if (!(s.one && g.pointwise())) {
          widest_if_half<T>([&] { im2col(x, ws.col, g, b0, p, gi, 0, k, u.begin, u.end); });
        } else if constexpr (std::is_same_v<T, C>) {  // pointwise, one image: the planes are the columns
          cols = x + (b0 * g.cin + gi * g.cin_g()) * g.hw();
          ldc = hwo;
        }
        const C* wg = wc + gi * cg * k;
        if (!s.one) {
          gemm(false, false, cg, nc, k, C(1), wg, k, cols + c0, ldc, C(0), ws.rows + c0, p);
          widest_if_half<T>([&] { scatter_rows(ws.rows, y, bias, g, b0, p, gi, u.begin, u.end); });
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
    });
  }
}

// ---- the BLAS engine: data gradient ------------------------------------------------
// Each chunk multiplies its block of columns (wᵀ·dy); then, once all have,
// each chunk runs col2im of its share of the input planes.

template <class T>
void conv2d_backward_data_blas(const ops::ConvGeometry& g, const ConvScratch& s,
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
  const std::int64_t nt = blas_chunks(g.flops());
  for (std::int64_t b0 = 0; b0 < g.n; b0 += s.images) {
    const std::int64_t nb = std::min(s.images, g.n - b0), p = nb * hwo;
    for (std::int64_t gi = 0; gi < g.groups; ++gi) {
      each_chunk(nt, [&](std::int64_t t) {
        const Share u = share(nb * g.ho, t, nt);
        const std::int64_t c0 = u.begin * g.wo, nc = (u.end - u.begin) * g.wo;
        const C* dyg = ws.rows;
        std::int64_t lddy = p;
        if (!s.one) {
          widest_if_half<T>([&] { gather_rows(dy, ws.rows, g, b0, p, gi, u.begin, u.end); });
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
          return;
        }
        if (nc > 0) gemm(true, false, k, nc, cg, C(1), wg, k, dyg + c0, lddy, C(0), ws.col + c0, p);
      });
      if (!ws.col) continue;
      each_chunk(nt, [&](std::int64_t t) {
        widest_if_half<T>([&] { col2im_into_dx(ws.col, ws.acc, g, p, share(nb * cin_g, t, nt), b0, gi, dx); });
      });
    }
  }
}

// ---- the BLAS engine: weight gradient ----------------------------------------------
// Each chunk owns a block of the weight gradient's columns (rows r of the
// column matrix): it packs those rows of the columns and multiplies them by
// all of dy, accumulating image block after image block in image order. Only
// a gathered dy is shared, gathered in a phase of its own.

template <class T>
void conv2d_backward_weight_blas(const ops::ConvGeometry& g, const ConvScratch& s,
                                 const conv_detail::Scratch<conv_detail::compute_t<T>>& ws, const T* x, const T* dy,
                                 T* dw) {
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
  const std::int64_t nt = blas_chunks(g.flops());
  for (std::int64_t b0 = 0; b0 < g.n; b0 += s.images) {
    const std::int64_t nb = std::min(s.images, g.n - b0), p = nb * hwo;
    for (std::int64_t gi = 0; gi < g.groups; ++gi) {
      const C* dyg = ws.rows;
      std::int64_t lddy = p;
      if (!s.one) {
        each_chunk(nt, [&](std::int64_t t) {
          const Share u = share(nb * g.ho, t, nt);
          widest_if_half<T>([&] { gather_rows(dy, ws.rows, g, b0, p, gi, u.begin, u.end); });
        });
      } else if constexpr (std::is_same_v<T, C>) {
        dyg = dy + (b0 * g.cout + gi * cg) * hwo;
        lddy = hwo;
      }
      each_chunk(nt, [&](std::int64_t t) {
        const Share r = share(k, t, nt);
        const C* cols = ws.col;
        std::int64_t ldc = p;
        if (ws.col) {
          widest_if_half<T>([&] { im2col(x, ws.col, g, b0, p, gi, r.begin, r.end, 0, nb * g.ho); });
        } else if constexpr (std::is_same_v<T, C>) {
          cols = x + (b0 * g.cin + gi * g.cin_g()) * g.hw();
          ldc = hwo;
        }
        if (r.end > r.begin)
          gemm(false, true, cg, r.end - r.begin, p, C(1), dyg, lddy, cols + r.begin * ldc, ldc, b0 == 0 ? C(0) : C(1),
               dwc + gi * cg * k + r.begin, k);
      });
    }
  }
  if constexpr (is_half_v<T>) narrow_all(dwc, dw, g.cout * k);
}

// ---- bias gradient -------------------------------------------------------------------

// db[co] = sum over images and positions of dy, per channel in image order, in double.
template <class T>
void conv2d_bias_grad(const ops::ConvGeometry& g, const T* dy, T* db) {
  using C = conv_detail::compute_t<T>;
  const std::int64_t hwo = g.hw_out();
  parallel_for(g.cout, g.n * hwo, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t co = b; co < e; ++co) {
      double acc = 0;
      for (std::int64_t img = 0; img < g.n; ++img) {
        const T* row = dy + (img * g.cout + co) * hwo;
        for (std::int64_t q = 0; q < hwo; ++q) acc += double(conv_detail::widen<C>(row[q]));
      }
      db[co] = T(C(acc));
    }
  });
}

// ---- the AVX-512 engine ----------------------------------------------------------------
// (conv_avx512.hpp has the micro-kernel and why.) Columns of a chunk are
// numbered n = image * Ho*Wo + oh * Wo + ow; a panel is 32 of them.

namespace conv_detail {

using conv_fast::MR;
using conv_fast::NR;
static_assert(NR == kConvPanel, "the planned scratch is sized for 32-column panels");

inline std::int64_t panels(std::int64_t n) { return (n + NR - 1) / NR; }

// Pieces of the columns [n0, n0 + count) that stay in one output line
// (`lines`) or in one image: where they start in the image and in the panel.
struct Piece {
  std::int64_t img, q, len, c;
};
inline int pieces(const ops::ConvGeometry& g, std::int64_t n0, std::int64_t count, bool lines, Piece* out) {
  const std::int64_t hwo = g.hw_out();
  int np = 0;
  for (std::int64_t c = 0, n = n0; c < count;) {
    const std::int64_t img = n / hwo, q = n % hwo;
    const std::int64_t len = std::min(lines ? g.wo - q % g.wo : hwo - q, count - c);
    out[np++] = {img, q, len, c};
    c += len;
    n += len;
  }
  return np;
}

// A panel's element type D: f32 ([k][32], widened), or bf16 bits in
// pairs ([k/2][32] 32-bit words, rows 2q and 2q + 1 of a column side by side,
// for micro_kernel_bf16). Where row r's column c lies, and a value as D.
template <class D>
constexpr std::int64_t panel_at(std::int64_t r, std::int64_t c) {
  if constexpr (std::is_same_v<D, float>) return r * NR + c;
  else return (r >> 1) * 2 * NR + 2 * c + (r & 1);
}
template <class D>
inline constexpr std::int64_t kPanelStride = std::is_same_v<D, float> ? 1 : 2;  // between columns
template <class D, class T>
inline D panel_value(T v) {
  if constexpr (std::is_same_v<D, float>) return widen<float>(v);
  else return v.bits;
}

// The im2col columns [n0, n0 + count) of the chunk from image b0, group gi,
// packed as a panel of D (above), zero past count.
template <class T, class D = float>
void pack_columns(const T* x, D* __restrict panel, const ops::ConvGeometry& g, std::int64_t b0, std::int64_t gi,
                  std::int64_t n0, std::int64_t count) {
  constexpr std::int64_t S = kPanelStride<D>;
  Piece pc[NR];
  const int np = pieces(g, n0, count, true, pc);
  // Per piece: its output row and first column, and its image's planes.
  std::int64_t oh[NR], ow0[NR];
  const T* planes[NR];
  for (int t = 0; t < np; ++t) {
    oh[t] = pc[t].q / g.wo;
    ow0[t] = pc[t].q % g.wo;
    planes[t] = x + ((b0 + pc[t].img) * g.cin + gi * g.cin_g()) * g.hw();
  }
  // Each kernel column's valid output range, computed once (it has divisions).
  constexpr std::int64_t kTaps = 16;
  std::int64_t lo_of[kTaps], hi_of[kTaps];
  for (std::int64_t j = 0; j < std::min(g.kw, kTaps); ++j) tap_range(j * g.dw - g.pw, g.sw, g.w, g.wo, lo_of[j], hi_of[j]);
  std::int64_t r = 0;  // the panel row: tap (ci, i, j)
  for (std::int64_t ci = 0; ci < g.cin_g(); ++ci)
    for (std::int64_t i = 0; i < g.kh; ++i) {
      const std::int64_t offh = i * g.dh - g.ph;
      for (std::int64_t j = 0; j < g.kw; ++j, ++r) {
        D* d = panel + panel_at<D>(r, 0);  // d[c * S] is column c
        const std::int64_t offw = j * g.dw - g.pw;
        std::int64_t lo, hi;
        if (j < kTaps) lo = lo_of[j], hi = hi_of[j];
        else tap_range(offw, g.sw, g.w, g.wo, lo, hi);
        for (int t = 0; t < np; ++t) {
          const Piece& p = pc[t];
          D* dd = d + p.c * S;  // dd[e * S] is output column ow0 + e
          const std::int64_t iy = oh[t] * g.sh + offh;
          if (iy < 0 || iy >= g.h) {
            for (std::int64_t e = 0; e < p.len; ++e) dd[e * S] = D(0);
            continue;
          }
          // Input positions exist for columns [a, b) of the piece; the rest is padding.
          const std::int64_t a = std::clamp(lo - ow0[t], std::int64_t(0), p.len);
          const std::int64_t b = std::clamp(hi - ow0[t], a, p.len);
          const T* row = planes[t] + (ci * g.h + iy) * g.w;
          for (std::int64_t e = 0; e < a; ++e) dd[e * S] = D(0);
          if (g.sw == 1) {
            const T* src = row + (ow0[t] + offw);
            for (std::int64_t e = a; e < b; ++e) dd[e * S] = panel_value<D>(src[e]);
          } else {
            for (std::int64_t e = a; e < b; ++e) dd[e * S] = panel_value<D>(row[(ow0[t] + e) * g.sw + offw]);
          }
          for (std::int64_t e = b; e < p.len; ++e) dd[e * S] = D(0);
        }
        for (std::int64_t c = count; c < NR; ++c) d[c * S] = D(0);
      }
    }
}

// dy's columns [n0, n0 + count) of group gi (rows: its Cout/g channels) as a
// panel [Cout/g][32], zero past count.
template <class T>
void pack_dy(const T* dy, float* __restrict panel, const ops::ConvGeometry& g, std::int64_t b0, std::int64_t gi,
             std::int64_t n0, std::int64_t count) {
  Piece pc[NR];
  const int np = pieces(g, n0, count, false, pc);
  const std::int64_t cg = g.cout_g(), hwo = g.hw_out();
  for (std::int64_t co = 0; co < cg; ++co) {
    float* d = panel + co * NR;
    for (int t = 0; t < np; ++t) {
      const Piece& p = pc[t];
      const T* src = dy + ((b0 + p.img) * g.cout + gi * cg + co) * hwo + p.q;
      for (std::int64_t e = 0; e < p.len; ++e) d[p.c + e] = widen<float>(src[e]);
    }
    for (std::int64_t c = count; c < NR; ++c) d[c] = 0.f;
  }
}

// dy transposed: panel slot s = 32 * panel + j holds channel co = s of group
// gi down the chunk's p columns: panels [p][32], zero for channels past Cout/g.
template <class T>
void pack_dy_transposed(const T* dy, float* panels_base, const ops::ConvGeometry& g, std::int64_t b0,
                        std::int64_t nb, std::int64_t gi, std::int64_t s0, std::int64_t s1) {
  const std::int64_t cg = g.cout_g(), hwo = g.hw_out(), p = nb * hwo;
  for (std::int64_t slot = s0; slot < s1; ++slot) {
    float* __restrict d = panels_base + (slot / NR) * p * NR + slot % NR;
    if (slot >= cg) {
      for (std::int64_t n = 0; n < p; ++n) d[n * NR] = 0.f;
      continue;
    }
    for (std::int64_t img = 0; img < nb; ++img) {
      const T* src = dy + ((b0 + img) * g.cout + gi * cg + slot) * hwo;
      float* dd = d + img * hwo * NR;
      for (std::int64_t q = 0; q < hwo; ++q) dd[q * NR] = widen<float>(src[q]);
    }
  }
}

}  // namespace conv_detail

// The forward pass over weights wc [Cout, k] (also the data gradient of a
// stride-1 convolution, run as a convolution of dy): f32 (W = float), or,
// on the bf16 micro-kernel, the bf16 tensors' own bits (W = std::uint16_t;
// k even). Each chunk owns a share of the images' column panels: it packs a
// panel's im2col columns and multiplies every 8-row block of the weight by
// it, storing straight into y. Nothing is shared between chunks.
template <class T, class W = float>
void conv_forward_panels(const ops::ConvGeometry& g, std::int64_t images, float* col, const T* x, const W* wc,
                         const T* bias, T* y) {
  using namespace conv_detail;
  const std::int64_t hwo = g.hw_out(), k = g.k(), cg = g.cout_g();
  const std::int64_t nt = fast_chunks(g.flops());
  for (std::int64_t b0 = 0; b0 < g.n; b0 += images) {
    each_chunk(nt, [&](std::int64_t t) {
      alignas(64) float tile[MR * NR];
      Piece pc[NR];
      const std::int64_t nb = std::min(images, g.n - b0), p = nb * hwo;
      const Share sh = share(panels(p), t, nt);
      for (std::int64_t gi = 0; gi < g.groups; ++gi)
        for (std::int64_t jp = sh.begin; jp < sh.end; ++jp) {
          const std::int64_t n0 = jp * NR, count = std::min<std::int64_t>(NR, p - n0);
          float* panel = col + jp * k * NR;  // pairs take the first half of it
          widest_if_half<T>([&] {
            if constexpr (std::is_same_v<W, float>) pack_columns(x, panel, g, b0, gi, n0, count);
            else pack_columns(x, reinterpret_cast<std::uint16_t*>(panel), g, b0, gi, n0, count);
          });
          const int np = pieces(g, n0, count, false, pc);
          for (std::int64_t m0 = 0; m0 < cg; m0 += MR) {
            const int mr = int(std::min<std::int64_t>(MR, cg - m0));
            if constexpr (std::is_same_v<W, float>)
              conv_fast::micro_kernel(k, wc + (gi * cg + m0) * k, k, 1, mr, panel, tile);
            else
              conv_fast::micro_kernel_bf16(k / 2, wc + (gi * cg + m0) * k, k, mr,
                                           reinterpret_cast<const std::uint32_t*>(panel), tile);
            for (int i = 0; i < mr; ++i) {
              const std::int64_t co = gi * cg + m0 + i;
              const float bv = bias ? widen<float>(bias[co]) : 0.f;
              for (int q = 0; q < np; ++q) {
                T* __restrict d = y + ((b0 + pc[q].img) * g.cout + co) * hwo + pc[q].q;
                const float* __restrict src = tile + i * NR + pc[q].c;
                for (std::int64_t e = 0; e < pc[q].len; ++e) d[e] = conv_detail::narrow<T>(src[e] + bv);
              }
            }
          }
        }
    });
  }
}

// Whether a bf16 pass of depth k runs on the bf16 micro-kernel: the CPU
// has AVX512-BF16 (and FRUGAL_CPU_ISA does not cap it below), and k is
// even (its weight rows are read in place as pairs).
template <class T>
bool bf16_panels(std::int64_t k) {
  return std::is_same_v<T, BFloat16> && k % 2 == 0 && cpu_isa() >= CpuIsa::avx512bf16 && bf16gemm512::available();
}
template <class T>
const std::uint16_t* bits_of(const T* p) {
  return reinterpret_cast<const std::uint16_t*>(p);
}

template <class T>
void conv2d_forward_avx512(const ops::ConvGeometry& g, const ConvScratch& s,
                           const conv_detail::Scratch<float>& ws, const T* x, const T* w, const T* bias, T* y) {
  if constexpr (conv_detail::is_half_v<T>) {
    if constexpr (std::is_same_v<T, BFloat16>)
      if (bf16_panels<T>(g.k())) return conv_forward_panels(g, s.images, ws.col, x, bits_of(w), bias, y);
    conv_detail::widen_all(w, ws.weight, g.cout * g.k());
    conv_forward_panels(g, s.images, ws.col, x, ws.weight, bias, y);
  } else {
    conv_forward_panels(g, s.images, ws.col, x, w, bias, y);
  }
}

// The data gradient of a stride-1 convolution as the convolution of dy by
// the flipped weight wf[gi][ci][co][kh-1-i][kw-1-j] = w[gi][co][ci][i][j]
// (see conv_data_grad_is_conv).
template <class T>
void conv2d_backward_data_as_conv(const ops::ConvGeometry& g, const ConvScratch& s,
                                  const conv_detail::Scratch<float>& ws, const T* dy, const T* w, T* dx) {
  const ops::ConvGeometry f = conv_data_grad_geometry(g);
  const std::int64_t k = g.k(), kf = f.k(), khw = g.kh * g.kw, cg = g.cout_g(), cin_g = g.cin_g();
  // The flipped weight: f32, or on the bf16 micro-kernel bf16 bits (in the
  // same scratch, which holds the f32 form).
  auto flip = [&](auto* wf, auto value) {
    parallel_for(g.groups * cin_g, kf, [&](std::int64_t b, std::int64_t e) {
      for (std::int64_t row = b; row < e; ++row) {
        const std::int64_t gi = row / cin_g, ci = row % cin_g;
        auto* __restrict d = wf + row * kf;
        for (std::int64_t co = 0; co < cg; ++co) {
          const T* src = w + (gi * cg + co) * k + ci * khw;
          for (std::int64_t t = 0; t < khw; ++t) d[co * khw + t] = value(src[khw - 1 - t]);
        }
      }
    });
  };
  if constexpr (std::is_same_v<T, BFloat16>) {
    if (bf16_panels<T>(kf)) {
      auto* wf = reinterpret_cast<std::uint16_t*>(ws.weight);
      flip(wf, [](T v) { return conv_detail::panel_value<std::uint16_t>(v); });
      return conv_forward_panels(f, s.images, ws.col, dy, static_cast<const std::uint16_t*>(wf),
                                 static_cast<const T*>(nullptr), dx);
    }
  }
  float* wf = ws.weight;
  flip(wf, [](T v) { return conv_detail::widen<float>(v); });
  conv_forward_panels(f, s.images, ws.col, dy, static_cast<const float*>(wf), static_cast<const T*>(nullptr), dx);
}

// Each chunk packs its share of dy's column panels and multiplies wᵀ by
// them into the column gradient; then each chunk runs col2im of its share
// of the planes (or, 1x1 stride 1 with one image, the product is dx itself).
template <class T>
void conv2d_backward_data_avx512(const ops::ConvGeometry& g, const ConvScratch& s,
                                 const conv_detail::Scratch<float>& ws, const T* dy, const T* w, T* dx) {
  using namespace conv_detail;
  if (conv_data_grad_is_conv(g)) return conv2d_backward_data_as_conv(g, s, ws, dy, w, dx);
  const std::int64_t hwo = g.hw_out(), k = g.k(), cg = g.cout_g(), cin_g = g.cin_g();
  const float* wc = nullptr;
  if constexpr (is_half_v<T>) {
    widen_all(w, ws.weight, g.cout * k);
    wc = ws.weight;
  } else {
    wc = w;
  }
  const std::int64_t nt = fast_chunks(g.flops());
  for (std::int64_t b0 = 0; b0 < g.n; b0 += s.images) {
    const std::int64_t nb = std::min(s.images, g.n - b0), p = nb * hwo;
    for (std::int64_t gi = 0; gi < g.groups; ++gi) {
      each_chunk(nt, [&](std::int64_t t) {
        alignas(64) float tile[MR * NR];
        alignas(64) float ablock[conv_fast::KA * MR];  // 8 rows of wᵀ, up to KA deep
        const Share sh = share(panels(p), t, nt);
        // Without a column buffer (pointwise, one image, f32) the product is dx's planes.
        float* out = ws.col;
        std::int64_t ldo = p;
        if (!ws.col) {
          if constexpr (std::is_same_v<T, float>) {
            out = dx + (b0 * g.cin + gi * cin_g) * g.hw();
            ldo = hwo;
          }
        }
        widest_if_half<T>([&] {
          for (std::int64_t jp = sh.begin; jp < sh.end; ++jp)
            pack_dy(dy, ws.rows + jp * cg * NR, g, b0, gi, jp * NR, std::min<std::int64_t>(NR, p - jp * NR));
        });
        // Rows m0.. of wᵀ (A(i, c) = w[gi * Cout/g + c, m0 + i]) are gathered
        // once into `ablock` and multiplied by every panel this thread owns.
        for (std::int64_t m0 = 0; m0 < k; m0 += MR) {
          const int mr = int(std::min<std::int64_t>(MR, k - m0));
          for (std::int64_t c0 = 0; c0 < cg; c0 += conv_fast::KA) {
            const std::int64_t depth = std::min<std::int64_t>(conv_fast::KA, cg - c0);
            for (std::int64_t c = 0; c < depth; ++c) {
              const float* wr = wc + (gi * cg + c0 + c) * k + m0;
              for (int i = 0; i < MR; ++i) ablock[c * MR + i] = wr[std::min(i, mr - 1)];
            }
            for (std::int64_t jp = sh.begin; jp < sh.end; ++jp) {
              const std::int64_t n0 = jp * NR, count = std::min<std::int64_t>(NR, p - n0);
              conv_fast::micro_kernel(depth, ablock, 1, MR, MR, ws.rows + jp * cg * NR + c0 * NR, tile);
              for (int i = 0; i < mr; ++i) {
                float* __restrict d = out + (m0 + i) * ldo + n0;
                if (c0 == 0)
                  for (std::int64_t c = 0; c < count; ++c) d[c] = tile[i * NR + c];
                else
                  for (std::int64_t c = 0; c < count; ++c) d[c] += tile[i * NR + c];
              }
            }
          }
        }
      });
      if (!ws.col) continue;
      each_chunk(nt, [&](std::int64_t t) {
        widest_if_half<T>([&] { col2im_into_dx(ws.col, ws.acc, g, p, share(nb * cin_g, t, nt), b0, gi, dx); });
      });
    }
  }
}

// The weight gradient transposed, dwᵀ[r, co] = sum_n col[r, n] dy[co, n]:
// each chunk owns a share of the 8-row blocks of the column matrix (rows r
// of dwᵀ), packs those rows of im2col, and multiplies them by dy's panels
// (packed by all chunks in a phase before), accumulating image block after
// image block.
template <class T>
void conv2d_backward_weight_avx512(const ops::ConvGeometry& g, const ConvScratch& s,
                                   const conv_detail::Scratch<float>& ws, const T* x, const T* dy, T* dw) {
  using namespace conv_detail;
  const std::int64_t hwo = g.hw_out(), k = g.k(), cg = g.cout_g();
  float* dwc = nullptr;
  if constexpr (is_half_v<T>) {
    dwc = ws.acc;
  } else {
    dwc = dw;
  }
  if (g.n == 0) std::fill(dwc, dwc + g.cout * k, 0.f);
  const std::int64_t cpanels = panels(cg);
  const std::int64_t nt = fast_chunks(g.flops());
  auto rows_of = [&](std::int64_t t) {  // the 8-row blocks of chunk t: [r0, r1)
    const Share blocks = share((k + MR - 1) / MR, t, nt);
    return Share{blocks.begin * MR, std::min(k, blocks.end * MR)};
  };
  for (std::int64_t b0 = 0; b0 < g.n; b0 += s.images) {
    const std::int64_t nb = std::min(s.images, g.n - b0), p = nb * hwo;
    for (std::int64_t gi = 0; gi < g.groups; ++gi) {
      each_chunk(nt, [&](std::int64_t t) {
        const Share slots = share(cpanels * NR, t, nt);
        const Share r = rows_of(t);
        widest_if_half<T>([&] {
          pack_dy_transposed(dy, ws.rows, g, b0, nb, gi, slots.begin, slots.end);
          if (ws.col) im2col(x, ws.col, g, b0, p, gi, r.begin, r.end, 0, nb * g.ho);
        });
      });
      const float* cols = ws.col;
      std::int64_t ldc = p;
      if (!ws.col) {
        if constexpr (std::is_same_v<T, float>) {  // pointwise, one image: the planes are the columns
          cols = x + (b0 * g.cin + gi * g.cin_g()) * g.hw();
          ldc = hwo;
        }
      }
      each_chunk(nt, [&](std::int64_t t) {
        alignas(64) float tile[MR * NR];
        const Share r = rows_of(t);
        const std::int64_t r0 = r.begin, r1 = r.end;
        float* dwg = dwc + gi * cg * k;
        for (std::int64_t jp = 0; jp < cpanels; ++jp) {
          const std::int64_t c0 = jp * NR, count = std::min<std::int64_t>(NR, cg - c0);
          const float* panel = ws.rows + jp * p * NR;
          for (std::int64_t m0 = r0; m0 < r1; m0 += MR) {
            const int mr = int(std::min<std::int64_t>(MR, r1 - m0));
            conv_fast::micro_kernel(p, cols + m0 * ldc, ldc, 1, mr, panel, tile);
            for (std::int64_t c = 0; c < count; ++c) {
              float* __restrict d = dwg + (c0 + c) * k + m0;
              if (b0 == 0)
                for (int i = 0; i < mr; ++i) d[i] = tile[i * NR + c];
              else
                for (int i = 0; i < mr; ++i) d[i] += tile[i * NR + c];
            }
          }
        }
      });
    }
  }
  if constexpr (is_half_v<T>) narrow_all(dwc, dw, g.cout * k);
}

// ---- engines ---------------------------------------------------------------------------

// Which engine runs f32, bf16 and f16 convolutions (f64 always uses BLAS).
// It is a property of the backend that owns the kernel table (chosen when
// the backend is made, BackendOptions::conv_engine), never a process-wide
// setting, so two steps in one process can use different engines.
enum class ConvEngine { blas, avx512 };

inline ConvEngine conv_engine_from(const std::string& name) {
  if (name == "blas") return ConvEngine::blas;
  if (name == "avx512") {
    if (!conv_fast::available())
      fail("cpu: the AVX-512 convolution engine was asked for (conv_engine \"avx512\"), but ",
           conv_fast::kCompiledIn ? "this CPU has no AVX-512F" : "frugal's kernels were built without it (FRUGAL_WITH_AVX512=OFF)",
           "; use \"auto\" or \"blas\"");
    return ConvEngine::avx512;
  }
  // A forced narrower instruction set (FRUGAL_CPU_ISA, isa.hpp) keeps "auto" on BLAS.
  if (name == "auto" || name.empty())
    return conv_fast::available() && cpu_isa() >= CpuIsa::avx512 ? ConvEngine::avx512 : ConvEngine::blas;
  fail("cpu: unknown convolution engine '", name, "' (use \"auto\", \"blas\" or \"avx512\")");
}

// Which algorithm runs the 3x3 stride-1 convolutions: BackendOptions::
// conv_algorithm, like the engine a property of the backend (the plan's
// scratch follows it).
inline ConvAlgorithm conv_algorithm_from(const std::string& name) {
  if (name == "auto" || name.empty()) return ConvAlgorithm::by_shape;
  if (name == "direct") return ConvAlgorithm::direct;
  if (name == "winograd") return ConvAlgorithm::winograd;
  if (name == "winograd-f2") return ConvAlgorithm::winograd_f2;
  if (name == "winograd-f4") return ConvAlgorithm::winograd_f4;
  fail("cpu: unknown convolution algorithm '", name,
       "' (use \"auto\", \"direct\", \"winograd\", \"winograd-f2\" or \"winograd-f4\")");
}

template <class T>
void conv2d_forward(ConvEngine e, const ops::ConvGeometry& g, const ConvScratch& s,
                    const conv_detail::Scratch<conv_detail::compute_t<T>>& ws, const T* x, const T* w, const T* bias,
                    T* y) {
  if constexpr (!std::is_same_v<T, double>) {
    if (s.winograd) return winograd::forward(g, s, ws.wu, ws.wv, ws.wm, x, w, false, bias, y);
    if (e == ConvEngine::avx512) return conv2d_forward_avx512<T>(g, s, ws, x, w, bias, y);
  }
  conv2d_forward_blas<T>(g, s, ws, x, w, bias, y);
}

template <class T>
void conv2d_backward_data(ConvEngine e, const ops::ConvGeometry& g, const ConvScratch& s,
                          const conv_detail::Scratch<conv_detail::compute_t<T>>& ws, const T* dy, const T* w, T* dx) {
  if constexpr (!std::is_same_v<T, double>) {
    if (s.winograd)
      return winograd::forward(conv_data_grad_geometry(g), s, ws.wu, ws.wv, ws.wm, dy, w, true,
                               static_cast<const T*>(nullptr), dx);
    if (e == ConvEngine::avx512) return conv2d_backward_data_avx512<T>(g, s, ws, dy, w, dx);
  }
  conv2d_backward_data_blas<T>(g, s, ws, dy, w, dx);
}

template <class T>
void conv2d_backward_weight(ConvEngine e, const ops::ConvGeometry& g, const ConvScratch& s,
                            const conv_detail::Scratch<conv_detail::compute_t<T>>& ws, const T* x, const T* dy, T* dw,
                            T* db) {
  if constexpr (!std::is_same_v<T, double>) {
    if (s.winograd) winograd::backward_weight(g, s, ws.wu, ws.wv, ws.wm, x, dy, dw);
    else if (e == ConvEngine::avx512) conv2d_backward_weight_avx512<T>(g, s, ws, x, dy, dw);
    else conv2d_backward_weight_blas<T>(g, s, ws, x, dy, dw);
  } else {
    conv2d_backward_weight_blas<T>(g, s, ws, x, dy, dw);
  }
  if (db) conv2d_bias_grad(g, dy, db);
}

// ---- kernels ---------------------------------------------------------------------------

inline void conv2d_kernel(ConvEngine e, ConvAlgorithm algo, const ops::Conv2d& op, const KernelArgs& a) {
  conv_detail::dispatch_storage(a.in[0].dtype, "conv2d", [&](auto tag) {
    using T = decltype(tag);
    using C = conv_detail::compute_t<T>;
    auto g = op.geometry(*a.in[0].shape, *a.in[1].shape);
    auto s = conv_scratch(g, a.in[0].dtype, ConvPass::forward, 0, algo);
    conv2d_forward<T>(e, g, s, conv_detail::carve<C>(s, a, "conv2d"), a.in[0].as<T>(), a.in[1].as<T>(),
                      op.has_bias() ? a.in[2].as<T>() : nullptr, a.out[0].as<T>());
  });
}

inline void conv2d_backward_data_kernel(ConvEngine e, ConvAlgorithm algo, const ops::Conv2dBackwardData& op, const KernelArgs& a) {
  conv_detail::dispatch_storage(a.in[0].dtype, "conv2d_backward_data", [&](auto tag) {
    using T = decltype(tag);
    using C = conv_detail::compute_t<T>;
    auto g = op.geometry(*a.in[1].shape);
    auto s = conv_scratch(g, a.in[0].dtype, ConvPass::backward_data, 0, algo);
    conv2d_backward_data<T>(e, g, s, conv_detail::carve<C>(s, a, "conv2d_backward_data"), a.in[0].as<T>(),
                            a.in[1].as<T>(), a.out[0].as<T>());
  });
}

inline void conv2d_backward_weight_kernel(ConvEngine e, ConvAlgorithm algo, const ops::Conv2dBackwardWeight& op, const KernelArgs& a) {
  conv_detail::dispatch_storage(a.in[0].dtype, "conv2d_backward_weight", [&](auto tag) {
    using T = decltype(tag);
    using C = conv_detail::compute_t<T>;
    auto g = op.geometry(*a.in[0].shape);
    auto s = conv_scratch(g, a.in[0].dtype, ConvPass::backward_weight, 0, algo);
    conv2d_backward_weight<T>(e, g, s, conv_detail::carve<C>(s, a, "conv2d_backward_weight"), a.in[0].as<T>(),
                              a.in[1].as<T>(), a.out[0].as<T>(), op.with_bias() ? a.out[1].as<T>() : nullptr);
  });
}

// The workspace each conv op's kernel needs, for the kernel table.
inline std::size_t conv2d_workspace(const ops::Conv2d& op, std::span<const TensorMeta> in,
                                ConvAlgorithm algo = ConvAlgorithm::by_shape) {
  return conv_scratch(op.geometry(in), in[0].dtype, ConvPass::forward, 0, algo).bytes();
}
inline std::size_t conv2d_backward_data_workspace(const ops::Conv2dBackwardData& op, std::span<const TensorMeta> in,
                                ConvAlgorithm algo = ConvAlgorithm::by_shape) {
  return conv_scratch(op.geometry(in), in[0].dtype, ConvPass::backward_data, 0, algo).bytes();
}
inline std::size_t conv2d_backward_weight_workspace(const ops::Conv2dBackwardWeight& op,
                                                    std::span<const TensorMeta> in,
                                ConvAlgorithm algo = ConvAlgorithm::by_shape) {
  return conv_scratch(op.geometry(in), in[0].dtype, ConvPass::backward_weight, 0, algo).bytes();
}

}  // namespace frugal::cpu
