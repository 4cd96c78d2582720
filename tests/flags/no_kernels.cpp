// A program that forgot frugal_add_kernels (and <frugal/kernels.hpp>): it
// must not link. tests/CMakeLists.txt builds it and expects the linker to
// name what is missing.
#include <frugal/frugal.hpp>

int main() {
  frugal::Step s = frugal::compile_inference([](frugal::Var x) { return frugal::relu(x); },
                                             {frugal::input<float>({4})});
  return s.run(frugal::Tensor({4})) == 0 ? 0 : 1;
}
