#pragma once
// FRUGAL_HD marks math that must compile for both the host and a CUDA device,
// so the CPU backend runs (and tests) exactly the arithmetic the GPU runs.
//
// On the host it is also always inlined, as on the device: such a function
// is then compiled into each caller with the caller's flags, so a kernel
// never calls a copy of it that a user's file compiled (say with
// -ffast-math) and the linker happened to keep.
#if defined(__CUDACC__)
#define FRUGAL_HD __host__ __device__ __forceinline__
#elif defined(__GNUC__)
#define FRUGAL_HD inline __attribute__((always_inline))
#else
#define FRUGAL_HD inline
#endif
