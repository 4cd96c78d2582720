#pragma once
// FRUGAL_HD marks math that must compile for both the host and a CUDA device,
// so the CPU backend runs (and tests) exactly the arithmetic the GPU runs.
#if defined(__CUDACC__)
#define FRUGAL_HD __host__ __device__ __forceinline__
#else
#define FRUGAL_HD inline
#endif
