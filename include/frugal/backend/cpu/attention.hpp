#pragma once
// Fused causal attention on the CPU, flash-attention style.
//
// Forward: one task per (batch-head, block of kBq query rows). A task walks
// the key blocks its rows may see, computing a kBq x kBk score tile with a
// small GEMM, masking the diagonal tile, and folding it into the output rows
// with the online softmax (running max m, running sum l, the output rows
// rescaled when m grows) and a second small GEMM (P V). It ends with
// o /= l and writes lse = m + log l. Nothing of size Tq x Tk exists.
//
// Backward: one task per batch-head, which owns its dq, dk and dv outright
// (no atomics, no reduction across threads). For each (query block, key
// block) tile it recomputes P = exp(S - lse) and accumulates
//   dv += Pᵀ do,  dP = do vᵀ,  dS = P (dP - rowsum(do * o)) * scale,
//   dq += dS k,   dk += dSᵀ q.
//
// Tiles live on the stack (2 x kBq x kBk elements), the running statistics
// too; the output rows are the accumulator. Each key block (and in the
// backward its values) is transposed before its products, so that every
// tile product reads its right operand by rows; the transposes are
// kAttnBk x hd, so the scratch outside the plan stays bounded by the head
// width, as the packed GEMM's was, whatever the context length. The products run on the task's thread:
// in f32 on an AVX-512 CPU through small_gemm_avx512.hpp, which reads the
// tiles where they lie (the packed engine packed both operands of every
// 32 x 64 x 64 product, as long as the product itself took); elsewhere
// through gemm_serial. Every task's work is fixed by the shapes alone: the
// same bits for any thread count and wherever the operands sit.
//
// bf16/f16: the same kernels on f32 images of q, k, v (o, do) in the op's
// planned workspace, the outputs rounded once (half_images.hpp); the
// logsumexp is f32 either way.
#include <algorithm>
#include <cmath>
#include <limits>

#include "../../ops/attention.hpp"
#include "../../ops/gelu.hpp"
#include "blas.hpp"
#include "half_images.hpp"
#include "../../runtime/backend.hpp"
#include "parallel.hpp"
#include "isa.hpp"
#include "row_math.hpp"
#include "small_gemm_avx512.hpp"

#include "abi.hpp"

namespace frugal::cpu::inline FRUGAL_KERNEL_ABI {

inline constexpr std::int64_t kAttnBq = 32;  // query rows per tile
inline constexpr std::int64_t kAttnBk = 64;  // keys per tile

// exp for the softmax: math::exp_poly, which the compiler vectorises in f32
// (libm's exp in f64).
template <class T>
inline T attn_exp(T x) {
  return math::exp_poly(x);
}

// Where one (batch, head) of q, k, v or o lies: element (b, h, t, c) at
// base + b * batch + h * head + t * row + c. Covers [B, H, T, hd] tensors
// and the packed [B, T, 3, H, hd] qkv layout alike.
template <class T>
struct HeadView {
  T* base;
  std::int64_t batch, head, row;
  T* at(std::int64_t b, std::int64_t h) const { return base + b * batch + h * head; }
};

// C[m, n] = alpha * sum_p A(i, p) B(p, j) + beta * C on the calling thread,
// A(i, p) = A[i*sai + p*sap] (one of the strides 1: a tile or its
// transpose), B(p, j) = B[p*ldb + j].
template <class T>
void tile_product(std::int64_t m, std::int64_t n, std::int64_t k, T alpha, const T* A, std::int64_t sai,
                  std::int64_t sap, const T* B, std::int64_t ldb, T beta, T* C, std::int64_t ldc) {
  if constexpr (std::is_same_v<T, float>)
    if (cpu_isa() >= CpuIsa::avx512 && small_gemm::available() && !gemm_detail::openblas_forced())
      return small_gemm::gemm(m, n, k, alpha, A, sai, sap, B, ldb, beta, C, ldc);
  // Inside the task's chunk the product's tiles run inline, on this thread.
  const bool ta = sap != 1;
  gemm(ta, false, m, n, k, alpha, A, ta ? sap : sai, B, ldb, beta, C, ldc);
}

// xt[c * rows + j] = x[j * ld + c] for j < rows, c < cols: a block of keys
// (or values) as columns, so that products with them read rows.
template <class T>
void transpose_rows(const T* x, std::int64_t ld, std::int64_t rows, std::int64_t cols, T* xt) {
  if constexpr (std::is_same_v<T, float>)
    if (cpu_isa() >= CpuIsa::avx512 && small_gemm::available()) return small_gemm::transpose(x, ld, rows, cols, xt);
  for (std::int64_t j = 0; j < rows; ++j)
    for (std::int64_t c = 0; c < cols; ++c) xt[c * rows + j] = x[j * ld + c];
}

// This thread's transposed key and value blocks (hd x kAttnBk floats each).
template <class T>
struct AttnBuffers {
  sgemm512::GrowingBuffer<T> kt, vt;
  static AttnBuffers& mine() {
    static thread_local AttnBuffers b;
    return b;
  }
};

struct AttnShape {
  std::int64_t batch, heads, tq, tk, hd, hdv;
  std::int64_t offset() const { return tk - tq; }  // query i attends keys <= i + offset
};

// Keys of the tile starting at key j0 (width nk) that query `row` may
// attend: the count of valid columns from the left.
inline std::int64_t valid_keys(std::int64_t row, std::int64_t offset, std::int64_t j0, std::int64_t nk) {
  return std::clamp<std::int64_t>(row + offset + 1 - j0, 0, nk);
}

// lse is [batch, heads, tq], contiguous.
template <class T>
void attention_forward(HeadView<const T> q, HeadView<const T> k, HeadView<const T> v, HeadView<T> o, T* lse,
                       const AttnShape& d, T scale) {
  const std::int64_t qblocks = (d.tq + kAttnBq - 1) / kAttnBq;
  const std::int64_t tasks = d.batch * d.heads * qblocks;
  const std::int64_t off = d.offset();
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
  parallel_for(tasks, kAttnBq * d.tk * (d.hd + d.hdv), [&](std::int64_t t0, std::int64_t t1) {
    T s[kAttnBq * kAttnBk];
    T m[kAttnBq], l[kAttnBq];
    AttnBuffers<T>& buf = AttnBuffers<T>::mine();
    for (std::int64_t t = t0; t < t1; ++t) {
      const std::int64_t bh = t / qblocks, b = bh / d.heads, h = bh % d.heads;
      const std::int64_t i0 = (t % qblocks) * kAttnBq, nq = std::min(kAttnBq, d.tq - i0);
      const T* Q = q.at(b, h) + i0 * q.row;
      const T* K = k.at(b, h);
      const T* V = v.at(b, h);
      T* O = o.at(b, h) + i0 * o.row;
      T* L = lse + bh * d.tq + i0;
      for (std::int64_t r = 0; r < nq; ++r) {
        std::fill(O + r * o.row, O + r * o.row + d.hdv, T(0));
        m[r] = kNegInf, l[r] = T(0);
      }
      const std::int64_t keys = i0 + nq + off;  // the last row's keys: every row here sees a prefix of them
      T* Kt = buf.kt.at_least(std::max<std::int64_t>(kAttnBk * d.hd, 1));
      for (std::int64_t j0 = 0; j0 < keys; j0 += kAttnBk) {
        const std::int64_t nk = std::min(kAttnBk, keys - j0);
        transpose_rows(K + j0 * k.row, k.row, nk, d.hd, Kt);
        tile_product(nq, nk, d.hd, scale, Q, q.row, 1, Kt, nk, T(0), s, kAttnBk);
        // run_widest: the exponentials in AVX-512 or AVX2 registers, the
        // baseline build's bits (the kernel units build -ffp-contract=off).
        run_widest([&] {
          for (std::int64_t r = 0; r < nq; ++r) {
            T* __restrict row = s + r * kAttnBk;
            const std::int64_t n = valid_keys(i0 + r, off, j0, nk);
            if (n == 0) {  // this tile lies wholly beyond the row's last key
              std::fill(row, row + nk, T(0));
              continue;
            }
            const T mnew = std::max(m[r], row_max(row, n));
            const T corr = attn_exp(m[r] - mnew);  // 0 on the first tile (m = -inf)
            for (std::int64_t j = 0; j < n; ++j) row[j] = attn_exp(row[j] - mnew);
            std::fill(row + n, row + nk, T(0));
            l[r] = l[r] * corr + row_sum(row, n);
            m[r] = mnew;
            if (corr != T(1)) {
              T* orow = O + r * o.row;
              for (std::int64_t c = 0; c < d.hdv; ++c) orow[c] *= corr;
            }
          }
        });
        tile_product(nq, d.hdv, nk, T(1), s, kAttnBk, 1, V + j0 * v.row, v.row, T(1), O, o.row);
      }
      for (std::int64_t r = 0; r < nq; ++r) {
        const T inv = T(1) / l[r];
        T* orow = O + r * o.row;
        for (std::int64_t c = 0; c < d.hdv; ++c) orow[c] *= inv;
        L[r] = m[r] + math::log_(l[r]);
      }
    }
  });
}

// One task per (batch, head): it owns that head's rows of dq, dk and dv.
template <class T>
void attention_backward(HeadView<const T> q, HeadView<const T> k, HeadView<const T> v, HeadView<const T> o,
                        const T* lse, HeadView<const T> dout, HeadView<T> dq, HeadView<T> dk, HeadView<T> dv,
                        const AttnShape& d, T scale) {
  const std::int64_t off = d.offset();
  parallel_for(d.batch * d.heads, d.tq * d.tk * (3 * d.hd + 2 * d.hdv), [&](std::int64_t b0, std::int64_t b1) {
    T p[kAttnBq * kAttnBk], dp[kAttnBq * kAttnBk];
    T delta[kAttnBq];
    AttnBuffers<T>& buf = AttnBuffers<T>::mine();
    for (std::int64_t bh = b0; bh < b1; ++bh) {
      const std::int64_t b = bh / d.heads, h = bh % d.heads;
      const T *Q = q.at(b, h), *K = k.at(b, h), *V = v.at(b, h), *O = o.at(b, h), *dO = dout.at(b, h);
      const T* L = lse + bh * d.tq;
      T *dQ = dq.at(b, h), *dK = dk.at(b, h), *dV = dv.at(b, h);
      T* Kt = buf.kt.at_least(std::max<std::int64_t>(kAttnBk * d.hd, 1));
      T* Vt = buf.vt.at_least(std::max<std::int64_t>(kAttnBk * d.hdv, 1));
      for (std::int64_t r = 0; r < d.tq; ++r) std::fill(dQ + r * dq.row, dQ + r * dq.row + d.hd, T(0));
      for (std::int64_t r = 0; r < d.tk; ++r) {
        std::fill(dK + r * dk.row, dK + r * dk.row + d.hd, T(0));
        std::fill(dV + r * dv.row, dV + r * dv.row + d.hdv, T(0));
      }
      for (std::int64_t i0 = 0; i0 < d.tq; i0 += kAttnBq) {
        const std::int64_t nq = std::min(kAttnBq, d.tq - i0);
        for (std::int64_t r = 0; r < nq; ++r) delta[r] = row_dot(dO + (i0 + r) * dout.row, O + (i0 + r) * o.row, d.hdv);
        const std::int64_t keys = i0 + nq + off;
        for (std::int64_t j0 = 0; j0 < keys; j0 += kAttnBk) {
          const std::int64_t nk = std::min(kAttnBk, keys - j0);
          transpose_rows(K + j0 * k.row, k.row, nk, d.hd, Kt);
          transpose_rows(V + j0 * v.row, v.row, nk, d.hdv, Vt);
          tile_product(nq, nk, d.hd, scale, Q + i0 * q.row, q.row, 1, Kt, nk, T(0), p, kAttnBk);
          run_widest([&] {
            for (std::int64_t r = 0; r < nq; ++r) {
              T* __restrict row = p + r * kAttnBk;
              const std::int64_t n = valid_keys(i0 + r, off, j0, nk);
              const T lr = L[i0 + r];
              for (std::int64_t j = 0; j < n; ++j) row[j] = attn_exp(row[j] - lr);
              std::fill(row + n, row + nk, T(0));
            }
          });
          // dV[j0:] += Pᵀ dO[i0:]
          tile_product(nk, d.hdv, nq, T(1), p, 1, kAttnBk, dO + i0 * dout.row, dout.row, T(1), dV + j0 * dv.row,
                       dv.row);
          // dP = dO[i0:] V[j0:]ᵀ
          tile_product(nq, nk, d.hdv, T(1), dO + i0 * dout.row, dout.row, 1, Vt, nk, T(0), dp, kAttnBk);
          // dS = P (dP - delta) scale, written over dP; masked entries have P = 0.
          run_widest([&] {
            for (std::int64_t r = 0; r < nq; ++r) {
              const T* __restrict prow = p + r * kAttnBk;
              T* __restrict drow = dp + r * kAttnBk;
              const T dr = delta[r];
              for (std::int64_t j = 0; j < nk; ++j) drow[j] = prow[j] * (drow[j] - dr) * scale;
            }
          });
          // dQ[i0:] += dS K[j0:];  dK[j0:] += dSᵀ Q[i0:]
          tile_product(nq, d.hd, nk, T(1), dp, kAttnBk, 1, K + j0 * k.row, k.row, T(1), dQ + i0 * dq.row, dq.row);
          tile_product(nk, d.hd, nq, T(1), dp, 1, kAttnBk, Q + i0 * q.row, q.row, T(1), dK + j0 * dk.row, dk.row);
        }
      }
    }
  });
}

// Views of a contiguous [batch, tq, hd] tensor (one "head" per batch entry).
template <class T>
HeadView<T> dense_view(T* p, std::int64_t t, std::int64_t w) {
  return {p, t * w, 0, w};
}

inline void attention_kernel(const ops::CausalAttention& op, const KernelArgs& a) {
  if (is_half(a.in[0].dtype))  // the f32 kernel on f32 images (half_images.hpp)
    return on_f32_images("causal_attention", a, [&](const KernelArgs& f) { attention_kernel(op, f); });
  dispatch_float(a.in[0].dtype, "causal_attention", [&](auto tag) {
    using T = decltype(tag);
    const ops::AttentionDims d = ops::attention_shape_dims(*a.in[0].shape, *a.in[1].shape, *a.in[2].shape);
    const AttnShape s{d.batch, 1, d.tq, d.tk, d.hd, d.hdv};
    attention_forward<T>(dense_view(a.in[0].as<const T>(), d.tq, d.hd), dense_view(a.in[1].as<const T>(), d.tk, d.hd),
                         dense_view(a.in[2].as<const T>(), d.tk, d.hdv), dense_view(a.out[0].as<T>(), d.tq, d.hdv),
                         a.out[1].as<T>(), s, T(op.scale_for(d.hd)));
  });
}

inline void attention_grad_kernel(const ops::CausalAttentionGrad& op, const KernelArgs& a) {
  if (is_half(a.in[0].dtype))  // the f32 kernel on f32 images (half_images.hpp)
    return on_f32_images("causal_attention_grad", a, [&](const KernelArgs& f) { attention_grad_kernel(op, f); });
  dispatch_float(a.in[0].dtype, "causal_attention_grad", [&](auto tag) {
    using T = decltype(tag);
    const ops::AttentionDims d = ops::attention_shape_dims(*a.in[0].shape, *a.in[1].shape, *a.in[2].shape);
    const AttnShape s{d.batch, 1, d.tq, d.tk, d.hd, d.hdv};
    attention_backward<T>(
        dense_view(a.in[0].as<const T>(), d.tq, d.hd), dense_view(a.in[1].as<const T>(), d.tk, d.hd),
        dense_view(a.in[2].as<const T>(), d.tk, d.hdv), dense_view(a.in[3].as<const T>(), d.tq, d.hdv),
        a.in[4].as<const T>(), dense_view(a.in[5].as<const T>(), d.tq, d.hdv), dense_view(a.out[0].as<T>(), d.tq, d.hd),
        dense_view(a.out[1].as<T>(), d.tk, d.hd), dense_view(a.out[2].as<T>(), d.tk, d.hdv), s, T(op.scale()));
  });
}

// The packed layout: q, k, v of head h at columns h*hd, d + h*hd, 2d + h*hd
// of rows of width 3d; o (and do) at column h*hd of rows of width d.
template <class T>
struct QkvViews {
  HeadView<T> q, k, v;
};
template <class T>
QkvViews<T> qkv_views(T* p, const ops::QkvDims& d) {
  const std::int64_t w = 3 * d.d();
  return {{p, d.t * w, d.hd, w}, {p + d.d(), d.t * w, d.hd, w}, {p + 2 * d.d(), d.t * w, d.hd, w}};
}
template <class T>
HeadView<T> heads_view(T* p, const ops::QkvDims& d) {
  return {p, d.t * d.d(), d.hd, d.d()};
}

inline void attention_qkv_kernel(const ops::CausalAttentionQkv& op, const KernelArgs& a) {
  if (is_half(a.in[0].dtype))  // the f32 kernel on f32 images (half_images.hpp)
    return on_f32_images("causal_attention_qkv", a, [&](const KernelArgs& f) { attention_qkv_kernel(op, f); });
  dispatch_float(a.in[0].dtype, "causal_attention_qkv", [&](auto tag) {
    using T = decltype(tag);
    const ops::QkvDims d = ops::qkv_shape_dims(*a.in[0].shape, op.heads());
    const auto in = qkv_views(a.in[0].as<const T>(), d);
    const AttnShape s{d.batch, d.heads, d.t, d.t, d.hd, d.hd};
    attention_forward<T>(in.q, in.k, in.v, heads_view(a.out[0].as<T>(), d), a.out[1].as<T>(), s, T(op.scale_for(d.hd)));
  });
}

inline void attention_qkv_grad_kernel(const ops::CausalAttentionQkvGrad& op, const KernelArgs& a) {
  if (is_half(a.in[0].dtype))  // the f32 kernel on f32 images (half_images.hpp)
    return on_f32_images("causal_attention_qkv_grad", a, [&](const KernelArgs& f) { attention_qkv_grad_kernel(op, f); });
  dispatch_float(a.in[0].dtype, "causal_attention_qkv_grad", [&](auto tag) {
    using T = decltype(tag);
    const ops::QkvDims d = ops::qkv_shape_dims(*a.in[0].shape, op.heads());
    const auto in = qkv_views(a.in[0].as<const T>(), d);
    const auto out = qkv_views(a.out[0].as<T>(), d);
    const AttnShape s{d.batch, d.heads, d.t, d.t, d.hd, d.hd};
    attention_backward<T>(in.q, in.k, in.v, heads_view(a.in[1].as<const T>(), d), a.in[2].as<const T>(),
                          heads_view(a.in[3].as<const T>(), d), out.q, out.k, out.v, s, T(op.scale()));
  });
}


}  // namespace frugal::cpu
