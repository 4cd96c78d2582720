// cuda_tests SUITE: the CUDA suites that run frugal's steps and ops (ops,
// step, gpt_step; see each file) and check the kernel table (kernel_ops, which
// needs no device), one program so that their frugal.hpp is
// compiled once (a unity build of the three); ctest runs each suite as its
// own test. Exits 0 when every check passes, 1 when one fails, 77 where the
// machine has no CUDA device.
#include <cstdio>
#include <cstring>

namespace cuda_ops_test { int run(); }
namespace cuda_step_test { int run(); }
namespace cuda_gpt_step_test { int run(); }
namespace cuda_kernel_ops_test { int run(); }

int main(int argc, char** argv) {
  const char* suite = argc == 2 ? argv[1] : "";
  if (!std::strcmp(suite, "ops")) return cuda_ops_test::run();
  if (!std::strcmp(suite, "step")) return cuda_step_test::run();
  if (!std::strcmp(suite, "gpt_step")) return cuda_gpt_step_test::run();
  if (!std::strcmp(suite, "kernel_ops")) return cuda_kernel_ops_test::run();
  std::fprintf(stderr, "usage: cuda_tests ops|step|gpt_step|kernel_ops\n");
  return 2;
}
