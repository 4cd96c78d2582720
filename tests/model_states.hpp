#pragma once
// What one rank holds of the model states, as the ZeRO paper counts them
// (§3: parameters, gradients, optimizer state): its persistent parameters
// and optimizer state, and the gradients its update reads -- what the
// gradients' collectives leave it, whole (all-reduce) or its shard
// (reduce-scatter). The planner's side of the published checks
// (tests/cluster_plan_test.cpp, bench/published_checks.cpp); the papers'
// side is bench/published/zero_formulas.hpp.
#include <frugal/frugal.hpp>

namespace frugal::test_model_states {

struct ModelStates {
  double parameters = 0, optimizer_state = 0, gradients = 0;
  double total() const { return parameters + optimizer_state + gradients; }
};

inline ModelStates of(const PlannedStep& ps) {
  auto kind = [&](const char* k) {
    auto it = ps.plan.persistent_by_kind.find(k);
    return it == ps.plan.persistent_by_kind.end() ? 0.0 : double(it->second);
  };
  ModelStates s;
  s.parameters = kind("parameters");
  s.optimizer_state = kind("optimizer state");
  for (NodeId id : ps.plan.schedule) {
    const Node& node = ps.graph->node(id);
    std::string name = node.op->name();
    if (name.ends_with(".start")) name.resize(name.size() - 6);
    if (name != "all_reduce_mean" && name != "reduce_scatter_mean") continue;
    for (ValueId v : node.outputs) {
      const Value& val = ps.graph->value(v);
      if (!val.is_workspace && val.meta.shape.numel() > 1) s.gradients += double(val.meta.nbytes());
    }
  }
  return s;
}

}  // namespace frugal::test_model_states
