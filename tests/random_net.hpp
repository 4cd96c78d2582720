#pragma once
// The random networks of the budget property test (budget_test.cpp), shared
// with the fusion tests (fusion_test.cpp).
#include <memory>
#include <vector>

#include <frugal/frugal.hpp>

namespace testnets {

using namespace frugal;

// A random network: a stack of linear layers of one width with random
// activations, layer norms, dropout, skip connections to earlier layers, and
// views (reshapes) around in-place chains, which the next layer views again.
struct RandomNet : nn::Module {
  std::vector<std::unique_ptr<nn::Linear>> fc;
  std::vector<std::unique_ptr<nn::LayerNorm>> ln;
  std::vector<int> act, skip;
  int width, classes;
  RandomNet(std::uint64_t seed, int in, int width_, int depth, int classes_) : width(width_), classes(classes_) {
    Rng r(seed);
    nn::manual_seed(seed);
    for (int i = 0; i < depth; ++i) {
      fc.push_back(std::make_unique<nn::Linear>(i == 0 ? in : width, width));
      register_module(cat("fc", i), *fc.back());
      ln.push_back(std::make_unique<nn::LayerNorm>(width));
      register_module(cat("ln", i), *ln.back());
      act.push_back(int(r.below(7)));
      skip.push_back(i > 0 && r.below(2) ? int(r.below(std::uint64_t(i))) : -1);
    }
    fc.push_back(std::make_unique<nn::Linear>(width, classes));
    register_module("head", *fc.back());
  }
  Var forward(Var x) {
    std::vector<Var> hidden;
    for (std::size_t i = 0; i + 1 < fc.size(); ++i) {
      x = (*fc[i])(x);
      switch (act[i]) {
        case 0: x = relu(x); break;
        case 1: x = gelu(x); break;
        case 2: x = tanh(x) * 0.5 + 0.1; break;
        case 3: x = (*ln[i])(x); break;
        case 4: x = dropout_with_key(sigmoid(x), 0.2, 100 + i); break;
        case 5: x = softmax(x) * x; break;
        default: x = reshape(relu(reshape(x, {-1, 1, width})) * 0.5 + 0.1, {-1, width}); break;
      }
      if (skip[i] >= 0) x = x + hidden[std::size_t(skip[i])];
      hidden.push_back(x);
    }
    return (*fc.back())(x);
  }
};

}  // namespace testnets
