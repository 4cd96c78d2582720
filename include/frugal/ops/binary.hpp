#pragma once
// add, sub, mul, div with numpy broadcasting. The backward of a broadcast
// input sums its gradient back to the input's shape.
#include "reduce.hpp"

namespace frugal::ops {

template <class F>
class Binary final : public Op {
 public:
  std::string name() const override { return F::name; }
  std::vector<TensorMeta> infer(std::span<const TensorMeta> in) const override {
    expect_arity(name(), in, 2);
    expect_float_storage(name(), in[0]);
    expect_same_dtype(name(), in[0], in[1]);
    auto out = broadcast_shapes(in[0].shape, in[1].shape);
    if (!out)
      fail<ShapeError>(name(), ": shapes ", in[0].shape.str(), " and ", in[1].shape.str(),
                       " do not broadcast (trailing dimensions must match or be 1)");
    return {{in[0].dtype, *out}};
  }
  inline std::vector<std::optional<Var>> backward(const BackwardArgs& a) const override;
  Cost cost(std::span<const TensorMeta>, std::span<const TensorMeta> out) const override {
    return {double(out[0].shape.numel()), 3.0 * double(out[0].nbytes())};
  }
  // Only an input of the output's own shape (not a broadcast one) qualifies;
  // the planner checks the shapes.
  std::vector<int> inplace_inputs() const override { return {0, 1}; }
};

using BinaryFunctors = FunctorList<math::Add, math::Sub, math::Mul, math::Div>;
using MinMaxFunctors = FunctorList<math::Maximum, math::Minimum, math::MaxShare>;

}  // namespace frugal::ops

namespace frugal {

inline Var operator+(Var a, Var b) { return apply1<ops::Binary<math::Add>>({a, b}); }
inline Var operator-(Var a, Var b) { return apply1<ops::Binary<math::Sub>>({a, b}); }
inline Var operator*(Var a, Var b) { return apply1<ops::Binary<math::Mul>>({a, b}); }
inline Var operator/(Var a, Var b) { return apply1<ops::Binary<math::Div>>({a, b}); }
inline Var add(Var a, Var b) { return a + b; }
inline Var sub(Var a, Var b) { return a - b; }
inline Var mul(Var a, Var b) { return a * b; }
inline Var div(Var a, Var b) { return a / b; }
// torch.maximum / torch.minimum: elementwise, broadcasting, NaN-propagating.
inline Var maximum(Var a, Var b) { return apply1<ops::Binary<math::Maximum>>({a, b}); }
inline Var minimum(Var a, Var b) { return apply1<ops::Binary<math::Minimum>>({a, b}); }
// maximum(a, b)'s share of the gradient that goes to a (for their backward).
inline Var max_share(Var a, Var b) { return apply1<ops::Binary<math::MaxShare>>({a, b}); }

template <class F>
std::vector<std::optional<Var>> ops::Binary<F>::backward(const BackwardArgs& args) const {
  Var a = args.inputs[0], b = args.inputs[1], y = args.outputs[0], g = *args.grad_outputs[0];
  Var ga, gb;
  if constexpr (std::is_same_v<F, math::Add>) {
    ga = g, gb = g;
  } else if constexpr (std::is_same_v<F, math::Sub>) {
    ga = g, gb = -g;
  } else if constexpr (std::is_same_v<F, math::Mul>) {
    ga = g * b, gb = g * a;
  } else if constexpr (std::is_same_v<F, math::Div>) {
    ga = g / b;
    gb = -(ga * y);  // d(a/b)/db = -a/b^2 = -(1/b)(a/b)
  } else if constexpr (std::is_same_v<F, math::Maximum> || std::is_same_v<F, math::Minimum>) {
    // PyTorch's split: ties share the gradient evenly (math::MaxShare).
    Var share_a = std::is_same_v<F, math::Maximum> ? max_share(a, b) : max_share(b, a);
    Var share_b = std::is_same_v<F, math::Maximum> ? max_share(b, a) : max_share(a, b);
    ga = g * share_a, gb = g * share_b;
  } else {
    // A piecewise-constant function (math::MaxShare): no gradient flows.
    static_assert(std::is_same_v<F, math::MaxShare>);
    return {std::nullopt, std::nullopt};
  }
  return {sum_to(ga, a.shape()), sum_to(gb, b.shape())};
}

}  // namespace frugal

// Compiled once per program, in ops/units/ops.hpp.
namespace frugal::ops {
extern template class Binary<math::Add>;
extern template class Binary<math::Sub>;
extern template class Binary<math::Mul>;
extern template class Binary<math::Div>;
extern template class Binary<math::Maximum>;
extern template class Binary<math::Minimum>;
extern template class Binary<math::MaxShare>;
}  // namespace frugal::ops
