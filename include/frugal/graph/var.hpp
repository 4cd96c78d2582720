#pragma once
#include <memory>
#include <vector>

#include "graph.hpp"

namespace frugal {

// A symbolic tensor during capture: a value of a Graph. Arithmetic on Vars
// appends nodes to that graph; nothing is computed until the step runs.
struct Var {
  Graph* graph = nullptr;
  ValueId id = kNoValue;

  // By value: appending nodes may move the graph's storage, so a reference
  // held across an op call would dangle.
  TensorMeta meta() const { return graph->value(id).meta; }
  Shape shape() const { return graph->value(id).meta.shape; }
  DType dtype() const { return graph->value(id).meta.dtype; }
  int rank() const { return graph->value(id).meta.shape.rank(); }
  std::int64_t dim(int axis) const { return graph->value(id).meta.shape.dim(axis); }
};

// Applies `op` to `inputs` (all in one graph) and returns its outputs.
inline std::vector<Var> apply(std::shared_ptr<const Op> op, std::vector<Var> inputs) {
  if (inputs.empty()) fail("op ", op->name(), " was applied to no inputs");
  Graph* g = inputs[0].graph;
  std::vector<ValueId> ids;
  for (auto& v : inputs) {
    if (v.graph != g || !g)
      fail("op ", op->name(), ": its inputs belong to different graphs (a Var from another capture was reused)");
    ids.push_back(v.id);
  }
  std::vector<Var> out;
  for (ValueId id : g->apply(std::move(op), std::move(ids))) out.push_back({g, id});
  return out;
}

template <class OpT, class... Args>
Var apply1(std::vector<Var> inputs, Args&&... args) {
  return frugal::apply(std::make_shared<OpT>(std::forward<Args>(args)...), std::move(inputs)).at(0);
}

inline std::vector<std::optional<Var>> Op::backward(const BackwardArgs&) const {
  fail("op ", name(), " has no backward: it cannot sit between the loss and a parameter");
}

}  // namespace frugal
