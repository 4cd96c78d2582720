#pragma once
// A learnable toy task the step tests train on.
#include <frugal/frugal.hpp>

namespace toy {

// x [n, d] standard normal; the class is the index of the largest of the
// first `classes` features.
inline void make_batch(frugal::Tensor& x, frugal::Tensor& y, std::uint64_t seed, std::int64_t classes = 4) {
  frugal::Rng r(seed);
  std::int64_t n = x.shape()[0], d = x.shape()[1];
  for (std::int64_t i = 0; i < n; ++i) {
    int best = 0;
    for (std::int64_t j = 0; j < d; ++j) {
      float v = float(r.normal());
      x.data<float>()[i * d + j] = v;
      if (j < classes && v > x.data<float>()[i * d + best]) best = int(j);
    }
    y.data<std::int32_t>()[i] = best;
  }
}

}  // namespace toy
