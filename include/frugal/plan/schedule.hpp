#pragma once
// The order nodes run in. Capture order is already topological; the one
// change that pays on every model is to run each optimizer update as soon as
// its gradient is complete (and every reader of its parameter has run), so
// gradients die one by one instead of all living until the end of backward.
//
// A gradient's collective run beside compute (ops::CollectiveStart) starts
// as soon as the gradient is complete; its dones are held
// back until starting another would put more than `most_in_flight`
// collectives in flight, or nothing else can run: the backward computes the
// next gradients while it communicates, and at most `most_in_flight`
// buckets of gradients (and their scratch) wait on the communication.
#include <deque>
#include <queue>
#include <utility>
#include <vector>

#include "../graph/graph.hpp"
#include "../ops/collective.hpp"

namespace frugal::plan {

inline std::vector<NodeId> schedule(const Graph& g, const std::vector<bool>& live, int most_in_flight = 2) {
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
  // Ready updates and collectives started beside compute first; otherwise
  // capture order. (A collective run in place that does not shrink what it
  // reads (an all-reduce) keeps its captured place,
  // after the backward: in the backward its scratch would add to the
  // activations' peak, which a budget that binds cannot afford: the gpt
  // sample's least under ZeRO 1 rises from 8.1 to 10.9 MiB. A forward
  // collective, ZeRO 3's gather of a parameter, keeps its place at the
  // parameter's first read; started beside compute, it is ordered after the
  // gather before it is done (Node::after), so it starts there and runs
  // while that earlier parameter's readers compute: a prefetch.)
  // A collective in place that shrinks what it reads (ZeRO 2-3's
  // reduce-scatter: the shard of a whole gradient) runs as soon as its
  // gradient is complete too: after the backward, every layer's whole
  // gradient would be alive at once (on ZeRO-Infinity's 0.5T at 4 layers,
  // 16 V100s, the budget solve then swapped them to the host and back: 2.7
  // GB each for the MLP weights; bench/RESULTS.md).
  auto shrinks = [&](const Node& node) {
    if (!node.op->is_collective() || dynamic_cast<const ops::CollectiveDone*>(node.op.get())) return false;
    std::size_t in = 0, out = 0;
    for (ValueId v : node.inputs)
      if (!is_persistent(g.value(v).kind)) in += g.value(v).meta.nbytes();
    for (ValueId v : node.outputs)
      if (!g.value(v).is_workspace) out += g.value(v).meta.nbytes();  // its scratch lives there only
    return out < in;
  };
  // Once per node: the ready queue's comparisons read it many times each.
  std::vector<char> urgent(static_cast<std::size_t>(n), 0);
  for (NodeId v = 0; v < n; ++v) {
    if (!live[std::size_t(v)]) continue;
    const Node& node = g.node(v);
    urgent[std::size_t(v)] = node.phase == Phase::optimizer ||
                             dynamic_cast<const ops::CollectiveStart*>(node.op.get()) != nullptr || shrinks(node);
  }
  auto key = [&](NodeId v) { return std::pair{urgent[std::size_t(v)] ? 0 : 1, v}; };
  auto later = [&](NodeId a, NodeId b) { return key(a) > key(b); };
  auto is_done = [&](NodeId v) { return dynamic_cast<const ops::CollectiveDone*>(g.node(v).op.get()) != nullptr; };
  auto is_start = [&](NodeId v) { return dynamic_cast<const ops::CollectiveStart*>(g.node(v).op.get()) != nullptr; };
  std::priority_queue<NodeId, std::vector<NodeId>, decltype(later)> ready(later);
  std::deque<NodeId> in_flight;                  // collectives started, not yet waited, in the order they started
  std::vector<std::vector<NodeId>> dones_of(static_cast<std::size_t>(n));  // by start: its dones, held back
  std::vector<NodeId> order;
  auto run = [&](NodeId v) {
    order.push_back(v);
    if (is_start(v)) in_flight.push_back(v);
    for (NodeId s : succ[std::size_t(v)])
      if (--pending[std::size_t(s)] == 0) {
        if (is_done(s)) dones_of[std::size_t(g.value(g.node(s).inputs[0]).producer)].push_back(s);
        else ready.push(s);
      }
  };
  auto wait_oldest = [&] {
    const NodeId s = in_flight.front();
    in_flight.pop_front();
    for (NodeId d : std::exchange(dones_of[std::size_t(s)], {})) run(d);
  };
  for (NodeId v = 0; v < n; ++v)
    if (live[std::size_t(v)] && pending[std::size_t(v)] == 0) ready.push(v);
  while (!ready.empty() || !in_flight.empty()) {
    if (ready.empty()) {
      wait_oldest();
      continue;
    }
    const NodeId v = ready.top();
    ready.pop();
    if (g.node(v).op->is_collective()) {
      // One run at once waits for every collective before it anyway.
      const std::size_t keep = is_start(v) ? std::size_t(std::max(most_in_flight, 1) - 1) : 0;
      while (in_flight.size() > keep) wait_oldest();
    }
    run(v);
  }
  return order;
}

}  // namespace frugal::plan
