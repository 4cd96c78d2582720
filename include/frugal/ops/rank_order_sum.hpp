#pragma once
// The one way frugal's collectives add, as one element's arithmetic that
// the host (dist/rank_order_sum.hpp, for MPI) and a CUDA device
// (backend/cuda/rank_order_sum.cuh, for NCCL) both run: rows[0] + rows[1]
// + ... in rank order, in Acc (f32 for bf16 and f16, rounded once at the
// end). Each chunk of a reduction is added by one rank alone and then sent
// to the others, so this order fixes the bits on every rank, in every call,
// whatever the transport.
#include <cstddef>

#include "../core/hd.hpp"
#include "../core/half.hpp"

namespace frugal {

// Element i of the sum of n rows of `len` elements (rank 0's row first).
template <class T, class Acc>
FRUGAL_HD T rank_order_element(const T* rows, std::size_t len, int n, std::size_t i) {
  Acc acc = Acc(rows[i]);
  for (int k = 1; k < n; ++k) acc = acc + Acc(rows[std::size_t(k) * len + i]);
  return T(acc);
}

}  // namespace frugal
