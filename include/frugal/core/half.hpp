#pragma once
#include <cstdint>
#include <cstring>

#include "hd.hpp"

namespace frugal {

namespace detail {
FRUGAL_HD std::uint32_t float_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
FRUGAL_HD float bits_float(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
}  // namespace detail

// BFloat16 storage: the top 16 bits of an IEEE float, rounded to nearest even.
struct BFloat16 {
  std::uint16_t bits = 0;
  BFloat16() = default;
  FRUGAL_HD explicit BFloat16(float f) {
    std::uint32_t u = detail::float_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) {  // NaN stays a (quiet) NaN
      bits = std::uint16_t((u >> 16) | 0x40u);
      return;
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    bits = std::uint16_t(u >> 16);
  }
  FRUGAL_HD explicit operator float() const { return detail::bits_float(std::uint32_t(bits) << 16); }
};

// IEEE 754 binary16 storage, round to nearest even, with subnormals.
struct Half {
  std::uint16_t bits = 0;
  Half() = default;
  FRUGAL_HD explicit Half(float f) {
    std::uint32_t x = detail::float_bits(f);
    std::uint32_t sign = (x >> 16) & 0x8000u;
    std::uint32_t absx = x & 0x7fffffffu;
    if (absx > 0x7f800000u) {  // NaN
      bits = std::uint16_t(sign | 0x7e00u);
      return;
    }
    if (absx >= 0x477ff000u) {  // rounds to >= 65520: infinity
      bits = std::uint16_t(sign | 0x7c00u);
      return;
    }
    if (absx < 0x38800000u) {  // below the smallest normal half: subnormal or zero
      // Adding 0.5 scales the value so the float's rounding does the half's.
      float v = detail::bits_float(absx) + 0.5f;
      bits = std::uint16_t(sign | (detail::float_bits(v) - 0x3f000000u));
      return;
    }
    std::uint32_t mant_odd = (absx >> 13) & 1u;
    absx += 0xc8000fffu + mant_odd;  // rebias exponent (-112 << 23) and round
    bits = std::uint16_t(sign | (absx >> 13));
  }
  FRUGAL_HD explicit operator float() const {
    std::uint32_t sign = std::uint32_t(bits & 0x8000u) << 16;
    std::uint32_t exp = (bits >> 10) & 0x1fu;
    std::uint32_t mant = bits & 0x3ffu;
    if (exp == 0) {  // zero or subnormal: mant * 2^-24
      float v = float(mant) * 5.9604644775390625e-8f;
      return detail::bits_float(detail::float_bits(v) | sign);
    }
    if (exp == 31) return detail::bits_float(sign | 0x7f800000u | (mant << 13));
    return detail::bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
  }
};

}  // namespace frugal
