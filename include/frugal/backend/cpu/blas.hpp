#pragma once
// The one place frugal calls BLAS: row-major GEMM in float and double.
//
// BLAS always runs single-threaded here. A product is cut into tiles of C
// (full depth each, so every element comes from one BLAS call) by its sizes
// alone, and the tiles run on the calling thread's team (worker_team.hpp):
// OpenBLAS's own threads split a product by the thread count (7 of 8 shapes
// tried gave different bits at 1 and 2 threads) and wait for each other at
// every call, which is what collapsed steps on a loaded machine.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "../../core/error.hpp"

#include "abi.hpp"
#include "worker_team.hpp"

namespace frugal::cpu::inline FRUGAL_KERNEL_ABI {

// BLAS takes sizes and strides as blasint (32-bit in Debian's OpenBLAS): a
// value that does not fit would wrap into a wrong (or negative) size, so it
// is an error naming the product, before BLAS is called.
inline void check_gemm_dims(std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t lda, std::int64_t ldb,
                            std::int64_t ldc) {
  constexpr std::int64_t lo = std::numeric_limits<blasint>::min(), hi = std::numeric_limits<blasint>::max();
  const std::int64_t v[] = {m, n, k, lda, ldb, ldc};
  const char* names[] = {"m", "n", "k", "lda", "ldb", "ldc"};
  for (int i = 0; i < 6; ++i)
    if (v[i] < lo || v[i] > hi)
      fail("gemm (m=", m, ", n=", n, ", k=", k, ", lda=", lda, ", ldb=", ldb, ", ldc=", ldc, "): ", names[i], " = ",
           v[i], " does not fit BLAS's ", sizeof(blasint) * 8, "-bit integer (at most ", hi, ")");
}

// The tiles of an [m, n] product of depth k: about kGemmTileFlops each (at
// least 16 rows and 32 columns, at most kGemmMaxTiles), as square as the
// shape allows, which packs the fewest operand bytes per tile, and an even
// number where there are several, so two or four threads share them evenly.
// Every tile repacks its operands: one OpenBLAS call on 1024x768x256 takes
// 3.9 ms on one core here, and the same product in 16 MFLOP tiles 13% more,
// in 64 MFLOP tiles 4-16% more (bench/RESULTS.md, "the team").
inline constexpr double kGemmTileFlops = 48.0 * 1024 * 1024;
inline constexpr std::int64_t kGemmMaxTiles = 64;
struct GemmTiles {
  std::int64_t rows, cols;  // tiles along m and along n
};
inline GemmTiles gemm_tiles(std::int64_t m, std::int64_t n, std::int64_t k) {
  const double flops = 2.0 * double(m) * double(n) * double(k);
  const double want = std::clamp(flops / kGemmTileFlops, 1.0, double(kGemmMaxTiles));
  if (want < 1.5) return {1, 1};
  const std::int64_t most_rows = std::max<std::int64_t>(1, m / 16), most_cols = std::max<std::int64_t>(1, n / 32);
  const double side = std::sqrt(double(m) * double(n) / want);
  std::int64_t rows = std::clamp<std::int64_t>(std::llround(double(m) / side), 1, most_rows);
  std::int64_t cols = std::clamp<std::int64_t>(std::llround(want / double(rows)), 1, most_cols);
  if ((rows * cols) % 2 == 1) {
    if (cols < most_cols) ++cols;
    else if (rows < most_rows) ++rows;
  }
  return {rows, cols};
}

// Where tile i of `tiles` along a side of n starts: on a multiple of 16,
// so only the last tile has a partial block of OpenBLAS's micro-kernel.
inline std::int64_t tile_edge(std::int64_t n, std::int64_t i, std::int64_t tiles) {
  if (i >= tiles) return n;
  return std::min(n, (n * i / tiles + 8) / 16 * 16);
}

// C[m,n] = alpha * op(A) op(B) + beta * C, all row-major, tile by tile.
template <class T, class Blas>
void tiled_gemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, T alpha, const T* A, std::int64_t lda,
                const T* B, std::int64_t ldb, T beta, T* C, std::int64_t ldc, Blas&& blas) {
  check_gemm_dims(m, n, k, lda, ldb, ldc);
  if (m <= 0 || n <= 0) return;
  const GemmTiles t = gemm_tiles(m, n, k);
  WorkerTeam::mine().run(t.rows * t.cols, std::max(1, omp_get_max_threads()), [&](std::int64_t c) {
    const std::int64_t i = c / t.cols, j = c % t.cols;
    const std::int64_t r0 = tile_edge(m, i, t.rows), r1 = tile_edge(m, i + 1, t.rows);
    const std::int64_t c0 = tile_edge(n, j, t.cols), c1 = tile_edge(n, j + 1, t.cols);
    if (r0 == r1 || c0 == c1) return;
    // Row r of op(A) starts at A + r*lda untransposed, at column r transposed.
    const T* a = ta ? A + r0 : A + r0 * lda;
    const T* b = tb ? B + c0 * ldb : B + c0;
    blas(ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, blasint(r1 - r0), blasint(c1 - c0),
         blasint(k), alpha, a, blasint(lda), b, blasint(ldb), beta, C + r0 * ldc + c0, blasint(ldc));
  });
}

inline void gemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* A,
                 std::int64_t lda, const float* B, std::int64_t ldb, float beta, float* C, std::int64_t ldc) {
  tiled_gemm(ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc,
             [](auto... a) { cblas_sgemm(CblasRowMajor, a...); });
}
inline void gemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, double alpha, const double* A,
                 std::int64_t lda, const double* B, std::int64_t ldb, double beta, double* C, std::int64_t ldc) {
  tiled_gemm(ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc,
             [](auto... a) { cblas_dgemm(CblasRowMajor, a...); });
}

inline void set_blas_threads(int n) { openblas_set_num_threads(n); }

}  // namespace frugal::cpu
