// A step function that returns a Tensor (data) instead of a Var. Expected:
// one static_assert saying what it must return.
#include <frugal/frugal.hpp>
using namespace frugal;

int main() {
  Tensor t({2});
  Step s = compile_inference([&](Var) { return t; }, {input<float>({2})});
}
