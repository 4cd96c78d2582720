#pragma once
// Optimizer offload (ZeRO-Offload) in the planner's terms: which reads of a
// value need it on the device, which optimizer state may live on the host
// with its update run there (ops::HostUpdate), and the pass that puts all
// of it there when CompileOptions::offload_optimizer pins it.
#include <algorithm>
#include <memory>
#include <span>
#include <vector>

#include "../graph/graph.hpp"
#include "../ops/host_update.hpp"

namespace frugal::plan {

// Whether node n's read of its input i needs the value on the device: not
// a transfer's (it reads the value's home), nor a host update's read of
// state it keeps on the host.
inline bool reads_on_device(const Node& n, std::size_t i) {
  if (n.op->as_transfer()) return false;
  auto* hu = dynamic_cast<const ops::HostUpdate*>(n.op.get());
  return !hu || !hu->reads_on_host(i);
}

// Persistents that no op in `schedule` needs on the device: their home is
// the host (only transfers stage them, or host updates read them in place).
inline std::vector<char> persistents_on_host(const Graph& g, std::span<const NodeId> schedule) {
  std::vector<char> on_device(g.num_values(), 0), read(g.num_values(), 0);
  for (NodeId n : schedule) {
    const Node& node = g.node(n);
    for (std::size_t i = 0; i < node.inputs.size(); ++i) {
      read[std::size_t(node.inputs[i])] = 1;
      if (reads_on_device(node, i)) on_device[std::size_t(node.inputs[i])] = 1;
    }
  }
  std::vector<char> home(g.num_values(), 0);
  for (ValueId v = 0; v < ValueId(g.num_values()); ++v)
    home[std::size_t(v)] = is_persistent(g.value(v).kind) && read[std::size_t(v)] && !on_device[std::size_t(v)];
  return home;
}

// Whether node n's input i is optimizer state its parameter update could
// read and write on the host: n is in the optimizer phase, updates a
// parameter in place (its input 0), and updates input i, a state value.
inline bool state_updatable_on_host(const Graph& g, const Node& n, std::size_t i) {
  if (n.phase != Phase::optimizer || n.op->as_transfer() || n.op->is_collective() || i == 0) return false;
  if (g.value(n.inputs[i]).kind != ValueKind::state || g.value(n.inputs[0]).kind != ValueKind::parameter) return false;
  const auto mutated = n.op->mutated_inputs();
  auto writes = [&](std::size_t k) { return std::find(mutated.begin(), mutated.end(), int(k)) != mutated.end(); };
  return writes(0) && writes(i);
}

// Runs, on the host, the update of every state value in `values` (by id,
// nonzero: move it there; ids past its end, a rewrite's own values, are
// not moved): each node of `nodes` that reads such a value
// becomes an ops::HostUpdate of its op keeping those inputs on the host.
// Every read of a moved value must be one state_updatable_on_host allowed
// (in the graph before a budget rewrite, which may since have staged the
// parameter); ops::HostUpdate refuses an input its op does not update.
inline void run_updates_on_host(Graph& g, std::span<const NodeId> nodes, const std::vector<char>& values) {
  for (NodeId n : nodes) {
    const Node& node = g.node(n);
    std::vector<int> host;
    for (std::size_t i = 0; i < node.inputs.size(); ++i)
      if (std::size_t(node.inputs[i]) < values.size() && values[std::size_t(node.inputs[i])]) host.push_back(int(i));
    if (host.empty()) continue;
    std::shared_ptr<const Op> op = node.op;
    if (auto* hu = dynamic_cast<const ops::HostUpdate*>(op.get())) {  // more of its state goes there
      host.insert(host.end(), hu->host_inputs().begin(), hu->host_inputs().end());
      op = hu->inner_ptr();
    }
    g.wrap_op(n, std::make_shared<ops::HostUpdate>(std::move(op), std::move(host)));
  }
}

// The optimizer state of the whole step on the host (CompileOptions::
// offload_optimizer = true): every state value that only parameter
// updates read, with those updates run there (Plan::offloaded_by_kind
// then counts its bytes).
inline void offload_optimizer_state(Graph& g) {
  std::vector<char> movable(g.num_values(), 0), seen(g.num_values(), 0);
  for (const Node& n : g.nodes())
    for (std::size_t i = 0; i < n.inputs.size(); ++i) {
      const ValueId v = n.inputs[i];
      if (g.value(v).kind != ValueKind::state) continue;
      const bool ok = state_updatable_on_host(g, n, i);
      movable[std::size_t(v)] = seen[std::size_t(v)] ? movable[std::size_t(v)] && ok : ok;
      seen[std::size_t(v)] = 1;
    }
  std::vector<NodeId> all(g.num_nodes());
  for (NodeId n = 0; n < NodeId(g.num_nodes()); ++n) all[std::size_t(n)] = n;
  run_updates_on_host(g, all, movable);
}

}  // namespace frugal::plan
