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

// Same shape, same dtype, same bytes.
inline bool same_bytes(const frugal::Tensor& a, const frugal::Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}
// The same bytes, whatever the shapes (a flat shard against its tensor).
inline bool same_raw_bytes(const frugal::Tensor& a, const frugal::Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}
