#pragma once
#include <cmath>
#include <cstdint>

#include "hd.hpp"

namespace frugal {

// Philox-4x32-10 (Salmon et al., SC'11): a counter-based generator. The same
// (key, counter) always gives the same numbers, on the CPU and the GPU, in any
// order — so a recomputed op replays exactly the randomness it first drew.
struct Philox {
  std::uint32_t key[2];
  FRUGAL_HD explicit Philox(std::uint64_t seed) : key{std::uint32_t(seed), std::uint32_t(seed >> 32)} {}

  struct Block {
    std::uint32_t v[4];
  };
  FRUGAL_HD Block operator()(std::uint64_t counter_hi, std::uint64_t counter_lo) const {
    std::uint32_t c[4] = {std::uint32_t(counter_lo), std::uint32_t(counter_lo >> 32), std::uint32_t(counter_hi),
                          std::uint32_t(counter_hi >> 32)};
    std::uint32_t k0 = key[0], k1 = key[1];
    for (int r = 0; r < 10; ++r) {
      std::uint64_t p0 = std::uint64_t(0xD2511F53u) * c[0];
      std::uint64_t p1 = std::uint64_t(0xCD9E8D57u) * c[2];
      std::uint32_t n0 = std::uint32_t(p1 >> 32) ^ c[1] ^ k0;
      std::uint32_t n2 = std::uint32_t(p0 >> 32) ^ c[3] ^ k1;
      c[0] = n0;
      c[1] = std::uint32_t(p1);
      c[2] = n2;
      c[3] = std::uint32_t(p0);
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    return {{c[0], c[1], c[2], c[3]}};
  }
};

// Uniform in [0, 1) with 24 bits, exactly representable as float.
FRUGAL_HD float uniform01(std::uint32_t bits) { return float(bits >> 8) * (1.0f / 16777216.0f); }

// A host-side stream over Philox for initialisation and data shuffling.
class Rng {
 public:
  explicit Rng(std::uint64_t seed, std::uint64_t stream = 0) : philox_(seed), stream_(stream) {}
  std::uint32_t next_u32() {
    if (used_ == 4) {
      block_ = philox_(stream_, counter_++);
      used_ = 0;
    }
    return block_.v[used_++];
  }
  // Uniform in [lo, hi).
  double uniform(double lo = 0.0, double hi = 1.0) {
    std::uint64_t bits = (std::uint64_t(next_u32()) << 21) ^ (next_u32() >> 11);  // 53 bits
    return lo + (hi - lo) * (double(bits) * (1.0 / 9007199254740992.0));
  }
  double normal() {
    double u1 = uniform(), u2 = uniform();
    if (u1 < 1e-300) u1 = 1e-300;
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
  std::uint64_t below(std::uint64_t n) { return std::uint64_t(uniform() * double(n)) % n; }

 private:
  Philox philox_;
  std::uint64_t stream_;
  std::uint64_t counter_ = 0;
  Philox::Block block_{};
  int used_ = 4;
};

}  // namespace frugal
