// A generic (variadic auto) step function: compile cannot know how many
// inputs it takes. Expected: one static_assert naming generic lambdas.
#include <frugal/frugal.hpp>
using namespace frugal;

int main() {
  Step s = compile_inference([](auto... xs) { return (xs + ...); }, {input<float>({2}), input<float>({2})});
}
