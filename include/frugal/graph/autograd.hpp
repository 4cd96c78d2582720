#pragma once
#include <functional>
#include <optional>
#include <vector>

#include "var.hpp"

namespace frugal {

// The two graph ops a reverse sweep needs besides each op's own backward:
// summing two gradient contributions, and the seed d(loss)/d(loss) = 1.
// They are passed in because graph/ sits above ops/ and may not include it.
struct GradientAlgebra {
  std::function<Var(Var, Var)> add;
  std::function<Var(Var)> ones_like;
};

// Reverse-mode differentiation on the captured graph: appends the backward
// ops to the same graph and returns d(loss)/d(w) for each w (nullopt where
// w does not influence the loss).
inline std::vector<std::optional<Var>> gradients(Var loss, std::span<const Var> wrt, const GradientAlgebra& alg) {
  Graph& g = *loss.graph;
  if (loss.shape().numel() != 1)
    fail<ShapeError>("gradients: the loss must be a single number, got shape ", loss.shape().str(),
                     " (reduce it with mean or sum)");
  if (!is_floating(loss.dtype())) fail("gradients: the loss has integer dtype ", dtype_name(loss.dtype()));

  // Only nodes on a path from a wanted value to the loss take part.
  std::size_t forward_nodes = g.num_nodes();
  std::vector<bool> reaches_wrt(g.num_values(), false);
  for (auto& w : wrt) reaches_wrt[std::size_t(w.id)] = true;
  for (NodeId n = 0; n < NodeId(forward_nodes); ++n) {
    const Node& node = g.node(n);
    bool any = false;
    for (ValueId i : node.inputs) any = any || reaches_wrt[std::size_t(i)];
    if (any)
      for (ValueId o : node.outputs) reaches_wrt[std::size_t(o)] = true;
  }

  std::vector<std::optional<Var>> grad(g.num_values());
  auto accumulate = [&](ValueId v, Var contribution) {
    auto& slot = grad[std::size_t(v)];
    slot = slot ? alg.add(*slot, contribution) : contribution;
  };
  const Phase previous_phase = g.set_phase(Phase::backward);
  accumulate(loss.id, alg.ones_like(loss));

  for (NodeId n = NodeId(forward_nodes) - 1; n >= 0; --n) {
    // Copy what we need: the backward below appends nodes and may reallocate.
    Node node = g.node(n);
    std::vector<std::optional<Var>> gout;
    bool any_grad = false;
    for (ValueId o : node.results()) {
      gout.push_back(o < ValueId(grad.size()) ? grad[std::size_t(o)] : std::nullopt);
      any_grad = any_grad || gout.back().has_value();
    }
    bool any_input_needs = false;
    for (ValueId i : node.inputs) any_input_needs = any_input_needs || reaches_wrt[std::size_t(i)];
    if (!any_grad || !any_input_needs) continue;

    std::vector<Var> ins, outs;
    for (ValueId i : node.inputs) ins.push_back({&g, i});
    for (ValueId o : node.results()) outs.push_back({&g, o});
    auto gin = node.op->backward({ins, outs, gout});
    if (gin.size() != ins.size())
      fail("op ", node.op->name(), ": backward returned ", gin.size(), " gradient entries for its ", ins.size(),
           " inputs (it must return exactly one per input, nullopt where none flows)");
    grad.resize(g.num_values());
    for (std::size_t k = 0; k < ins.size(); ++k) {
      if (!gin[k] || !reaches_wrt[std::size_t(ins[k].id)]) continue;
      if (gin[k]->shape() != ins[k].shape())
        fail<ShapeError>("op ", node.op->name(), ": backward made a gradient of shape ", gin[k]->shape().str(),
                         " for input ", k, " of shape ", ins[k].shape().str());
      accumulate(ins[k].id, *gin[k]);
      grad.resize(g.num_values());
    }
  }

  g.set_phase(previous_phase);
  std::vector<std::optional<Var>> out;
  for (auto& w : wrt) {
    auto& gw = grad[std::size_t(w.id)];
    if (gw) g.value(gw->id).is_gradient = true;
    out.push_back(gw);
  }
  return out;
}

}  // namespace frugal
