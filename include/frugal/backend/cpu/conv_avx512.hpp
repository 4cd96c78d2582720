#pragma once
// The AVX-512 engine of the convolution kernels, chosen at run time on CPUs
// that have AVX-512F (the library itself is compiled for plain x86-64; only
// the micro-kernel below is compiled for AVX-512, through a target
// attribute).
//
// Why not OpenBLAS here: on this project's machines OpenBLAS 0.3.21 runs
// its AVX2 kernels (it detects Zen 5 as Haswell), which peak near 97 GFLOP/s
// per core; an 8x32 AVX-512 FMA micro-kernel reaches 150-180 on the same
// conv-shaped products, and packing the im2col columns straight into its
// panels saves writing and re-reading the column matrix.
//
// Every product is C[m, n] = sum_p A(m, p) B(p, n) computed tile by tile
// (8 rows x 32 columns), each tile's sum running over p in order in one
// register per output, so the result does not depend on the thread count
// or the split. B is packed into 32-wide panels [p][32] that live in the
// op's planned scratch (indexed by panel, not by thread); A is read in place
// through strides (or, when its rows are strided, packed 256 deep on the
// stack inside the micro-kernel).
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "../../core/error.hpp"

// Compiled only for x86-64, and not when the build turns it off
// (FRUGAL_WITH_AVX512=OFF defines FRUGAL_NO_AVX512 for the kernel sources):
// elsewhere the engine is absent and the BLAS engine runs every convolution.
#if defined(__x86_64__) && !defined(FRUGAL_NO_AVX512)
#define FRUGAL_CONV_AVX512 1
// Silenced for the intrinsics header only: GCC 12's false -Wuninitialized
// on inlined intrinsics (see sgemm_avx512.hpp).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#else
#define FRUGAL_CONV_AVX512 0
#endif

#include "abi.hpp"

namespace frugal::cpu::inline FRUGAL_KERNEL_ABI::conv_fast {

inline constexpr int MR = 8;    // tile rows
inline constexpr int NR = 32;   // tile columns: two 16-float vectors
inline constexpr int KC = 256;  // depth of a stack-packed block of A
inline constexpr int KA = 1024; // depth of a block of A a caller packs for many panels

inline constexpr bool kCompiledIn = FRUGAL_CONV_AVX512;

// True when the engine is compiled in and this CPU (and its OS) can run it.
inline bool available() {
#if FRUGAL_CONV_AVX512
  static const bool ok = __builtin_cpu_supports("avx512f");
  return ok;
#else
  return false;
#endif
}

#if FRUGAL_CONV_AVX512
// tile[i * NR + j] = sum_{p < K} A(i, p) * b[p * NR + j] for i < 8, with
// A(i, p) = a[i * rs + p * cs] for i < mr (rows past mr repeat row mr - 1:
// their results are computed and ignored). b is a 64-byte aligned panel.
__attribute__((target("avx512f"))) inline void micro_kernel(std::int64_t K, const float* a, std::int64_t rs,
                                                             std::int64_t cs, int mr, const float* __restrict b,
                                                             float* __restrict tile) {
  __m512 c0[MR], c1[MR];
  const float* ar[MR];
  for (int i = 0; i < MR; ++i) {
    c0[i] = _mm512_setzero_ps();
    c1[i] = _mm512_setzero_ps();
    ar[i] = a + std::min(i, mr - 1) * rs;
  }
  if (cs <= MR) {  // A's columns are close together: read them where they are
    for (std::int64_t p = 0; p < K; ++p) {
      const __m512 b0 = _mm512_load_ps(b + p * NR), b1 = _mm512_load_ps(b + p * NR + 16);
      const std::int64_t at = p * cs;
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) {
        const __m512 av = _mm512_set1_ps(ar[i][at]);
        c0[i] = _mm512_fmadd_ps(av, b0, c0[i]);
        c1[i] = _mm512_fmadd_ps(av, b1, c1[i]);
      }
    }
  } else {
    // A's columns are far apart: gather a block of it into consecutive
    // memory first, so the inner loop reads one line per step.
    alignas(64) float ap[KC * MR];
    for (std::int64_t p0 = 0; p0 < K; p0 += KC) {
      const std::int64_t kc = std::min<std::int64_t>(KC, K - p0);
      for (std::int64_t q = 0; q < kc; ++q)
        for (int i = 0; i < MR; ++i) ap[q * MR + i] = ar[i][(p0 + q) * cs];
      const float* bb = b + p0 * NR;
      for (std::int64_t q = 0; q < kc; ++q) {
        const __m512 b0 = _mm512_load_ps(bb + q * NR), b1 = _mm512_load_ps(bb + q * NR + 16);
#pragma GCC unroll 8
        for (int i = 0; i < MR; ++i) {
          const __m512 av = _mm512_set1_ps(ap[q * MR + i]);
          c0[i] = _mm512_fmadd_ps(av, b0, c0[i]);
          c1[i] = _mm512_fmadd_ps(av, b1, c1[i]);
        }
      }
    }
  }
  for (int i = 0; i < MR; ++i) {
    _mm512_store_ps(tile + i * NR, c0[i]);
    _mm512_store_ps(tile + i * NR + 16, c1[i]);
  }
}

// The bf16 form, for CPUs with AVX512-BF16 (bf16gemm512::available):
// tile[i * NR + j] = sum_{q < kp} A(i, 2q) B(2q, j) + A(i, 2q + 1) B(2q + 1, j)
// in f32, with A(i, .) the bf16 row a + i * rs (rows past mr repeat row
// mr - 1), read in place as 32-bit pairs (rs even), and b a panel of [kp][32]
// pairs (B(2q, j) in the low half of word q * NR + j). VDPBF16PS does 32
// multiply-adds an instruction where the f32 kernel's FMA does 16, and
// nothing is widened: each bf16 product is exact in f32 and added to its
// f32 sum in the order 1, 0, 3, 2, ... (the odd element of a pair first),
// subnormal inputs and results taken as zero, as in bf16_gemm_avx512.hpp.
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) inline void micro_kernel_bf16(
    std::int64_t kp, const std::uint16_t* a, std::int64_t rs, int mr, const std::uint32_t* __restrict b,
    float* __restrict tile) {
  __m512 c0[MR], c1[MR];
  const std::uint16_t* ar[MR];
  for (int i = 0; i < MR; ++i) {
    c0[i] = _mm512_setzero_ps();
    c1[i] = _mm512_setzero_ps();
    ar[i] = a + std::min(i, mr - 1) * rs;
  }
  for (std::int64_t q = 0; q < kp; ++q) {
    const __m512bh b0 = (__m512bh)_mm512_load_si512(b + q * NR), b1 = (__m512bh)_mm512_load_si512(b + q * NR + 16);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      std::uint32_t pair;
      std::memcpy(&pair, ar[i] + 2 * q, sizeof pair);
      const __m512bh av = (__m512bh)_mm512_set1_epi32(int(pair));
      c0[i] = _mm512_dpbf16_ps(c0[i], av, b0);
      c1[i] = _mm512_dpbf16_ps(c1[i], av, b1);
    }
  }
  for (int i = 0; i < MR; ++i) {
    _mm512_store_ps(tile + i * NR, c0[i]);
    _mm512_store_ps(tile + i * NR + 16, c1[i]);
  }
}
#else
// Never called: available() is false, so no engine choice reaches them.
inline void micro_kernel(std::int64_t, const float*, std::int64_t, std::int64_t, int, const float*, float*) {
  fail("internal error: the AVX-512 convolution micro-kernel was called but is not compiled in");
}
inline void micro_kernel_bf16(std::int64_t, const std::uint16_t*, std::int64_t, int, const std::uint32_t*, float*) {
  fail("internal error: the AVX-512 convolution micro-kernel was called but is not compiled in");
}
#endif

}  // namespace frugal::cpu::conv_fast
