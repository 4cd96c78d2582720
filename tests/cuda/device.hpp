#pragma once
// What the cuda_* tests share: the skip rule (exit 77, "skipped: no CUDA
// device", which ctest reads as SKIP_RETURN_CODE 77) and a plain check
// counter, so the tests need no Catch2 (a lent GPU machine may not have it).
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include <frugal/frugal.hpp>

namespace cuda_test {

inline int failures = 0;

// The backend, or exit 77 where this program has it but the machine has no
// device; a program built without CUDA is a failure (the test must not
// pass by skipping there).
inline std::shared_ptr<frugal::Backend> cuda_backend_or_skip() {
  try {
    return frugal::make_backend("cuda");
  } catch (const frugal::Error& e) {
    const std::string what = e.what();
    if (what.find("no CUDA device") != std::string::npos) {
      std::printf("skipped: no CUDA device (%s)\n", what.c_str());
      std::exit(77);
    }
    std::printf("FAIL: make_backend(\"cuda\"): %s\n", what.c_str());
    std::exit(1);
  }
}

inline void expect(bool ok, const std::string& what) {
  if (!ok) {
    ++failures;
    std::printf("FAIL: %s\n", what.c_str());
  }
}

inline int finish(const char* name) {
  if (failures) std::printf("%s: %d check(s) failed\n", name, failures);
  else std::printf("%s: all checks passed\n", name);
  return failures ? 1 : 0;
}

}  // namespace cuda_test
