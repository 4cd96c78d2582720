#pragma once
// Every op family, and the gradient algebra autograd uses.
#include "../graph/autograd.hpp"
#include "binary.hpp"
#include "cast.hpp"
#include "fill.hpp"
#include "fused_elementwise.hpp"
#include "loss.hpp"
#include "loss_scaling.hpp"
#include "matmul.hpp"
#include "optimizer_updates.hpp"
#include "adamw_master.hpp"
#include "reduce.hpp"
#include "shape_ops.hpp"
#include "softmax.hpp"
#include "unary.hpp"
#include "spmm.hpp"
#include "layer_norm.hpp"
#include "embedding.hpp"
#include "dropout.hpp"
#include "attention.hpp"
#include "indexing.hpp"
#include "gelu.hpp"
#include "conv.hpp"
#include "batch_norm.hpp"
#include "pool.hpp"
#include "pointwise.hpp"
#include "where.hpp"
#include "max_min.hpp"
#include "detach.hpp"
#include "nll_loss.hpp"
#include "mahalanobis.hpp"
#include "losses.hpp"
#include "conv_transpose.hpp"
#include "upsample.hpp"
#include "group_norm.hpp"
#include "batch_norm1d.hpp"
#include "grad_clipping.hpp"
#include "skip_count.hpp"
#include "sdpa.hpp"
#include "accumulation.hpp"
#include "collective.hpp"
#include "zero.hpp"
#include "host_update.hpp"

namespace frugal {

using ops::permute;
using ops::reshape;
using ops::transpose;

inline GradientAlgebra default_gradient_algebra() {
  return {[](Var a, Var b) { return a + b; }, [](Var x) { return fill_like(x, 1.0); }};
}

// d(loss)/d(w) for each w, appended to the capture's graph.
inline std::vector<std::optional<Var>> grad(Var loss, std::span<const Var> wrt) {
  return gradients(loss, wrt, default_gradient_algebra());
}

}  // namespace frugal
