#pragma once
// A tensor's bytes, for the suite's bit-for-bit comparisons.
#include <cstring>
#include <vector>

#include <frugal/core/tensor.hpp>

inline std::vector<char> bytes_of(const frugal::Tensor& t) {
  std::vector<char> b(t.nbytes());
  std::memcpy(b.data(), t.raw(), t.nbytes());
  return b;
}
