#pragma once
// Bulk conversions between f32 and the 16-bit storage types, bitwise equal
// to core/half.hpp's scalar ones (the test compares them on every 16-bit
// pattern and on the rounding boundaries of f32 inputs, in every
// instruction set) but written as branch-free integer selects, which GCC
// vectorises, compiled for x86-64, AVX2 and AVX-512 and chosen at run
// time. Measured on this machine (Zen 5, one thread, L1-resident blocks of
// 256, per element), the fixed-block SSE2 loops these replaced -> AVX2 and
// AVX-512: bf16->f32 0.20 -> 0.04 ns, f32->bf16 0.42 -> 0.11 ns, f16->f32
// 0.53 -> 0.23 ns, f32->f16 1.04 -> 0.41 ns (plain x86-64: 0.05, 0.28,
// 0.40, 0.89); a partial block no longer falls back to the scalar
// conversions.
#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "../../ops/cast.hpp"
#include "isa.hpp"
#include "parallel.hpp"

#include "abi.hpp"

namespace frugal::cpu::inline FRUGAL_KERNEL_ABI {

namespace bulk {

// Elements per block, the unit the kernels convert in (a few KiB of f32 on
// the stack).
inline constexpr int kBlock = 256;

// One element each, as bit patterns; the block loops below (and
// round_block) are these in a loop.
inline std::uint32_t bf16_bits_to_f32(std::uint32_t h) { return h << 16; }

// Round to nearest even on the top 16 bits; a NaN stays a quiet NaN.
inline std::uint32_t f32_bits_to_bf16(std::uint32_t u) {
  std::uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  std::uint32_t quiet = (u >> 16) | 0x40u;
  return (u & 0x7fffffffu) > 0x7f800000u ? quiet : rounded;
}

// Selects are written as masks: GCC does not if-convert these loops at -O2.
inline std::uint32_t f16_bits_to_f32(std::uint32_t h) {
  std::uint32_t sign = (h & 0x8000u) << 16, em = h & 0x7fffu;
  // Normal: rebias the exponent by 127 - 15 (112 << 23); infinity and
  // NaN: by twice that, to 255.
  std::uint32_t special = 0u - std::uint32_t(em >= 0x7c00u);
  std::uint32_t wide = (em << 13) + 0x38000000u + (special & 0x38000000u);
  // Subnormal and zero: mantissa * 2^-24, exact in f32.
  std::uint32_t sub = std::bit_cast<std::uint32_t>(float(std::int32_t(em)) * 5.9604644775390625e-8f);
  std::uint32_t tiny = 0u - std::uint32_t(em < 0x0400u);
  return sign | (sub & tiny) | (wide & ~tiny);
}

// Round to nearest even, with subnormals; overflow to infinity; NaN quiet.
inline std::uint32_t f32_bits_to_f16(std::uint32_t u) {
  std::uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  std::uint32_t normal = (a + 0xc8000fffu + ((a >> 13) & 1u)) >> 13;  // rebias (-112 << 23), round
  // Below the smallest normal: adding 0.5 makes the f32 adder round at
  // the subnormal's last place.
  std::uint32_t sub = std::bit_cast<std::uint32_t>(std::bit_cast<float>(a) + 0.5f) - 0x3f000000u;
  std::uint32_t tiny = 0u - std::uint32_t(a < 0x38800000u);
  std::uint32_t r = (sub & tiny) | (normal & ~tiny);
  std::uint32_t big = 0u - std::uint32_t(a >= 0x477ff000u);  // rounds to >= 65520: infinity
  r = (0x7c00u & big) | (r & ~big);
  std::uint32_t nan = 0u - std::uint32_t(a > 0x7f800000u);
  r = (0x7e00u & nan) | (r & ~nan);
  return sign | r;
}

// One value each way. The 16-bit types hold their bits as a member, so
// nothing is read as another type, and these loops vectorise as they are.
inline float widen_one(BFloat16 h) { return std::bit_cast<float>(bf16_bits_to_f32(h.bits)); }
inline float widen_one(Half h) { return std::bit_cast<float>(f16_bits_to_f32(h.bits)); }
template <class S>
inline S narrow_one(float f) {
  S r;
  const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  if constexpr (std::is_same_v<S, BFloat16>) r.bits = std::uint16_t(f32_bits_to_bf16(u));
  else r.bits = std::uint16_t(f32_bits_to_f16(u));
  return r;
}

template <class From, class To>
[[gnu::always_inline]] inline void convert_loop(const From* __restrict x, To* __restrict y, std::int64_t n) {
  if constexpr (std::is_same_v<To, float>)
    for (std::int64_t i = 0; i < n; ++i) y[i] = widen_one(x[i]);
  else
    for (std::int64_t i = 0; i < n; ++i) y[i] = narrow_one<To>(x[i]);
}
// x[i] = f32(S(x[i])) in place: what storing to S and reading back gives,
// without the round trip through memory.
template <class S>
[[gnu::always_inline]] inline void round_loop(float* __restrict x, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) x[i] = widen_one(narrow_one<S>(x[i]));
}

// y[0, n) = x[0, n) between f32 and bf16/f16, and the rounding in place,
// compiled for the widest instruction set the CPU runs (run_widest): every
// 16-bit tensor a kernel reads or writes passes through these, and at
// x86-64's width they cost as much as the arithmetic they feed (bf16 steps
// of the ResNet ran slower than f32 ones). Integer operations only: the
// same bits everywhere.
template <class From, class To>
void convert_span(const From* x, To* y, std::int64_t n) {
  run_widest([&] { convert_loop(x, y, n); });
}
template <class S>
void round_span(float* x, std::int64_t n) {
  run_widest([&] { round_loop<S>(x, n); });
}

}  // namespace bulk

// One value read into the compute type C (a 16-bit value widened exactly),
// and one value of C rounded once to the storage type S: math::convert's
// results, with the 16-bit conversions branch-free (bulk::widen_one,
// narrow_one), so the loops of kernels that widen while they pack and round
// as they store vectorise, in registers.
template <class C, class S>
inline C widen_as(S v) {
  if constexpr (std::is_same_v<C, float> && (std::is_same_v<S, BFloat16> || std::is_same_v<S, Half>))
    return bulk::widen_one(v);
  else
    return math::convert<C>(v);
}
template <class S, class C>
inline S narrow_as(C v) {
  if constexpr (std::is_same_v<C, float> && (std::is_same_v<S, BFloat16> || std::is_same_v<S, Half>))
    return bulk::narrow_one<S>(v);
  else
    return math::convert<S>(v);
}

// y[0, n) = x[0, n) converted, rounding as math::convert: f32 <-> bf16/f16
// through the vectorised span loops above, anything else element by
// element. (Callers work a bulk::kBlock at a time.)
template <class From, class To>
void convert_block(const From* __restrict x, To* __restrict y, int n) {
  constexpr bool to_f32 = std::is_same_v<To, float> && (std::is_same_v<From, BFloat16> || std::is_same_v<From, Half>);
  constexpr bool from_f32 = std::is_same_v<From, float> && (std::is_same_v<To, BFloat16> || std::is_same_v<To, Half>);
  if constexpr (to_f32 || from_f32) {
    bulk::convert_span(x, y, n);
  } else {
    for (int i = 0; i < n; ++i) y[i] = math::convert<To>(x[i]);
  }
}

// x[0, n) = what storing each to S and reading it back as f32 gives:
// math::convert<float>(math::convert<S>(x[i])), bit for bit.
template <class S>
void round_block(float* x, int n) {
  static_assert(std::is_same_v<S, BFloat16> || std::is_same_v<S, Half>);
  bulk::round_span<S>(x, n);
}

// y[i] = x[i] converted, i in [b, e), block by block.
template <class From, class To>
void convert_range(const From* x, To* y, std::int64_t b, std::int64_t e) {
  for (std::int64_t i = b; i < e; i += bulk::kBlock)
    convert_block(x + i, y + i, int(std::min<std::int64_t>(bulk::kBlock, e - i)));
}

// y[i] = x[i] converted for i in [0, n), in parallel.
template <class From, class To>
void convert_into(const From* x, To* y, std::int64_t n) {
  parallel_for(n, 1, [&](std::int64_t b, std::int64_t e) { convert_range(x, y, b, e); });
}

}  // namespace frugal::cpu
