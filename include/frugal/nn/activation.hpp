#pragma once
#include "../ops/unary.hpp"
#include "module.hpp"

namespace frugal::nn {

class ReLU : public Layer {
 public:
  ~ReLU() override;
  Var forward(Var x) override { return relu(x); }
};
class GELU : public Layer {
 public:
  ~GELU() override;
  explicit GELU(bool approximate = true) : approximate_(approximate) {}
  Var forward(Var x) override { return gelu(x, approximate_); }

 private:
  bool approximate_;
};
class Tanh : public Layer {
 public:
  ~Tanh() override;
  Var forward(Var x) override { return frugal::tanh(x); }
};
class Sigmoid : public Layer {
 public:
  ~Sigmoid() override;
  Var forward(Var x) override { return sigmoid(x); }
};

}  // namespace frugal::nn
