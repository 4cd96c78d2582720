// Fused causal attention against the composed form (matmul, scale, additive
// mask, softmax, matmul) at the peer GPT's shape: forward + backward of
// sum(attention(q, k, v) * r), timed as whole compiled steps.
//
//   g++ -std=c++20 -O3 -fopenmp -Iinclude -I/usr/include/x86_64-linux-gnu/openblas-openmp
//       bench/attention_kernels.cpp /usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.so -o /tmp/attention_kernels
//   /tmp/attention_kernels [B H T hd threads steps [fused|composed]]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <frugal/frugal.hpp>
#include <string>
#include <vector>

using namespace frugal;

namespace {

Tensor random(Shape s, std::uint64_t seed) {
  Tensor t(std::move(s));
  Rng r(seed);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = float(r.uniform(-1, 1));
  return t;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::int64_t B = 8, H = 4, T = 128, hd = 64;
  int threads = 2, steps = 50;
  const char* only = argc == 8 ? argv[7] : "";
  if (argc >= 7) {
    B = std::atoll(argv[1]), H = std::atoll(argv[2]), T = std::atoll(argv[3]), hd = std::atoll(argv[4]);
    threads = std::atoi(argv[5]), steps = std::atoi(argv[6]);
  }
  Tensor q = random({B, H, T, hd}, 1), k = random({B, H, T, hd}, 2), v = random({B, H, T, hd}, 3),
         r = random({B, H, T, hd}, 4), mask({T, T});
  for (std::int64_t i = 0; i < T; ++i)
    for (std::int64_t j = 0; j < T; ++j) mask.data<float>()[i * T + j] = j <= i ? 0.0f : -1e30f;

  auto make = [&](bool fused) {
    return compile_gradients(
        [&] {
          Var qv = persistent_var(q, ValueKind::parameter, "q"), kv = persistent_var(k, ValueKind::parameter, "k"),
              vv = persistent_var(v, ValueKind::parameter, "v");
          Var o;
          if (fused) {
            o = causal_attention(qv, kv, vv);
          } else {
            Var s = matmul(qv, kv, false, true) * (1.0 / std::sqrt(double(hd))) +
                    persistent_var(mask, ValueKind::state, "mask");
            o = matmul(softmax(s), vv);
          }
          return sum(o * persistent_var(r, ValueKind::state, "r"));
        },
        {}, {q, k, v}, {}, {.threads = threads});
  };
  std::printf("causal attention fwd+bwd, B=%lld H=%lld T=%lld hd=%lld, f32, %d threads, median of %d steps\n",
              (long long)B, (long long)H, (long long)T, (long long)hd, threads, steps);
  for (bool fused : {true, false}) {
    if (*only && (std::string(only) == "fused") != fused) continue;
    Step s = make(fused);
    for (int i = 0; i < 3; ++i) s.run();
    std::vector<double> ms;
    for (int i = 0; i < steps; ++i) {
      auto t0 = std::chrono::steady_clock::now();
      s.run();
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    std::printf("  %-9s %8.3f ms/step (min %.3f)  arena %.2f MiB\n", fused ? "fused" : "composed", median(ms),
                *std::min_element(ms.begin(), ms.end()), double(s.arena_bytes()) / (1 << 20));
  }
}
