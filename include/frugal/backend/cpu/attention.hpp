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
// too; the output rows are the accumulator. The GEMMs are OpenBLAS called
// from inside the OpenMP region, so each runs single-threaded on its task.
// Every task's work is fixed by the shapes alone: the same bits for any
// thread count and wherever the operands sit.
#include <algorithm>
#include <cmath>
#include <limits>

#include "../../ops/attention.hpp"
#include "blas.hpp"
#include "kernel_table.hpp"
#include "parallel.hpp"
#include "row_math.hpp"

namespace frugal::cpu {

inline constexpr std::int64_t kAttnBq = 64;  // query rows per tile
inline constexpr std::int64_t kAttnBk = 64;  // keys per tile

// Keys [0, n) that row `row` of the queries may attend, restricted to the
// tile starting at key j0 of width nk: the count of valid columns.
inline std::int64_t valid_keys(std::int64_t row, std::int64_t offset, std::int64_t j0, std::int64_t nk) {
  return std::clamp<std::int64_t>(row + offset + 1 - j0, 0, nk);
}

template <class T>
void attention_forward(const T* q, const T* k, const T* v, T* o, T* lse, const ops::AttentionDims& d, T scale) {
  const std::int64_t qblocks = (d.tq + kAttnBq - 1) / kAttnBq;
  const std::int64_t tasks = d.batch * qblocks;
  const std::int64_t off = d.offset();
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
  parallel_for(tasks, kAttnBq * d.tk * (d.hd + d.hdv), [&](std::int64_t t0, std::int64_t t1) {
    T s[kAttnBq * kAttnBk];
    T m[kAttnBq], l[kAttnBq];
    for (std::int64_t t = t0; t < t1; ++t) {
      const std::int64_t bh = t / qblocks, i0 = (t % qblocks) * kAttnBq, nq = std::min(kAttnBq, d.tq - i0);
      const T* Q = q + (bh * d.tq + i0) * d.hd;
      const T* K = k + bh * d.tk * d.hd;
      const T* V = v + bh * d.tk * d.hdv;
      T* O = o + (bh * d.tq + i0) * d.hdv;
      T* L = lse + bh * d.tq + i0;
      std::fill(O, O + nq * d.hdv, T(0));
      for (std::int64_t r = 0; r < nq; ++r) m[r] = kNegInf, l[r] = T(0);
      const std::int64_t keys = i0 + nq + off;  // the last row's keys: every row here sees a prefix of them
      for (std::int64_t j0 = 0; j0 < keys; j0 += kAttnBk) {
        const std::int64_t nk = std::min(kAttnBk, keys - j0);
        gemm(false, true, nq, nk, d.hd, scale, Q, d.hd, K + j0 * d.hd, d.hd, T(0), s, kAttnBk);
        for (std::int64_t r = 0; r < nq; ++r) {
          T* row = s + r * kAttnBk;
          const std::int64_t n = valid_keys(i0 + r, off, j0, nk);
          if (n == 0) {  // this tile lies wholly beyond the row's last key
            std::fill(row, row + nk, T(0));
            continue;
          }
          const T mnew = std::max(m[r], row_max(row, n));
          const T corr = math::exp_(m[r] - mnew);  // 0 on the first tile (m = -inf)
          T sum = 0;
          for (std::int64_t j = 0; j < n; ++j) sum += (row[j] = math::exp_(row[j] - mnew));
          std::fill(row + n, row + nk, T(0));
          l[r] = l[r] * corr + sum;
          m[r] = mnew;
          if (corr != T(1)) {
            T* orow = O + r * d.hdv;
            for (std::int64_t c = 0; c < d.hdv; ++c) orow[c] *= corr;
          }
        }
        gemm(false, false, nq, d.hdv, nk, T(1), s, kAttnBk, V + j0 * d.hdv, d.hdv, T(1), O, d.hdv);
      }
      for (std::int64_t r = 0; r < nq; ++r) {
        const T inv = T(1) / l[r];
        T* orow = O + r * d.hdv;
        for (std::int64_t c = 0; c < d.hdv; ++c) orow[c] *= inv;
        L[r] = m[r] + math::log_(l[r]);
      }
    }
  });
}

template <class T>
void attention_backward(const T* q, const T* k, const T* v, const T* o, const T* lse, const T* dout, T* dq, T* dk,
                        T* dv, const ops::AttentionDims& d, T scale) {
  const std::int64_t off = d.offset();
  parallel_for(d.batch, d.tq * d.tk * (3 * d.hd + 2 * d.hdv), [&](std::int64_t b0, std::int64_t b1) {
    T p[kAttnBq * kAttnBk], dp[kAttnBq * kAttnBk];
    T delta[kAttnBq];
    for (std::int64_t bh = b0; bh < b1; ++bh) {
      const T* Q = q + bh * d.tq * d.hd;
      const T* K = k + bh * d.tk * d.hd;
      const T* V = v + bh * d.tk * d.hdv;
      const T* O = o + bh * d.tq * d.hdv;
      const T* dO = dout + bh * d.tq * d.hdv;
      const T* L = lse + bh * d.tq;
      T* dQ = dq + bh * d.tq * d.hd;
      T* dK = dk + bh * d.tk * d.hd;
      T* dV = dv + bh * d.tk * d.hdv;
      std::fill(dQ, dQ + d.tq * d.hd, T(0));
      std::fill(dK, dK + d.tk * d.hd, T(0));
      std::fill(dV, dV + d.tk * d.hdv, T(0));
      for (std::int64_t i0 = 0; i0 < d.tq; i0 += kAttnBq) {
        const std::int64_t nq = std::min(kAttnBq, d.tq - i0);
        for (std::int64_t r = 0; r < nq; ++r) delta[r] = row_dot(dO + (i0 + r) * d.hdv, O + (i0 + r) * d.hdv, d.hdv);
        const std::int64_t keys = i0 + nq + off;
        for (std::int64_t j0 = 0; j0 < keys; j0 += kAttnBk) {
          const std::int64_t nk = std::min(kAttnBk, keys - j0);
          gemm(false, true, nq, nk, d.hd, scale, Q + i0 * d.hd, d.hd, K + j0 * d.hd, d.hd, T(0), p, kAttnBk);
          for (std::int64_t r = 0; r < nq; ++r) {
            T* row = p + r * kAttnBk;
            const std::int64_t n = valid_keys(i0 + r, off, j0, nk);
            const T lr = L[i0 + r];
            for (std::int64_t j = 0; j < n; ++j) row[j] = math::exp_(row[j] - lr);
            std::fill(row + n, row + nk, T(0));
          }
          // dV[j0:] += Pᵀ dO[i0:]
          gemm(true, false, nk, d.hdv, nq, T(1), p, kAttnBk, dO + i0 * d.hdv, d.hdv, T(1), dV + j0 * d.hdv, d.hdv);
          // dP = dO[i0:] V[j0:]ᵀ
          gemm(false, true, nq, nk, d.hdv, T(1), dO + i0 * d.hdv, d.hdv, V + j0 * d.hdv, d.hdv, T(0), dp, kAttnBk);
          // dS = P (dP - delta) scale, written over dP; masked entries have P = 0.
          for (std::int64_t r = 0; r < nq; ++r) {
            const T* prow = p + r * kAttnBk;
            T* drow = dp + r * kAttnBk;
            const T dr = delta[r];
            for (std::int64_t j = 0; j < nk; ++j) drow[j] = prow[j] * (drow[j] - dr) * scale;
          }
          // dQ[i0:] += dS K[j0:];  dK[j0:] += dSᵀ Q[i0:]
          gemm(false, false, nq, d.hd, nk, T(1), dp, kAttnBk, K + j0 * d.hd, d.hd, T(1), dQ + i0 * d.hd, d.hd);
          gemm(true, false, nk, d.hd, nq, T(1), dp, kAttnBk, Q + i0 * d.hd, d.hd, T(1), dK + j0 * d.hd, d.hd);
        }
      }
    }
  });
}

inline void attention_kernel(const ops::CausalAttention& op, const KernelArgs& a) {
  dispatch_float(a.in[0].dtype, "causal_attention", [&](auto tag) {
    using T = decltype(tag);
    const ops::AttentionDims d = ops::attention_shape_dims(*a.in[0].shape, *a.in[1].shape, *a.in[2].shape);
    attention_forward<T>(a.in[0].as<T>(), a.in[1].as<T>(), a.in[2].as<T>(), a.out[0].as<T>(), a.out[1].as<T>(), d,
                         T(op.scale_for(d.hd)));
  });
}

inline void attention_grad_kernel(const ops::CausalAttentionGrad& op, const KernelArgs& a) {
  dispatch_float(a.in[0].dtype, "causal_attention_grad", [&](auto tag) {
    using T = decltype(tag);
    const ops::AttentionDims d = ops::attention_shape_dims(*a.in[0].shape, *a.in[1].shape, *a.in[2].shape);
    attention_backward<T>(a.in[0].as<T>(), a.in[1].as<T>(), a.in[2].as<T>(), a.in[3].as<T>(), a.in[4].as<T>(),
                          a.in[5].as<T>(), a.out[0].as<T>(), a.out[1].as<T>(), a.out[2].as<T>(), d, T(op.scale()));
  });
}

inline const bool attention_registered = kernels().add<ops::CausalAttention>(attention_kernel) &&
                                         kernels().add<ops::CausalAttentionGrad>(attention_grad_kernel);

}  // namespace frugal::cpu
