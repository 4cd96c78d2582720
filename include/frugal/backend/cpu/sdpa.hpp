#pragma once
// Fused scaled-dot-product attention with boolean masks on the CPU, the
// flash-attention scheme of attention.hpp with a general "may query i see
// key j" test in place of the causal prefix:
//
// Forward: one task per (batch, block of kAttnBq query rows); for each key
// tile a kBq x kBk score GEMM, the allowed pairs of the tile evaluated once
// into a byte tile, the online softmax over the allowed scores only, and a
// P V GEMM into the output rows. A row none of whose keys is allowed keeps
// o = 0 and lse = -inf (a fully masked row: PyTorch's _safe_softmax result).
//
// Backward: one task per batch entry (it owns its dq, dk, dv), recomputing
// P = exp(S - lse) on the allowed pairs (0 elsewhere, so a fully masked row
// contributes nothing), then the same four GEMMs as attention.hpp.
//
// The work of a task depends on the shapes alone, so the bits do not depend
// on thread counts or on where the operands lie.
#include <cstdint>

#include "../../ops/sdpa.hpp"
#include "attention.hpp"

#include "abi.hpp"

namespace frugal::cpu::inline FRUGAL_KERNEL_ABI {

// One mask, positioned for one batch entry: element (i, j) at
// base[i * row + j * col] (a stride is 0 along a broadcast axis).
struct MaskView {
  const std::uint8_t* base = nullptr;
  std::int64_t row = 0, col = 0;
  bool drops = false;  // a true element masks the pair out
};

// The masks of an op as laid out in memory, with their shapes, to be
// positioned per batch entry.
struct SdpaMasks {
  int n = 0;
  const std::uint8_t* data[ops::kMaxAttentionMasks] = {};
  const Shape* shape[ops::kMaxAttentionMasks] = {};
  bool drops[ops::kMaxAttentionMasks] = {};
  const Shape* q = nullptr;  // the leading axes of q name the batch entries
  bool causal = false;

  // Mask m positioned at batch entry bh (the flat index over q's leading
  // axes): numpy broadcasting, the mask aligned to the right of
  // [..., Tq, Tk]. Walks the axes in place; allocates nothing.
  MaskView at(int m, std::int64_t bh) const {
    const Shape& ms = *shape[m];
    const int mr = ms.rank(), lead = q->rank() - 2;  // the target's rank is lead + 2
    auto mdim = [&](int target_axis) -> std::int64_t {  // the mask's size along a target axis (1 if absent)
      const int a = target_axis - (lead + 2 - mr);
      return a >= 0 ? ms[a] : 1;
    };
    const std::int64_t tk = mdim(lead + 1), tq = mdim(lead);
    MaskView v{data[m], tq == 1 ? 0 : tk, tk == 1 ? 0 : 1, drops[m]};  // base, row, col
    std::int64_t stride = tq * tk, rest = bh;
    for (int d = lead - 1; d >= 0; --d) {
      const std::int64_t qd = (*q)[d], idx = rest % qd, md = mdim(d);
      rest /= qd;
      if (md != 1) v.base += idx * stride;
      stride *= md;
    }
    return v;
  }
};

// The allowed pairs of the tile at (i0, j0), nq x nk, into ok (row stride kAttnBk).
inline void allowed_tile(const MaskView* mv, int n, bool causal, std::int64_t i0, std::int64_t nq, std::int64_t j0,
                         std::int64_t nk, std::uint8_t* ok) {
  for (std::int64_t r = 0; r < nq; ++r) {
    std::uint8_t* o = ok + r * kAttnBk;
    const std::int64_t i = i0 + r;
    for (std::int64_t j = 0; j < nk; ++j) o[j] = !causal || j0 + j <= i;
    for (int m = 0; m < n; ++m) {
      const std::uint8_t* row = mv[m].base + i * mv[m].row + j0 * mv[m].col;
      const bool drops = mv[m].drops;
      for (std::int64_t j = 0; j < nk; ++j) o[j] &= std::uint8_t((row[j * mv[m].col] != 0) != drops);
    }
  }
}

// Keys the rows of [i0, i0 + nq) may see: all of them, or up to the last
// row's diagonal when causal (top-left aligned).
inline std::int64_t sdpa_keys(bool causal, std::int64_t i0, std::int64_t nq, std::int64_t tk) {
  return causal ? std::min(tk, i0 + nq) : tk;
}

// q, k, v, o are dense [batch, T, width]; lse [batch, tq].
template <class T>
void sdpa_forward(const T* q, const T* k, const T* v, T* o, T* lse, const AttnShape& d, T scale,
                  const SdpaMasks& masks) {
  const std::int64_t qblocks = (d.tq + kAttnBq - 1) / kAttnBq;
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
  parallel_for(d.batch * qblocks, kAttnBq * d.tk * (d.hd + d.hdv), [&](std::int64_t t0, std::int64_t t1) {
    T s[kAttnBq * kAttnBk];
    std::uint8_t ok[kAttnBq * kAttnBk];
    T m[kAttnBq], l[kAttnBq];
    MaskView mv[ops::kMaxAttentionMasks];
    for (std::int64_t t = t0; t < t1; ++t) {
      const std::int64_t b = t / qblocks, i0 = (t % qblocks) * kAttnBq, nq = std::min(kAttnBq, d.tq - i0);
      for (int i = 0; i < masks.n; ++i) mv[i] = masks.at(i, b);
      const T* Q = q + (b * d.tq + i0) * d.hd;
      const T* K = k + b * d.tk * d.hd;
      const T* V = v + b * d.tk * d.hdv;
      T* O = o + (b * d.tq + i0) * d.hdv;
      T* L = lse + b * d.tq + i0;
      std::fill(O, O + nq * d.hdv, T(0));
      for (std::int64_t r = 0; r < nq; ++r) m[r] = kNegInf, l[r] = T(0);
      const std::int64_t keys = sdpa_keys(masks.causal, i0, nq, d.tk);
      for (std::int64_t j0 = 0; j0 < keys; j0 += kAttnBk) {
        const std::int64_t nk = std::min(kAttnBk, keys - j0);
        gemm(false, true, nq, nk, d.hd, scale, Q, d.hd, K + j0 * d.hd, d.hd, T(0), s, kAttnBk);
        allowed_tile(mv, masks.n, masks.causal, i0, nq, j0, nk, ok);
        for (std::int64_t r = 0; r < nq; ++r) {
          T* __restrict row = s + r * kAttnBk;
          const std::uint8_t* __restrict okr = ok + r * kAttnBk;
          T tmax = kNegInf;
          bool any = false;
          for (std::int64_t j = 0; j < nk; ++j)
            if (okr[j]) tmax = std::max(tmax, row[j]), any = true;
          // Nothing allowed in this tile: it adds nothing to the row. (Not
          // tmax == -inf: std::max skips NaN scores, so a query holding a NaN
          // would look fully masked and give 0; PyTorch gives NaN, and so do
          // the exps below.)
          if (!any) {
            std::fill(row, row + nk, T(0));
            continue;
          }
          const T mnew = std::max(m[r], tmax);
          const T corr = m[r] == kNegInf ? T(0) : attn_exp(m[r] - mnew);
          for (std::int64_t j = 0; j < nk; ++j) row[j] = okr[j] ? attn_exp(row[j] - mnew) : T(0);
          l[r] = l[r] * corr + row_sum(row, nk);
          m[r] = mnew;
          if (corr != T(1)) {
            T* orow = O + r * d.hdv;
            for (std::int64_t c = 0; c < d.hdv; ++c) orow[c] *= corr;
          }
        }
        gemm(false, false, nq, d.hdv, nk, T(1), s, kAttnBk, V + j0 * d.hdv, d.hdv, T(1), O, d.hdv);
      }
      for (std::int64_t r = 0; r < nq; ++r) {
        if (l[r] == T(0)) {  // a fully masked row: o stays 0
          L[r] = kNegInf;
          continue;
        }
        const T inv = T(1) / l[r];
        T* orow = O + r * d.hdv;
        for (std::int64_t c = 0; c < d.hdv; ++c) orow[c] *= inv;
        L[r] = m[r] + math::log_(l[r]);
      }
    }
  });
}

template <class T>
void sdpa_backward(const T* q, const T* k, const T* v, const T* o, const T* lse, const T* dout, T* dq, T* dk, T* dv,
                   const AttnShape& d, T scale, const SdpaMasks& masks) {
  parallel_for(d.batch, d.tq * d.tk * (3 * d.hd + 2 * d.hdv), [&](std::int64_t b0, std::int64_t b1) {
    T p[kAttnBq * kAttnBk], dp[kAttnBq * kAttnBk];
    std::uint8_t ok[kAttnBq * kAttnBk];
    T delta[kAttnBq];
    MaskView mv[ops::kMaxAttentionMasks];
    for (std::int64_t b = b0; b < b1; ++b) {
      for (int i = 0; i < masks.n; ++i) mv[i] = masks.at(i, b);
      const T *Q = q + b * d.tq * d.hd, *K = k + b * d.tk * d.hd, *V = v + b * d.tk * d.hdv;
      const T *O = o + b * d.tq * d.hdv, *dO = dout + b * d.tq * d.hdv, *L = lse + b * d.tq;
      T *dQ = dq + b * d.tq * d.hd, *dK = dk + b * d.tk * d.hd, *dV = dv + b * d.tk * d.hdv;
      std::fill(dQ, dQ + d.tq * d.hd, T(0));
      std::fill(dK, dK + d.tk * d.hd, T(0));
      std::fill(dV, dV + d.tk * d.hdv, T(0));
      for (std::int64_t i0 = 0; i0 < d.tq; i0 += kAttnBq) {
        const std::int64_t nq = std::min(kAttnBq, d.tq - i0);
        for (std::int64_t r = 0; r < nq; ++r) delta[r] = row_dot(dO + (i0 + r) * d.hdv, O + (i0 + r) * d.hdv, d.hdv);
        const std::int64_t keys = sdpa_keys(masks.causal, i0, nq, d.tk);
        for (std::int64_t j0 = 0; j0 < keys; j0 += kAttnBk) {
          const std::int64_t nk = std::min(kAttnBk, keys - j0);
          gemm(false, true, nq, nk, d.hd, scale, Q + i0 * d.hd, d.hd, K + j0 * d.hd, d.hd, T(0), p, kAttnBk);
          allowed_tile(mv, masks.n, masks.causal, i0, nq, j0, nk, ok);
          for (std::int64_t r = 0; r < nq; ++r) {
            T* __restrict row = p + r * kAttnBk;
            const std::uint8_t* __restrict okr = ok + r * kAttnBk;
            const T lr = L[i0 + r];
            for (std::int64_t j = 0; j < nk; ++j) row[j] = okr[j] ? attn_exp(row[j] - lr) : T(0);
          }
          // dV[j0:] += Pᵀ dO[i0:]
          gemm(true, false, nk, d.hdv, nq, T(1), p, kAttnBk, dO + i0 * d.hdv, d.hdv, T(1), dV + j0 * d.hdv, d.hdv);
          // dP = dO[i0:] V[j0:]ᵀ
          gemm(false, true, nq, nk, d.hdv, T(1), dO + i0 * d.hdv, d.hdv, V + j0 * d.hdv, d.hdv, T(0), dp, kAttnBk);
          // dS = P (dP - delta) scale over dP; masked pairs have P = 0.
          for (std::int64_t r = 0; r < nq; ++r) {
            const T* __restrict prow = p + r * kAttnBk;
            T* __restrict drow = dp + r * kAttnBk;
            const T dr = delta[r];
            for (std::int64_t j = 0; j < nk; ++j) drow[j] = prow[j] * (drow[j] - dr) * scale;
          }
          gemm(false, false, nq, d.hd, nk, T(1), dp, kAttnBk, K + j0 * d.hd, d.hd, T(1), dQ + i0 * d.hd, d.hd);
          gemm(true, false, nk, d.hd, nq, T(1), dp, kAttnBk, Q + i0 * d.hd, d.hd, T(1), dK + j0 * d.hd, d.hd);
        }
      }
    }
  });
}

inline SdpaMasks sdpa_masks(const KernelArgs& a, std::size_t first, const std::vector<bool>& drops, bool causal) {
  SdpaMasks m;
  m.q = a.in[0].shape;
  m.causal = causal;
  m.n = int(drops.size());
  for (int i = 0; i < m.n; ++i) {
    m.data[i] = a.in[first + std::size_t(i)].as<const std::uint8_t>();
    m.shape[i] = a.in[first + std::size_t(i)].shape;
    m.drops[i] = drops[std::size_t(i)];
  }
  return m;
}

inline void sdpa_kernel(const ops::ScaledDotProductAttention& op, const KernelArgs& a) {
  dispatch_float(a.in[0].dtype, "scaled_dot_product_attention", [&](auto tag) {
    using T = decltype(tag);
    const ops::AttentionDims d = ops::attention_shape_dims(*a.in[0].shape, *a.in[1].shape, *a.in[2].shape);
    const AttnShape s{d.batch, 1, d.tq, d.tk, d.hd, d.hdv};
    sdpa_forward<T>(a.in[0].as<const T>(), a.in[1].as<const T>(), a.in[2].as<const T>(), a.out[0].as<T>(),
                    a.out[1].as<T>(), s, T(op.scale_for(d.hd)), sdpa_masks(a, 3, op.mask_drops(), op.causal()));
  });
}

inline void sdpa_grad_kernel(const ops::ScaledDotProductAttentionGrad& op, const KernelArgs& a) {
  dispatch_float(a.in[0].dtype, "scaled_dot_product_attention_grad", [&](auto tag) {
    using T = decltype(tag);
    const ops::AttentionDims d = ops::attention_shape_dims(*a.in[0].shape, *a.in[1].shape, *a.in[2].shape);
    const AttnShape s{d.batch, 1, d.tq, d.tk, d.hd, d.hdv};
    sdpa_backward<T>(a.in[0].as<const T>(), a.in[1].as<const T>(), a.in[2].as<const T>(), a.in[3].as<const T>(),
                     a.in[4].as<const T>(), a.in[5].as<const T>(), a.out[0].as<T>(), a.out[1].as<T>(),
                     a.out[2].as<T>(), s, T(op.scale()), sdpa_masks(a, 6, op.mask_drops(), op.causal()));
  });
}

}  // namespace frugal::cpu
