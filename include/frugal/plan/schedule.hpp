#pragma once
// The order nodes run in. Capture order is already topological; the one
// change that pays on every model is to run each optimizer update as soon as
// its gradient is complete (and every reader of its parameter has run), so
// gradients die one by one instead of all living until the end of backward.
#include <queue>
#include <vector>

#include "../graph/graph.hpp"

namespace frugal::plan {

inline std::vector<NodeId> schedule(const Graph& g, const std::vector<bool>& live) {
  const NodeId n = NodeId(g.num_nodes());
  std::vector<int> pending(static_cast<std::size_t>(n), 0);
  std::vector<std::vector<NodeId>> succ(static_cast<std::size_t>(n));
  for (NodeId v = 0; v < n; ++v) {
    if (!live[std::size_t(v)]) continue;
    const Node& node = g.node(v);
    auto depend = [&](NodeId before) {
      if (before >= 0 && live[std::size_t(before)]) {
        succ[std::size_t(before)].push_back(v);
        ++pending[std::size_t(v)];
      }
    };
    for (ValueId in : node.inputs) depend(g.value(in).producer);
    for (NodeId a : node.after) depend(a);
  }
  // Ready updates first; otherwise capture order.
  auto key = [&](NodeId v) { return std::pair{g.node(v).phase == Phase::optimizer ? 0 : 1, v}; };
  auto later = [&](NodeId a, NodeId b) { return key(a) > key(b); };
  std::priority_queue<NodeId, std::vector<NodeId>, decltype(later)> ready(later);
  for (NodeId v = 0; v < n; ++v)
    if (live[std::size_t(v)] && pending[std::size_t(v)] == 0) ready.push(v);
  std::vector<NodeId> order;
  while (!ready.empty()) {
    NodeId v = ready.top();
    ready.pop();
    order.push_back(v);
    for (NodeId s : succ[std::size_t(v)])
      if (--pending[std::size_t(s)] == 0) ready.push(s);
  }
  return order;
}

}  // namespace frugal::plan
