#pragma once
// The register tile of frugal's AVX-512 GEMM (sgemm_avx512.hpp) computed
// with AVX2 and FMA3, on the same packed operands: an MR-row sliver of A
// ([p][MR]) times an NR-column panel of B ([p][NR]). Kernels that write
// their operands packed themselves (Winograd's transforms) call it where the
// CPU has no AVX-512 (or OpenBLAS is not trusted with it), instead of
// OpenBLAS's own packing for each small product. With the AVX2 packers
// below and the AVX-512 engine's loops, it is also frugal's float GEMM
// engine on AVX2 CPUs (blas.hpp, SgemmEngine::avx2).
//
// Each element of C is the same chain as the AVX-512 tile computes (fused
// multiply-adds over p = 0..k-1 in order from zero, then alpha * sum
// (+ beta * C)), so both give the same bits, and a product has the same
// bits on an AVX2 and an AVX-512 machine.
#include <algorithm>
#include <cstdint>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define FRUGAL_SGEMM_AVX2_TILE 1
#include <immintrin.h>
#else
#define FRUGAL_SGEMM_AVX2_TILE 0
#endif

#include "../../core/error.hpp"
#include "abi.hpp"
#include "sgemm_avx512.hpp"

namespace frugal::cpu::inline FRUGAL_KERNEL_ABI::sgemm_avx2 {

using sgemm512::MR;
using sgemm512::NR;

#if FRUGAL_SGEMM_AVX2_TILE
// Whether this CPU runs the tile (AVX2 and FMA3).
inline bool available() {
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has;
}

// Lanes j < n of an 8-float vector (none for n <= 0, all from n = 8), as
// the mask of _mm256_maskload_ps and _mm256_maskstore_ps.
__attribute__((target("avx2,fma"))) inline __m256i lanes_below(int n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// C[i, j] = alpha * sum_p ap[p*MR + i] * bp[p*NR + j] (+ beta * C[i, j]) for
// i < mr, j < nr, in sub-tiles of 6 rows by 16 columns (12 accumulators,
// what 16 ymm registers hold beside two of B and a broadcast of A); rows
// past mr cost nothing. C is read only when beta != 0.
__attribute__((target("avx2,fma"))) inline void micro_kernel(std::int64_t k, const float* __restrict ap,
                                                             const float* __restrict bp, float* C, std::int64_t ldc,
                                                             int mr, int nr, float alpha, float beta) {
  constexpr int kRows = 6, kCols = 16;
  const __m256 va = _mm256_set1_ps(alpha), vb = _mm256_set1_ps(beta);
  for (int r0 = 0; r0 < mr; r0 += kRows)
    for (int c0 = 0; c0 < nr; c0 += kCols) {
      __m256 acc[kRows][2];
#pragma GCC unroll 6
      for (int i = 0; i < kRows; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
      for (std::int64_t p = 0; p < k; ++p) {
        const __m256 b0 = _mm256_load_ps(bp + p * NR + c0), b1 = _mm256_load_ps(bp + p * NR + c0 + 8);
        const float* a = ap + p * MR + r0;
#pragma GCC unroll 6
        for (int i = 0; i < kRows; ++i) {
          const __m256 av = _mm256_broadcast_ss(a + i);
          acc[i][0] = _mm256_fmadd_ps(av, b0, acc[i][0]);
          acc[i][1] = _mm256_fmadd_ps(av, b1, acc[i][1]);
        }
      }
      const int cols = nr - c0;  // this sub-tile's columns: lanes j with j < cols (then j - 8 < cols - 8)
      const __m256i m0 = lanes_below(cols), m1 = lanes_below(cols - 8);
      for (int i = 0; i < kRows && r0 + i < mr; ++i) {
        float* row = C + (r0 + i) * ldc + c0;
        __m256 s0 = _mm256_mul_ps(va, acc[i][0]), s1 = _mm256_mul_ps(va, acc[i][1]);
        if (beta != 0.f) {
          s0 = _mm256_add_ps(s0, _mm256_mul_ps(vb, _mm256_maskload_ps(row, m0)));
          s1 = _mm256_add_ps(s1, _mm256_mul_ps(vb, _mm256_maskload_ps(row + 8, m1)));
        }
        _mm256_maskstore_ps(row, m0, s0);
        _mm256_maskstore_ps(row + 8, m1, s1);
      }
    }
}

// r[c] becomes column c of the 8 x 8 block whose rows were r[0..7].
__attribute__((target("avx2,fma"))) inline void transpose8(__m256 r[8]) {
  __m256 t[8], u[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 2; ++i) {
    u[4 * i] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    u[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    u[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    u[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int j = 0; j < 4; ++j) {
    r[j] = _mm256_permute2f128_ps(u[j], u[4 + j], 0x20);
    r[4 + j] = _mm256_permute2f128_ps(u[j], u[4 + j], 0x31);
  }
}

// The packings of sgemm512::pack_a and pack_b (the same layouts, so the
// same packed values) in AVX2 registers: the transposing ones 8 deep at a
// time through transpose8, the depth left over (k % 8) by scalar loops.
//
// dst[p * W + i] = src[i * ld + p] for the n lines i < n (each contiguous
// along p), zero for n <= i < W: rows of A into a sliver (W = MR), or
// columns of op(B) into a panel (W = NR).
template <int W>
__attribute__((target("avx2,fma"))) inline void pack_lines(const float* src, std::int64_t ld, int n, std::int64_t k,
                                                           float* dst) {
  std::int64_t p0 = 0;
  for (; p0 + 8 <= k; p0 += 8)
    for (int i0 = 0; i0 < W; i0 += 8) {
      __m256 r[8];
      for (int i = 0; i < 8; ++i) r[i] = i0 + i < n ? _mm256_loadu_ps(src + (i0 + i) * ld + p0) : _mm256_setzero_ps();
      transpose8(r);
      for (int q = 0; q < 8; ++q) {
        float* d = dst + (p0 + q) * W + i0;
        if (i0 + 8 <= W) _mm256_storeu_ps(d, r[q]);
        else _mm_storeu_ps(d, _mm256_castps256_ps128(r[q]));  // W = MR: lines 8-11
      }
    }
  for (int i = 0; i < W; ++i)
    for (std::int64_t p = p0; p < k; ++p) dst[p * W + i] = i < n ? src[i * ld + p] : 0.f;
}

__attribute__((target("avx2,fma"))) inline void pack_a(bool ta, const float* A, std::int64_t lda, std::int64_t r0,
                                                       int mr, std::int64_t k, float* ap) {
  if (ta) {  // op(A)(r, p) = A[p * lda + r]: mr contiguous floats a step
    const __m256i m0 = lanes_below(mr), m1 = lanes_below(mr - 8);
    for (std::int64_t p = 0; p < k; ++p) {
      const float* src = A + p * lda + r0;
      float* dst = ap + p * MR;
      _mm256_storeu_ps(dst, _mm256_maskload_ps(src, m0));
      _mm_storeu_ps(dst + 8, _mm256_castps256_ps128(_mm256_maskload_ps(src + 8, m1)));
    }
    return;
  }
  pack_lines<MR>(A + r0 * lda, lda, mr, k, ap);  // rows contiguous along p
}

__attribute__((target("avx2,fma"))) inline void pack_b(bool tb, const float* B, std::int64_t ldb, std::int64_t c0,
                                                       std::int64_t nc, std::int64_t k, float* bp) {
  for (std::int64_t q = 0; q * NR < nc; ++q) {
    const int nr = int(std::min<std::int64_t>(NR, nc - q * NR));
    float* panel = bp + q * k * NR;
    const std::int64_t c = c0 + q * NR;
    if (!tb) {  // rows of B: nr contiguous floats a step, the columns past nr zero
      __m256i m[NR / 8];
      for (int j = 0; j < NR / 8; ++j) m[j] = lanes_below(nr - 8 * j);
      for (std::int64_t p = 0; p < k; ++p)
        for (int j = 0; j < NR / 8; ++j)
          _mm256_store_ps(panel + p * NR + 8 * j, _mm256_maskload_ps(B + p * ldb + c + 8 * j, m[j]));
      continue;
    }
    pack_lines<NR>(B + c * ldb, ldb, nr, k, panel);  // columns of op(B) contiguous along p
  }
}
#else
inline bool available() { return false; }
// Never called: available() is false where this is compiled.
inline void micro_kernel(std::int64_t, const float*, const float*, float*, std::int64_t, int, int, float, float) {
  fail("internal error: the AVX2 GEMM tile was called but is not compiled in");
}
inline void pack_a(bool, const float*, std::int64_t, std::int64_t, int, std::int64_t, float*) {
  fail("internal error: the AVX2 GEMM packing was called but is not compiled in");
}
inline void pack_b(bool, const float*, std::int64_t, std::int64_t, std::int64_t, std::int64_t, float*) {
  fail("internal error: the AVX2 GEMM packing was called but is not compiled in");
}
#endif

// C[r0:r1, c0:c1] of C = alpha * op(A) op(B) + beta * C, row-major, on the
// calling thread: sgemm512::gemm_block's walk with this file's packers and
// tile, so its bits are that engine's, however C is cut.
inline void gemm_block(bool ta, bool tb, std::int64_t r0, std::int64_t r1, std::int64_t c0, std::int64_t c1,
                       std::int64_t k, float alpha, const float* A, std::int64_t lda, const float* B, std::int64_t ldb,
                       float beta, float* C, std::int64_t ldc) {
  sgemm512::gemm_block_with(pack_a, pack_b, micro_kernel, ta, tb, r0, r1, c0, c1, k, alpha, A, lda, B, ldb, beta, C,
                            ldc);
}

}  // namespace frugal::cpu::sgemm_avx2
