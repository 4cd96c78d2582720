#pragma once
// The order nodes run in. Capture order is already topological; the one
// change that pays on every model is to run each optimizer update as soon as
// its gradient is complete (and every reader of its parameter has run), so
// gradients die one by one instead of all living until the end of backward.
//
// A gradient's collective likewise runs as soon as the gradient is complete.
// Where it runs beside compute (ops::CollectiveStart), its done is held back
// until `in_flight` collectives have started since, or nothing else can
// run: the backward computes the next gradients while it communicates, and
// at most `in_flight` gradients and scratch buffers wait on the
// communication at once.
#include <deque>
#include <queue>
#include <vector>

#include "../graph/graph.hpp"
#include "../ops/collective.hpp"

namespace frugal::plan {

inline std::vector<NodeId> schedule(const Graph& g, const std::vector<bool>& live, int in_flight = 2) {
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
  // Ready updates and gradient collectives first; otherwise capture order.
  // (A forward collective, ZeRO 3's gather of a parameter, keeps its place
  // at the parameter's first read: run early, it would hold the whole
  // parameter for longer.)
  auto urgent = [&](NodeId v) {
    const Node& node = g.node(v);
    return node.phase == Phase::optimizer || (node.phase == Phase::backward && node.op->is_collective());
  };
  auto key = [&](NodeId v) { return std::pair{urgent(v) ? 0 : 1, v}; };
  auto later = [&](NodeId a, NodeId b) { return key(a) > key(b); };
  auto is_done = [&](NodeId v) { return dynamic_cast<const ops::CollectiveDone*>(g.node(v).op.get()) != nullptr; };
  std::priority_queue<NodeId, std::vector<NodeId>, decltype(later)> ready(later);
  std::deque<NodeId> held;  // dones of collectives in flight, in the order they started
  std::vector<NodeId> order;
  auto run = [&](NodeId v) {
    order.push_back(v);
    for (NodeId s : succ[std::size_t(v)])
      if (--pending[std::size_t(s)] == 0) {
        if (is_done(s)) held.push_back(s);
        else ready.push(s);
      }
  };
  for (NodeId v = 0; v < n; ++v)
    if (live[std::size_t(v)] && pending[std::size_t(v)] == 0) ready.push(v);
  while (!ready.empty() || !held.empty()) {
    if (ready.empty()) {
      const NodeId d = held.front();
      held.pop_front();
      run(d);
      continue;
    }
    const NodeId v = ready.top();
    ready.pop();
    if (g.node(v).op->is_collective()) {
      // One run at once waits for every collective before it anyway.
      const bool started = dynamic_cast<const ops::CollectiveStart*>(g.node(v).op.get()) != nullptr;
      const std::size_t keep = started ? std::size_t(std::max(in_flight, 1) - 1) : 0;
      while (held.size() > keep) {
        const NodeId d = held.front();
        held.pop_front();
        run(d);
      }
    }
    run(v);
  }
  return order;
}

}  // namespace frugal::plan
