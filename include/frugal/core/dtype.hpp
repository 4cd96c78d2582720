#pragma once
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "half.hpp"

namespace frugal {

// u8 is raw bytes: kernels' planned scratch space (Op::workspace_bytes).
enum class DType : std::uint8_t { f32, f64, bf16, f16, i32, i64, u8 };

constexpr std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::f64: return 8;
    case DType::bf16: return 2;
    case DType::f16: return 2;
    case DType::i32: return 4;
    case DType::i64: return 8;
    case DType::u8: return 1;
  }
  return 0;
}

constexpr const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::u8: return "u8";
  }
  return "?";
}

constexpr bool is_floating(DType t) { return t == DType::f32 || t == DType::f64 || t == DType::bf16 || t == DType::f16; }
constexpr bool is_integer(DType t) { return t == DType::i32 || t == DType::i64; }
// The 16-bit storage types: kernels read them into f32, compute in f32 and
// round once on store (core/precision.hpp).
constexpr bool is_half(DType t) { return t == DType::bf16 || t == DType::f16; }
// The dtype a kernel computes a tensor of dtype t in: f32 for bf16/f16, else
// t itself. Statistics an op saves for its backward (layer norm's mean and
// rstd, attention's logsumexp) are stored in it, so a 16-bit tensor's
// backward reads them unrounded.
constexpr DType compute_dtype(DType t) { return is_half(t) ? DType::f32 : t; }

template <class T>
constexpr DType dtype_of() {
  if constexpr (std::is_same_v<T, float>) return DType::f32;
  else if constexpr (std::is_same_v<T, double>) return DType::f64;
  else if constexpr (std::is_same_v<T, BFloat16>) return DType::bf16;
  else if constexpr (std::is_same_v<T, Half>) return DType::f16;
  else if constexpr (std::is_same_v<T, std::int32_t>) return DType::i32;
  else if constexpr (std::is_same_v<T, std::int64_t>) return DType::i64;
  else if constexpr (std::is_same_v<T, std::uint8_t>) return DType::u8;
  else static_assert(sizeof(T) == 0, "frugal has no dtype for this C++ type");
}

}  // namespace frugal
