#pragma once
// frugal's bf16 GEMM for CPUs with AVX512-BF16, chosen at run time
// (blas.hpp, bf16_gemm_direct): C = alpha * op(A) op(B) + beta * C with A, B
// and C in bf16, multiplied and summed in f32 and rounded once on store.
//
// Why: a bf16 product otherwise converts both operands to f32 images in
// its workspace, runs the f32 GEMM and narrows the result, so bf16 training
// ran slower than f32 (gpt: 128 against 109 ms a step). VDPBF16PS does 32
// multiply-adds an instruction where an f32 FMA does 16, and the operands
// are widened nowhere but in registers, so no image is planned either.
//
// The arithmetic: a bf16 product is exact in f32, and VDPBF16PS adds the
// two products of a pair to its f32 accumulator one after the other (the
// odd element's first), rounding to nearest even each time. So every
// element of C is one chain of k f32 additions of exact products, like the
// f32 kernel's, in the order p = 1, 0, 3, 2, ...; its error bound is the f32
// kernel's, then one bf16 rounding. What differs from the f32 path: the
// order, and that the instruction treats subnormal inputs and results as
// zero (bf16 subnormals lie below 1.2e-38). The bits still do not depend on
// the tiling or the thread count.
//
// Layout: as sgemm_avx512.hpp, with pairs. A is packed MR rows at a time as
// [p/2][MR] 32-bit pairs (A(i, 2q) in the low half, A(i, 2q+1) in the high),
// B as [p/2][NR] pairs per 32-column panel; an odd k's last pair has a zero
// high half.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "../../core/error.hpp"
#include "../../core/half.hpp"
#include "sgemm_avx512.hpp"

#include "abi.hpp"

namespace frugal::cpu::inline FRUGAL_KERNEL_ABI::bf16gemm512 {

using sgemm512::MR;
using sgemm512::NC;
using sgemm512::NR;

#define FRUGAL_BF16_GEMM_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

// True when the kernel is compiled in and this CPU runs AVX512-BF16 (with
// the AVX512-BW and -VL forms its packing and stores use).
inline bool available() {
#if FRUGAL_SGEMM_AVX512
  static const bool ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16");
  return ok;
#else
  return false;
#endif
}

// This thread's packing buffers of 32-bit pairs.
struct PairBuffers {
  sgemm512::GrowingBuffer<std::uint32_t> a, b;
  static PairBuffers& mine() {
    static thread_local PairBuffers b;
    return b;
  }
};

inline std::uint32_t pair_of(std::uint16_t lo, std::uint16_t hi) { return std::uint32_t(lo) | (std::uint32_t(hi) << 16); }

#if FRUGAL_SGEMM_AVX512
// Pairs along p of row r of op(A) (untransposed: a row of A) for rows
// r0..r0+mr, 16 pairs at a time through the f32 transpose (a pair is 32
// bits); returns the pairs done (the rest, and an odd k's last, are the
// scalar loop's).
FRUGAL_BF16_GEMM_TARGET inline std::int64_t pack_a_rows(const std::uint16_t* A, std::int64_t lda, std::int64_t r0,
                                                        int mr, std::int64_t k, std::uint32_t* ap) {
  std::int64_t q0 = 0;
  for (; 2 * (q0 + 16) <= k; q0 += 16) {
    __m512 r[16];
    for (int i = 0; i < 16; ++i)
      r[i] = i < mr ? _mm512_loadu_ps(reinterpret_cast<const float*>(A + (r0 + i) * lda + 2 * q0)) : _mm512_setzero_ps();
    sgemm512::transpose16(r);
    for (int q = 0; q < 16; ++q)
      _mm512_mask_storeu_epi32(ap + (q0 + q) * MR, __mmask16((1u << MR) - 1), _mm512_castps_si512(r[q]));
  }
  return q0;
}
// Pairs of rows 2q, 2q+1 of op(A) transposed (rows of A, contiguous in i).
FRUGAL_BF16_GEMM_TARGET inline std::int64_t pack_a_cols(const std::uint16_t* A, std::int64_t lda, std::int64_t r0,
                                                        int mr, std::int64_t k, std::uint32_t* ap) {
  const __mmask16 m = __mmask16((1u << mr) - 1);
  std::int64_t q = 0;
  for (; 2 * q + 1 < k; ++q) {
    const __m512i lo = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, A + 2 * q * lda + r0));
    const __m512i hi = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, A + (2 * q + 1) * lda + r0));
    _mm512_mask_storeu_epi32(ap + q * MR, __mmask16((1u << MR) - 1), _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
  }
  return q;
}
// Pairs of B's rows 2q, 2q+1 (untransposed: contiguous along the columns).
FRUGAL_BF16_GEMM_TARGET inline std::int64_t pack_b_rows(const std::uint16_t* B, std::int64_t ldb, std::int64_t c,
                                                        int nr, std::int64_t k, std::uint32_t* panel) {
  std::int64_t q = 0;
  for (; 2 * q + 1 < k; ++q)
    for (int j0 = 0; j0 < NR; j0 += 16) {
      const int left = std::clamp(nr - j0, 0, 16);
      const __mmask16 m = __mmask16((1u << left) - 1);
      const __m512i lo = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, B + 2 * q * ldb + c + j0));
      const __m512i hi = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, B + (2 * q + 1) * ldb + c + j0));
      _mm512_store_si512(panel + q * NR + j0, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
    }
  return q;
}
// Pairs along p of op(B) transposed (a row of B holds one column of op(B)).
FRUGAL_BF16_GEMM_TARGET inline std::int64_t pack_b_cols(const std::uint16_t* B, std::int64_t ldb, std::int64_t c,
                                                        int nr, std::int64_t k, std::uint32_t* panel) {
  std::int64_t q0 = 0;
  for (; 2 * (q0 + 16) <= k; q0 += 16)
    for (int j0 = 0; j0 < NR; j0 += 16) {
      __m512 r[16];
      for (int j = 0; j < 16; ++j)
        r[j] = j0 + j < nr ? _mm512_loadu_ps(reinterpret_cast<const float*>(B + (c + j0 + j) * ldb + 2 * q0))
                           : _mm512_setzero_ps();
      sgemm512::transpose16(r);
      for (int q = 0; q < 16; ++q) _mm512_store_ps(reinterpret_cast<float*>(panel + (q0 + q) * NR + j0), r[q]);
    }
  return q0;
}

// 16 f32 values to bf16 bit patterns as core/half.hpp's BFloat16(float)
// rounds them: to nearest even, a NaN kept a quiet NaN.
FRUGAL_BF16_GEMM_TARGET inline __m256i round_to_bf16(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), odd)), 16);
  const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
  const __mmask16 nan =
      _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
  return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, rounded, quiet));
}

FRUGAL_BF16_GEMM_TARGET inline __m512 widen(__mmask16 m, const std::uint16_t* p) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16));
}

// C[i, j] = bf16(alpha * sum + beta * C[i, j]) for i < mr, j < nr, the sum
// over kp pairs; C is read only when beta != 0.
FRUGAL_BF16_GEMM_TARGET inline void micro_kernel(std::int64_t kp, const std::uint32_t* __restrict ap,
                                                 const std::uint32_t* __restrict bp, std::uint16_t* C,
                                                 std::int64_t ldc, int mr, int nr, float alpha, float beta) {
  __m512 c0[MR], c1[MR];
#pragma GCC unroll 12
  for (int i = 0; i < MR; ++i) {
    c0[i] = _mm512_setzero_ps();
    c1[i] = _mm512_setzero_ps();
  }
  for (std::int64_t q = 0; q < kp; ++q) {
    const __m512bh b0 = (__m512bh)_mm512_load_si512(bp + q * NR), b1 = (__m512bh)_mm512_load_si512(bp + q * NR + 16);
    const std::uint32_t* a = ap + q * MR;
#pragma GCC unroll 12
    for (int i = 0; i < MR; ++i) {
      const __m512bh av = (__m512bh)_mm512_set1_epi32(int(a[i]));
      c0[i] = _mm512_dpbf16_ps(c0[i], av, b0);
      c1[i] = _mm512_dpbf16_ps(c1[i], av, b1);
    }
  }
  const __mmask16 m0 = nr >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << nr) - 1);
  const __mmask16 m1 = nr >= 32 ? __mmask16(0xFFFF) : nr <= 16 ? __mmask16(0) : __mmask16((1u << (nr - 16)) - 1);
  const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
#pragma GCC unroll 12
  for (int i = 0; i < MR; ++i) {
    if (i >= mr) break;
    std::uint16_t* row = C + i * ldc;
    __m512 r0 = _mm512_mul_ps(va, c0[i]), r1 = _mm512_mul_ps(va, c1[i]);
    if (beta != 0.f) {
      r0 = _mm512_add_ps(r0, _mm512_mul_ps(vb, widen(m0, row)));
      r1 = _mm512_add_ps(r1, _mm512_mul_ps(vb, widen(m1, row + 16)));
    }
    _mm256_mask_storeu_epi16(row, m0, round_to_bf16(r0));
    _mm256_mask_storeu_epi16(row + 16, m1, round_to_bf16(r1));
  }
}
#else
// Never called: available() is false where this is compiled.
inline std::int64_t pack_a_rows(const std::uint16_t*, std::int64_t, std::int64_t, int, std::int64_t, std::uint32_t*) {
  return 0;
}
inline std::int64_t pack_a_cols(const std::uint16_t*, std::int64_t, std::int64_t, int, std::int64_t, std::uint32_t*) {
  return 0;
}
inline std::int64_t pack_b_rows(const std::uint16_t*, std::int64_t, std::int64_t, int, std::int64_t, std::uint32_t*) {
  return 0;
}
inline std::int64_t pack_b_cols(const std::uint16_t*, std::int64_t, std::int64_t, int, std::int64_t, std::uint32_t*) {
  return 0;
}
inline void micro_kernel(std::int64_t, const std::uint32_t*, const std::uint32_t*, std::uint16_t*, std::int64_t, int,
                         int, float, float) {
  fail("internal error: the bf16 GEMM micro-kernel was called but is not compiled in");
}
#endif
#undef FRUGAL_BF16_GEMM_TARGET

// ap[q * MR + i] = the pair (op(A)(r0 + i, 2q), op(A)(r0 + i, 2q + 1)), zero
// past k and for rows mr <= i < MR.
inline void pack_a(bool ta, const std::uint16_t* A, std::int64_t lda, std::int64_t r0, int mr, std::int64_t k,
                   std::uint32_t* ap) {
  const std::int64_t kp = (k + 1) / 2;
  auto at = [&](std::int64_t i, std::int64_t p) -> std::uint16_t {
    if (p >= k) return 0;
    return ta ? A[p * lda + r0 + i] : A[(r0 + i) * lda + p];
  };
  const std::int64_t done = ta ? pack_a_cols(A, lda, r0, mr, k, ap) : pack_a_rows(A, lda, r0, mr, k, ap);
  for (std::int64_t q = done; q < kp; ++q)
    for (int i = 0; i < MR; ++i) ap[q * MR + i] = i < mr ? pair_of(at(i, 2 * q), at(i, 2 * q + 1)) : 0u;
}

// Panel t of bp (kp * NR pairs each): bp[t * kp * NR + q * NR + j] = the pair
// (op(B)(2q, c), op(B)(2q + 1, c)) for c = c0 + t * NR + j before c0 + nc,
// zero beyond and past k.
inline void pack_b(bool tb, const std::uint16_t* B, std::int64_t ldb, std::int64_t c0, std::int64_t nc,
                   std::int64_t k, std::uint32_t* bp) {
  const std::int64_t kp = (k + 1) / 2;
  for (std::int64_t t = 0; t * NR < nc; ++t) {
    const int nr = int(std::min<std::int64_t>(NR, nc - t * NR));
    std::uint32_t* panel = bp + t * kp * NR;
    const std::int64_t c = c0 + t * NR;
    auto at = [&](std::int64_t p, std::int64_t j) -> std::uint16_t {
      if (p >= k || j >= nr) return 0;
      return tb ? B[(c + j) * ldb + p] : B[p * ldb + c + j];
    };
    const std::int64_t done = tb ? pack_b_cols(B, ldb, c, nr, k, panel) : pack_b_rows(B, ldb, c, nr, k, panel);
    for (std::int64_t q = done; q < kp; ++q)
      for (int j = 0; j < NR; ++j) panel[q * NR + j] = pair_of(at(2 * q, j), at(2 * q + 1, j));
  }
}

// C[r0:r1, c0:c1] of C = alpha * op(A) op(B) + beta * C, bf16 row-major, on
// the calling thread.
inline void gemm_block(bool ta, bool tb, std::int64_t r0, std::int64_t r1, std::int64_t c0, std::int64_t c1,
                       std::int64_t k, float alpha, const BFloat16* A, std::int64_t lda, const BFloat16* B,
                       std::int64_t ldb, float beta, BFloat16* C, std::int64_t ldc) {
  static_assert(sizeof(BFloat16) == 2);
  const auto* a16 = reinterpret_cast<const std::uint16_t*>(A);
  const auto* b16 = reinterpret_cast<const std::uint16_t*>(B);
  auto* c16 = reinterpret_cast<std::uint16_t*>(C);
  const std::int64_t kp = (k + 1) / 2;  // pairs: the packed depth
  PairBuffers& buf = PairBuffers::mine();
  std::uint32_t* ap = buf.a.at_least(std::max<std::int64_t>(kp, 1) * MR);
  const std::int64_t nc_most = sgemm512::columns_packed(std::max<std::int64_t>(kp, 1));
  std::uint32_t* bp = buf.b.at_least(std::max<std::int64_t>(kp, 1) * nc_most);
  sgemm512::for_each_register_tile(
      r0, r1, c0, c1, nc_most, [&](std::int64_t jc, std::int64_t nc) { pack_b(tb, b16, ldb, jc, nc, k, bp); },
      [&](std::int64_t ir, int mr) { pack_a(ta, a16, lda, ir, mr, k, ap); },
      [&](std::int64_t q, std::int64_t ir, std::int64_t jc, int mr, int nr) {
        micro_kernel(kp, ap, bp + q * kp * NR, c16 + ir * ldc + jc + q * NR, ldc, mr, nr, alpha, beta);
      });
}

}  // namespace frugal::cpu::bf16gemm512
