#pragma once
// The one way frugal's collectives add (ops/rank_order_sum.hpp), over host
// memory: rows[0] + rows[1] + ... in rank order, element by element, in f32
// for bf16 and f16 and rounded once at the end. Each chunk of a reduction is
// added by one rank alone and then sent to the others, so this order fixes
// the bits on every rank, in every call, and whatever the MPI library's own
// algorithms are.
#include <cstddef>
#include <cstdint>

#include "../core/dtype.hpp"
#include "../core/error.hpp"
#include "../core/half.hpp"
#include "../ops/rank_order_sum.hpp"

namespace frugal::dist {

namespace detail {
template <class T, class Acc>
void add_rows(const void* rows, std::size_t len, int n, void* out) {
  const T* r = static_cast<const T*>(rows);
  T* o = static_cast<T*>(out);
  for (std::size_t i = 0; i < len; ++i) o[i] = rank_order_element<T, Acc>(r, len, n, i);
}
}  // namespace detail

// `rows`: n rows of `len` elements, one per rank, rank 0 first; `out`: len.
inline void sum_in_rank_order(const void* rows, std::size_t len, int n, DType dtype, void* out) {
  switch (dtype) {
    case DType::f32: return detail::add_rows<float, float>(rows, len, n, out);
    case DType::f64: return detail::add_rows<double, double>(rows, len, n, out);
    case DType::bf16: return detail::add_rows<BFloat16, float>(rows, len, n, out);
    case DType::f16: return detail::add_rows<Half, float>(rows, len, n, out);
    case DType::i32: return detail::add_rows<std::int32_t, std::int64_t>(rows, len, n, out);
    case DType::i64: return detail::add_rows<std::int64_t, std::int64_t>(rows, len, n, out);
    default: fail("collective sum: dtype ", dtype_name(dtype), " cannot be summed (f32, f64, bf16, f16, i32, i64)");
  }
}

// The scratch each rank's sum needs: a row of its chunk from every rank.
// An all-reduce's chunks differ by at most one element (size() rows of the
// largest); a reduce-scatter's are `count` each.
inline std::size_t rank_order_all_reduce_workspace(std::size_t count, DType dtype, int ranks) {
  if (ranks == 1) return 0;
  return std::size_t(ranks) * ((count + std::size_t(ranks) - 1) / std::size_t(ranks)) * dtype_size(dtype);
}
inline std::size_t rank_order_reduce_scatter_workspace(std::size_t count, DType dtype, int ranks) {
  return ranks == 1 ? 0 : std::size_t(ranks) * count * dtype_size(dtype);
}

}  // namespace frugal::dist
