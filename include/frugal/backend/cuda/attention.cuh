#pragma once
// Fused causal attention (ops/attention.hpp) on the GPU, plain and on the
// packed qkv layout. No Tq x Tk buffer anywhere: one warp per query row
// walks its keys in order with the online softmax (running max m, running
// sum l, the output row rescaled when m grows) and writes o = acc / l and
// lse = m + log l. Each lane holds up to kCols columns of a head row (head
// dimensions up to 32·kCols = 256); dot products are per-lane partials met
// in a fixed shuffle tree. The exponential is math::exp_poly, the CPU
// kernel's own.
//
// Backward without atomics: one warp per query row computes its dq (keys in
// order), one warp per key row its dk and dv (queries in order), each
// recomputing P = exp(scale·q·k - lse) and delta = rowsum(do · o) itself.
// Every output element is written by exactly one lane, from sums in a
// fixed order: the same bits every run. (Speed is secondary here: a tiled
// kernel is the follow-up.)
//
// Tensors are stored in S and computed in C: bf16/f16 elements are read
// into f32 registers (scores, the softmax, the running sums all f32), o, dq,
// dk and dv rounded once on store; the logsumexp is C (f32) either way.
#include "../../ops/attention.hpp"
#include "../../ops/gelu.hpp"
#include "loss.cuh"

namespace frugal::cuda {

inline constexpr int kAttnCols = 8;  // columns of a head row per lane
inline constexpr std::int64_t kAttnMaxHead = kWarp * kAttnCols;

// Element (b, h, t, c) of q, k, v, o or do at base + b·batch + h·head + t·row + c:
// [B, H, T, hd] tensors and the packed [B, T, 3, H, hd] layout alike.
template <class T>
struct DevHead {
  T* base;
  std::int64_t batch, head, row;
  __device__ T* at(std::int64_t b, std::int64_t h, std::int64_t t) const { return base + b * batch + h * head + t * row; }
};

struct DevAttnShape {
  std::int64_t batch, heads, tq, tk, hd, hdv;
  __device__ std::int64_t offset() const { return tk - tq; }
};

template <class C, class S>
__device__ __forceinline__ void load_cols(const S* row, std::int64_t n, C (&r)[kAttnCols]) {
  const int lane = threadIdx.x % kWarp;
#pragma unroll
  for (int t = 0; t < kAttnCols; ++t) {
    const std::int64_t c = lane + std::int64_t(kWarp) * t;
    r[t] = c < n ? load<C>(row[c]) : C(0);
  }
}
template <class C, class S>
__device__ __forceinline__ C dot_cols(const C (&a)[kAttnCols], const S* row, std::int64_t n) {
  const int lane = threadIdx.x % kWarp;
  C s = 0;
#pragma unroll
  for (int t = 0; t < kAttnCols; ++t) {
    const std::int64_t c = lane + std::int64_t(kWarp) * t;
    if (c < n) s += a[t] * load<C>(row[c]);
  }
  return warp_sum(s);
}
template <class C>
__device__ __forceinline__ C dot_cols(const C (&a)[kAttnCols], const C (&b)[kAttnCols]) {
  C s = 0;
#pragma unroll
  for (int t = 0; t < kAttnCols; ++t) s += a[t] * b[t];  // columns past n hold 0 in both
  return warp_sum(s);
}
template <class S, class C>
__device__ __forceinline__ void store_cols(S* row, std::int64_t n, const C (&r)[kAttnCols]) {
  const int lane = threadIdx.x % kWarp;
#pragma unroll
  for (int t = 0; t < kAttnCols; ++t) {
    const std::int64_t c = lane + std::int64_t(kWarp) * t;
    if (c < n) row[c] = store<S>(r[t]);
  }
}

template <class S, class C>
__global__ void attention_fwd_k(DevHead<const S> q, DevHead<const S> k, DevHead<const S> v, DevHead<S> o, C* lse,
                                DevAttnShape d, C scale) {
  const std::int64_t r = blockIdx.x * std::int64_t(kRowsPerBlock) + threadIdx.x / kWarp;
  if (r >= d.batch * d.heads * d.tq) return;
  const std::int64_t bh = r / d.tq, i = r % d.tq, b = bh / d.heads, h = bh % d.heads;
  const int lane = threadIdx.x % kWarp;
  C qr[kAttnCols], acc[kAttnCols];
  load_cols(q.at(b, h, i), d.hd, qr);
#pragma unroll
  for (int t = 0; t < kAttnCols; ++t) acc[t] = C(0);
  C m = -INFINITY, l = 0;
  const std::int64_t keys = i + d.offset() + 1;
  for (std::int64_t j = 0; j < keys; ++j) {
    const C s = dot_cols(qr, k.at(b, h, j), d.hd) * scale;
    const C mnew = m > s ? m : s;
    const C corr = math::exp_poly(C(m - mnew));  // 0 on the first key (m = -inf)
    const C p = math::exp_poly(C(s - mnew));
    l = l * corr + p;
    const S* vr = v.at(b, h, j);
#pragma unroll
    for (int t = 0; t < kAttnCols; ++t) {
      const std::int64_t c = lane + std::int64_t(kWarp) * t;
      if (c < d.hdv) acc[t] = acc[t] * corr + p * load<C>(vr[c]);
    }
    m = mnew;
  }
  const C inv = C(1) / l;
#pragma unroll
  for (int t = 0; t < kAttnCols; ++t) acc[t] = acc[t] * inv;
  store_cols(o.at(b, h, i), d.hdv, acc);
  if (lane == 0) lse[bh * d.tq + i] = m + math::log_(l);
}

// dq_i = Σ_j dS_ij k_j, dS_ij = P_ij (do_i·v_j - delta_i) scale.
template <class S, class C>
__global__ void attention_dq_k(DevHead<const S> q, DevHead<const S> k, DevHead<const S> v, DevHead<const S> o,
                               const C* lse, DevHead<const S> dout, DevHead<S> dq, DevAttnShape d, C scale) {
  const std::int64_t r = blockIdx.x * std::int64_t(kRowsPerBlock) + threadIdx.x / kWarp;
  if (r >= d.batch * d.heads * d.tq) return;
  const std::int64_t bh = r / d.tq, i = r % d.tq, b = bh / d.heads, h = bh % d.heads;
  const int lane = threadIdx.x % kWarp;
  C qr[kAttnCols], dor[kAttnCols], orow[kAttnCols], acc[kAttnCols];
  load_cols(q.at(b, h, i), d.hd, qr);
  load_cols(dout.at(b, h, i), d.hdv, dor);
  load_cols(o.at(b, h, i), d.hdv, orow);
#pragma unroll
  for (int t = 0; t < kAttnCols; ++t) acc[t] = C(0);
  const C delta = dot_cols(dor, orow), li = lse[bh * d.tq + i];
  const std::int64_t keys = i + d.offset() + 1;
  for (std::int64_t j = 0; j < keys; ++j) {
    const S* kr = k.at(b, h, j);
    const C p = math::exp_poly(C(dot_cols(qr, kr, d.hd) * scale - li));
    const C ds = p * (dot_cols(dor, v.at(b, h, j), d.hdv) - delta) * scale;
#pragma unroll
    for (int t = 0; t < kAttnCols; ++t) {
      const std::int64_t c = lane + std::int64_t(kWarp) * t;
      if (c < d.hd) acc[t] = acc[t] + ds * load<C>(kr[c]);
    }
  }
  store_cols(dq.at(b, h, i), d.hd, acc);
}

// dv_j = Σ_i P_ij do_i, dk_j = Σ_i dS_ij q_i over the queries i that see key j.
template <class S, class C>
__global__ void attention_dkv_k(DevHead<const S> q, DevHead<const S> k, DevHead<const S> v, DevHead<const S> o,
                                const C* lse, DevHead<const S> dout, DevHead<S> dk, DevHead<S> dv, DevAttnShape d,
                                C scale) {
  const std::int64_t r = blockIdx.x * std::int64_t(kRowsPerBlock) + threadIdx.x / kWarp;
  if (r >= d.batch * d.heads * d.tk) return;
  const std::int64_t bh = r / d.tk, j = r % d.tk, b = bh / d.heads, h = bh % d.heads;
  const int lane = threadIdx.x % kWarp;
  C kr[kAttnCols], vr[kAttnCols], dka[kAttnCols], dva[kAttnCols];
  load_cols(k.at(b, h, j), d.hd, kr);
  load_cols(v.at(b, h, j), d.hdv, vr);
#pragma unroll
  for (int t = 0; t < kAttnCols; ++t) dka[t] = C(0), dva[t] = C(0);
  // Query i sees key j when j <= i + offset.
  const std::int64_t first = j - d.offset() > 0 ? j - d.offset() : 0;
  for (std::int64_t i = first; i < d.tq; ++i) {
    const S* qr = q.at(b, h, i);
    C dor[kAttnCols], orow[kAttnCols];
    load_cols(dout.at(b, h, i), d.hdv, dor);
    load_cols(o.at(b, h, i), d.hdv, orow);
    const C delta = dot_cols(dor, orow);
    const C p = math::exp_poly(C(dot_cols(kr, qr, d.hd) * scale - lse[bh * d.tq + i]));
    const C ds = p * (dot_cols(dor, vr) - delta) * scale;
#pragma unroll
    for (int t = 0; t < kAttnCols; ++t) {
      const std::int64_t c = lane + std::int64_t(kWarp) * t;
      dva[t] = dva[t] + p * dor[t];
      if (c < d.hd) dka[t] = dka[t] + ds * load<C>(qr[c]);
    }
  }
  store_cols(dk.at(b, h, j), d.hd, dka);
  store_cols(dv.at(b, h, j), d.hdv, dva);
}

inline void check_head_dims(const std::string& what, std::int64_t hd, std::int64_t hdv) {
  if (hd > kAttnMaxHead || hdv > kAttnMaxHead)
    fail("cuda: ", what, ": head dimensions up to ", kAttnMaxHead, " are supported, got ", hd, " and ", hdv);
}
inline unsigned warp_rows_grid(std::int64_t rows, const std::string& what) {
  const std::int64_t b = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  if (b > 2147483647) fail("cuda: ", what, ": too many rows for one grid");
  return unsigned(b);
}

template <class T>
DevHead<T> dense_head(T* p, std::int64_t t, std::int64_t w) {
  return {p, t * w, 0, w};
}
// The packed layout: q, k, v of head h at columns h·hd, d + h·hd, 2d + h·hd
// of rows of width 3d; o (and do) at column h·hd of rows of width d.
template <class T>
DevHead<T> qkv_part(T* p, const ops::QkvDims& d, int part) {
  const std::int64_t w = 3 * d.d();
  return {p + part * d.d(), d.t * w, d.hd, w};
}
template <class T>
DevHead<T> heads_of(T* p, const ops::QkvDims& d) {
  return {p, d.t * d.d(), d.hd, d.d()};
}

template <class S, class C>
void launch_attention_fwd(const Context& ctx, const std::string& what, DevHead<const S> q, DevHead<const S> k,
                          DevHead<const S> v, DevHead<S> o, C* lse, DevAttnShape s, C scale) {
  check_head_dims(what, s.hd, s.hdv);
  const std::int64_t rows = s.batch * s.heads * s.tq;
  if (rows == 0) return;
  attention_fwd_k<S, C><<<warp_rows_grid(rows, what), kThreads, 0, ctx.compute>>>(q, k, v, o, lse, s, scale);
  check_launch(what);
}

template <class S, class C>
void launch_attention_bwd(const Context& ctx, const std::string& what, DevHead<const S> q, DevHead<const S> k,
                          DevHead<const S> v, DevHead<const S> o, const C* lse, DevHead<const S> dout, DevHead<S> dq,
                          DevHead<S> dk, DevHead<S> dv, DevAttnShape s, C scale) {
  check_head_dims(what, s.hd, s.hdv);
  const std::int64_t qrows = s.batch * s.heads * s.tq, krows = s.batch * s.heads * s.tk;
  if (qrows > 0) {
    attention_dq_k<S, C><<<warp_rows_grid(qrows, what), kThreads, 0, ctx.compute>>>(q, k, v, o, lse, dout, dq, s, scale);
    check_launch(what);
  }
  if (krows > 0) {
    attention_dkv_k<S, C><<<warp_rows_grid(krows, what), kThreads, 0, ctx.compute>>>(q, k, v, o, lse, dout, dk, dv, s,
                                                                                    scale);
    check_launch(what);
  }
}

struct AttentionKernel {
  Context ctx;
  void operator()(const ops::CausalAttention& op, const KernelArgs& a) const {
    const std::string what = describe(op, a);
    dispatch_precision(a.in[0].dtype, "causal_attention", [&](auto p) {
      using S = typename decltype(p)::Storage;
      using C = typename decltype(p)::Compute;
      const ops::AttentionDims d = ops::attention_shape_dims(*a.in[0].shape, *a.in[1].shape, *a.in[2].shape);
      const DevAttnShape s{d.batch, 1, d.tq, d.tk, d.hd, d.hdv};
      launch_attention_fwd<S, C>(ctx, what, dense_head(a.in[0].as<const S>(), d.tq, d.hd),
                                 dense_head(a.in[1].as<const S>(), d.tk, d.hd),
                                 dense_head(a.in[2].as<const S>(), d.tk, d.hdv),
                                 dense_head(a.out[0].as<S>(), d.tq, d.hdv), a.out[1].as<C>(), s, C(op.scale_for(d.hd)));
    });
  }
};

struct AttentionGradKernel {
  Context ctx;
  void operator()(const ops::CausalAttentionGrad& op, const KernelArgs& a) const {
    const std::string what = describe(op, a);
    dispatch_precision(a.in[0].dtype, "causal_attention_grad", [&](auto p) {
      using S = typename decltype(p)::Storage;
      using C = typename decltype(p)::Compute;
      const ops::AttentionDims d = ops::attention_shape_dims(*a.in[0].shape, *a.in[1].shape, *a.in[2].shape);
      const DevAttnShape s{d.batch, 1, d.tq, d.tk, d.hd, d.hdv};
      launch_attention_bwd<S, C>(
          ctx, what, dense_head(a.in[0].as<const S>(), d.tq, d.hd), dense_head(a.in[1].as<const S>(), d.tk, d.hd),
          dense_head(a.in[2].as<const S>(), d.tk, d.hdv), dense_head(a.in[3].as<const S>(), d.tq, d.hdv),
          a.in[4].as<const C>(), dense_head(a.in[5].as<const S>(), d.tq, d.hdv), dense_head(a.out[0].as<S>(), d.tq, d.hd),
          dense_head(a.out[1].as<S>(), d.tk, d.hd), dense_head(a.out[2].as<S>(), d.tk, d.hdv), s, C(op.scale()));
    });
  }
};

struct AttentionQkvKernel {
  Context ctx;
  void operator()(const ops::CausalAttentionQkv& op, const KernelArgs& a) const {
    const std::string what = describe(op, a);
    dispatch_precision(a.in[0].dtype, "causal_attention_qkv", [&](auto p) {
      using S = typename decltype(p)::Storage;
      using C = typename decltype(p)::Compute;
      const ops::QkvDims d = ops::qkv_shape_dims(*a.in[0].shape, op.heads());
      const S* in = a.in[0].as<const S>();
      const DevAttnShape s{d.batch, d.heads, d.t, d.t, d.hd, d.hd};
      launch_attention_fwd<S, C>(ctx, what, qkv_part(in, d, 0), qkv_part(in, d, 1), qkv_part(in, d, 2),
                                 heads_of(a.out[0].as<S>(), d), a.out[1].as<C>(), s, C(op.scale_for(d.hd)));
    });
  }
};

struct AttentionQkvGradKernel {
  Context ctx;
  void operator()(const ops::CausalAttentionQkvGrad& op, const KernelArgs& a) const {
    const std::string what = describe(op, a);
    dispatch_precision(a.in[0].dtype, "causal_attention_qkv_grad", [&](auto p) {
      using S = typename decltype(p)::Storage;
      using C = typename decltype(p)::Compute;
      const ops::QkvDims d = ops::qkv_shape_dims(*a.in[0].shape, op.heads());
      const S* in = a.in[0].as<const S>();
      S* out = a.out[0].as<S>();
      const DevAttnShape s{d.batch, d.heads, d.t, d.t, d.hd, d.hd};
      launch_attention_bwd<S, C>(ctx, what, qkv_part(in, d, 0), qkv_part(in, d, 1), qkv_part(in, d, 2),
                                 heads_of(a.in[1].as<const S>(), d), a.in[2].as<const C>(),
                                 heads_of(a.in[3].as<const S>(), d), qkv_part(out, d, 0), qkv_part(out, d, 1),
                                 qkv_part(out, d, 2), s, C(op.scale()));
    });
  }
};

}  // namespace frugal::cuda
