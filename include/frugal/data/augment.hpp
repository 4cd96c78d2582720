#pragma once
// The standard CIFAR-style augmentation: pad by `pad` pixels of zeros, take a
// random crop of the original size, and flip left-right with probability 1/2.
// Randomness comes from Philox keyed by (seed, draw, item), so a resumed run
// augments every image exactly as the uninterrupted run did.
#include <cstdint>

#include "../core/rng.hpp"

namespace frugal::data {

// dst, src: one image [channels, h, w] (row-major f32).
inline void random_crop_flip(float* dst, const float* src, std::int64_t channels, std::int64_t h, std::int64_t w,
                             std::int64_t pad, std::uint64_t seed, std::uint64_t draw, std::uint64_t item) {
  auto bits = Philox(seed ^ 0xA06D'0000'0000'0000ull)(draw, item);
  const std::int64_t dy = std::int64_t(bits.v[0] % std::uint32_t(2 * pad + 1)) - pad;
  const std::int64_t dx = std::int64_t(bits.v[1] % std::uint32_t(2 * pad + 1)) - pad;
  const bool flip = bits.v[2] & 1u;
  for (std::int64_t c = 0; c < channels; ++c)
    for (std::int64_t y = 0; y < h; ++y)
      for (std::int64_t x = 0; x < w; ++x) {
        const std::int64_t sy = y + dy, sx0 = flip ? w - 1 - x : x, sx = sx0 + dx;
        dst[(c * h + y) * w + x] = sy >= 0 && sy < h && sx >= 0 && sx < w ? src[(c * h + sy) * w + sx] : 0.0f;
      }
}

}  // namespace frugal::data
