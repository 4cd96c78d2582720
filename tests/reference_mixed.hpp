#pragma once
// Float64 reference for mixed precision: rounding a double to a binary
// floating format, written from the IEEE 754 definition with frexp/ldexp and
// nearbyint (the default rounding mode rounds ties to even). Nothing here
// calls frugal, so the tests of frugal's bit-twiddling conversions
// (core/half.hpp, ops/cast.hpp) compare against an independent derivation.
#include <cfenv>
#include <cmath>
#include <limits>

#include "reference.hpp"
#include "reference_elementwise.hpp"  // abs

namespace ref {

// A binary format: p significant bits (the implicit one included), the
// exponent of its smallest normal number, and its largest finite value.
struct Format {
  int p;
  int emin;
  double max_finite;
};
inline constexpr Format kBf16{8, -126, 0x1.fep127};  // (2 - 2^-7) 2^127
inline constexpr Format kF16{11, -14, 65504.0};      // (2 - 2^-10) 2^15
inline constexpr Format kF32{24, -126, 0x1.fffffep127};

// x rounded to nearest (ties to even) in `f`, with gradual underflow, and
// infinity for what rounds above the largest finite value.
inline double round_to(double x, Format f) {
  if (std::isnan(x) || std::isinf(x) || x == 0) return x;
  require(std::fegetround() == FE_TONEAREST, "the reference needs the default rounding mode");
  int e = 0;
  std::frexp(x, &e);                          // |x| = m 2^e, m in [0.5, 1): the leading bit has weight 2^(e-1)
  int lead = std::max(e - 1, f.emin);         // below the normal range the quantum stops shrinking
  double quantum = std::ldexp(1.0, lead - (f.p - 1));
  double y = std::nearbyint(x / quantum) * quantum;  // both scalings by powers of two are exact
  if (std::abs(y) > f.max_finite) return std::copysign(std::numeric_limits<double>::infinity(), x);
  return y;
}

// The unit roundoff of a format: a rounded value is within u |x| of x
// (for x in the normal range).
inline double unit_roundoff(Format f) { return std::ldexp(1.0, -f.p); }

inline Array round_to(const Array& a, Format f) {
  Array r = a;
  for (auto& v : r.v) v = round_to(v, f);
  return r;
}

}  // namespace ref
