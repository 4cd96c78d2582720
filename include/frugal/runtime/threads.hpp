#pragma once
// A step's thread count, applied to the calling thread only for the length
// of a run, then the caller's own restored.
//
// omp_set_num_threads sets the nthreads-var ICV of the calling thread alone,
// so steps run from different threads do not see each other's setting. BLAS
// follows it: what OpenBLAS 0.3.21 (Debian's libopenblas0-openmp) does, as
// observed (a 512^3 sgemm from the main thread and from a std::thread):
//  - each call takes its thread count from the caller's omp_get_max_threads()
//    (capped at the build's maximum); a caller's ICV of 1 runs single-threaded;
//  - when that count differs from OpenBLAS's global one, the call rewrites
//    the global (openblas_get_num_threads() then reports it) and sets the
//    caller's ICV to the same value, so the caller's ICV is unchanged;
//  - openblas_set_num_threads(n) sets the global and also the caller's ICV
//    (permanently, for the caller); even after n = 1, a later call from a
//    thread whose ICV is 2 runs with 2 and resets the global to 2.
// So no openblas_set_num_threads per run: it would change the caller's ICV
// for good and race with other steps on the global. The global rewrite
// inside a call remains OpenBLAS's own unsynchronised write, and it can
// matter for bits: sgemm's results depend on how many threads split it (7 of
// 8 shapes tried gave different bits at 1 and 2 threads, and so do row or
// column blocks of one product run as separate calls). A step's bits are
// those of its own thread count, which each call reads from its caller.
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
