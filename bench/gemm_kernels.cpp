// frugal's float GEMM engines on the workloads' products (backend/cpu/blas.hpp):
// one OpenBLAS call with OpenBLAS's own threads (what the peer runs), frugal's
// fixed tiles of single-threaded OpenBLAS calls on its team, and frugal's
// AVX-512 kernel (sgemm_avx512.hpp) on the same tiles; and, where the CPU
// has AVX512-BF16, the same product in bf16 on frugal's bf16 kernel
// (bf16_gemm_avx512.hpp). Each is the median of --repeats runs; GFLOP/s =
// 2mnk / time. The error column is the f32 AVX-512 kernel's largest error
// against a float64 product, in units of 2^-24 * sum_p |a_ip b_pj| (the
// test's bound is k + 2 of them).
//
// The "AVX2 engine" column is frugal's engine for CPUs without AVX-512
// (sgemm_avx2_tile.hpp: the AVX-512 engine's walk and packed layout, AVX2
// packers, 6x16 register sub-tiles), on tiles that follow the team's size.
// "same bits" says whether its C equals the AVX-512 engine's bit for bit.
//
//   cmake --build build -j2 --target gemm_kernels && build/bench/gemm_kernels [--repeats 15] [--threads 2]
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <frugal/backend/cpu/blas.hpp>
#include <frugal/backend/cpu/sgemm_avx2_tile.hpp>

namespace {

template <class F>
double median_us(int repeats, F&& f) {
  std::vector<double> t;
  f();  // warm the caches and the team
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  namespace cpu = frugal::cpu;
  int repeats = 15, threads = 2;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--repeats" && i + 1 < argc) repeats = std::max(1, std::atoi(argv[++i]));
    else if (a == "--threads" && i + 1 < argc) threads = std::max(1, std::atoi(argv[++i]));
    else {
      std::fprintf(stderr, "usage: gemm_kernels [--repeats N] [--threads N]\n");
      return 2;
    }
  }
  if (!cpu::sgemm512::available()) {
    std::printf("this CPU (or build) has no AVX-512F: only OpenBLAS runs here\n");
    return 0;
  }
  std::printf("OpenBLAS core: %s; engine a float gemm takes here: %s\n", openblas_get_corename(),
              cpu::sgemm_engine_name(cpu::sgemm_engine(1024)));
  struct Shape {
    const char* what;
    bool ta, tb;
    long m, n, k;
  };
  const Shape shapes[] = {
      {"mlp fc1 forward", false, true, 256, 1024, 784},   {"mlp fc2 forward", false, true, 256, 1024, 1024},
      {"mlp fc2 data grad", false, false, 256, 1024, 1024}, {"mlp fc2 weight grad", true, false, 1024, 1024, 256},
      {"gpt qkv forward", false, true, 1024, 768, 256},   {"gpt mlp-out forward", false, true, 1024, 256, 1024},
      {"gpt mlp-in data grad", false, false, 1024, 256, 1024}, {"gpt mlp-in weight grad", true, false, 1024, 256, 1024},
      {"gpt lm-head forward", false, true, 1024, 512, 256}, {"odd edges", false, false, 301, 203, 157},
  };
  std::printf("\n%d threads, medians of %d runs\n\n", threads, repeats);
  std::printf(
      "| product | ta tb m n k | OpenBLAS, one call (us) | frugal tiles + OpenBLAS (us) | frugal AVX-512 (us) | "
      "AVX-512 GFLOP/s | OpenBLAS call / AVX-512 | largest error (units) | bf16 kernel (us) | bf16 GFLOP/s | "
      "AVX2 engine (us) | OpenBLAS call / AVX2 engine | same bits as AVX-512 |\n"
      "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n");
  for (const Shape& s : shapes) {
    std::vector<float> A(std::size_t(s.m * s.k)), B(std::size_t(s.k * s.n)), C(std::size_t(s.m * s.n));
    for (std::size_t i = 0; i < A.size(); ++i) A[i] = float(std::sin(double(i) * 0.37));
    for (std::size_t i = 0; i < B.size(); ++i) B[i] = float(std::cos(double(i) * 0.11));
    const long lda = s.ta ? s.m : s.k, ldb = s.tb ? s.k : s.n;
    omp_set_num_threads(threads);
    openblas_set_num_threads(threads);
    const double whole = median_us(repeats, [&] {
      cblas_sgemm(CblasRowMajor, s.ta ? CblasTrans : CblasNoTrans, s.tb ? CblasTrans : CblasNoTrans, int(s.m), int(s.n),
                  int(s.k), 1.f, A.data(), int(lda), B.data(), int(ldb), 0.f, C.data(), int(s.n));
    });
    openblas_set_num_threads(1);  // in an OpenMP build this also sets the ICV to 1
    omp_set_num_threads(threads);  // which frugal's team reads
    const double tiled = median_us(repeats, [&] {
      cpu::blas_tiled_gemm(s.ta, s.tb, s.m, s.n, s.k, 1.f, A.data(), lda, B.data(), ldb, 0.f, C.data(), s.n,
                           [](auto... a) { cblas_sgemm(CblasRowMajor, a...); });
    });
    auto own = [&] {
      cpu::tiled_gemm(s.m, s.n, s.k, cpu::sgemm512::MR, cpu::sgemm512::NR, true, [&](long r0, long r1, long c0, long c1) {
        cpu::sgemm512::gemm_block(s.ta, s.tb, r0, r1, c0, c1, s.k, 1.f, A.data(), lda, B.data(), ldb, 0.f, C.data(),
                                  s.n);
      });
    };
    const double fast = median_us(repeats, own);
    own();
    double worst = 0;
    for (long i = 0; i < s.m; i += std::max(1L, s.m / 37))
      for (long j = 0; j < s.n; j += std::max(1L, s.n / 41)) {
        double exact = 0, mag = 0;
        for (long p = 0; p < s.k; ++p) {
          const double a = s.ta ? A[std::size_t(p * lda + i)] : A[std::size_t(i * lda + p)];
          const double b = s.tb ? B[std::size_t(j * ldb + p)] : B[std::size_t(p * ldb + j)];
          exact += a * b;
          mag += std::fabs(a * b);
        }
        worst = std::max(worst, std::fabs(double(C[std::size_t(i * s.n + j)]) - exact) / (mag * std::ldexp(1.0, -24)));
      }
    double bf16_us = 0;
    if (cpu::bf16gemm512::available()) {
      std::vector<frugal::BFloat16> A16(A.size()), B16(B.size()), C16(C.size());
      for (std::size_t i = 0; i < A.size(); ++i) A16[i] = frugal::BFloat16(A[i]);
      for (std::size_t i = 0; i < B.size(); ++i) B16[i] = frugal::BFloat16(B[i]);
      bf16_us = median_us(repeats, [&] {
        cpu::gemm(s.ta, s.tb, s.m, s.n, s.k, 1.f, A16.data(), lda, B16.data(), ldb, 0.f, C16.data(), s.n);
      });
    }
    double avx2_us = 0;
    bool avx2_same = false;
    if (cpu::sgemm_avx2::available()) {
      auto avx2 = [&] {
        cpu::gemm_with(cpu::SgemmEngine::avx2, s.ta, s.tb, s.m, s.n, s.k, 1.f, A.data(), lda, B.data(), ldb, 0.f,
                       C.data(), s.n);
      };
      avx2_us = median_us(repeats, avx2);
      own();
      const std::vector<float> want = C;
      avx2();
      avx2_same = std::memcmp(want.data(), C.data(), C.size() * sizeof(float)) == 0;
    }
    const double flop = 2.0 * double(s.m) * double(s.n) * double(s.k);
    std::printf("| %s | %d %d %ld %ld %ld | %.0f | %.0f | %.0f | %.0f | %.2f | %.1f | ", s.what, s.ta, s.tb, s.m, s.n,
                s.k, whole, tiled, fast, 1e-3 * flop / fast, whole / fast, worst);
    if (bf16_us > 0) std::printf("%.0f | %.0f | ", bf16_us, 1e-3 * flop / bf16_us);
    else std::printf("- | - | ");
    if (avx2_us > 0) std::printf("%.0f | %.2f | %s |\n", avx2_us, whole / avx2_us, avx2_same ? "yes" : "NO");
    else std::printf("- | - | - |\n");
  }
}
