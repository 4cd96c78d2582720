#pragma once
// Parallel loops over fixed chunks (worker_team.hpp): the partition depends
// only on the sizes, so results are bitwise the same at any thread count.
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <utility>

#include "../../core/dtype.hpp"
#include "../../core/error.hpp"
#include "../../core/precision.hpp"
#include "../../ops/cast.hpp"

#include "abi.hpp"
#include "worker_team.hpp"

namespace frugal::cpu::inline FRUGAL_KERNEL_ABI {

// A chunk does at least this much work (elements, or the caller's unit):
// below it, handing the chunk to another thread costs more than it saves.
inline constexpr std::int64_t kParallelGrain = 1 << 15;
// At most this many chunks per region: enough to balance 16-32 threads and
// a descheduled one, few enough that claiming them costs nothing.
inline constexpr std::int64_t kMaxChunks = 64;

// The chunks n items of work_per_item each split into. Depends only on the
// sizes, never on the thread count.
inline std::int64_t chunk_count(std::int64_t n, std::int64_t work_per_item) {
  if (n <= 0) return 0;
  const double total = double(n) * double(std::max<std::int64_t>(work_per_item, 1));
  const double c = std::min(total / double(kParallelGrain), double(std::min(n, kMaxChunks)));
  return std::max<std::int64_t>(1, std::int64_t(c));
}

// Item range of chunk c of `chunks` over n items: equal contiguous shares.
struct Range {
  std::int64_t begin, end;
};
inline std::int64_t chunk_edge(std::int64_t n, std::int64_t c, std::int64_t chunks) {
  const std::int64_t e = n * c / chunks;
  // Chunks of at least kAlignItems items start on a multiple of it: 16
  // floats are one cache line, so a chunk's vector loop does not split
  // every 64-byte load and store across two lines (the AVX-512 optimizer
  // loops ran 1.3-1.7x slower than the AVX2 ones on unaligned chunks).
  constexpr std::int64_t kAlignItems = 16;
  if (c == 0 || c == chunks || n / chunks < 64 * kAlignItems) return e;
  return e / kAlignItems * kAlignItems;
}
inline Range chunk_range(std::int64_t n, std::int64_t c, std::int64_t chunks) {
  return {chunk_edge(n, c, chunks), chunk_edge(n, c + 1, chunks)};
}

// Calls fn(c) for every chunk c in [0, chunks) on the calling thread's team.
template <class Fn>
void run_chunks(std::int64_t chunks, Fn&& fn) {
  WorkerTeam::mine().run(chunks, team_threads(), fn);
}

// fn(begin, end) over [0, n) in fixed chunks.
template <class Fn>
void parallel_for(std::int64_t n, std::int64_t work_per_item, Fn&& fn) {
  const std::int64_t chunks = chunk_count(n, work_per_item);
  if (chunks == 0) return;
  if (chunks == 1) {
    fn(std::int64_t(0), n);
    return;
  }
  run_chunks(chunks, [&](std::int64_t c) {
    const Range r = chunk_range(n, c, chunks);
    if (r.begin < r.end) fn(r.begin, r.end);
  });
}

// Sum over [0, n) of fn(begin, end)'s partial sums, one per fixed chunk,
// added in chunk order.
template <class Fn>
double parallel_sum(std::int64_t n, std::int64_t work_per_item, Fn&& fn) {
  const std::int64_t chunks = chunk_count(n, work_per_item);
  if (chunks == 0) return 0.0;
  if (chunks == 1) return fn(std::int64_t(0), n);
  double partial[kMaxChunks] = {};
  run_chunks(chunks, [&](std::int64_t c) {
    const Range r = chunk_range(n, c, chunks);
    partial[c] = r.begin < r.end ? fn(r.begin, r.end) : 0.0;
  });
  double s = 0;
  for (std::int64_t c = 0; c < chunks; ++c) s += partial[c];
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
