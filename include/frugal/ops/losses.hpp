#pragma once
// Regression and binary-classification losses with PyTorch's names,
// parameters and reductions ('mean', 'sum', 'none'), composed from
// elementwise ops (so each has its backward, input and target alike, and
// the planner sees ordinary elementwise nodes):
//   mse_loss, l1_loss, smooth_l1_loss(beta), huber_loss(delta),
//   binary_cross_entropy_with_logits(weight, pos_weight).
// As PyTorch, mse/l1/smooth_l1/huber broadcast input against target (PyTorch
// warns when the shapes differ; frugal does not). nll_loss is its own op
// (nll_loss.hpp); cross_entropy is in loss.hpp.
#include <optional>

#include "binary.hpp"
#include "nll_loss.hpp"
#include "pointwise.hpp"

namespace frugal {

namespace ops {
inline Var reduce_loss(Var per_element, Reduction r) {
  switch (r) {
    case Reduction::none: return per_element;
    case Reduction::sum: return sum(per_element);
    case Reduction::mean: break;
  }
  return mean(per_element);
}
}  // namespace ops

inline Var mse_loss(Var input, Var target, std::string_view reduction = "mean") {
  const Reduction r = reduction_from("mse_loss", reduction);
  return ops::reduce_loss(square(input - target), r);
}

inline Var l1_loss(Var input, Var target, std::string_view reduction = "mean") {
  const Reduction r = reduction_from("l1_loss", reduction);
  return ops::reduce_loss(abs(input - target), r);
}

// beta == 0 is l1_loss (as recent PyTorch's F.smooth_l1_loss; its kernel
// alone would give the gradient -1 at an exact tie).
inline Var smooth_l1_loss(Var input, Var target, std::string_view reduction = "mean", double beta = 1.0) {
  const Reduction r = reduction_from("smooth_l1_loss", reduction);
  if (!(beta >= 0)) fail<ShapeError>("smooth_l1_loss: beta must be >= 0, got ", beta);
  if (beta == 0) return l1_loss(input, target, reduction);
  return ops::reduce_loss(apply1<ops::Unary<math::SmoothL1>>({input - target}, math::SmoothL1{beta}), r);
}

inline Var huber_loss(Var input, Var target, std::string_view reduction = "mean", double delta = 1.0) {
  const Reduction r = reduction_from("huber_loss", reduction);
  if (!(delta > 0)) fail<ShapeError>("huber_loss: delta must be > 0, got ", delta);
  return ops::reduce_loss(apply1<ops::Unary<math::Huber>>({input - target}, math::Huber{delta}), r);
}

// loss = (1 - y) x + (1 + (pos_weight - 1) y) log(1 + exp(-x)), times
// weight, in the stable form (math::Log1pExp). target must have input's
// shape (as PyTorch); weight and pos_weight broadcast against it.
inline Var binary_cross_entropy_with_logits(Var input, Var target, std::optional<Var> weight = std::nullopt,
                                            std::string_view reduction = "mean",
                                            std::optional<Var> pos_weight = std::nullopt) {
  const Reduction r = reduction_from("binary_cross_entropy_with_logits", reduction);
  if (target.shape() != input.shape())
    fail<ShapeError>("binary_cross_entropy_with_logits: target ", target.shape().str(),
                     " must have the input's shape ", input.shape().str());
  const Var softplus_neg = apply1<ops::Unary<math::Log1pExp>>({-input});
  Var l = input - input * target;
  l = pos_weight ? l + (1.0 + (*pos_weight - 1.0) * target) * softplus_neg : l + softplus_neg;
  if (weight) l = l * *weight;
  return ops::reduce_loss(l, r);
}

}  // namespace frugal
