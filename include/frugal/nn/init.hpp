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

// bf16/f16: each draw rounded once to the dtype (the same draws as f32).
inline void uniform_(Tensor& t, double lo, double hi) {
  if (t.is_meta()) return;  // shapes only (MetaScope): nothing to draw into
  auto fill = [&](auto* p) {
    using T = std::remove_pointer_t<decltype(p)>;
    for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = math::convert<T>(init_rng().uniform(lo, hi));
  };
  switch (t.dtype()) {
    case DType::f64: return fill(t.data<double>());
    case DType::bf16: return fill(t.data<BFloat16>());
    case DType::f16: return fill(t.data<Half>());
    default: return fill(t.data<float>());
  }
}

// PyTorch's Linear default: kaiming_uniform(a=sqrt(5)) on the weight, which is
// U(-1/sqrt(fan_in), 1/sqrt(fan_in)), and the same bound for the bias.
inline void linear_default_init(Tensor& weight, Tensor* bias, std::int64_t fan_in) {
  double bound = fan_in > 0 ? 1.0 / std::sqrt(double(fan_in)) : 0.0;
  uniform_(weight, -bound, bound);
  if (bias) uniform_(*bias, -bound, bound);
}

}  // namespace frugal::nn
