#pragma once
#include <cstddef>
#include <cstdint>
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

// "12.3 MiB": for people, not for parsing.
inline std::string format_bytes(std::size_t n) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = double(n);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  if (u == 0)
    std::snprintf(buf, sizeof buf, "%zu B", n);
  else
    std::snprintf(buf, sizeof buf, "%.1f %s", v, units[u]);
  return buf;
}

// Parses "64MiB", "1.5GiB", "512k", "1000000" (plain bytes). Units are binary.
inline std::size_t parse_bytes(const std::string& s) {
  std::size_t pos = 0;
  double v = 0;
  try {
    v = std::stod(s, &pos);
  } catch (...) {
    fail("cannot read '", s, "' as a byte size: write e.g. 64MiB, 1.5GiB or 1048576");
  }
  std::string unit = s.substr(pos);
  for (auto& c : unit) c = char(std::tolower(static_cast<unsigned char>(c)));
  double mult = 1;
  if (unit.empty() || unit == "b")
    mult = 1;
  else if (unit == "k" || unit == "kib" || unit == "kb")
    mult = 1024.0;
  else if (unit == "m" || unit == "mib" || unit == "mb")
    mult = 1024.0 * 1024;
  else if (unit == "g" || unit == "gib" || unit == "gb")
    mult = 1024.0 * 1024 * 1024;
  else
    fail("unknown byte unit '", s.substr(pos), "' in '", s, "': use B, KiB, MiB or GiB");
  if (v < 0) fail("byte size '", s, "' is negative");
  return std::size_t(v * mult);
}

}  // namespace frugal
