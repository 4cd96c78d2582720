#pragma once
// The one place frugal calls BLAS: row-major GEMM in float and double.
//
// BLAS always runs single-threaded here. A product is cut into tiles of C
// (full depth each, so every element comes from one BLAS call) by its sizes
// alone, and the tiles run on the calling thread's team (worker_team.hpp):
// OpenBLAS's own threads split a product by the thread count (7 of 8 shapes
// tried gave different bits at 1 and 2 threads) and wait for each other at
// every call, which is what collapsed steps on a loaded machine.
//
// Float products run on frugal's own AVX-512 kernel wherever the CPU's
// AVX-512 is full width (sgemm_engine below says when and why).
#include <cblas.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>
#include <type_traits>

#include "../../core/error.hpp"

#include "abi.hpp"
#include "bf16_gemm_avx512.hpp"
#include "isa.hpp"
#include "sgemm_avx2_tile.hpp"
#include "sgemm_avx512.hpp"
#include "worker_team.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#endif

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
//
// An engine whose bits do not depend on where C is cut (frugal's AVX-512
// kernels: every element is one FMA chain over the whole depth, then alpha
// and beta) passes most_tiles = kTilesPerThread * the team's threads. A
// tile packs its rows of A once per chunk of B's columns, and its columns
// of B once per tile row, so fewer, wider tiles pack less (the mlp's first
// layer, 256x1024x784, was ten tiles of about 100 columns, each packing all
// of A; now four of 256 in two chunks each, eight packings of A; fewer
// tiles also mean fewer tasks and edges), while two per thread still let the team's
// dynamic schedule even out a thread that another process slows. Step
// medians with shape-fixed tiles against two per thread (bench/train_bench,
// 2 threads, Zen 5, runs alternating): mlp 10.0/9.5/9.2/9.3 against
// 9.7/8.8/8.8/8.8 ms, gpt 84.0/83.8/83.1 against 82.2/81.3/80.5 ms, resnet
// 301/307 against 302/310 ms. OpenBLAS's tiles stay fixed by the shape
// alone: it may cut the depth by the size it is given, and its bits must
// not follow the thread count.
inline constexpr double kGemmTileFlops = 48.0 * 1024 * 1024;
inline constexpr std::int64_t kGemmMaxTiles = 64;
inline constexpr std::int64_t kTilesPerThread = 2;
struct GemmTiles {
  std::int64_t rows, cols;  // tiles along m and along n
};
inline GemmTiles gemm_tiles(std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t most_tiles = kGemmMaxTiles) {
  const double flops = 2.0 * double(m) * double(n) * double(k);
  const double want = std::clamp(flops / kGemmTileFlops, 1.0, double(std::clamp<std::int64_t>(most_tiles, 1, kGemmMaxTiles)));
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

// Where tile i of `tiles` along a side of n starts: on a multiple of
// `align` (16 for OpenBLAS's micro-kernel, the register tile's side for
// frugal's), so only the last tile has a partial block.
inline std::int64_t tile_edge(std::int64_t n, std::int64_t i, std::int64_t tiles, std::int64_t align = 16) {
  if (i >= tiles) return n;
  return std::min(n, (n * i / tiles + align / 2) / align * align);
}

// C[m,n] = alpha * op(A) op(B) + beta * C, all row-major, tile by tile:
// block(r0, r1, c0, c1) computes C[r0:r1, c0:c1] on its thread.
// cut_free: the block's bits do not depend on where C is cut, so the tiles
// may follow the team's size (gemm_tiles).
template <class Block>
void tiled_gemm(std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t row_align, std::int64_t col_align,
                bool cut_free, Block&& block) {
  if (m <= 0 || n <= 0) return;
  const GemmTiles t = gemm_tiles(m, n, k, cut_free ? kTilesPerThread * team_threads() : kGemmMaxTiles);
  WorkerTeam::mine().run(t.rows * t.cols, team_threads(), [&](std::int64_t c) {
    const std::int64_t i = c / t.cols, j = c % t.cols;
    const std::int64_t r0 = tile_edge(m, i, t.rows, row_align), r1 = tile_edge(m, i + 1, t.rows, row_align);
    const std::int64_t c0 = tile_edge(n, j, t.cols, col_align), c1 = tile_edge(n, j + 1, t.cols, col_align);
    if (r0 < r1 && c0 < c1) block(r0, r1, c0, c1);
  });
}

// One OpenBLAS call per tile.
template <class T, class Blas>
void blas_tiled_gemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, T alpha, const T* A,
                     std::int64_t lda, const T* B, std::int64_t ldb, T beta, T* C, std::int64_t ldc, Blas&& blas) {
  tiled_gemm(m, n, k, 16, 16, false, [&](std::int64_t r0, std::int64_t r1, std::int64_t c0, std::int64_t c1) {
    // Row r of op(A) starts at A + r*lda untransposed, at column r transposed.
    const T* a = ta ? A + r0 : A + r0 * lda;
    const T* b = tb ? B + c0 * ldb : B + c0;
    blas(ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, blasint(r1 - r0), blasint(c1 - c0),
         blasint(k), alpha, a, blasint(lda), b, blasint(ldb), beta, C + r0 * ldc + c0, blasint(ldc));
  });
}

// ---- which engine runs float products -------------------------------------------------

enum class SgemmEngine { openblas, avx512, avx2 };

namespace gemm_detail {

inline std::string lower(std::string s) {
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// AMD's Zen 4 (family 0x19) executes a 512-bit FMA as two 256-bit halves:
// its AVX-512 peak is its AVX2 peak, so frugal's kernel has nothing to add
// to OpenBLAS's there. (Debian's OpenBLAS 0.3.21 runs its Cooperlake
// AVX-512 kernels on a Zen 4, and bench/gemm_kernels measured them at
// 0.95-1.05x frugal's on the mlp and gpt products, 2 threads; frugal's
// engine for a convolution's products gained 3% at 1 thread and nothing
// at 2, so those stay on OpenBLAS too.) Zen 5 (family 0x1A) and Intel's
// AVX-512 cores have 512-bit FMA units, and there frugal's engine runs
// even where OpenBLAS has AVX-512 kernels of its own: on a Zen 5 with
// OPENBLAS_CORETYPE=SkylakeX, OpenBLAS's one threaded call took 1.0-1.23x
// frugal's time on the mlp and gpt products, and the tiles frugal must
// cut to keep its bits independent of the thread count (one OpenBLAS call
// each) another 1.03-1.2x (bench/gemm_kernels, 2 threads).
inline bool avx512_half_width() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  unsigned a, b, c, d;
  if (!__get_cpuid(0, &a, &b, &c, &d)) return false;
  const bool amd = b == 0x68747541u && d == 0x69746e65u && c == 0x444d4163u;  // "AuthenticAMD"
  if (!amd || !__get_cpuid(1, &a, &b, &c, &d)) return false;
  unsigned family = (a >> 8) & 0xF;
  if (family == 0xF) family += (a >> 20) & 0xFF;
  return family == 0x19;
#else
  return false;
#endif
}

// FRUGAL_SGEMM, read once: "" when unset.
inline const std::string& sgemm_env() {
  static const std::string v = [] {
    const char* e = std::getenv("FRUGAL_SGEMM");
    return e ? lower(e) : std::string();
  }();
  return v;
}
inline bool openblas_forced() { return sgemm_env() == "openblas"; }

// FRUGAL_SGEMM=openblas|avx512|auto; auto when unset.
inline SgemmEngine configured() {
  static const SgemmEngine e = [] {
    const std::string& s = sgemm_env();
    if (s == "openblas") return SgemmEngine::openblas;
    if (s == "avx512") {
      if (!sgemm512::available())
        fail("FRUGAL_SGEMM=avx512 asks for frugal's AVX-512 GEMM, but ",
             sgemm512::kCompiledIn ? "this CPU has no AVX-512F" : "frugal's kernels were built without it",
             "; unset it or use FRUGAL_SGEMM=openblas");
      return SgemmEngine::avx512;
    }
    if (s != "auto" && !s.empty())
      fail("FRUGAL_SGEMM='", s, "' is not an engine: use openblas, avx512 or auto");
    return sgemm512::available() && !avx512_half_width() ? SgemmEngine::avx512 : SgemmEngine::openblas;
  }();
  return e;
}

}  // namespace gemm_detail

// The engine for a float product of depth k. It depends on the CPU, the
// environment and k only, never on the thread count, so a step's bits do
// not either. Below AVX-512 (an AVX2 CPU, or FRUGAL_CPU_ISA=avx2, which is
// how that path is measured on an AVX-512 machine) frugal's AVX2 engine
// runs: the AVX-512 engine's packing and walk with its AVX2 twin tile
// (sgemm_avx2_tile.hpp), so a product has the same bits as on an AVX-512
// machine, and its tiles follow the team's size. On the mlp's and gpt's
// products (bench/gemm_kernels, 2 threads, a Zen 5 capped at AVX2),
// OpenBLAS's one threaded Haswell call took 0.90-1.08x its time, and it was
// 4-16% ahead of OpenBLAS per tile (the path before it) but for a
// transposed-A product of depth 1024, 2-4% behind; the mlp's step 3-7% faster.
// FRUGAL_SGEMM=openblas keeps OpenBLAS everywhere.
inline SgemmEngine sgemm_engine(std::int64_t k) {
  if (k > sgemm512::kMaxDepth) return SgemmEngine::openblas;
  if (cpu_isa() < CpuIsa::avx512)
    return cpu_isa() >= CpuIsa::avx2 && sgemm_avx2::available() && !gemm_detail::openblas_forced()
               ? SgemmEngine::avx2
               : SgemmEngine::openblas;
  return gemm_detail::configured();
}

inline const char* sgemm_engine_name(SgemmEngine e) {
  return e == SgemmEngine::avx512 ? "avx512" : e == SgemmEngine::avx2 ? "avx2" : "openblas";
}

// A float product on the calling thread alone, for kernels that run many
// independent products over their team (one per task): its bits are those
// of one engine call on the whole product, whoever runs it.
inline void gemm_serial(SgemmEngine e, bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                        const float* A, std::int64_t lda, const float* B, std::int64_t ldb, float beta, float* C,
                        std::int64_t ldc) {
  check_gemm_dims(m, n, k, lda, ldb, ldc);
  if (m <= 0 || n <= 0) return;
  if (e == SgemmEngine::avx512) {
    if (!sgemm512::available()) fail("gemm: the AVX-512 engine was asked for, but this CPU or build has none");
    sgemm512::gemm_block(ta, tb, 0, m, 0, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  if (e == SgemmEngine::avx2) {
    if (!sgemm_avx2::available())
      fail("gemm: the AVX2 engine was asked for, but this CPU or build has no AVX2 and FMA");
    sgemm_avx2::gemm_block(ta, tb, 0, m, 0, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, blasint(m), blasint(n),
              blasint(k), alpha, A, blasint(lda), B, blasint(ldb), beta, C, blasint(ldc));
}

// A float product on the given engine (tests run each engine this way),
// its tiles spread over the team, each one engine call on the calling
// thread.
inline void gemm_with(SgemmEngine e, bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                      const float* A, std::int64_t lda, const float* B, std::int64_t ldb, float beta, float* C,
                      std::int64_t ldc) {
  check_gemm_dims(m, n, k, lda, ldb, ldc);
  const bool own = e != SgemmEngine::openblas;  // frugal's engines: register-tile edges, tiles by team size
  tiled_gemm(m, n, k, own ? sgemm512::MR : 16, own ? sgemm512::NR : 16, own,
             [&](std::int64_t r0, std::int64_t r1, std::int64_t c0, std::int64_t c1) {
               // Row r of op(A) starts at A + r*lda untransposed, at column r transposed.
               gemm_serial(e, ta, tb, r1 - r0, c1 - c0, k, alpha, ta ? A + r0 : A + r0 * lda, lda,
                           tb ? B + c0 * ldb : B + c0, ldb, beta, C + r0 * ldc + c0, ldc);
             });
}
inline void gemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* A,
                 std::int64_t lda, const float* B, std::int64_t ldb, float beta, float* C, std::int64_t ldc) {
  gemm_with(sgemm_engine(k), ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
}
inline void gemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, double alpha, const double* A,
                 std::int64_t lda, const double* B, std::int64_t ldb, double beta, double* C, std::int64_t ldc) {
  check_gemm_dims(m, n, k, lda, ldb, ldc);
  blas_tiled_gemm(ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc,
                  [](auto... a) { cblas_dgemm(CblasRowMajor, a...); });
}

// ---- bf16 products ---------------------------------------------------------------------

// Does a bf16 product of depth k run on frugal's bf16 kernel (AVX512-BF16,
// bf16_gemm_avx512.hpp), reading and writing bf16 directly? Otherwise the
// caller multiplies f32 images of its operands. Like sgemm_engine, this
// depends on the CPU, the environment (FRUGAL_CPU_ISA below avx512bf16, or
// FRUGAL_SGEMM=openblas, turn it off) and k only.
inline bool bf16_gemm_direct(std::int64_t k) {
  return k <= sgemm512::kMaxDepth && cpu_isa() >= CpuIsa::avx512bf16 && bf16gemm512::available() &&
         !gemm_detail::openblas_forced();
}

// C[m,n] = alpha * op(A) op(B) + beta * C in bf16, row-major, on the team;
// only where bf16_gemm_direct(k).
inline void gemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const BFloat16* A,
                 std::int64_t lda, const BFloat16* B, std::int64_t ldb, float beta, BFloat16* C, std::int64_t ldc) {
  check_gemm_dims(m, n, k, lda, ldb, ldc);
  if (!bf16gemm512::available())
    fail("internal error: a bf16 GEMM was called directly on a CPU without AVX512-BF16 (check bf16_gemm_direct)");
  tiled_gemm(m, n, k, sgemm512::MR, sgemm512::NR, true, [&](std::int64_t r0, std::int64_t r1, std::int64_t c0, std::int64_t c1) {
    bf16gemm512::gemm_block(ta, tb, r0, r1, c0, c1, k, alpha, A, lda, B, ldb, beta, C, ldc);
  });
}

// The scalar type gemm takes for alpha and beta with T operands.
template <class T>
using gemm_scalar_t = std::conditional_t<std::is_same_v<T, BFloat16>, float, T>;

inline void set_blas_threads(int n) { openblas_set_num_threads(n); }

}  // namespace frugal::cpu
