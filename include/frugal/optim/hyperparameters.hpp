#pragma once
// Range checks for optimizer hyperparameters, at construction and in every
// setter: a NaN or infinite learning rate would otherwise turn every weight
// into NaN at the first step, far from the line that caused it. The ranges
// are PyTorch's (torch.optim checks lr, eps, betas, momentum and
// weight_decay the same way), plus finiteness, which PyTorch leaves out.
#include <cmath>
#include <string_view>

#include "../core/error.hpp"

namespace frugal::optim::hyper {

// `value` must be finite and at least `least`.
inline void require_at_least(std::string_view who, std::string_view field, double value, double least) {
  if (!std::isfinite(value) || value < least)
    fail(who, ": ", field, " = ", value, " is out of range: it must be a finite number >= ", least);
}

// `value` must be finite (any sign).
inline void require_finite(std::string_view who, std::string_view field, double value) {
  if (!std::isfinite(value)) fail(who, ": ", field, " = ", value, " is out of range: it must be a finite number");
}

// A moving-average coefficient: finite, in [0, 1).
inline void require_beta(std::string_view who, std::string_view field, double value) {
  if (!(value >= 0 && value < 1))
    fail(who, ": ", field, " = ", value, " is out of range: it must lie in [0, 1) (PyTorch's default is 0.9 for beta1 "
         "and 0.999 for beta2)");
}

}  // namespace frugal::optim::hyper
