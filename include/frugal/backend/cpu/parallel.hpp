#pragma once
// OpenMP helpers with fixed, static work splits: the same thread count
// always gives the same partition, so results are bitwise reproducible.
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <utility>

#include "../../core/dtype.hpp"
#include "../../core/error.hpp"
#include "../../core/precision.hpp"
#include "../../ops/cast.hpp"

#include "abi.hpp"

namespace frugal::cpu::inline FRUGAL_KERNEL_ABI {

// Below this many elements a parallel region costs more than it saves.
inline constexpr std::int64_t kParallelGrain = 1 << 15;
inline constexpr int kMaxThreads = 256;

// fn(begin, end) over [0, n) split into equal contiguous chunks, one per thread.
template <class Fn>
void parallel_for(std::int64_t n, std::int64_t work_per_item, Fn&& fn) {
  if (n <= 0) return;
  if (n * std::max<std::int64_t>(work_per_item, 1) < kParallelGrain || omp_get_max_threads() == 1) {
    fn(std::int64_t(0), n);
    return;
  }
#pragma omp parallel
  {
    std::int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    std::int64_t b = n * t / nt, e = n * (t + 1) / nt;
    if (b < e) fn(b, e);
  }
}

// Sum over [0, n) of fn(begin, end)'s partial sums, combined in chunk order.
template <class Fn>
double parallel_sum(std::int64_t n, std::int64_t work_per_item, Fn&& fn) {
  if (n * std::max<std::int64_t>(work_per_item, 1) < kParallelGrain || omp_get_max_threads() == 1) return fn(0, n);
  double partial[kMaxThreads] = {};
  int used = 1;
#pragma omp parallel num_threads(std::min(omp_get_max_threads(), kMaxThreads))
  {
    std::int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    std::int64_t b = n * t / nt, e = n * (t + 1) / nt;
    partial[t] = b < e ? fn(b, e) : 0.0;
#pragma omp single
    used = int(nt);
  }
  double s = 0;
  for (int t = 0; t < used; ++t) s += partial[t];
  return s;
}

// Calls fn(T{}) with T = float or double for a floating dtype.
template <class Fn>
void dispatch_float(DType t, const char* op, Fn&& fn) {
  switch (t) {
    case DType::f32: fn(float{}); return;
    case DType::f64: fn(double{}); return;
    default: fail("cpu: op ", op, " has no kernel for dtype ", dtype_name(t), " (f32 and f64 are supported)");
  }
}

// The dtype dispatcher of kernels that have bf16/f16 paths
// (core/precision.hpp).
template <class Fn>
void dispatch_precision(DType t, const char* op, Fn&& fn) {
  dispatch_precision_on("cpu", t, op, std::forward<Fn>(fn));
}

// Calls fn(T{}) with the storage type of a floating dtype.
template <class Fn>
void dispatch_storage(DType t, const char* op, Fn&& fn) {
  dispatch_precision(t, op, [&](auto p) { fn(typename decltype(p)::Storage{}); });
}

// Calls fn(T{}) with an unsigned integer type of the dtype's size, for
// kernels that only move elements (any dtype of that size).
template <class Fn>
void dispatch_bits(DType t, const char* op, Fn&& fn) {
  switch (dtype_size(t)) {
    case 1: fn(std::uint8_t{}); return;
    case 2: fn(std::uint16_t{}); return;
    case 4: fn(std::uint32_t{}); return;
    case 8: fn(std::uint64_t{}); return;
    default: fail("cpu: op ", op, " cannot move elements of dtype ", dtype_name(t));
  }
}

}  // namespace frugal::cpu
