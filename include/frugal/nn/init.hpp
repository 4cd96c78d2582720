#pragma once
// Parameter initialisation. Draws come from one seeded stream per thread, so
// the same seed and construction order give the same weights.
#include <cmath>
#include <type_traits>

#include "../core/rng.hpp"
#include "../core/tensor.hpp"
#include "../ops/cast.hpp"

namespace frugal::nn {

inline Rng& init_rng() {
  thread_local Rng r(0x5eed);
  return r;
}

// Reseeds parameter initialisation (like torch::manual_seed for weights).
inline void manual_seed(std::uint64_t seed) { init_rng() = Rng(seed); }

// Writes draw() (a double) into every element of t, in order: f64 keeps
// it, f32 rounds it to float, bf16/f16 round that float once more. So a
// model built in 16 bits from the same seed starts from the f32 model's
// weights, rounded (the draws are the same, one per element).
template <class Draw>
void fill_drawn_(Tensor& t, Draw&& draw) {
  if (t.is_meta()) return;  // shapes only (MetaScope): nothing to draw into
  auto fill = [&](auto* p, auto round) {
    for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = round(draw());
  };
  switch (t.dtype()) {
    case DType::f64: fill(t.data<double>(), [](double x) { return x; }); return;
    case DType::f32: fill(t.data<float>(), [](double x) { return float(x); }); return;
    case DType::bf16: fill(t.data<BFloat16>(), [](double x) { return BFloat16(float(x)); }); return;
    case DType::f16: fill(t.data<Half>(), [](double x) { return Half(float(x)); }); return;
    default:
      fail("nn: cannot initialise a ", dtype_name(t.dtype()), " tensor ", t.shape().str(),
           " (parameters are f32, f64, bf16 or f16)");
  }
}

inline void uniform_(Tensor& t, double lo, double hi) {
  if (t.is_meta()) return;  // shapes only (MetaScope): nothing to draw into
  fill_drawn_(t, [&] { return init_rng().uniform(lo, hi); });
}

// Every element v (exact in every floating dtype for v = 0 or 1).
inline void constant_(Tensor& t, double v) {
  if (t.is_meta()) return;
  fill_drawn_(t, [v] { return v; });
}

// PyTorch's Linear default: kaiming_uniform(a=sqrt(5)) on the weight, which is
// U(-1/sqrt(fan_in), 1/sqrt(fan_in)), and the same bound for the bias.
inline void linear_default_init(Tensor& weight, Tensor* bias, std::int64_t fan_in) {
  double bound = fan_in > 0 ? 1.0 / std::sqrt(double(fan_in)) : 0.0;
  uniform_(weight, -bound, bound);
  if (bias) uniform_(*bias, -bound, bound);
}

}  // namespace frugal::nn
