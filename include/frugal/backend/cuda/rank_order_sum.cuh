#pragma once
// The kernel of cuda::sum_in_rank_order (rank_order_sum.hpp): each thread
// adds one element's column of rows in rank order, with the host's element
// arithmetic (ops/rank_order_sum.hpp).
#include <cstdint>

#include "../../core/error.hpp"
#include "../../ops/rank_order_sum.hpp"
#include "launch.cuh"
#include "rank_order_sum.hpp"

namespace frugal::cuda {

template <class T, class Acc>
__global__ void rank_order_sum_kernel(const T* rows, std::size_t len, int n, T* out) {
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < len;
       i += std::size_t(gridDim.x) * blockDim.x)
    out[i] = rank_order_element<T, Acc>(rows, len, n, i);
}

template <class T, class Acc>
void launch_rank_order_sum(const void* rows, std::size_t len, int n, void* out, cudaStream_t stream) {
  rank_order_sum_kernel<T, Acc><<<blocks_for(std::int64_t(len)), kThreads, 0, stream>>>(static_cast<const T*>(rows), len,
                                                                                        n, static_cast<T*>(out));
  check_launch("the rank-order sum of a collective");
}

void sum_in_rank_order(const void* rows, std::size_t len, int n, DType dtype, void* out, cudaStream_t stream) {
  if (len == 0) return;
  switch (dtype) {
    case DType::f32: return launch_rank_order_sum<float, float>(rows, len, n, out, stream);
    case DType::f64: return launch_rank_order_sum<double, double>(rows, len, n, out, stream);
    case DType::bf16: return launch_rank_order_sum<BFloat16, float>(rows, len, n, out, stream);
    case DType::f16: return launch_rank_order_sum<Half, float>(rows, len, n, out, stream);
    case DType::i32: return launch_rank_order_sum<std::int32_t, std::int64_t>(rows, len, n, out, stream);
    case DType::i64: return launch_rank_order_sum<std::int64_t, std::int64_t>(rows, len, n, out, stream);
    default: fail("cuda: collective sum: dtype ", dtype_name(dtype), " cannot be summed (f32, f64, bf16, f16, i32, i64)");
  }
}

}  // namespace frugal::cuda
