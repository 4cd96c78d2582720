#pragma once
#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <utility>
#include <vector>

#include "kernel_queries.hpp"
#include "op.hpp"
#include "value.hpp"

namespace frugal {

// Which part of the training step a node belongs to, for plans and reports.
enum class Phase : std::uint8_t { forward, backward, optimizer };

inline const char* phase_name(Phase p) {
  switch (p) {
    case Phase::forward: return "forward";
    case Phase::backward: return "backward";
    case Phase::optimizer: return "optimizer";
  }
  return "?";
}

struct Node {
  std::shared_ptr<const Op> op;
  std::vector<ValueId> inputs;
  std::vector<ValueId> outputs;
  std::vector<NodeId> after;  // ordering edges beyond data flow (readers before an in-place writer)
  Phase phase = Phase::forward;
  bool has_workspace = false;  // the last output is the op's scratch space
  // Inputs whose memory the output may take over when they die here: the
  // op's candidates (Op::inplace_inputs) that the backend's kernel accepts.
  std::vector<int> inplace;
  // The outputs the op computes, without its scratch space.
  std::span<const ValueId> results() const {
    return {outputs.data(), outputs.size() - (has_workspace ? 1 : 0)};
  }
};

// The captured training step: a static DAG of nodes over values. Nodes are
// appended in a valid topological order, which is the default schedule.
class Graph {
 public:
  Graph() = default;
  // A graph for the backend these queries come from: every node added gets
  // the scratch its kernel there needs, and that kernel's in-place choices.
  explicit Graph(KernelQueries q) : queries_(std::move(q)) {}
  const KernelQueries& kernel_queries() const { return queries_; }

  ValueId add_input(TensorMeta meta, std::string name) {
    return add_value({.meta = std::move(meta), .kind = ValueKind::input, .name = std::move(name)});
  }

  // A persistent value backed by `storage`. The same storage maps to the same
  // value however often a model reads it.
  ValueId add_persistent(const Tensor& storage, ValueKind kind, std::string name);

  // Where a parameter's readers get its value when not from its tensor (ZeRO
  // stage 3 gathers it from the ranks' shards): asked at the parameter's
  // first read, during capture; a value id, or kNoValue to bind the tensor.
  // Later reads of the same tensor get the same value.
  using ParameterSource = std::function<ValueId(Graph&, const Tensor&, const std::string&)>;
  void set_parameter_source(ParameterSource source) { parameter_source_ = std::move(source); }

  // Appends a node; shape inference runs here, so a bad shape fails at
  // capture with the op's name and the shapes it was given.
  std::vector<ValueId> apply(std::shared_ptr<const Op> op, std::vector<ValueId> inputs) {
    return apply_impl(std::move(op), std::move(inputs), nullptr);
  }

 private:
  // Compiled once per program (graph/units/graph.hpp): every op a model
  // applies comes through here.
  std::vector<ValueId> apply_impl(std::shared_ptr<const Op> op, std::vector<ValueId> inputs,
                                  const std::vector<NodeId>* after);

 public:

  // Appends a node ordered after `after` (beyond its data inputs) instead of
  // after the readers of what it mutates: for planner rewrites (transfers,
  // recomputations), which know the order they need.
  std::vector<ValueId> apply_ordered(std::shared_ptr<const Op> op, std::vector<ValueId> inputs, Phase phase,
                                     std::vector<NodeId> after) {
    Phase previous = std::exchange(phase_, phase);
    auto out = apply_impl(std::move(op), std::move(inputs), &after);
    phase_ = previous;
    return out;
  }
  NodeId last_node() const { return NodeId(nodes_.size()) - 1; }
  // Points input `slot` of node n at another value (a planner rewrite: a
  // reader takes a fetched or recomputed copy instead of the original).
  void set_input(NodeId n, std::size_t slot, ValueId v) {
    ValueId& in = nodes_.at(std::size_t(n)).inputs.at(slot);
    const ValueId old = std::exchange(in, v);
    drop_reader_unless_read(old, n);
    add_reader(v, n);
  }

  // Puts `op` in node n's place, reading `inputs` and producing the existing
  // values `outputs` (a graph pass merging nodes: ops/fusion.hpp). Each
  // output's producer becomes n; the node's in-place choices are asked of
  // the backend again. The caller keeps the graph acyclic and gives the
  // nodes that produced these outputs before new outputs of their own.
  void replace_node(NodeId n, std::shared_ptr<const Op> op, std::vector<ValueId> inputs,
                    std::vector<ValueId> outputs, std::vector<NodeId> after) {
    Node& node = nodes_.at(std::size_t(n));
    node.op = std::move(op);
    std::vector<ValueId> old = std::exchange(node.inputs, std::move(inputs));
    for (ValueId v : old) drop_reader_unless_read(v, n);
    for (ValueId v : node.inputs) add_reader(v, n);
    node.outputs = std::move(outputs);
    node.after = std::move(after);
    node.has_workspace = false;
    node.inplace = queries_.inplace_inputs ? queries_.inplace_inputs(*node.op) : node.op->inplace_inputs();
    for (ValueId o : node.outputs) values_.at(std::size_t(o)).producer = n;
  }
  // Puts `op` in node n's place with the node's inputs, outputs, scratch
  // and in-place choices as they are: an op that computes what the old one
  // did, somewhere else (ops::HostUpdate runs an update on the host).
  void wrap_op(NodeId n, std::shared_ptr<const Op> op) { nodes_.at(std::size_t(n)).op = std::move(op); }
  // Gives output `slot` of node n a new value of the same meta, which nothing
  // reads: the node's old output has moved to another producer.
  void detach_output(NodeId n, std::size_t slot) {
    ValueId old = nodes_.at(std::size_t(n)).outputs.at(slot);
    Value fresh{.meta = values_.at(std::size_t(old)).meta, .kind = ValueKind::activation, .producer = n};
    nodes_[std::size_t(n)].outputs[slot] = add_value(std::move(fresh));
  }
  // Node n runs after `before` as well as after its inputs' producers.
  void set_after(NodeId n, std::vector<NodeId> before) { nodes_.at(std::size_t(n)).after = std::move(before); }

  // Nodes appended from now on belong to phase p.
  Phase set_phase(Phase p) { return std::exchange(phase_, p); }

  const Value& value(ValueId id) const { return values_.at(std::size_t(id)); }
  Value& value(ValueId id) { return values_.at(std::size_t(id)); }
  const Node& node(NodeId id) const { return nodes_.at(std::size_t(id)); }
  const std::vector<Value>& values() const { return values_; }
  const std::vector<Node>& nodes() const { return nodes_; }
  std::size_t num_values() const { return values_.size(); }
  std::size_t num_nodes() const { return nodes_.size(); }

  // The nodes that read v, in node order. Kept as nodes are added and
  // rewired: a capture asks it for every op that updates a value in place
  // (each optimizer update), which a walk over all nodes made quadratic.
  const std::vector<NodeId>& consumers(ValueId v) const { return readers_.at(std::size_t(v)); }

  std::vector<ValueId> values_of_kind(ValueKind k) const {
    std::vector<ValueId> out;
    for (ValueId v = 0; v < ValueId(values_.size()); ++v)
      if (values_[std::size_t(v)].kind == k) out.push_back(v);
    return out;
  }

  // A node that was captured but turned out unused (a forward value whose
  // gradient nothing needs, say) stays in the graph; the planner skips nodes
  // that nothing live depends on.
  std::vector<bool> live_nodes(std::span<const ValueId> roots) const {
    std::vector<bool> live_value(values_.size(), false), live(nodes_.size(), false);
    for (ValueId r : roots) live_value[std::size_t(r)] = true;
    for (NodeId n = NodeId(nodes_.size()) - 1; n >= 0; --n) {
      const Node& node = nodes_[std::size_t(n)];
      bool keep = !node.op->mutated_inputs().empty();
      for (ValueId o : node.outputs) keep = keep || live_value[std::size_t(o)];
      if (!keep) continue;
      live[std::size_t(n)] = true;
      for (ValueId i : node.inputs) live_value[std::size_t(i)] = true;
    }
    return live;
  }

 private:
  ValueId add_value(Value v) {
    values_.push_back(std::move(v));
    readers_.emplace_back();
    return ValueId(values_.size() - 1);
  }
  void add_reader(ValueId v, NodeId n) {
    std::vector<NodeId>& r = readers_.at(std::size_t(v));
    auto at = std::lower_bound(r.begin(), r.end(), n);
    if (at == r.end() || *at != n) r.insert(at, n);
  }
  void drop_reader_unless_read(ValueId v, NodeId n) {
    const std::vector<ValueId>& in = nodes_[std::size_t(n)].inputs;
    if (std::find(in.begin(), in.end(), v) != in.end()) return;
    std::vector<NodeId>& r = readers_.at(std::size_t(v));
    auto at = std::lower_bound(r.begin(), r.end(), n);
    if (at != r.end() && *at == n) r.erase(at);
  }
  std::vector<Value> values_;
  std::vector<Node> nodes_;
  std::vector<std::vector<NodeId>> readers_;  // per value: the nodes reading it, ascending
  std::map<const void*, ValueId> by_storage_;
  ParameterSource parameter_source_;
  KernelQueries queries_;
  Phase phase_ = Phase::forward;
};

}  // namespace frugal
