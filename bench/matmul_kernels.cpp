// Batched GEMM on the CPU backend: where does running the batch items in
// parallel (one single-threaded GEMM per item, OpenBLAS called inside an
// OpenMP region) beat one multi-threaded GEMM after another? And what does
// the bf16 path (convert to f32 in the workspace, sgemm, round on store)
// cost over f32?
//
// Standalone, no CMake (one line):
//   g++ -O3 -std=c++20 -fopenmp -Iinclude -I/usr/include/x86_64-linux-gnu/openblas-openmp
//       bench/matmul_kernels.cpp /usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.so -o /tmp/matmul_kernels
//   /tmp/matmul_kernels [threads=2]
// Prints one line per shape: time per call for the serial batch of
// multi-threaded GEMMs, the parallel batch of single-threaded GEMMs, what
// frugal's kernel picks, and frugal's bf16 path. Timings are the best of 15
// rounds, the strategies interleaved round by round, so load from other
// processes on a shared machine hits them alike.
#include <omp.h>
#include <array>
#include <chrono>
#include <functional>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <frugal/frugal.hpp>
#include "frugal/backend/cpu/matmul.hpp"  // the kernels themselves

using namespace frugal;

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// Best time per call of each fn over interleaved timed rounds, each round
// long enough to time.
template <std::size_t N>
std::array<double, N> best_seconds(const std::array<std::function<void()>, N>& fns, double flops) {
  int inner = std::max(1, int(1e8 / std::max(flops, 1.0)));
  for (auto& f : fns) f();  // warm up (OpenBLAS buffers, pages)
  std::array<double, N> best;
  best.fill(1e30);
  for (int r = 0; r < 15; ++r)
    for (std::size_t k = 0; k < N; ++k) {
      double t0 = now();
      for (int i = 0; i < inner; ++i) fns[k]();
      best[k] = std::min(best[k], (now() - t0) / inner);
    }
  return best;
}

struct Shape3 {
  std::int64_t batch, m, n, k;
  bool ta, tb;
  const char* what;
};

void run(const Shape3& s, int threads) {
  std::int64_t sa = s.m * s.k, sb = s.k * s.n, sc = s.m * s.n;
  std::vector<float> A(std::size_t(s.batch * sa)), B(std::size_t(s.batch * sb)), C(std::size_t(s.batch * sc));
  Rng r(1);
  for (auto& v : A) v = float(r.uniform(-1, 1));
  for (auto& v : B) v = float(r.uniform(-1, 1));
  std::int64_t lda = s.ta ? s.m : s.k, ldb = s.tb ? s.k : s.n;
  auto item = [&](std::int64_t i) {
    cpu::gemm(s.ta, s.tb, s.m, s.n, s.k, 1.0f, A.data() + i * sa, lda, B.data() + i * sb, ldb, 0.0f,
              C.data() + i * sc, s.n);
  };
  double flops = 2.0 * double(s.batch * s.m * s.n * s.k);
  ops::MatMul::Dims d{s.batch, s.m, s.k, s.n, true, true};
  // The bf16 path: convert both operands, f32 GEMM, round the product.
  std::vector<BFloat16> A16(A.size()), B16(B.size()), C16(C.size());
  for (std::size_t i = 0; i < A.size(); ++i) A16[i] = BFloat16(A[i]);
  for (std::size_t i = 0; i < B.size(); ++i) B16[i] = BFloat16(B[i]);
  std::vector<float> A32(A.size()), B32(B.size()), C32(C.size());
  auto t = best_seconds<4>(
      {[&] {
         for (std::int64_t i = 0; i < s.batch; ++i) item(i);
       },
       [&] {
#pragma omp parallel for schedule(static) num_threads(threads)
         for (std::int64_t i = 0; i < s.batch; ++i) item(i);
       },
       [&] { cpu::matmul_typed(d, s.ta, s.tb, A.data(), B.data(), C.data()); },
       [&] {
         cpu::convert_into(A16.data(), A32.data(), std::int64_t(A.size()));
         cpu::convert_into(B16.data(), B32.data(), std::int64_t(B.size()));
         cpu::matmul_typed(d, s.ta, s.tb, A32.data(), B32.data(), C32.data());
         cpu::convert_into(C32.data(), C16.data(), std::int64_t(C.size()));
       }},
      flops);
  double serial = t[0], split = t[1], frugal_f32 = t[2], frugal_bf16 = t[3];
  bool picks_split = cpu::split_batch(s.batch, s.m, s.n, s.k, threads);
  std::printf("%-34s %4lld x [%4lld,%4lld,%4lld]  item %8.2f MFLOP | serial MT %8.3f ms %6.1f GF/s | split ST %8.3f ms "
              "%6.1f GF/s | x%.2f | frugal f32 %8.3f ms (%s) | bf16 %8.3f ms (x%.2f of f32)\n",
              s.what, (long long)s.batch, (long long)s.m, (long long)s.n, (long long)s.k,
              2.0 * double(s.m * s.n * s.k) / 1e6, serial * 1e3, flops / serial / 1e9, split * 1e3,
              flops / split / 1e9, serial / split, frugal_f32 * 1e3, picks_split ? "split" : "serial",
              frugal_bf16 * 1e3, frugal_bf16 / frugal_f32);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  int threads = argc > 1 ? std::atoi(argv[1]) : 2;
  omp_set_num_threads(threads);
  cpu::set_blas_threads(threads);
  std::printf("threads %d (OpenMP and OpenBLAS)\n", threads);
  const Shape3 shapes[] = {
      {32, 128, 128, 64, false, true, "attention scores Q K^T (B*H=32)"},
      {32, 128, 64, 128, false, false, "attention output P V"},
      {32, 128, 64, 128, true, false, "backward dV = P^T dO"},
      {32, 64, 128, 128, true, false, "backward dK-like TN"},
      {8, 128, 128, 64, false, true, "scores, B*H=8"},
      {3, 128, 128, 64, false, true, "scores, odd batch 3"},
      {32, 32, 32, 32, false, false, "square 32"},
      {32, 64, 64, 64, false, false, "square 64"},
      {32, 96, 96, 96, false, false, "square 96"},
      {32, 128, 128, 128, false, false, "square 128"},
      {32, 192, 192, 192, false, false, "square 192"},
      {16, 256, 256, 256, false, false, "square 256"},
      {8, 384, 384, 384, false, false, "square 384"},
      {4, 512, 512, 512, false, false, "square 512"},
      {3, 256, 256, 256, false, false, "square 256, odd batch 3"},
      {3, 512, 512, 512, false, false, "square 512, odd batch 3"},
      {5, 384, 384, 384, false, false, "square 384, odd batch 5"},
  };
  for (auto& s : shapes) run(s, threads);
  // The crossover for the batch that splits worst over 2 threads: 3 items,
  // so one thread runs two. There the split wins only while one
  // multi-threaded GEMM is below 3/4 parallel efficiency.
  std::printf("crossover sweep, batch 3:\n");
  for (std::int64_t n : {64, 96, 128, 160, 192, 224, 256, 320, 384, 448, 512})
    run({3, n, n, n, false, false, "square, batch 3"}, threads);
}
