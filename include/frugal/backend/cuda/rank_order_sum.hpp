#pragma once
// The rank-order sum of a reduction's rows on the device (NCCL's
// communicator, dist/nccl.hpp): the host's arithmetic
// (ops/rank_order_sum.hpp) run by a CUDA kernel, so a reduction over NCCL
// gives the bits one over MPI gives. Declared here for host code; defined
// in rank_order_sum.cuh, which the kernel unit compiles once with nvcc.
#include <cuda_runtime_api.h>

#include <cstddef>

#include "../../core/dtype.hpp"

namespace frugal::cuda {

// `rows`: n rows of `len` elements on the device, rank 0's first; `out`:
// len elements on the device. Enqueued on `stream`; f32, f64, bf16, f16,
// i32, i64.
void sum_in_rank_order(const void* rows, std::size_t len, int n, DType dtype, void* out, cudaStream_t stream);

}  // namespace frugal::cuda
