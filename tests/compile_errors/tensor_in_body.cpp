// A Tensor passed where the body needs a Var. Expected: the compiler's own
// error at relu(t), and no second error from compile about the step
// function's parameters.
#include <frugal/frugal.hpp>
using namespace frugal;

int main() {
  Tensor t({2});
  Step s = compile_inference([&](Var x) { return relu(t) + x; }, {input<float>({2})});
}
