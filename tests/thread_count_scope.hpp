#pragma once
// Sets the calling thread's OpenMP thread count (what a step's
// ScopedThreads does) for a scope, and puts the old one back at its end.
#include <omp.h>

namespace test_support {

struct ThreadCount {
  int saved = omp_get_max_threads();
  explicit ThreadCount(int n) { omp_set_num_threads(n); }
  ThreadCount(const ThreadCount&) = delete;
  ThreadCount& operator=(const ThreadCount&) = delete;
  ~ThreadCount() { omp_set_num_threads(saved); }
};

}  // namespace test_support
