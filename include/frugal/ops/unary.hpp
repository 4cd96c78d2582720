#pragma once
// Elementwise unary ops. One op template over the functors in
// elementwise_math.hpp; the backward is one fused kernel computing
// dx = F::grad(x, y, dy).
#include "cast.hpp"
#include "elementwise_math.hpp"

namespace frugal::ops {

template <class F>
class UnaryGrad;

template <class F>
class Unary final : public Op {
 public:
  explicit Unary(F f = {}) : f_(f) {}
  const F& functor() const { return f_; }
  std::string name() const override { return F::name; }
  std::vector<TensorMeta> infer(std::span<const TensorMeta> in) const override {
    expect_arity(name(), in, 1);
    expect_float_storage(name(), in[0]);
    return {in[0]};
  }
  std::vector<std::optional<Var>> backward(const BackwardArgs& a) const override {
    // What the gradient does not read is replaced by dy, so it can die early.
    Var dy = *a.grad_outputs[0];
    return {apply1<UnaryGrad<F>>({F::uses_x ? a.inputs[0] : dy, F::uses_y ? a.outputs[0] : dy, dy}, f_)};
  }
  Cost cost(std::span<const TensorMeta> in, std::span<const TensorMeta> out) const override {
    const double n = double(in[0].shape.numel());
    return {n, double(in[0].nbytes() + out[0].nbytes()), n * math::transcendentals_of<F>()};
  }
  std::vector<int> inplace_inputs() const override { return {0}; }

 private:
  F f_;
};

// Inputs (x, y, dy) -> dx; an input F does not read is passed as dy.
template <class F>
class UnaryGrad final : public Op {
 public:
  explicit UnaryGrad(F f = {}) : f_(f) {}
  const F& functor() const { return f_; }
  std::string name() const override { return std::string(F::name) + "_grad"; }
  std::vector<TensorMeta> infer(std::span<const TensorMeta> in) const override {
    expect_arity(name(), in, 3);
    for (int i = 1; i < 3; ++i)
      if (in[i].shape != in[0].shape || in[i].dtype != in[0].dtype)
        fail<ShapeError>(name(), ": inputs ", in[0].str(), " and ", in[i].str(), " differ");
    return {in[0]};
  }
  Cost cost(std::span<const TensorMeta> in, std::span<const TensorMeta> out) const override {
    Cost c = Op::cost(in, out);
    c.flops = double(in[0].shape.numel());
    c.transcendentals = c.flops * math::grad_transcendentals_of<F>();
    return c;
  }
  std::vector<int> inplace_inputs() const override { return {2, 1, 0}; }

 private:
  F f_;
};

// The functors the backends must implement kernels for.
template <class... F>
struct FunctorList {};
using UnaryFunctors = FunctorList<math::Relu, math::GeluTanh, math::GeluErf, math::Tanh, math::Sigmoid, math::Exp,
                                  math::Log, math::Rsqrt, math::Affine>;

}  // namespace frugal::ops

namespace frugal {

inline Var relu(Var x) { return apply1<ops::Unary<math::Relu>>({x}); }
// approximate=true is GPT-2's tanh form; false is the exact erf form.
inline Var gelu(Var x, bool approximate = true) {
  return approximate ? apply1<ops::Unary<math::GeluTanh>>({x}) : apply1<ops::Unary<math::GeluErf>>({x});
}
inline Var tanh(Var x) { return apply1<ops::Unary<math::Tanh>>({x}); }
inline Var sigmoid(Var x) { return apply1<ops::Unary<math::Sigmoid>>({x}); }
inline Var exp(Var x) { return apply1<ops::Unary<math::Exp>>({x}); }
inline Var log(Var x) { return apply1<ops::Unary<math::Log>>({x}); }
inline Var rsqrt(Var x) { return apply1<ops::Unary<math::Rsqrt>>({x}); }
// a*x + b for constants a, b.
inline Var affine(Var x, double a, double b = 0) { return apply1<ops::Unary<math::Affine>>({x}, math::Affine{a, b}); }

inline Var operator*(Var x, double c) { return affine(x, c); }
inline Var operator*(double c, Var x) { return affine(x, c); }
inline Var operator/(Var x, double c) { return affine(x, 1.0 / c); }
inline Var operator+(Var x, double c) { return affine(x, 1.0, c); }
inline Var operator+(double c, Var x) { return affine(x, 1.0, c); }
inline Var operator-(Var x, double c) { return affine(x, 1.0, -c); }
inline Var operator-(double c, Var x) { return affine(x, -1.0, c); }
inline Var operator-(Var x) { return affine(x, -1.0); }

}  // namespace frugal

// Compiled once per program, in ops/units/ops.hpp.
namespace frugal::ops {
extern template class Unary<math::Relu>;
extern template class UnaryGrad<math::Relu>;
extern template class Unary<math::GeluTanh>;
extern template class UnaryGrad<math::GeluTanh>;
extern template class Unary<math::GeluErf>;
extern template class UnaryGrad<math::GeluErf>;
extern template class Unary<math::Tanh>;
extern template class UnaryGrad<math::Tanh>;
extern template class Unary<math::Sigmoid>;
extern template class UnaryGrad<math::Sigmoid>;
extern template class Unary<math::Exp>;
extern template class UnaryGrad<math::Exp>;
extern template class Unary<math::Log>;
extern template class UnaryGrad<math::Log>;
extern template class Unary<math::Rsqrt>;
extern template class UnaryGrad<math::Rsqrt>;
extern template class Unary<math::Affine>;
extern template class UnaryGrad<math::Affine>;
}  // namespace frugal::ops
