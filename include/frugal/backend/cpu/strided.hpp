#pragma once
// Walking an output shape while reading inputs through broadcast strides.
// Fixed-size arrays: kernels must not allocate while a step runs.
#include <array>

#include "../../core/shape.hpp"

#include "abi.hpp"

namespace frugal::cpu::inline FRUGAL_KERNEL_ABI {

inline constexpr int kMaxRank = 8;

struct Strides {
  std::array<std::int64_t, kMaxRank> v{};
  std::int64_t operator[](int i) const { return v[std::size_t(i)]; }
  std::int64_t& operator[](int i) { return v[std::size_t(i)]; }
};

inline void check_rank(const Shape& s, const char* op) {
  if (s.rank() > kMaxRank) fail("cpu: op ", op, " supports up to ", kMaxRank, " dimensions, got ", s.str());
}

inline Strides strides_of(const Shape& s) {
  Strides st;
  std::int64_t acc = 1;
  for (int i = s.rank() - 1; i >= 0; --i) {
    st[i] = acc;
    acc *= s[i];
  }
  return st;
}

// Element strides of `in` read as if broadcast to `out` (0 on stretched axes).
inline Strides broadcast_strides(const Shape& in, const Shape& out) {
  check_rank(out, "broadcast");
  Strides s, st = strides_of(in);
  int lead = out.rank() - in.rank();
  for (int i = 0; i < in.rank(); ++i)
    if (in[i] != 1) s[i + lead] = st[i];
  return s;
}

// Offset of row `row` (an index over all axes but the last) under `strides`.
inline std::int64_t row_offset(std::int64_t row, const Shape& out, const Strides& strides) {
  std::int64_t off = 0;
  for (int d = out.rank() - 2; d >= 0; --d) {
    std::int64_t n = out[d];
    off += (row % n) * strides[d];
    row /= n;
  }
  return off;
}

}  // namespace frugal::cpu
