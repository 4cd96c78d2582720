// What cutting a GEMM into frugal's fixed tiles (backend/cpu/blas.hpp) costs
// against one OpenBLAS call, both on one thread: every tile repacks its
// operands. The shapes are the gpt and mlp workloads' products.
//
//   cmake --build build -j2 --target gemm_tiles && build/bench/gemm_tiles [--repeats 10]
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <frugal/backend/cpu/blas.hpp>

int main(int argc, char** argv) {
  int repeats = 10;
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]) == "--repeats" && i + 1 < argc) repeats = std::max(1, std::atoi(argv[++i]));
  struct Shape {
    bool ta, tb;
    long m, n, k;
  };
  const Shape shapes[] = {{false, true, 1024, 768, 256},  {false, true, 1024, 256, 1024}, {false, false, 1024, 256, 768},
                          {true, false, 768, 256, 1024},  {false, true, 256, 1024, 784},  {false, true, 256, 1024, 1024},
                          {true, false, 1024, 1024, 256}};
  omp_set_num_threads(1);  // one thread both ways: the cost of the tiles alone
  std::printf("| product (ta tb m n k) | tiles | one call (us) | tiled (us) | ratio |\n|---|---|---|---|---|\n");
  for (const Shape& s : shapes) {
    std::vector<float> A(std::size_t(s.m * s.k), 0.5f), B(std::size_t(s.k * s.n), 0.25f), C(std::size_t(s.m * s.n));
    const long lda = s.ta ? s.m : s.k, ldb = s.tb ? s.k : s.n;
    const auto t = frugal::cpu::gemm_tiles(s.m, s.n, s.k);
    double whole = 1e30, tiled = 1e30;
    for (int r = 0; r < repeats; ++r) {
      using clock = std::chrono::steady_clock;
      auto t0 = clock::now();
      cblas_sgemm(CblasRowMajor, s.ta ? CblasTrans : CblasNoTrans, s.tb ? CblasTrans : CblasNoTrans, int(s.m), int(s.n),
                  int(s.k), 1.f, A.data(), int(lda), B.data(), int(ldb), 0.f, C.data(), int(s.n));
      auto t1 = clock::now();
      frugal::cpu::gemm(s.ta, s.tb, s.m, s.n, s.k, 1.f, A.data(), lda, B.data(), ldb, 0.f, C.data(), s.n);
      auto t2 = clock::now();
      whole = std::min(whole, std::chrono::duration<double, std::micro>(t1 - t0).count());
      tiled = std::min(tiled, std::chrono::duration<double, std::micro>(t2 - t1).count());
    }
    std::printf("| %d %d %ld %ld %ld | %ldx%ld | %.0f | %.0f | %.2f |\n", s.ta, s.tb, s.m, s.n, s.k, t.rows, t.cols, whole,
                tiled, tiled / whole);
  }
}
