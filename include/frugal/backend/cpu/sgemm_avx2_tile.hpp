#pragma once
// The register tile of frugal's AVX-512 GEMM (sgemm_avx512.hpp) computed
// with AVX2 and FMA3, on the same packed operands: an MR-row sliver of A
// ([p][MR]) times an NR-column panel of B ([p][NR]). Kernels that write
// their operands packed themselves (Winograd's transforms) call it where the
// CPU has no AVX-512 (or OpenBLAS is not trusted with it), instead of
// OpenBLAS's own packing for each small product.
//
// Each element of C is the same chain as the AVX-512 tile computes (fused
// multiply-adds over p = 0..k-1 in order from zero, then alpha * sum
// (+ beta * C)), so both give the same bits.
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

// C[i, j] = alpha * sum_p ap[p*MR + i] * bp[p*NR + j] (+ beta * C[i, j]) for
// i < mr, j < nr, in sub-tiles of 6 rows by 16 columns (12 accumulators,
// what 16 ymm registers hold beside two of B and a broadcast of A); rows
// past mr cost nothing. C is read only when beta != 0.
__attribute__((target("avx2,fma"))) inline void micro_kernel(std::int64_t k, const float* __restrict ap,
                                                             const float* __restrict bp, float* C, std::int64_t ldc,
                                                             int mr, int nr, float alpha, float beta) {
  constexpr int kRows = 6, kCols = 16;
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
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
      const __m256i m0 = _mm256_cmpgt_epi32(_mm256_set1_epi32(cols), lane);
      const __m256i m1 = _mm256_cmpgt_epi32(_mm256_set1_epi32(cols - 8), lane);
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
#else
inline bool available() { return false; }
// Never called: available() is false where this is compiled.
inline void micro_kernel(std::int64_t, const float*, const float*, float*, std::int64_t, int, int, float, float) {
  fail("internal error: the AVX2 GEMM tile was called but is not compiled in");
}
#endif

}  // namespace frugal::cpu::sgemm_avx2
