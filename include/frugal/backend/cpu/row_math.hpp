#pragma once
// Reductions over one contiguous row that the compiler can vectorise without
// -ffast-math: kLanes independent partial sums, combined in a fixed order at
// the end. The order of additions depends only on the row length, so the
// result is the same bits wherever the row sits and however many threads run.
#include <cstdint>

#include "abi.hpp"

namespace frugal::cpu::inline FRUGAL_KERNEL_ABI {

inline constexpr int kLanes = 8;

// Sum over j of f(j), for j in [0, n).
template <class T, class F>
inline T lane_sum(std::int64_t n, F&& f) {
  T acc[kLanes] = {};
  std::int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] += f(j + l);
  for (int l = 0; j + l < n; ++l) acc[l] += f(j + l);
  T s = 0;
  for (int l = 0; l < kLanes; ++l) s += acc[l];
  return s;
}

template <class T>
inline T row_sum(const T* __restrict x, std::int64_t n) {
  return lane_sum<T>(n, [x](std::int64_t j) { return x[j]; });
}

template <class T>
inline T row_dot(const T* __restrict x, const T* __restrict y, std::int64_t n) {
  return lane_sum<T>(n, [x, y](std::int64_t j) { return x[j] * y[j]; });
}

template <class T>
inline T row_max(const T* __restrict x, std::int64_t n) {
  T acc[kLanes];
  for (int l = 0; l < kLanes; ++l) acc[l] = x[0];
  std::int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] = acc[l] > x[j + l] ? acc[l] : x[j + l];
  for (int l = 0; j + l < n; ++l) acc[l] = acc[l] > x[j + l] ? acc[l] : x[j + l];
  T m = acc[0];
  for (int l = 1; l < kLanes; ++l) m = m > acc[l] ? m : acc[l];
  return m;
}

}  // namespace frugal::cpu
