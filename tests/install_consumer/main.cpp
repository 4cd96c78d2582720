// Trains a tiny model through the installed headers and checks it learned.
#include <frugal/frugal.hpp>
#include <iostream>

using namespace frugal;

int main() {
  nn::Linear fc(4, 2);
  optim::SGD opt(fc.parameters(), {.lr = 0.5, .momentum = 0.5});
  Step step = compile([&](Var x, Var y) { return cross_entropy(fc(x), y); },
                      {input<float>({8, 4}), input<std::int32_t>({8})}, opt);
  Tensor x({8, 4}), y({8}, DType::i32);
  for (int i = 0; i < 8; ++i) {
    y.data<std::int32_t>()[i] = i % 2;
    for (int j = 0; j < 4; ++j) x.data<float>()[i * 4 + j] = (i % 2 ? 1.0f : -1.0f) * float(j + 1) / 4;
  }
  float first = step.run(x, y), last = first;
  for (int s = 0; s < 30; ++s) last = step.run(x, y);
  std::cout << "consumer: loss " << first << " -> " << last << "\n";
  return last < first / 4 ? 0 : 1;
}
