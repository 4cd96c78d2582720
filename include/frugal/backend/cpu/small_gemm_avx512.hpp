#pragma once
// Small float products without packing, for kernels that multiply tiles they
// already hold (attention's 32 x 64 score tiles against 64-wide heads):
//
//   C[m, n] = alpha * sum_p A(i, p) B(p, j) + beta * C,
//
// A read an element at a time through two strides, A(i, p) = A[i*sai + p*sap]
// (so a transposed tile costs nothing), B's rows contiguous, B(p, j) =
// B[p*ldb + j]. The packed engine (sgemm_avx512.hpp) packs both operands on
// every call, which for a 32 x 64 x 64 product costs about what the product
// does. Each element gets the packed engine's arithmetic: FMAs over p in
// order from zero, then alpha times the sum, plus beta times C where beta is
// not zero (C is not read otherwise, as BLAS does).
#include <algorithm>
#include <array>
#include <cstdint>

#include "sgemm_avx512.hpp"

#include "abi.hpp"

namespace frugal::cpu::inline FRUGAL_KERNEL_ABI::small_gemm {

inline constexpr int kRows = 6;     // rows of a register tile
inline constexpr int kVectors = 4;  // 16-float vectors across it: 6 x 64, 24 accumulators

inline bool available() { return sgemm512::available(); }

#if FRUGAL_SGEMM_AVX512
// One register tile of R rows and NV vectors; the last vector's columns
// are `last` (a full mask unless n ends inside it).
template <int R, int NV>
__attribute__((target("avx512f"))) void tile(std::int64_t k, const float* A, std::int64_t sai, std::int64_t sap,
                                             const float* B, std::int64_t ldb, float* C, std::int64_t ldc,
                                             __mmask16 last, float alpha, float beta) {
  __m512 acc[R][NV];
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_setzero_ps();
  for (std::int64_t p = 0; p < k; ++p) {
    const float* b = B + p * ldb;
    __m512 bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v)
      bv[v] = v == NV - 1 ? _mm512_maskz_loadu_ps(last, b + 16 * v) : _mm512_loadu_ps(b + 16 * v);
    const float* a = A + p * sap;
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const __m512 av = _mm512_set1_ps(a[r * sai]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_fmadd_ps(av, bv[v], acc[r][v]);
    }
  }
  const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      const __mmask16 m = v == NV - 1 ? last : __mmask16(0xFFFF);
      float* c = C + r * ldc + 16 * v;
      __m512 y = _mm512_mul_ps(va, acc[r][v]);
      if (beta != 0.f) y = _mm512_add_ps(y, _mm512_mul_ps(vb, _mm512_maskz_loadu_ps(m, c)));
      _mm512_mask_storeu_ps(c, m, y);
    }
}

using TileFn = void (*)(std::int64_t, const float*, std::int64_t, std::int64_t, const float*, std::int64_t, float*,
                        std::int64_t, __mmask16, float, float);

template <int R, std::size_t... V>
constexpr std::array<TileFn, kVectors> tiles_of_rows(std::index_sequence<V...>) {
  return {&tile<R, int(V) + 1>...};
}
template <std::size_t... R>
constexpr std::array<std::array<TileFn, kVectors>, kRows> tile_table(std::index_sequence<R...>) {
  return {tiles_of_rows<int(R) + 1>(std::make_index_sequence<kVectors>{})...};
}
// kTiles[rows - 1][vectors - 1]
inline constexpr auto kTiles = tile_table(std::make_index_sequence<kRows>{});

// The product, on the calling thread: 64 columns at a time (their k x 64
// slice of B stays in L1 while every row group passes over it).
inline void gemm(std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* A, std::int64_t sai,
                 std::int64_t sap, const float* B, std::int64_t ldb, float beta, float* C, std::int64_t ldc) {
  constexpr std::int64_t width = 16 * kVectors;
  for (std::int64_t j0 = 0; j0 < n; j0 += width) {
    const std::int64_t w = std::min(width, n - j0);
    const int nv = int((w + 15) / 16);
    const int tail = int(w - 16 * (nv - 1));
    const __mmask16 last = tail == 16 ? __mmask16(0xFFFF) : __mmask16((1u << tail) - 1);
    for (std::int64_t i0 = 0; i0 < m; i0 += kRows) {
      const int rows = int(std::min<std::int64_t>(kRows, m - i0));
      kTiles[std::size_t(rows - 1)][std::size_t(nv - 1)](k, A + i0 * sai, sai, sap, B + j0, ldb, C + i0 * ldc + j0,
                                                           ldc, last, alpha, beta);
    }
  }
}
// xt[c * rows + j] = x[j * ld + c] for j < rows, c < cols: 16 x 16 blocks
// through registers (sgemm512::transpose16), the edges element by element.
__attribute__((target("avx512f"))) inline void transpose(const float* x, std::int64_t ld, std::int64_t rows,
                                                         std::int64_t cols, float* xt) {
  std::int64_t j0 = 0;
  for (; j0 + 16 <= rows; j0 += 16) {
    std::int64_t c0 = 0;
    for (; c0 + 16 <= cols; c0 += 16) {
      __m512 r[16];
      for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(x + (j0 + i) * ld + c0);
      sgemm512::transpose16(r);
      for (int q = 0; q < 16; ++q) _mm512_storeu_ps(xt + (c0 + q) * rows + j0, r[q]);
    }
    for (; c0 < cols; ++c0)
      for (std::int64_t j = j0; j < j0 + 16; ++j) xt[c0 * rows + j] = x[j * ld + c0];
  }
  for (std::int64_t j = j0; j < rows; ++j)
    for (std::int64_t c = 0; c < cols; ++c) xt[c * rows + j] = x[j * ld + c];
}
#else
// Never called: available() is false where this is compiled.
inline void transpose(const float*, std::int64_t, std::int64_t, std::int64_t, float*) {
  fail("internal error: the AVX-512 transpose was called but is not compiled in");
}
inline void gemm(std::int64_t, std::int64_t, std::int64_t, float, const float*, std::int64_t, std::int64_t,
                 const float*, std::int64_t, float, float*, std::int64_t) {
  fail("internal error: the small AVX-512 product was called but is not compiled in");
}
#endif

}  // namespace frugal::cpu::small_gemm
