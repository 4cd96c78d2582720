// The README's model, as a user writes it: bench/compile-time measures how
// long one such file takes to compile (it compiles no kernel).
#include <frugal/frugal.hpp>
#include <iostream>
using namespace frugal;

struct Mlp : nn::Module {
  nn::Linear fc1{784, 256}, fc2{256, 10};
  Mlp() { register_module("fc1", fc1); register_module("fc2", fc2); }
  Var forward(Var x) { return fc2(relu(fc1(x))); }
};

int main() {
  Mlp model;
  optim::AdamW opt(model.parameters(), {.lr = 1e-3});
  Step step = compile([&](Var x, Var y) { return cross_entropy(model.forward(x), y); },
                      {input<float>({64, 784}), input<std::int32_t>({64})}, opt,
                      Budget{.device = 64_MiB});
  std::cout << step.summary();
  Tensor x({64, 784}), y({64}, DType::i32);  // fill with a batch
  float loss = step.run(x, y);
  std::cout << "loss " << loss << "\n";
}
