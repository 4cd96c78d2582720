#pragma once
// frugal's own single-precision GEMM for CPUs whose AVX-512 runs at full
// width, chosen at run time (blas.hpp, sgemm_engine); the library is
// compiled for plain x86-64 and only the micro-kernel is compiled for
// AVX-512F, through a target attribute.
//
// Why not OpenBLAS everywhere: OpenBLAS picks its kernels by CPU model, and
// Debian's 0.3.21 does not know Zen 5, so it runs its Haswell (AVX2)
// kernels there, which peak at half of what the core's two 512-bit FMA
// pipes do. bench/gemm_kernels.cpp measures both on the workloads' shapes.
//
// Every element of C is one chain of fused multiply-adds over p = 0..k-1 in
// order, started from zero and held in a register from first to last, and
// then alpha * sum (+ beta * C). Its bits therefore do not depend on how C
// is cut into tiles, on the thread count, or on which thread ran a tile.
//
// Layout: A is packed MR rows at a time, k deep ([p][MR], rows past the
// edge zero); B is packed NR columns at a time, k deep ([p][NR], columns
// past the edge zero), NC columns (a few panels) at once so each packed
// sliver of A is reused over them. Packing reads op(A) and op(B) through
// their strides, so the four transpose cases share one kernel.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "../../core/error.hpp"

#if defined(__x86_64__) && !defined(FRUGAL_NO_AVX512) && (defined(__GNUC__) || defined(__clang__))
#define FRUGAL_SGEMM_AVX512 1
// GCC 12 warns that the intrinsics' own _mm512_undefined_* placeholders
// are used uninitialized once they are inlined (GCC bug 105593, fixed in
// 13); the warning's location is inside the intrinsics header, so it is
// silenced for that header only.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#else
#define FRUGAL_SGEMM_AVX512 0
#endif

#include "abi.hpp"

namespace frugal::cpu::inline FRUGAL_KERNEL_ABI::sgemm512 {

inline constexpr int MR = 12;               // rows of a register tile: 24 accumulators
inline constexpr int NR = 32;               // columns of a register tile: two 16-float vectors
inline constexpr std::int64_t NC = 128;     // columns of B packed together (4 panels), at least
inline constexpr std::int64_t kMaxDepth = 8192;  // deeper products go to BLAS: the packed
                                                 // slivers would outgrow the caches

inline constexpr bool kCompiledIn = FRUGAL_SGEMM_AVX512;

// A 64-byte aligned buffer that grows on demand and is kept (as OpenBLAS
// keeps its own).
template <class T>
struct GrowingBuffer {
  struct Free {
    void operator()(T* p) const { std::free(p); }
  };
  std::unique_ptr<T, Free> data;
  std::int64_t capacity = 0;
  T* at_least(std::int64_t want) {
    if (want > capacity) {
      const std::size_t bytes = (std::size_t(want) * sizeof(T) + 63) / 64 * 64;
      T* q = static_cast<T*>(std::aligned_alloc(64, bytes));
      if (!q) fail("gemm: could not allocate ", bytes, " bytes of packing buffer");
      data.reset(q);
      capacity = want;
    }
    return data.get();
  }
};

// This thread's packing buffers: at k = kMaxDepth they hold (NC + MR) * k
// floats, 4.6 MB (bf16_gemm_avx512.hpp's pairs: half that); at most
// kPackedChunkWords + MR * k below depth 1024.
struct PackBuffers {
  GrowingBuffer<float> a, b;
  static PackBuffers& mine() {
    static thread_local PackBuffers b;
    return b;
  }
};

// True when the kernel is compiled in and this CPU (and its OS) runs
// AVX-512F.
inline bool available() {
#if FRUGAL_SGEMM_AVX512
  static const bool ok = __builtin_cpu_supports("avx512f");
  return ok;
#else
  return false;
#endif
}

#if FRUGAL_SGEMM_AVX512
// r[c] becomes column c of the 16 x 16 block whose rows were r[0..15]:
// pairs, then quads within each 128-bit lane, then the lanes themselves.
__attribute__((target("avx512f"))) inline void transpose16(__m512 r[16]) {
  __m512 t[16], u[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  // u[4i + j], lane L: column 4L + j of rows 4i..4i+3.
  for (int i = 0; i < 4; ++i) {
    u[4 * i] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    u[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    u[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    u[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int j = 0; j < 4; ++j) {
    const __m512 p0 = _mm512_shuffle_f32x4(u[j], u[4 + j], _MM_SHUFFLE(2, 0, 2, 0));
    const __m512 p1 = _mm512_shuffle_f32x4(u[j], u[4 + j], _MM_SHUFFLE(3, 1, 3, 1));
    const __m512 q0 = _mm512_shuffle_f32x4(u[8 + j], u[12 + j], _MM_SHUFFLE(2, 0, 2, 0));
    const __m512 q1 = _mm512_shuffle_f32x4(u[8 + j], u[12 + j], _MM_SHUFFLE(3, 1, 3, 1));
    r[j] = _mm512_shuffle_f32x4(p0, q0, _MM_SHUFFLE(2, 0, 2, 0));
    r[8 + j] = _mm512_shuffle_f32x4(p0, q0, _MM_SHUFFLE(3, 1, 3, 1));
    r[4 + j] = _mm512_shuffle_f32x4(p1, q1, _MM_SHUFFLE(2, 0, 2, 0));
    r[12 + j] = _mm512_shuffle_f32x4(p1, q1, _MM_SHUFFLE(3, 1, 3, 1));
  }
}

// The strided packings, 16 deep at a time through transpose16: rows of A
// (untransposed) into [p][MR], rows of B (transposed) into [p][NR]. The
// depth left over (k % 16) is packed by the scalar loops.
__attribute__((target("avx512f"))) inline std::int64_t pack_a_rows_avx512(const float* A, std::int64_t lda,
                                                                           std::int64_t r0, int mr, std::int64_t k,
                                                                           float* ap) {
  std::int64_t p0 = 0;
  for (; p0 + 16 <= k; p0 += 16) {
    __m512 r[16];
    for (int i = 0; i < 16; ++i) r[i] = i < mr ? _mm512_loadu_ps(A + (r0 + i) * lda + p0) : _mm512_setzero_ps();
    transpose16(r);
    for (int q = 0; q < 16; ++q) _mm512_mask_storeu_ps(ap + (p0 + q) * MR, __mmask16((1u << MR) - 1), r[q]);
  }
  return p0;
}
__attribute__((target("avx512f"))) inline std::int64_t pack_b_cols_avx512(const float* B, std::int64_t ldb,
                                                                           std::int64_t c, int nr, std::int64_t k,
                                                                           float* panel) {
  std::int64_t p0 = 0;
  for (; p0 + 16 <= k; p0 += 16)
    for (int j0 = 0; j0 < NR; j0 += 16) {
      __m512 r[16];
      for (int j = 0; j < 16; ++j)
        r[j] = j0 + j < nr ? _mm512_loadu_ps(B + (c + j0 + j) * ldb + p0) : _mm512_setzero_ps();
      transpose16(r);
      for (int q = 0; q < 16; ++q) _mm512_store_ps(panel + (p0 + q) * NR + j0, r[q]);
    }
  return p0;
}
// Rows of B (untransposed) into [p][NR]: two masked loads and two stores a
// row, the columns past nr zero. (GCC inlined the 128-byte memcpy of each
// row as `rep movsq`, whose start-up made packing 28% of a Winograd
// convolution's time.)
__attribute__((target("avx512f"))) inline void pack_b_rows_avx512(const float* B, std::int64_t ldb, std::int64_t c,
                                                                   int nr, std::int64_t k, float* panel) {
  const __mmask16 m0 = nr >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << nr) - 1);
  const __mmask16 m1 = nr >= 32 ? __mmask16(0xFFFF) : nr <= 16 ? __mmask16(0) : __mmask16((1u << (nr - 16)) - 1);
  for (std::int64_t p = 0; p < k; ++p) {
    const float* src = B + p * ldb + c;
    _mm512_store_ps(panel + p * NR, _mm512_maskz_loadu_ps(m0, src));
    _mm512_store_ps(panel + p * NR + 16, _mm512_maskz_loadu_ps(m1, src + 16));
  }
}
// Columns of A (transposed: op(A)(r, p) = A[p * lda + r]) into [p][MR]:
// one masked load and store a depth step, the rows past mr zero. (The
// scalar copy of 12 floats a step was 5% of the gpt step, in its weight
// gradients.)
__attribute__((target("avx512f"))) inline void pack_a_cols_avx512(const float* A, std::int64_t lda, std::int64_t r0,
                                                                   int mr, std::int64_t k, float* ap) {
  const __mmask16 load = __mmask16((1u << mr) - 1), store = __mmask16((1u << MR) - 1);
  for (std::int64_t p = 0; p < k; ++p)
    _mm512_mask_storeu_ps(ap + p * MR, store, _mm512_maskz_loadu_ps(load, A + p * lda + r0));
}
#else
// Never called: the vector packers run only where available() is true.
inline void pack_a_cols_avx512(const float*, std::int64_t, std::int64_t, int, std::int64_t, float*) {}
inline std::int64_t pack_a_rows_avx512(const float*, std::int64_t, std::int64_t, int, std::int64_t, float*) { return 0; }
inline std::int64_t pack_b_cols_avx512(const float*, std::int64_t, std::int64_t, int, std::int64_t, float*) { return 0; }
inline void pack_b_rows_avx512(const float*, std::int64_t, std::int64_t, int, std::int64_t, float*) {}
#endif

// The packers' vector loops run where the micro-kernel does; elsewhere
// (a test calling pack_a on a CPU without AVX-512) the scalar loops do.
inline bool vector_packing() { return available(); }

// ap[p * MR + i] = op(A)(r0 + i, p) for i < mr, zero for mr <= i < MR.
// op(A)(r, p) is A[r * lda + p], or A[p * lda + r] transposed.
inline void pack_a(bool ta, const float* A, std::int64_t lda, std::int64_t r0, int mr, std::int64_t k, float* ap) {
  if (!ta) {
    // Each row is contiguous along p: 16 x 16 blocks transposed in registers.
    const std::int64_t done = vector_packing() ? pack_a_rows_avx512(A, lda, r0, mr, k, ap) : 0;
    for (int i = 0; i < MR; ++i) {
      if (i < mr) {
        const float* src = A + (r0 + i) * lda;
        for (std::int64_t p = done; p < k; ++p) ap[p * MR + i] = src[p];
      } else {
        for (std::int64_t p = done; p < k; ++p) ap[p * MR + i] = 0.f;
      }
    }
  } else if (vector_packing()) {
    pack_a_cols_avx512(A, lda, r0, mr, k, ap);
  } else {
    for (std::int64_t p = 0; p < k; ++p) {
      const float* src = A + p * lda + r0;
      float* dst = ap + p * MR;
      int i = 0;
      for (; i < mr; ++i) dst[i] = src[i];
      for (; i < MR; ++i) dst[i] = 0.f;
    }
  }
}

// Panel q of bp (k * NR floats each): bp[q * k * NR + p * NR + j] =
// op(B)(p, c0 + q * NR + j) for columns before c0 + nc, zero beyond.
// op(B)(p, c) is B[p * ldb + c], or B[c * ldb + p] transposed.
inline void pack_b(bool tb, const float* B, std::int64_t ldb, std::int64_t c0, std::int64_t nc, std::int64_t k,
                   float* bp) {
  for (std::int64_t q = 0; q * NR < nc; ++q) {
    const int nr = int(std::min<std::int64_t>(NR, nc - q * NR));
    float* panel = bp + q * k * NR;
    const std::int64_t c = c0 + q * NR;
    if (!tb && vector_packing()) {
      pack_b_rows_avx512(B, ldb, c, nr, k, panel);
    } else if (!tb) {
      for (std::int64_t p = 0; p < k; ++p) {
        std::memcpy(panel + p * NR, B + p * ldb + c, std::size_t(nr) * sizeof(float));
        if (nr < NR) std::memset(panel + p * NR + nr, 0, std::size_t(NR - nr) * sizeof(float));
      }
    } else {
      // Each column of op(B) is contiguous along p: 16 x 16 blocks transposed in registers.
      const std::int64_t done = vector_packing() ? pack_b_cols_avx512(B, ldb, c, nr, k, panel) : 0;
      for (int j = 0; j < NR; ++j) {
        if (j < nr) {
          const float* src = B + (c + j) * ldb;
          for (std::int64_t p = done; p < k; ++p) panel[p * NR + j] = src[p];
        } else {
          for (std::int64_t p = done; p < k; ++p) panel[p * NR + j] = 0.f;
        }
      }
    }
  }
}


#if FRUGAL_SGEMM_AVX512
// C[i, j] = alpha * sum_p ap[p*MR + i] * bp[p*NR + j] (+ beta * C[i, j]) for
// i < mr, j < nr; C is read only when beta != 0 (BLAS's rule: with beta 0,
// whatever C held, NaN included, is overwritten).
__attribute__((target("avx512f"))) inline void micro_kernel(std::int64_t k, const float* __restrict ap,
                                                             const float* __restrict bp, float* C, std::int64_t ldc,
                                                             int mr, int nr, float alpha, float beta) {
  __m512 c0[MR], c1[MR];
#pragma GCC unroll 12
  for (int i = 0; i < MR; ++i) {
    c0[i] = _mm512_setzero_ps();
    c1[i] = _mm512_setzero_ps();
  }
  for (std::int64_t p = 0; p < k; ++p) {
    const __m512 b0 = _mm512_load_ps(bp + p * NR), b1 = _mm512_load_ps(bp + p * NR + 16);
    const float* a = ap + p * MR;
#pragma GCC unroll 12
    for (int i = 0; i < MR; ++i) {
      const __m512 av = _mm512_set1_ps(a[i]);
      c0[i] = _mm512_fmadd_ps(av, b0, c0[i]);
      c1[i] = _mm512_fmadd_ps(av, b1, c1[i]);
    }
  }
  const __mmask16 m0 = nr >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << nr) - 1);
  const __mmask16 m1 = nr >= 32 ? __mmask16(0xFFFF) : nr <= 16 ? __mmask16(0) : __mmask16((1u << (nr - 16)) - 1);
  const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
#pragma GCC unroll 12
  for (int i = 0; i < MR; ++i) {
    if (i >= mr) break;
    float* row = C + i * ldc;
    __m512 r0 = _mm512_mul_ps(va, c0[i]), r1 = _mm512_mul_ps(va, c1[i]);
    if (beta != 0.f) {
      r0 = _mm512_add_ps(r0, _mm512_mul_ps(vb, _mm512_maskz_loadu_ps(m0, row)));
      r1 = _mm512_add_ps(r1, _mm512_mul_ps(vb, _mm512_maskz_loadu_ps(m1, row + 16)));
    }
    _mm512_mask_storeu_ps(row, m0, r0);
    _mm512_mask_storeu_ps(row + 16, m1, r1);
  }
}
#else
// Never called: available() is false where this is compiled.
inline void micro_kernel(std::int64_t, const float*, const float*, float*, std::int64_t, int, int, float, float) {
  fail("internal error: the AVX-512 GEMM micro-kernel was called but is not compiled in");
}
#endif


// Columns of B packed together for a product whose packed columns are
// `words` 4-byte words deep: NC, or more while the chunk stays within
// kPackedChunkWords (512 KB, NC columns at depth 1024, what the L2 of every
// AVX-512 core holds). A is packed again for every chunk, so shallow
// products take wide chunks: at depth 256 a block of 512 columns packed
// its A four times with chunks of NC, once now. The chunking does not touch
// the order of any sum: the bits are the same.
inline constexpr std::int64_t kPackedChunkWords = 128 * 1024;
inline std::int64_t columns_packed(std::int64_t words) {
  const std::int64_t wide = kPackedChunkWords / std::max<std::int64_t>(words, 1) / NR * NR;
  return std::max(NC, wide);
}

// How both kernels (this one and bf16_gemm_avx512.hpp's) walk a block
// C[r0:r1, c0:c1]: B packed nc_most columns at a time (pack_b(jc, nc)),
// then A MR rows at a time (pack_a(ir, mr)), then one register tile per
// NR-column panel of the packed chunk (tile(q, ir, jc, mr, nr) for panel q).
template <class PackB, class PackA, class Tile>
void for_each_register_tile(std::int64_t r0, std::int64_t r1, std::int64_t c0, std::int64_t c1, std::int64_t nc_most,
                            PackB&& pack_b, PackA&& pack_a, Tile&& tile) {
  for (std::int64_t jc = c0; jc < c1; jc += nc_most) {
    const std::int64_t nc = std::min(nc_most, c1 - jc);
    pack_b(jc, nc);
    for (std::int64_t ir = r0; ir < r1; ir += MR) {
      const int mr = int(std::min<std::int64_t>(MR, r1 - ir));
      pack_a(ir, mr);
      for (std::int64_t q = 0; q * NR < nc; ++q) tile(q, ir, jc, mr, int(std::min<std::int64_t>(NR, nc - q * NR)));
    }
  }
}

// C[r0:r1, c0:c1] of C = alpha * op(A) op(B) + beta * C, row-major, on the
// calling thread, with the given packers (pack_a, pack_b's signatures) and
// register tile (micro_kernel's): this engine's, or their AVX2 twins
// (sgemm_avx2_tile.hpp), which share this walk and these buffers.
template <class PackA, class PackB, class Tile>
void gemm_block_with(PackA&& pack_a_fn, PackB&& pack_b_fn, Tile&& tile_fn, bool ta, bool tb, std::int64_t r0,
                     std::int64_t r1, std::int64_t c0, std::int64_t c1, std::int64_t k, float alpha, const float* A,
                     std::int64_t lda, const float* B, std::int64_t ldb, float beta, float* C, std::int64_t ldc) {
  PackBuffers& buf = PackBuffers::mine();
  const std::int64_t kk = std::max<std::int64_t>(k, 1);
  float* ap = buf.a.at_least(kk * MR);
  const std::int64_t nc_most = columns_packed(kk);
  float* bp = buf.b.at_least(kk * nc_most);
  for_each_register_tile(
      r0, r1, c0, c1, nc_most, [&](std::int64_t jc, std::int64_t nc) { pack_b_fn(tb, B, ldb, jc, nc, k, bp); },
      [&](std::int64_t ir, int mr) { pack_a_fn(ta, A, lda, ir, mr, k, ap); },
      [&](std::int64_t q, std::int64_t ir, std::int64_t jc, int mr, int nr) {
        tile_fn(k, ap, bp + q * k * NR, C + ir * ldc + jc + q * NR, ldc, mr, nr, alpha, beta);
      });
}

// The same on this engine (the caller splits C into such blocks over its team).
inline void gemm_block(bool ta, bool tb, std::int64_t r0, std::int64_t r1, std::int64_t c0, std::int64_t c1,
                       std::int64_t k, float alpha, const float* A, std::int64_t lda, const float* B, std::int64_t ldb,
                       float beta, float* C, std::int64_t ldc) {
  gemm_block_with(pack_a, pack_b, micro_kernel, ta, tb, r0, r1, c0, c1, k, alpha, A, lda, B, ldb, beta, C, ldc);
}

}  // namespace frugal::cpu::sgemm512
