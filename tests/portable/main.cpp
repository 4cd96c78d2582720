// With the AVX-512 engine compiled out, convolutions run on the BLAS
// engine, asking for AVX-512 is a clear error, and a convolutional step
// still computes what a float64 reference computes.
#include <cmath>
#include <cstdio>
#include <frugal/frugal.hpp>

using namespace frugal;

int main() {
  int failures = 0;
  auto check = [&](bool ok, const char* what) {
    std::printf("%s: %s\n", ok ? "ok" : "FAILED", what);
    failures += !ok;
  };
  try {
    make_backend("cpu", {.conv_engine = "avx512"});
    check(false, "asking for the compiled-out AVX-512 engine is an error");
  } catch (const Error& e) {
    check(std::string(e.what()).find("FRUGAL_WITH_AVX512=OFF") != std::string::npos,
          "asking for the compiled-out AVX-512 engine is an error naming the build option");
  }
  // y = conv2d(x, w, pad 1): every output against a direct f64 sum.
  const std::int64_t N = 2, C = 3, H = 7, K = 4;
  Tensor x({N, C, H, H}), w({K, C, 3, 3});
  Rng r(7);
  for (std::int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = float(r.normal());
  for (std::int64_t i = 0; i < w.numel(); ++i) w.data<float>()[i] = float(r.normal());
  Step s = compile_inference(
      [&] {
        return conv2d(persistent_var(x, ValueKind::parameter, "x"), persistent_var(w, ValueKind::parameter, "w"),
                      std::nullopt, {.padding = 1});
      },
      {});
  s.run();
  const float* y = s.output().data<float>();
  double worst = 0;
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t k = 0; k < K; ++k)
      for (std::int64_t i = 0; i < H; ++i)
        for (std::int64_t j = 0; j < H; ++j) {
          double want = 0, scale = 0;
          for (std::int64_t c = 0; c < C; ++c)
            for (std::int64_t a = 0; a < 3; ++a)
              for (std::int64_t b = 0; b < 3; ++b) {
                std::int64_t ii = i + a - 1, jj = j + b - 1;
                if (ii < 0 || jj < 0 || ii >= H || jj >= H) continue;
                double t = double(x.data<float>()[((n * C + c) * H + ii) * H + jj]) *
                           double(w.data<float>()[((k * C + c) * 3 + a) * 3 + b]);
                want += t;
                scale += std::abs(t);
              }
          double got = y[((n * K + k) * H + i) * H + j];
          // 27 f32 products and sums: within 27 * 2^-23 of the sum of |terms|.
          worst = std::max(worst, std::abs(got - want) / (27 * 0x1p-23 * scale + 1e-30));
        }
  check(worst <= 1, "conv2d on the BLAS engine matches the f64 reference within 27 ulp of sum |x w|");
  std::printf("%d failed\n", failures);
  return failures ? 1 : 0;
}
