#pragma once
#include <cstddef>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>

#include "error.hpp"

namespace frugal {

inline namespace literals {
constexpr std::size_t operator""_KiB(unsigned long long v) { return std::size_t(v) << 10; }
constexpr std::size_t operator""_MiB(unsigned long long v) { return std::size_t(v) << 20; }
constexpr std::size_t operator""_GiB(unsigned long long v) { return std::size_t(v) << 30; }
}  // namespace literals

// Every arena offset and every tensor allocation is aligned to this, so a
// kernel takes the same SIMD path wherever its operand lands.
inline constexpr std::size_t kAlignment = 256;

constexpr std::size_t align_up(std::size_t n, std::size_t a = kAlignment) { return (n + a - 1) / a * a; }

namespace detail {
// 128 bits hold every product below exactly. __extension__: a GCC/Clang
// type, which -Wpedantic would otherwise flag in every file including this.
__extension__ typedef unsigned __int128 u128;

inline constexpr const char* kByteUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};

// A decimal number as written: digits, optionally '.' and more digits. Only
// that: no sign, exponent, hex, "inf" or "nan", which std::stod would take.
struct Decimal {
  u128 whole = 0;     // the integer part
  std::uint64_t fraction = 0;      // the digits after the point, as an integer
  std::uint64_t fraction_scale = 1;  // 10^(number of those digits)
};

// Reads a Decimal at s[pos...], moving pos past it; false if none is there
// or it has more digits than any byte size.
inline bool read_decimal(const std::string& s, std::size_t& pos, Decimal& d) {
  int whole_digits = 0, fraction_digits = 0;
  while (pos < s.size() && s[pos] >= '0' && s[pos] <= '9') {
    if (++whole_digits > 20) return false;  // more than 2^64 bytes in any unit
    d.whole = d.whole * 10 + unsigned(s[pos++] - '0');
  }
  if (pos < s.size() && s[pos] == '.') {
    ++pos;
    while (pos < s.size() && s[pos] >= '0' && s[pos] <= '9') {
      if (++fraction_digits > 18) return false;  // finer than a byte in any unit
      d.fraction = d.fraction * 10 + std::uint64_t(s[pos++] - '0');
      d.fraction_scale *= 10;
    }
  }
  return whole_digits + fraction_digits > 0;
}

// d * numerator / denominator, rounded to the nearest integer, in 128 bits
// (every operand fits: whole < 10^20, numerator <= 2^60 * 100).
inline u128 scaled(const Decimal& d, u128 numerator, u128 denominator) {
  const u128 scale = d.fraction_scale;
  // (whole + fraction / scale) * numerator / denominator
  const u128 num = (d.whole * scale + d.fraction) * numerator;
  const u128 den = scale * denominator;
  return (num + den / 2) / den;
}

[[noreturn]] inline void bad_bytes(const std::string& s, const char* why, const char* forms) {
  fail("cannot read '", s, "' as a byte size: ", why, "; write ", forms);
}
}  // namespace detail

// "12.3 MiB": one decimal in the largest binary unit that keeps the number
// under 1024 as printed. parse_bytes reads it back (to within the printed
// precision: half a tenth of the unit).
inline std::string format_bytes(std::size_t n) {
  char buf[40];
  if (n < 1024) {
    std::snprintf(buf, sizeof buf, "%zu B", n);
    return buf;
  }
  int u = 0;
  long double v = (long double)n;
  // Up a unit while the number, rounded to one decimal, would reach 1024
  // ("1024.0 KiB" is 1.0 MiB).
  while (u < 6 && v >= 1023.95L) {
    v /= 1024.0L;
    ++u;
  }
  // Rounding up near 2^64 (16.0 EiB) would print a size parse_bytes cannot
  // hold: round down there instead.
  const long double tenths = std::round(v * 10);
  const long double shown = tenths / 10 * std::pow(1024.0L, u);
  const long double printed = shown > (long double)std::numeric_limits<std::size_t>::max() ? std::floor(v * 10) / 10
                                                                                             : tenths / 10;
  std::snprintf(buf, sizeof buf, "%.1Lf %s", printed, detail::kByteUnits[u]);
  return buf;
}

// Parses a byte size: a decimal number and an optional unit, with or
// without a space between: "64MiB", "1.5 GiB", "512k", "1048576", and
// everything format_bytes writes. Units are binary and case-insensitive:
// B, K/KiB/KB, M/MiB/MB, G/GiB/GB, T/TiB/TB, P/PiB/PB, E/EiB/EB (KB = KiB,
// as in many tools' memory options). The result is rounded to the nearest
// byte. Refused with an Error naming the text: anything else (signs,
// exponents, hex, "inf", "nan", trailing words), sizes over 2^64 - 1, and
// sizes that round to 0 bytes (a 0 budget would mean "unlimited").
// A percentage ("40%") needs a reference size: the overload below.
inline std::size_t parse_bytes(const std::string& s) {
  const char* forms = "e.g. 64MiB, 1.5 GiB or 1048576";
  std::size_t pos = 0;
  detail::Decimal d;
  if (s.empty()) detail::bad_bytes(s, "it is empty", forms);
  if (!detail::read_decimal(s, pos, d)) detail::bad_bytes(s, "it does not start with a plain decimal number", forms);
  if (pos < s.size() && s[pos] == ' ') ++pos;
  std::string unit = s.substr(pos);
  for (auto& c : unit) c = char(std::tolower(static_cast<unsigned char>(c)));
  if (unit == "%")
    detail::bad_bytes(s, "a percentage needs a reference size, which this option does not have", forms);
  int power = -1;
  if (unit.empty() || unit == "b") power = 0;
  const char* letters = "kmgtpe";
  for (int i = 0; i < 6 && power < 0; ++i) {
    const std::string l(1, letters[i]);
    if (unit == l || unit == l + "ib" || unit == l + "b") power = i + 1;
  }
  if (power < 0)
    fail("cannot read '", s, "' as a byte size: unknown unit '", s.substr(pos),
         "'; use B, KiB, MiB, GiB, TiB, PiB or EiB, e.g. 64MiB or 1.5 GiB");
  const detail::u128 bytes = detail::scaled(d, detail::u128(1) << (10 * power), 1);
  if (bytes > std::numeric_limits<std::size_t>::max())
    detail::bad_bytes(s, "it is more than 2^64 - 1 bytes", forms);
  if (bytes == 0) detail::bad_bytes(s, "it rounds to 0 bytes", "at least 1 byte (leave the option out for no limit)");
  return std::size_t(bytes);
}

// As above, and also a percentage of `reference` ("40%", "12.5 %"), for
// options whose size can be relative to a known one (a budget as a share
// of the unconstrained step's bytes).
inline std::size_t parse_bytes(const std::string& s, std::size_t reference) {
  if (s.empty() || s.back() != '%') return parse_bytes(s);
  const char* forms = "a percentage such as 40% or 12.5%, or a size such as 64MiB";
  std::size_t pos = 0;
  detail::Decimal d;
  if (!detail::read_decimal(s, pos, d)) detail::bad_bytes(s, "it does not start with a plain decimal number", forms);
  if (pos < s.size() && s[pos] == ' ') ++pos;
  if (pos != s.size() - 1) detail::bad_bytes(s, "there is more than a number before the '%'", forms);
  const detail::u128 bytes = detail::scaled(d, reference, 100);
  if (bytes > std::numeric_limits<std::size_t>::max())
    detail::bad_bytes(s, "it is more than 2^64 - 1 bytes", forms);
  if (bytes == 0)
    fail("cannot read '", s, "' as a byte size: it is 0 bytes (", format_bytes(0), ") of ", format_bytes(reference),
         "; write a larger percentage");
  return std::size_t(bytes);
}

}  // namespace frugal
