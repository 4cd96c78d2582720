#pragma once
// CSR × dense kernels: spmm, its transposed form (spmm's backward for X) and
// the gradient for the sparse values.
//
// Every kernel is a gather over rows of the sparse operand: one thread owns
// each output row, so there are no atomics and the result does not depend on
// the thread count. Rows are split between threads by nonzeros (plus one per
// row, for the row's own output), so a skewed degree distribution does not
// leave one thread with most of the work.
//
// The cost is the random reads of dense rows X[col[p], :] (a random graph has
// no locality to exploit by reordering rows). Two things keep them cheap: the
// dense rows of the entries eight ahead are prefetched while the current ones
// are summed (about 1.5x at 128 features), and four entries are summed per
// pass over the output row, so it is loaded and stored once per four entries.
// Rows of exactly one cache line (16 floats) sum into registers instead.
#include <algorithm>
#include <cstring>
#include <type_traits>

#include "../../ops/spmm.hpp"
#include "../../runtime/backend.hpp"
#include "parallel.hpp"

#include "abi.hpp"

namespace frugal::cpu::inline FRUGAL_KERNEL_ABI {

namespace spmm_detail {

// Entries whose dense rows are prefetched ahead of the ones being summed.
inline constexpr std::int64_t kPrefetchAhead = 8;

// row_ptr must start at 0, never decrease, and end at nnz.
inline void check_row_ptr(const char* op, const char* what, const std::int64_t* ptr, std::int64_t rows,
                          std::int64_t nnz) {
  if (ptr[0] != 0) fail<DataError>(op, ": ", what, "[0] is ", ptr[0], "; a CSR row pointer must start at 0");
  for (std::int64_t i = 0; i < rows; ++i)
    if (ptr[i + 1] < ptr[i])
      fail<DataError>(op, ": ", what, " decreases at row ", i, " (", what, "[", i, "] = ", ptr[i], ", ", what, "[",
                      i + 1, "] = ", ptr[i + 1], "); a CSR row pointer must be non-decreasing");
  if (ptr[rows] != nnz)
    fail<DataError>(op, ": ", what, "[", rows, "] is ", ptr[rows], " but there are ", nnz,
                    " entries; a CSR row pointer must end at the number of entries");
}

// The rows [b, e) of chunk t of nt: equal shares of nnz + rows, found by
// binary search over w(i) = ptr[i] + i (strictly increasing).
inline void balanced_rows(const std::int64_t* ptr, std::int64_t rows, std::int64_t t, std::int64_t nt,
                          std::int64_t& b, std::int64_t& e) {
  const std::int64_t total = ptr[rows] + rows;
  auto first_at_least = [&](std::int64_t target) {
    std::int64_t lo = 0, hi = rows;  // the first i in [0, rows] with w(i) >= target
    while (lo < hi) {
      std::int64_t mid = lo + (hi - lo) / 2;
      if (ptr[mid] + mid < target) lo = mid + 1;
      else hi = mid;
    }
    return lo;
  };
  b = t == 0 ? 0 : first_at_least(total * t / nt);
  e = t + 1 == nt ? rows : first_at_least(total * (t + 1) / nt);
}

// Runs fn(b, e) over row ranges of about equal work (fixed chunks, so the
// same at any thread count); fn returns the first row whose indices are out
// of range, or -1. Returns the first such row over all chunks, or -1.
template <class Fn>
std::int64_t for_row_ranges(const std::int64_t* ptr, std::int64_t rows, std::int64_t f, Fn&& fn) {
  if (rows <= 0) return -1;
  const std::int64_t chunks = chunk_count(ptr[rows] + rows, std::max<std::int64_t>(f, 1));
  if (chunks == 1) return fn(std::int64_t(0), rows);
  std::int64_t bad[kMaxChunks];
  run_chunks(chunks, [&](std::int64_t c) {
    std::int64_t b = 0, e = 0;
    balanced_rows(ptr, rows, c, chunks, b, e);
    bad[c] = b < e ? fn(b, e) : -1;
  });
  for (std::int64_t c = 0; c < chunks; ++c)
    if (bad[c] >= 0) return bad[c];
  return -1;
}

// True when every index in [b, e) lies in [0, limit).
template <class I>
inline bool indices_in_range(const I* idx, std::int64_t b, std::int64_t e, std::int64_t limit) {
  bool ok = true;  // negative indices wrap to huge unsigned values
  for (std::int64_t p = b; p < e; ++p) ok &= std::uint64_t(std::int64_t(idx[p])) < std::uint64_t(limit);
  return ok;
}

template <class I>
[[noreturn]] void fail_index(const char* op, const char* what, const I* idx, const std::int64_t* ptr, std::int64_t row,
                             std::int64_t limit, const char* range_of) {
  for (std::int64_t p = ptr[row]; p < ptr[row + 1]; ++p)
    if (idx[p] < 0 || idx[p] >= limit)
      fail<DataError>(op, ": ", what, " ", std::int64_t(idx[p]), " at entry ", p, " (row ", row, ") is outside [0, ",
                      limit, ") ", range_of);
  fail<DataError>(op, ": ", what, " out of range in row ", row);
}

// Always inlined, and never called through a lambda: GCC 12 judges a helper
// whose only effect is __builtin_prefetch to be pure and deletes the call
// before inlining it (measured: the prefetches vanished from the binary).
[[gnu::always_inline]] inline void prefetch_row(const void* p, std::int64_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (std::int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(c + b, 0, 3);
}

// y[i, :] = Σ_p w(p) x[idx[p], :] for rows [b, e), w(p) = val[p] or, with a
// permutation, val[perm[p]]. Returns the first row with a bad index, or -1.
template <class T, class I, bool Permuted>
std::int64_t rows_product(const std::int64_t* __restrict ptr, const I* __restrict idx, const T* __restrict val,
                          const I* __restrict perm, const T* __restrict x, T* __restrict y, std::int64_t m,
                          std::int64_t f, std::int64_t nnz, std::int64_t b, std::int64_t e) {
  const std::int64_t row_bytes = f * std::int64_t(sizeof(T));
  auto w = [&](std::int64_t p) { return Permuted ? val[perm[p]] : val[p]; };
  for (std::int64_t i = b; i < e; ++i) {
    std::int64_t p = ptr[i];
    const std::int64_t pe = ptr[i + 1];
    if (!indices_in_range(idx, p, pe, m)) return i;
    if constexpr (Permuted)
      if (!indices_in_range(perm, p, pe, nnz)) return i;
    T* __restrict yi = y + i * f;
    for (std::int64_t k = 0; k < f; ++k) yi[k] = T(0);
    for (; p + 4 <= pe; p += 4) {
      for (std::int64_t q = p + kPrefetchAhead; q < std::min(p + kPrefetchAhead + 4, nnz); ++q) {
        prefetch_row(x + std::int64_t(idx[q]) * f, row_bytes);
        if constexpr (Permuted) __builtin_prefetch(val + perm[q], 0, 3);
      }
      const T* __restrict x0 = x + std::int64_t(idx[p]) * f;
      const T* __restrict x1 = x + std::int64_t(idx[p + 1]) * f;
      const T* __restrict x2 = x + std::int64_t(idx[p + 2]) * f;
      const T* __restrict x3 = x + std::int64_t(idx[p + 3]) * f;
      const T w0 = w(p), w1 = w(p + 1), w2 = w(p + 2), w3 = w(p + 3);
      for (std::int64_t k = 0; k < f; ++k) yi[k] += (w0 * x0[k] + w1 * x1[k]) + (w2 * x2[k] + w3 * x3[k]);
    }
    for (; p < pe; ++p) {
      if (p + kPrefetchAhead < nnz) prefetch_row(x + std::int64_t(idx[p + kPrefetchAhead]) * f, row_bytes);
      const T* __restrict x0 = x + std::int64_t(idx[p]) * f;
      const T w0 = w(p);
      for (std::int64_t k = 0; k < f; ++k) yi[k] += w0 * x0[k];
    }
  }
  return -1;
}

// The same product for rows of exactly C features, summed in a local
// accumulator the compiler keeps in registers: short rows (one cache line)
// are latency-bound, and a register accumulator beats the output-row loop.
template <class T, class I, bool Permuted, int C>
std::int64_t rows_product_narrow(const std::int64_t* __restrict ptr, const I* __restrict idx,
                                 const T* __restrict val, const I* __restrict perm, const T* __restrict x,
                                 T* __restrict y, std::int64_t m, std::int64_t nnz, std::int64_t b, std::int64_t e) {
  for (std::int64_t i = b; i < e; ++i) {
    const std::int64_t pb = ptr[i], pe = ptr[i + 1];
    if (!indices_in_range(idx, pb, pe, m)) return i;
    if constexpr (Permuted)
      if (!indices_in_range(perm, pb, pe, nnz)) return i;
    T acc[C] = {};
    for (std::int64_t p = pb; p < pe; ++p) {
      if (p + kPrefetchAhead < nnz) {
        __builtin_prefetch(x + std::int64_t(idx[p + kPrefetchAhead]) * C, 0, 3);
        if constexpr (Permuted) __builtin_prefetch(val + perm[p + kPrefetchAhead], 0, 3);
      }
      const T* __restrict xj = x + std::int64_t(idx[p]) * C;
      const T wp = Permuted ? val[perm[p]] : val[p];
      for (int k = 0; k < C; ++k) acc[k] += wp * xj[k];
    }
    std::memcpy(y + i * C, acc, sizeof acc);
  }
  return -1;
}

// Y [n, f] = B · X [m, f] with B = (ptr, idx, val[perm]) or (ptr, idx, val).
template <class T, class I, bool Permuted>
void product(const char* op, const KernelArgs& a) {
  const std::int64_t* ptr = a.in[0].as<std::int64_t>();
  const I* idx = a.in[1].as<I>();
  const T* val = a.in[2].as<T>();
  const T* x = a.in[3].as<T>();
  const I* perm = Permuted ? a.in[4].as<I>() : nullptr;
  T* y = a.out[0].as<T>();
  const std::int64_t n = a.in[0].numel() - 1, nnz = a.in[1].numel(), m = a.in[3].shape->dim(0),
                     f = a.in[3].shape->dim(1);
  check_row_ptr(op, Permuted ? "ptr" : "row_ptr", ptr, n, nnz);
  if (f == 0) return;
  constexpr int narrow = int(64 / sizeof(T));  // one cache line of features
  std::int64_t bad = for_row_ranges(ptr, n, f, [&](std::int64_t b, std::int64_t e) {
    if (f == narrow) return rows_product_narrow<T, I, Permuted, narrow>(ptr, idx, val, perm, x, y, m, nnz, b, e);
    return rows_product<T, I, Permuted>(ptr, idx, val, perm, x, y, m, f, nnz, b, e);
  });
  if (bad < 0) return;
  if (!indices_in_range(idx, ptr[bad], ptr[bad + 1], m))
    fail_index(op, Permuted ? "index" : "column index", idx, ptr, bad, m,
               cat("for a dense operand with ", m, " rows").c_str());
  fail_index(op, "permutation entry", perm, ptr, bad, nnz, cat("for ", nnz, " values").c_str());
}

template <class Fn>
void dispatch_index(DType t, Fn&& fn) {
  if (t == DType::i32) fn(std::int32_t{});
  else fn(std::int64_t{});
}

// dv[p] = Σ_k dy[i, k] x[col[p], k] for the entries of rows [b, e). The dot
// product runs in 8 fixed lanes, so it vectorises and its order is fixed.
template <class T, class I>
std::int64_t rows_values_grad(const std::int64_t* __restrict ptr, const I* __restrict col, const T* __restrict dy,
                              const T* __restrict x, T* __restrict dv, std::int64_t m, std::int64_t f, std::int64_t nnz,
                              std::int64_t b, std::int64_t e) {
  constexpr int L = 8;
  const std::int64_t row_bytes = f * std::int64_t(sizeof(T)), body = f - f % L;
  for (std::int64_t i = b; i < e; ++i) {
    const std::int64_t pb = ptr[i], pe = ptr[i + 1];
    if (!indices_in_range(col, pb, pe, m)) return i;
    const T* __restrict g = dy + i * f;
    for (std::int64_t p = pb; p < pe; ++p) {
      if (p + kPrefetchAhead < nnz) prefetch_row(x + std::int64_t(col[p + kPrefetchAhead]) * f, row_bytes);
      const T* __restrict xj = x + std::int64_t(col[p]) * f;
      T lane[L] = {};
      for (std::int64_t k = 0; k < body; k += L)
        for (int l = 0; l < L; ++l) lane[l] += g[k + l] * xj[k + l];
      T s = ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
      for (std::int64_t k = body; k < f; ++k) s += g[k] * xj[k];
      dv[p] = s;
    }
  }
  return -1;
}

}  // namespace spmm_detail

inline void spmm_kernel(const ops::Spmm&, const KernelArgs& a) {
  dispatch_float(a.in[2].dtype, "spmm", [&](auto tag) {
    using T = decltype(tag);
    spmm_detail::dispatch_index(a.in[1].dtype, [&](auto itag) {
      spmm_detail::product<T, decltype(itag), false>("spmm", a);
    });
  });
}

inline void spmm_permuted_kernel(const ops::SpmmPermuted&, const KernelArgs& a) {
  dispatch_float(a.in[2].dtype, "spmm_transposed", [&](auto tag) {
    using T = decltype(tag);
    spmm_detail::dispatch_index(a.in[1].dtype, [&](auto itag) {
      spmm_detail::product<T, decltype(itag), true>("spmm_transposed", a);
    });
  });
}

inline void spmm_values_grad_kernel(const ops::SpmmValuesGrad&, const KernelArgs& a) {
  dispatch_float(a.in[2].dtype, "spmm_values_grad", [&](auto tag) {
    using T = decltype(tag);
    spmm_detail::dispatch_index(a.in[1].dtype, [&](auto itag) {
      using I = decltype(itag);
      const std::int64_t* ptr = a.in[0].as<std::int64_t>();
      const I* col = a.in[1].as<I>();
      const T *dy = a.in[2].as<T>(), *x = a.in[3].as<T>();
      T* dv = a.out[0].as<T>();
      const std::int64_t n = a.in[0].numel() - 1, nnz = a.in[1].numel(), m = a.in[3].shape->dim(0),
                         f = a.in[3].shape->dim(1);
      spmm_detail::check_row_ptr("spmm_values_grad", "row_ptr", ptr, n, nnz);
      std::int64_t bad = spmm_detail::for_row_ranges(ptr, n, f, [&](std::int64_t b, std::int64_t e) {
        return spmm_detail::rows_values_grad<T, I>(ptr, col, dy, x, dv, m, f, nnz, b, e);
      });
      if (bad >= 0)
        spmm_detail::fail_index("spmm_values_grad", "column index", col, ptr, bad, m,
                                cat("for a dense operand with ", m, " rows").c_str());
    });
  });
}


}  // namespace frugal::cpu
