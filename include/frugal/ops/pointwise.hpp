#pragma once
// abs, sqrt, square, sin, cos, pow (constant exponent) and clamp: more
// elementwise unary ops over the Unary template (unary.hpp), with
// PyTorch's names, gradients and NaN semantics (the functors are in
// elementwise_math.hpp, so a device backend runs the same math). maximum
// and minimum, being binary, are in binary.hpp.
#include <cmath>
#include <optional>

#include "unary.hpp"

namespace frugal::ops {
using PointwiseFunctors = FunctorList<math::Abs, math::Sqrt, math::Square, math::Sin, math::Cos, math::Pow,
                                      math::Clamp, math::SmoothL1, math::Huber, math::Log1pExp>;
}  // namespace frugal::ops

namespace frugal {

inline Var abs(Var x) { return apply1<ops::Unary<math::Abs>>({x}); }
inline Var sqrt(Var x) { return apply1<ops::Unary<math::Sqrt>>({x}); }
inline Var square(Var x) { return apply1<ops::Unary<math::Square>>({x}); }
inline Var sin(Var x) { return apply1<ops::Unary<math::Sin>>({x}); }
inline Var cos(Var x) { return apply1<ops::Unary<math::Cos>>({x}); }
// torch.pow(x, exponent) for a scalar exponent. (A tensor exponent is not
// supported: exp(b * log(a)) differs from it for a <= 0.)
inline Var pow(Var x, double exponent) {
  if (std::isnan(exponent)) fail<ShapeError>("pow: the exponent is NaN");
  return apply1<ops::Unary<math::Pow>>({x}, math::Pow{exponent});
}
// torch.clamp(x, min, max): either bound may be absent, not both.
inline Var clamp(Var x, std::optional<double> min, std::optional<double> max) {
  if (!min && !max) fail<ShapeError>("clamp: at least one of min and max must be given");
  if ((min && std::isnan(*min)) || (max && std::isnan(*max))) fail<ShapeError>("clamp: a bound is NaN");
  return apply1<ops::Unary<math::Clamp>>({x}, math::Clamp{min.value_or(-HUGE_VAL), max.value_or(HUGE_VAL)});
}
inline Var clamp_min(Var x, double min) { return clamp(x, min, std::nullopt); }
inline Var clamp_max(Var x, double max) { return clamp(x, std::nullopt, max); }

}  // namespace frugal

// Compiled once per program, in ops/units/ops.hpp.
namespace frugal::ops {
extern template class Unary<math::Abs>;
extern template class UnaryGrad<math::Abs>;
extern template class Unary<math::Sqrt>;
extern template class UnaryGrad<math::Sqrt>;
extern template class Unary<math::Square>;
extern template class UnaryGrad<math::Square>;
extern template class Unary<math::Sin>;
extern template class UnaryGrad<math::Sin>;
extern template class Unary<math::Cos>;
extern template class UnaryGrad<math::Cos>;
extern template class Unary<math::Pow>;
extern template class UnaryGrad<math::Pow>;
extern template class Unary<math::Clamp>;
extern template class UnaryGrad<math::Clamp>;
extern template class Unary<math::SmoothL1>;
extern template class UnaryGrad<math::SmoothL1>;
extern template class Unary<math::Huber>;
extern template class UnaryGrad<math::Huber>;
extern template class Unary<math::Log1pExp>;
extern template class UnaryGrad<math::Log1pExp>;
}  // namespace frugal::ops
