#pragma once
// The vectorised exact GELU: the shared unary kernels over its functor.
#include "../../ops/gelu.hpp"
#include "elementwise.hpp"

namespace frugal::cpu {

inline const bool gelu_registered =
    kernels().add<ops::Unary<math::GeluErfPoly>>(unary_kernel<math::GeluErfPoly>) &&
    kernels().add<ops::UnaryGrad<math::GeluErfPoly>>(unary_grad_kernel<math::GeluErfPoly>);

}  // namespace frugal::cpu
