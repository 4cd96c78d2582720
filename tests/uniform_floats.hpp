#pragma once
// n floats drawn uniformly from [-1, 1) by a seeded mt19937: test operands
// that are the same on every machine.
#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

namespace test_support {

inline std::vector<float> uniform_floats(std::size_t n, std::uint32_t seed) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> v(n);
  for (auto& x : v) x = u(g);
  return v;
}

}  // namespace test_support
