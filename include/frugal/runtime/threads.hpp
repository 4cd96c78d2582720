#pragma once
// A step's thread count, applied to the calling thread only for the length
// of a run, then the caller's own restored.
//
// The count is the calling thread's OpenMP nthreads-var ICV, which
// omp_set_num_threads sets for the calling thread alone, so steps run from
// different threads do not see each other's setting. The CPU kernels read
// it as the size of the calling thread's team (backend/cpu/worker_team.hpp)
// and run on that team, not on OpenMP: their work is cut into chunks by the
// sizes alone, so a step's bits are the same at any thread count. OpenBLAS
// reads the same ICV for each call, so the team sets it to 1 on every thread
// while a chunk runs, and BLAS never starts threads of its own.
//
// No openblas_set_num_threads per run: it sets OpenBLAS's global count and
// the caller's ICV for good (observed with Debian's libopenblas0-openmp
// 0.3.21), which would leak into the caller's own setting.
#include <omp.h>

namespace frugal {

class ScopedThreads {
 public:
  // n <= 0 leaves the caller's setting alone.
  explicit ScopedThreads(int n) : saved_(omp_get_max_threads()), set_(n > 0 && n != saved_) {
    if (set_) omp_set_num_threads(n);
  }
  ~ScopedThreads() {
    if (set_) omp_set_num_threads(saved_);
  }
  ScopedThreads(const ScopedThreads&) = delete;
  ScopedThreads& operator=(const ScopedThreads&) = delete;

 private:
  int saved_;
  bool set_;
};

}  // namespace frugal
