// A step function that takes a Tensor (the data) instead of a Var (the
// symbolic input). Expected: one static_assert saying so.
#include <frugal/frugal.hpp>
using namespace frugal;

int main() {
  Step s = compile_inference([](Tensor x) { return Var{}; }, {input<float>({2})});
}
