// An outside project on the installed package, as a user builds one: it
// links frugal::frugal and compiles the kernels with frugal_add_kernels.
// It is configured with FRUGAL_WITH_AVX512=OFF, so it is also what an
// aarch64 or AVX2-only machine builds: convolutions run on the BLAS engine,
// asking for AVX-512 is a clear error, and results match float64.
#include <cmath>
#include <frugal/frugal.hpp>
#include <iostream>

using namespace frugal;

namespace {

int failures = 0;
void check(bool ok, const char* what) {
  std::cout << (ok ? "ok: " : "FAILED: ") << what << "\n";
  failures += !ok;
}

// A tiny model learns a separable task.
void trains() {
  nn::Linear fc(4, 2);
  optim::SGD opt(fc.parameters(), {.lr = 0.5, .momentum = 0.5});
  Step step = compile([&](Var x, Var y) { return cross_entropy(fc(x), y); },
                      {input<float>({8, 4}), input<std::int32_t>({8})}, opt);
  Tensor x({8, 4}), y({8}, DType::i32);
  for (int i = 0; i < 8; ++i) {
    y.data<std::int32_t>()[i] = i % 2;
    for (int j = 0; j < 4; ++j) x.data<float>()[i * 4 + j] = (i % 2 ? 1.0f : -1.0f) * float(j + 1) / 4;
  }
  float first = step.run(x, y), last = first;
  for (int s = 0; s < 30; ++s) last = step.run(x, y);
  std::cout << "consumer: loss " << first << " -> " << last << "\n";
  check(last < first / 4, "a linear model trains through the installed headers");
}

void no_avx512() {
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
  check(worst <= 1, "conv2d on the BLAS engine matches float64 within 27 ulp of sum |x w|");
}

}  // namespace

int main() {
  trains();
  no_avx512();
  std::cout << failures << " failed\n";
  return failures ? 1 : 0;
}
