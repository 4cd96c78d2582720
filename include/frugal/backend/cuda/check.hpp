#pragma once
// Every CUDA runtime and cuBLASLt call, and every kernel launch, is checked:
// a failure names the op, its shapes and the library's own error string.
// Host-only code (compiles with g++ or nvcc against the CUDA headers).
#include <cuda_runtime_api.h>

#include <string>

#include "../../core/error.hpp"
#include "cublaslt_api.hpp"

namespace frugal::cuda {

// `what`: the call and the op it served, e.g. "cudaMemcpyAsync (linear [64,784])".
inline void check(cudaError_t e, const std::string& what) {
  if (e != cudaSuccess) fail("cuda: ", what, " failed: ", cudaGetErrorName(e), ": ", cudaGetErrorString(e));
}
inline void check(cublasStatus_t s, const std::string& what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    fail("cuda: ", what, " failed: cuBLAS status ", int(s), ": ", cublaslt().GetStatusString(s));
}
// After a kernel launch: a bad configuration (grid too large, too much
// shared memory) is reported here, by the op that launched it; a fault
// inside a kernel surfaces at the next synchronisation.
inline void check_launch(const std::string& op) { check(cudaGetLastError(), "kernel launch of " + op); }

}  // namespace frugal::cuda
