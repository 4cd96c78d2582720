// The float GEMM engines (backend/cpu/blas.hpp, sgemm_avx512.hpp): each is
// checked against a float64 product on every transpose case, on edges that
// are not multiples of the register tile, with strides wider than the
// matrices, and with BLAS's alpha/beta rules; frugal's AVX-512 and AVX2
// engines also give the same bits however C is cut into tiles, and each
// other's.
#include <omp.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <frugal/backend/cpu/blas.hpp>
#include <frugal/backend/cpu/sgemm_avx2_tile.hpp>
#include <frugal/backend/cpu/small_gemm_avx512.hpp>
#include <limits>
#include <random>
#include <vector>

#include "cpu_isa_scope.hpp"
#include "uniform_floats.hpp"

using namespace frugal;

namespace {

std::vector<cpu::SgemmEngine> gemm_engines() {
  std::vector<cpu::SgemmEngine> e{cpu::SgemmEngine::openblas};
  if (cpu::sgemm512::available()) e.push_back(cpu::SgemmEngine::avx512);
  if (cpu::sgemm_avx2::available()) e.push_back(cpu::SgemmEngine::avx2);
  return e;
}

const char* engine_label(cpu::SgemmEngine e) { return cpu::sgemm_engine_name(e); }

// frugal's own engines where this CPU runs them, each by its gemm_block.
struct OwnEngine {
  const char* name;
  void (*block)(bool, bool, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t, float, const float*,
                std::int64_t, const float*, std::int64_t, float, float*, std::int64_t);
};
std::vector<OwnEngine> own_engines() {
  std::vector<OwnEngine> e;
  if (cpu::sgemm512::available()) e.push_back({"avx512", &cpu::sgemm512::gemm_block});
  if (cpu::sgemm_avx2::available()) e.push_back({"avx2", &cpu::sgemm_avx2::gemm_block});
  return e;
}

struct GemmCase {
  bool ta, tb;
  std::int64_t m, n, k;
  std::int64_t pad;  // extra elements at the end of every row of A, B and C
};

// How far each element of C lies from the float64 product, in units of the
// bound (k + 2) * 2^-24 * (|alpha| sum_p |a b| + |beta c|): the k roundings of
// a chain of k products (fused or not) and two for alpha and beta. Elements
// of C's row padding must be untouched.
double worst_against_float64(const GemmCase& c, float alpha, float beta, const std::vector<float>& A,
                             const std::vector<float>& B, const std::vector<float>& C0, const std::vector<float>& C,
                             std::int64_t lda, std::int64_t ldb, std::int64_t ldc) {
  double worst = 0;
  for (std::int64_t i = 0; i < c.m; ++i) {
    for (std::int64_t j = 0; j < c.n; ++j) {
      double s = 0, mag = 0;
      for (std::int64_t p = 0; p < c.k; ++p) {
        const double a = A[std::size_t(c.ta ? p * lda + i : i * lda + p)];
        const double b = B[std::size_t(c.tb ? j * ldb + p : p * ldb + j)];
        s += a * b;
        mag += std::abs(a * b);
      }
      const double c0 = beta == 0.f ? 0.0 : double(C0[std::size_t(i * ldc + j)]);
      const double want = double(alpha) * s + double(beta) * c0;
      const double bound = (double(c.k) + 2) * 0x1p-24 * (std::abs(alpha) * mag + std::abs(beta * c0)) + 1e-300;
      const float got = C[std::size_t(i * ldc + j)];
      if (!std::isfinite(got)) return std::numeric_limits<double>::infinity();
      worst = std::max(worst, std::abs(double(got) - want) / bound);
    }
    for (std::int64_t j = c.n; j < ldc; ++j)
      if (std::memcmp(&C[std::size_t(i * ldc + j)], &C0[std::size_t(i * ldc + j)], 4) != 0)
        return std::numeric_limits<double>::infinity();
  }
  return worst;
}

}  // namespace

TEST_CASE("gemm: every engine within float rounding of a float64 product, on every transpose and edge",
          "[blas][gemm]") {
  // Sizes around the AVX-512 kernel's 12 x 32 register tile and its 128-column
  // packing, and products large enough to be cut into several tiles.
  const GemmCase cases[] = {
      {false, false, 1, 1, 1, 0},    {false, false, 11, 31, 7, 3},    {false, true, 13, 33, 64, 1},
      {true, false, 25, 65, 129, 5}, {true, true, 12, 32, 300, 0},    {false, true, 37, 130, 17, 2},
      {true, true, 5, 257, 33, 7},   {false, false, 300, 203, 157, 0}, {true, false, 517, 96, 260, 4},
      {false, true, 64, 700, 96, 0}, {true, true, 190, 161, 75, 1},    {false, false, 3, 1000, 500, 0},
  };
  const float alphas[] = {1.f, -0.75f}, betas[] = {0.f, 1.f, 0.5f};
  for (const cpu::SgemmEngine e : gemm_engines()) {
    for (const GemmCase& c : cases) {
      const std::int64_t lda = (c.ta ? c.m : c.k) + c.pad, ldb = (c.tb ? c.k : c.n) + c.pad, ldc = c.n + c.pad;
      const auto A = test_support::uniform_floats(std::size_t((c.ta ? c.k : c.m) * lda), 1);
      const auto B = test_support::uniform_floats(std::size_t((c.tb ? c.n : c.k) * ldb), 2);
      auto C0 = test_support::uniform_floats(std::size_t(c.m * ldc), 3);
      for (const float alpha : alphas)
        for (const float beta : betas) {
          INFO(engine_label(e) << ": ta " << c.ta << " tb " << c.tb << " m " << c.m << " n " << c.n << " k " << c.k
                               << " pad " << c.pad << " alpha " << alpha << " beta " << beta);
          std::vector<float> start = C0;
          // With beta 0, C is not read: NaN there must not reach the result.
          if (beta == 0.f)
            for (std::int64_t i = 0; i < c.m; ++i)
              for (std::int64_t j = 0; j < c.n; ++j) start[std::size_t(i * ldc + j)] = std::nanf("");
          std::vector<float> C = start;
          cpu::gemm_with(e, c.ta, c.tb, c.m, c.n, c.k, alpha, A.data(), lda, B.data(), ldb, beta, C.data(), ldc);
          CHECK(worst_against_float64(c, alpha, beta, A, B, start, C, lda, ldb, ldc) <= 1.0);
        }
    }
  }
}

TEST_CASE("gemm: a product of depth 0 is beta * C", "[blas][gemm]") {
  for (const cpu::SgemmEngine e : gemm_engines()) {
    INFO(engine_label(e));
    std::vector<float> A(4, 1.f), B(4, 1.f), C = {1.f, 2.f, 3.f, 4.f};
    cpu::gemm_with(e, false, false, 2, 2, 0, 1.f, A.data(), 1, B.data(), 2, 0.5f, C.data(), 2);
    CHECK(C == std::vector<float>{0.5f, 1.f, 1.5f, 2.f});
  }
}

// And the AVX2 engine gives the AVX-512 engine's bits, over several packed
// chunks of B (k = 203: 640 columns a chunk).
TEST_CASE("gemm: frugal's engines give the same bits however C is cut, and each other's", "[blas][gemm]") {
  if (own_engines().empty()) {
    WARN("skipped: this CPU (or build) has neither AVX-512F nor AVX2 with FMA");
    return;
  }
  const std::int64_t m = 157, n = 1301, k = 203;
  const auto A = test_support::uniform_floats(std::size_t(m * k), 4);
  const auto B = test_support::uniform_floats(std::size_t(k * n), 5);
  for (const bool ta : {false, true})
    for (const bool tb : {false, true}) {
      const std::int64_t lda = ta ? m : k, ldb = tb ? k : n;
      std::vector<float> first;
      for (const OwnEngine& e : own_engines()) {
        INFO(e.name << " ta " << ta << " tb " << tb);
        std::vector<float> whole(std::size_t(m * n), 0.f), cut(std::size_t(m * n), 0.f);
        e.block(ta, tb, 0, m, 0, n, k, 1.f, A.data(), lda, B.data(), ldb, 0.f, whole.data(), n);
        // Blocks whose edges fall inside the register tile and the packed columns.
        const std::int64_t rows[] = {0, 5, 17, 18, 100, m}, cols[] = {0, 1, 45, 160, 161, 700, n};
        for (int i = 0; i + 1 < 6; ++i)
          for (int j = 0; j + 1 < 7; ++j)
            e.block(ta, tb, rows[i], rows[i + 1], cols[j], cols[j + 1], k, 1.f, A.data(), lda, B.data(), ldb, 0.f,
                    cut.data(), n);
        CHECK(std::memcmp(whole.data(), cut.data(), whole.size() * 4) == 0);
        if (first.empty()) first = whole;
        else CHECK(std::memcmp(whole.data(), first.data(), whole.size() * 4) == 0);
      }
    }
}

// Each element is one chain of fused multiply-adds over p in order, from
// zero, then alpha * sum (+ beta * C): the property that lets C be cut
// anywhere, and that any blocking of the depth must keep. std::fma, one
// rounding each, is that chain in scalar code. Depths around 256 and
// several times it, where a blocked kernel would cut.
TEST_CASE("gemm: frugal's engines compute each element as one FMA chain over the depth, however deep",
          "[blas][gemm]") {
  if (own_engines().empty()) {
    WARN("skipped: this CPU (or build) has neither AVX-512F nor AVX2 with FMA");
    return;
  }
  const std::int64_t m = 29, n = 70;
  for (const std::int64_t k : {1, 255, 256, 257, 600, 1025}) {
    const auto A = test_support::uniform_floats(std::size_t(m * k), 11);
    const auto B = test_support::uniform_floats(std::size_t(k * n), 12);
    const auto C0 = test_support::uniform_floats(std::size_t(m * n), 13);
    for (const bool ta : {false, true})
      for (const bool tb : {false, true})
        for (const float alpha : {1.f, -0.75f})
          for (const float beta : {0.f, 0.5f}) {
            INFO("k " << k << " ta " << ta << " tb " << tb << " alpha " << alpha << " beta " << beta);
            const std::int64_t lda = ta ? m : k, ldb = tb ? k : n;
            std::vector<float> want(C0);
            for (std::int64_t i = 0; i < m; ++i)
              for (std::int64_t j = 0; j < n; ++j) {
                float sum = 0.f;
                for (std::int64_t p = 0; p < k; ++p)
                  sum = std::fma(A[std::size_t(ta ? p * lda + i : i * lda + p)],
                                 B[std::size_t(tb ? j * ldb + p : p * ldb + j)], sum);
                float& c = want[std::size_t(i * n + j)];
                const float scaled = alpha * sum, kept = beta * c;
                c = beta != 0.f ? scaled + kept : scaled;
              }
            for (const OwnEngine& e : own_engines()) {
              INFO(e.name);
              std::vector<float> got(C0);
              e.block(ta, tb, 0, m, 0, n, k, alpha, A.data(), lda, B.data(), ldb, beta, got.data(), n);
              CHECK(std::memcmp(want.data(), got.data(), want.size() * 4) == 0);
            }
          }
  }
}

// The unpacked kernel attention's tiles use (small_gemm_avx512.hpp) reads
// A through two strides and B by rows: within float rounding of a float64
// product, C's row padding untouched, NaN in C ignored with beta 0, and the
// packed kernel's bits element for element, since both run one FMA chain
// over p from zero and then alpha * sum + beta * C.
TEST_CASE("gemm: the unpacked small-product kernel gives the packed AVX-512 kernel's bits, plain or transposed A",
          "[blas][gemm]") {
  if (!cpu::small_gemm::available()) {
    WARN("skipped: this CPU (or build) has no AVX-512F");
    return;
  }
  const float alphas[] = {1.f, 0.125f}, betas[] = {0.f, 1.f};
  for (const std::int64_t m : {1, 5, 6, 7, 32, 65})
    for (const std::int64_t n : {1, 15, 16, 17, 64, 65, 130})
      for (const std::int64_t k : {0, 1, 17, 64})
        for (const bool ta : {false, true}) {
          const GemmCase c{ta, false, m, n, k, 3};
          const std::int64_t lda = (ta ? m : k) + c.pad, ldb = n + c.pad, ldc = n + c.pad;
          const auto A = test_support::uniform_floats(std::size_t((ta ? k : m) * lda) + 1, 6);
          const auto B = test_support::uniform_floats(std::size_t(k * ldb) + 1, 7);
          const auto C0 = test_support::uniform_floats(std::size_t(m * ldc), 8);
          for (const float alpha : alphas)
            for (const float beta : betas) {
              INFO("m " << m << " n " << n << " k " << k << " ta " << ta << " alpha " << alpha << " beta " << beta);
              std::vector<float> start = C0;
              if (beta == 0.f)
                for (std::int64_t i = 0; i < m; ++i)
                  for (std::int64_t j = 0; j < n; ++j) start[std::size_t(i * ldc + j)] = std::nanf("");
              std::vector<float> small = start, packed = start;
              cpu::small_gemm::gemm(m, n, k, alpha, A.data(), ta ? 1 : lda, ta ? lda : 1, B.data(), ldb, beta,
                                    small.data(), ldc);
              cpu::sgemm512::gemm_block(ta, false, 0, m, 0, n, k, alpha, A.data(), lda, B.data(), ldb, beta,
                                        packed.data(), ldc);
              CHECK(worst_against_float64(c, alpha, beta, A, B, start, small, lda, ldb, ldc) <= 1.0);
              CHECK(std::memcmp(small.data(), packed.data(), small.size() * 4) == 0);
            }
        }
}

TEST_CASE("gemm: the AVX-512 transpose attention uses moves every element, edges included", "[blas][gemm]") {
  if (!cpu::small_gemm::available()) {
    WARN("skipped: this CPU (or build) has no AVX-512F");
    return;
  }
  for (const std::int64_t rows : {1, 15, 16, 17, 40})
    for (const std::int64_t cols : {1, 15, 16, 33}) {
      INFO("rows " << rows << " cols " << cols);
      const std::int64_t ld = cols + 3;
      const auto x = test_support::uniform_floats(std::size_t(rows * ld), 9);
      std::vector<float> xt(std::size_t(rows * cols), -1.f);
      cpu::small_gemm::transpose(x.data(), ld, rows, cols, xt.data());
      bool same = true;
      for (std::int64_t j = 0; j < rows; ++j)
        for (std::int64_t c = 0; c < cols; ++c)
          same = same && xt[std::size_t(c * rows + j)] == x[std::size_t(j * ld + c)];
      CHECK(same);
    }
}

TEST_CASE("gemm: the engine a float product takes follows the CPU, the forced instruction set and the depth",
          "[blas][gemm]") {
  test_support::KeepCpuIsa keep;
  // Below AVX-512, frugal's AVX2 engine where the CPU has AVX2 and FMA (and
  // OpenBLAS is not asked for); OpenBLAS below that, and past the depth.
  cpu::forced_cpu_isa = int(cpu::CpuIsa::avx2);
  CHECK(cpu::sgemm_engine(256) == (cpu::sgemm_avx2::available() && !cpu::gemm_detail::openblas_forced()
                                       ? cpu::SgemmEngine::avx2
                                       : cpu::SgemmEngine::openblas));
  CHECK(cpu::sgemm_engine(cpu::sgemm512::kMaxDepth + 1) == cpu::SgemmEngine::openblas);
  cpu::forced_cpu_isa = int(cpu::CpuIsa::base);
  CHECK(cpu::sgemm_engine(256) == cpu::SgemmEngine::openblas);
  cpu::forced_cpu_isa = -1;
  CHECK(cpu::sgemm_engine(cpu::sgemm512::kMaxDepth + 1) == cpu::SgemmEngine::openblas);
  if (!cpu::sgemm512::available()) CHECK(cpu::sgemm_engine(256) == cpu::SgemmEngine::openblas);
  // Full-width AVX-512 takes frugal's engine whatever kernels OpenBLAS
  // chose (OPENBLAS_CORETYPE=SkylakeX must not move it); a Zen 4 keeps
  // OpenBLAS's.
  if (cpu::gemm_detail::sgemm_env().empty())
    CHECK(cpu::sgemm_engine(256) == (cpu::sgemm512::available() && !cpu::gemm_detail::avx512_half_width()
                                         ? cpu::SgemmEngine::avx512
                                         : cpu::SgemmEngine::openblas));
  // bf16 products: the bf16 kernel needs AVX512-BF16, so a cap at plain
  // AVX-512 sends them to f32 images.
  CHECK_FALSE(cpu::bf16_gemm_direct(cpu::sgemm512::kMaxDepth + 1));
  cpu::forced_cpu_isa = int(cpu::CpuIsa::avx512);
  CHECK_FALSE(cpu::bf16_gemm_direct(256));
  if (!cpu::bf16gemm512::available()) {
    cpu::forced_cpu_isa = -1;
    CHECK_FALSE(cpu::bf16_gemm_direct(256));
  }
}

namespace {

std::vector<BFloat16> to_bf16(const std::vector<float>& v) {
  std::vector<BFloat16> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = BFloat16(v[i]);
  return out;
}

}  // namespace

// The bf16 kernel (AVX512-BF16): exact products summed in f32, then one
// rounding to bf16, so within u16 |y| + (1 + u16) (k + 2) 2^-24 (|alpha|
// sum|a b| + |beta c|) of the float64 product, u16 = 2^-8 (bf16's unit
// roundoff). The inputs hold no subnormals (the instruction reads them as zero).
TEST_CASE("gemm: the bf16 kernel within one bf16 rounding of an f32-accurate product, on every transpose and edge",
          "[blas][gemm][bf16]") {
  if (!cpu::bf16gemm512::available()) {
    WARN("skipped: this CPU (or build) has no AVX512-BF16");
    return;
  }
  const GemmCase cases[] = {
      {false, false, 1, 1, 1, 0},    {false, false, 11, 31, 7, 3},    {false, true, 13, 33, 64, 1},
      {true, false, 25, 65, 129, 5}, {true, true, 12, 32, 300, 0},    {false, true, 37, 130, 17, 2},
      {true, true, 5, 257, 33, 7},   {false, false, 300, 203, 157, 0}, {true, false, 517, 96, 260, 4},
      {false, true, 64, 700, 96, 0}, {true, true, 190, 161, 75, 1},    {false, false, 3, 1000, 500, 0},
  };
  for (const GemmCase& c : cases)
    for (const float alpha : {1.f, -0.75f})
      for (const float beta : {0.f, 1.f, 0.5f}) {
        INFO("ta " << c.ta << " tb " << c.tb << " m " << c.m << " n " << c.n << " k " << c.k << " pad " << c.pad
                   << " alpha " << alpha << " beta " << beta);
        const std::int64_t lda = (c.ta ? c.m : c.k) + c.pad, ldb = (c.tb ? c.k : c.n) + c.pad, ldc = c.n + c.pad;
        const auto A = to_bf16(test_support::uniform_floats(std::size_t((c.ta ? c.k : c.m) * lda), 1));
        const auto B = to_bf16(test_support::uniform_floats(std::size_t((c.tb ? c.n : c.k) * ldb), 2));
        auto start = to_bf16(test_support::uniform_floats(std::size_t(c.m * ldc), 3));
        if (beta == 0.f)  // not read: NaN there must not reach the result
          for (std::int64_t i = 0; i < c.m; ++i)
            for (std::int64_t j = 0; j < c.n; ++j) start[std::size_t(i * ldc + j)] = BFloat16(std::nanf(""));
        auto C = start;
        cpu::gemm(c.ta, c.tb, c.m, c.n, c.k, alpha, A.data(), lda, B.data(), ldb, beta, C.data(), ldc);
        double worst = 0;
        bool padding_kept = true;
        for (std::int64_t i = 0; i < c.m; ++i) {
          for (std::int64_t j = 0; j < c.n; ++j) {
            double s = 0, mag = 0;
            for (std::int64_t p = 0; p < c.k; ++p) {
              const double a = float(A[std::size_t(c.ta ? p * lda + i : i * lda + p)]);
              const double b = float(B[std::size_t(c.tb ? j * ldb + p : p * ldb + j)]);
              s += a * b;
              mag += std::abs(a * b);
            }
            const double c0 = beta == 0.f ? 0.0 : double(float(start[std::size_t(i * ldc + j)]));
            const double want = double(alpha) * s + double(beta) * c0;
            const double bound = 0x1p-8 * std::abs(want) +
                                 (1 + 0x1p-8) * (double(c.k) + 2) * 0x1p-24 * (std::abs(alpha) * mag + std::abs(beta * c0)) +
                                 1e-300;
            const double got = float(C[std::size_t(i * ldc + j)]);
            worst = std::max(worst, std::isfinite(got) ? std::abs(got - want) / bound : 1e300);
          }
          for (std::int64_t j = c.n; j < ldc; ++j)
            padding_kept = padding_kept && C[std::size_t(i * ldc + j)].bits == start[std::size_t(i * ldc + j)].bits;
        }
        CHECK(worst <= 1.0);
        CHECK(padding_kept);
      }
}

TEST_CASE("gemm: the bf16 kernel rounds as BFloat16(float) does, and its bits do not depend on the tiling",
          "[blas][gemm][bf16]") {
  if (!cpu::bf16gemm512::available()) {
    WARN("skipped: this CPU (or build) has no AVX512-BF16");
    return;
  }
  // Depth 1: each result is one exact product, rounded once; ties and NaN
  // included (a product of two bf16 values has at most 16 significant bits).
  std::vector<float> a = test_support::uniform_floats(64, 7), b = test_support::uniform_floats(48, 8);
  a[3] = 1.0f + 0x1p-7f;  // (1 + 2^-7)(1 + 2^-8) = 1 + 3 * 2^-8 + 2^-15: rounds up
  b[5] = 1.0f + 0x1p-8f;  // (not representable in bf16: rounds to 1 on the way in)
  a[9] = std::nanf("");
  const auto A = to_bf16(a), B = to_bf16(b);
  std::vector<BFloat16> C(64 * 48);
  cpu::gemm(false, false, 64, 48, 1, 1.f, A.data(), 1, B.data(), 48, 0.f, C.data(), 48);
  bool same = true;
  for (int i = 0; i < 64; ++i)
    for (int j = 0; j < 48; ++j)
      same = same && C[std::size_t(i * 48 + j)].bits == BFloat16(float(A[std::size_t(i)]) * float(B[std::size_t(j)])).bits;
  CHECK(same);

  const std::int64_t m = 157, n = 301, k = 203;
  const auto X = to_bf16(test_support::uniform_floats(std::size_t(m * k), 4)), Y = to_bf16(test_support::uniform_floats(std::size_t(k * n), 5));
  for (const bool ta : {false, true})
    for (const bool tb : {false, true}) {
      INFO("ta " << ta << " tb " << tb);
      const std::int64_t lda = ta ? m : k, ldb = tb ? k : n;
      std::vector<BFloat16> whole(std::size_t(m * n)), cut(std::size_t(m * n));
      cpu::bf16gemm512::gemm_block(ta, tb, 0, m, 0, n, k, 1.f, X.data(), lda, Y.data(), ldb, 0.f, whole.data(), n);
      const std::int64_t rows[] = {0, 5, 17, 18, 100, m}, cols[] = {0, 1, 45, 160, 161, n};
      for (int i = 0; i + 1 < 6; ++i)
        for (int j = 0; j + 1 < 6; ++j)
          cpu::bf16gemm512::gemm_block(ta, tb, rows[i], rows[i + 1], cols[j], cols[j + 1], k, 1.f, X.data(), lda,
                                       Y.data(), ldb, 0.f, cut.data(), n);
      CHECK(std::memcmp(whole.data(), cut.data(), whole.size() * 2) == 0);
    }
}
