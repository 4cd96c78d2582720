#pragma once
// What every CUDA kernel file shares: the launch shape of elementwise
// kernels, the dtype dispatch (bf16/f16 are read into f32, computed in f32
// and rounded once on store, as on the CPU), and the op description errors
// name.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <utility>
#include <string>

#include "../../core/half.hpp"
#include "../../core/precision.hpp"
#include "../../runtime/backend.hpp"
#include "check.hpp"
#include "cuda_backend.hpp"

namespace frugal::cuda {

inline constexpr int kThreads = 256;

// Blocks for n elements, one element per thread in a grid-stride loop;
// capped so the grid stays far inside the hardware limit.
inline unsigned blocks_for(std::int64_t n) {
  return unsigned(std::clamp<std::int64_t>((n + kThreads - 1) / kThreads, 1, 65535 * 8));
}

// "linear f32 [64,784] [256,784] [256] -> [64,256]": what a failing op names.
inline std::string describe(const Op& op, const KernelArgs& a) {
  std::string s = op.name() + " " + (a.in.empty() ? std::string() : dtype_name(a.in[0].dtype));
  for (auto& t : a.in) s += " " + t.shape->str();
  s += " ->";
  for (auto& t : a.out) s += " " + t.shape->str();
  return s;
}

// The dtype dispatch (core/precision.hpp), failing with "cuda: ...".
template <class Fn>
void dispatch_precision(DType t, const char* op, Fn&& fn) {
  dispatch_precision_on("cuda", t, op, std::forward<Fn>(fn));
}
// Only f32 and f64 (optimizer updates, losses' seeds).
template <class Fn>
void dispatch_float(DType t, const char* op, Fn&& fn) {
  switch (t) {
    case DType::f32: fn(float{}); return;
    case DType::f64: fn(double{}); return;
    default: fail("cuda: op ", op, " has no kernel for dtype ", dtype_name(t), " (f32 and f64 are supported)");
  }
}

// Storage <-> compute conversions on the device (bf16/f16 round to nearest
// even through core/half.hpp's FRUGAL_HD code, the CPU's own).
template <class C, class S>
__device__ __forceinline__ C load(const S& s) {
  return C(s);
}
template <class S, class C>
__device__ __forceinline__ S store(C c) {
  return S(c);
}
}  // namespace frugal::cuda
