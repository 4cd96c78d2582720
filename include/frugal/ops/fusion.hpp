#pragma once
// Operator fusion as a graph rewrite: chains of elementwise nodes (unary,
// affine, unary gradients, binary with broadcasting: bias adds, residual
// adds, scales) become one FusedElementwise node, so values read only
// inside a chain never exist in memory. It runs on the whole captured step
// (forward, backward, updates), before planning. The pass lives in ops/
// because it recognises ops by type; graph/ cannot name them.
//
// What it keeps:
// - A value some node outside the chain reads (relu's output, which
//   relu_grad reads; a residual stream; a root) stays an output of the
//   fused node. Only values read by nothing but the chain are fused away.
// - The fused node takes the id of the chain's last node, and a chain only
//   grows while no outside reader of its values comes before the node that
//   joins it: the graph stays acyclic and capture order stays a valid
//   schedule (PlanOptions::reorder off runs nodes in id order).
// - The math: each step is the unfused op's functor in the unfused order,
//   rounded to the storage type after every step as each unfused kernel
//   rounds its output, so the fused step computes the unfused bits.
#include <algorithm>

#include "batch_norm.hpp"
#include "fused_elementwise.hpp"

namespace frugal::ops {

struct FusionReport {
  int chains = 0;              // fused nodes made
  int nodes_fused = 0;         // unfused nodes they replace
  int values_removed = 0;      // intermediate values that no longer exist
  std::size_t bytes_removed = 0;
};

namespace detail_fusion {

template <class T>
struct GradTarget {
  using type = void;
};
template <class F>
struct GradTarget<GradOf<F>> {
  using type = F;
};

template <class F>
bool match(const Op& op, std::optional<FusedFn>& out) {
  if constexpr (fused_arity<F> == 1) {
    if (auto* u = dynamic_cast<const Unary<F>*>(&op)) out = u->functor();
  } else if constexpr (fused_arity<F> == 2) {
    if (dynamic_cast<const Binary<F>*>(&op)) out = F{};
  } else {
    using G = typename GradTarget<F>::type;
    if (auto* u = dynamic_cast<const UnaryGrad<G>*>(&op)) out = F{u->functor()};
  }
  return out.has_value();
}

template <std::size_t... I>
std::optional<FusedFn> match_any(const Op& op, std::index_sequence<I...>) {
  std::optional<FusedFn> out;
  (match<std::variant_alternative_t<I, FusedFn>>(op, out) || ...);
  return out;
}

}  // namespace detail_fusion

// The step a fused program uses for this op, or nullopt if it is not one
// of the elementwise ops a program can express.
inline std::optional<FusedFn> fusible_fn(const Op& op) {
  return detail_fusion::match_any(op, std::make_index_sequence<std::variant_size_v<FusedFn>>{});
}

// BatchNorm + ReLU as one node: a BatchNorm2d (training or eval) whose
// normalised output only a ReLU reads becomes the same op with a ReLU
// epilogue (BatchNorm2dTrain/Eval's `relu`), so the normalised values are
// never stored and the activation takes one pass over memory instead of
// two. The backward is untouched: relu_grad reads the ReLU's output, which
// the merged node now makes, and the batch norm backward never read the
// normalised values. The merged node takes the batch norm's place (the
// running-statistics update, captured between the two, reads its batch
// statistics); the ReLU node is left dead, reading the merged output and
// producing the old normalised value, so every value keeps one producer.
inline void fuse_batch_norm_relu(Graph& g, std::span<const ValueId> roots, FusionReport& report) {
  const NodeId N = NodeId(g.num_nodes());
  const std::vector<bool> live = g.live_nodes(roots);
  std::vector<int> readers(g.num_values(), 0);
  for (NodeId n = 0; n < N; ++n)
    if (live[std::size_t(n)])
      for (ValueId v : g.node(n).inputs) ++readers[std::size_t(v)];
  for (ValueId r : roots) ++readers[std::size_t(r)];
  std::vector<NodeId> merged_into(static_cast<std::size_t>(N), -1);
  for (NodeId r = 0; r < N; ++r) {
    if (!live[std::size_t(r)]) continue;
    const Node& relu = g.node(r);
    if (!dynamic_cast<const Unary<math::Relu>*>(relu.op.get()) || relu.inputs.size() != 1 || !relu.after.empty())
      continue;
    const ValueId v = relu.inputs[0];
    const NodeId b = g.value(v).producer;
    if (b < 0 || !live[std::size_t(b)] || readers[std::size_t(v)] != 1) continue;
    const Node& bn = g.node(b);
    if (bn.phase != relu.phase || bn.has_workspace || bn.outputs.empty() || bn.outputs[0] != v) continue;
    std::shared_ptr<const Op> op;
    if (auto* t = dynamic_cast<const BatchNorm2dTrain*>(bn.op.get()); t && !t->relu())
      op = std::make_shared<BatchNorm2dTrain>(t->eps(), true);
    else if (auto* e = dynamic_cast<const BatchNorm2dEval*>(bn.op.get()); e && !e->relu())
      op = std::make_shared<BatchNorm2dEval>(e->eps(), true);
    if (!op) continue;
    const ValueId y = relu.outputs[0];
    std::vector<ValueId> outs = bn.outputs;
    outs[0] = y;
    std::vector<ValueId> ins = bn.inputs;
    std::vector<NodeId> after = bn.after;
    std::shared_ptr<const Op> relu_op = relu.op;
    g.replace_node(b, op, std::move(ins), std::move(outs), std::move(after));
    g.replace_node(r, relu_op, {y}, {v}, {});
    merged_into[std::size_t(r)] = b;
    ++report.chains;
    report.nodes_fused += 2;
    ++report.values_removed;
    report.bytes_removed += g.value(v).meta.nbytes();
  }
  // Ordering edges to a merged ReLU now point at the node that does its work.
  for (NodeId n = 0; n < N; ++n) {
    std::vector<NodeId> after = g.node(n).after;
    bool changed = false;
    for (NodeId& a : after)
      if (a >= 0 && a < N && merged_into[std::size_t(a)] >= 0) a = merged_into[std::size_t(a)], changed = true;
    if (changed) g.set_after(n, std::move(after));
  }
}

inline FusionReport fuse_elementwise(Graph& g, std::span<const ValueId> roots) {
  const NodeId N = NodeId(g.num_nodes());
  const std::vector<bool> live = g.live_nodes(roots);
  std::vector<std::vector<NodeId>> readers(g.num_values());
  for (NodeId n = 0; n < N; ++n) {
    if (!live[std::size_t(n)]) continue;
    for (ValueId v : g.node(n).inputs)
      if (readers[std::size_t(v)].empty() || readers[std::size_t(v)].back() != n) readers[std::size_t(v)].push_back(n);
  }
  // Nodes ordered after each node beyond data flow (in-place writers after
  // the readers of what they write): they count as its readers here.
  std::vector<std::vector<NodeId>> ordered_after(static_cast<std::size_t>(N));
  for (NodeId n = 0; n < N; ++n)
    if (live[std::size_t(n)])
      for (NodeId a : g.node(n).after)
        if (a >= 0 && a < N) ordered_after[std::size_t(a)].push_back(n);
  std::vector<char> is_root(g.num_values(), 0);
  for (ValueId r : roots) is_root[std::size_t(r)] = 1;

  struct Chain {
    std::vector<NodeId> members;
    std::vector<FusedFn> fns;
    TensorMeta meta;
    Phase phase;
  };
  std::vector<Chain> chains;
  std::vector<int> chain_of(static_cast<std::size_t>(N), -1);
  auto outside_readers = [&](int ci, ValueId v, NodeId joining) {
    int count = 0;
    for (NodeId r : readers[std::size_t(v)]) count += r != joining && chain_of[std::size_t(r)] != ci;
    return count;
  };

  for (NodeId n = 0; n < N; ++n) {
    if (!live[std::size_t(n)]) continue;
    const Node& node = g.node(n);
    // Updates stay as they are: they run between the readers and writers of
    // persistent state, where a merged node could move a read past a write.
    if (node.has_workspace || node.outputs.size() != 1 || node.phase == Phase::optimizer) continue;
    auto fn = fusible_fn(*node.op);
    if (!fn) continue;
    const TensorMeta& meta = g.value(node.outputs[0]).meta;
    int joined = -1;
    for (ValueId in : node.inputs) {
      const NodeId p = g.value(in).producer;
      if (p < 0 || chain_of[std::size_t(p)] < 0) continue;
      const int ci = chain_of[std::size_t(p)];
      Chain& c = chains[std::size_t(ci)];
      if (c.meta.shape != meta.shape || c.meta.dtype != meta.dtype || c.phase != node.phase) continue;
      if (int(c.members.size()) >= FusedProgram::kMaxSteps) continue;
      bool ordered = true;
      int outputs = 1, inputs = 0;
      std::vector<ValueId> seen;
      for (NodeId m : c.members) {
        ValueId v = g.node(m).outputs[0];
        for (NodeId r : readers[std::size_t(v)])
          if (r != n && chain_of[std::size_t(r)] != ci && r < n) ordered = false;
        for (NodeId r : ordered_after[std::size_t(m)])
          if (r < n) ordered = false;
        outputs += is_root[std::size_t(v)] || outside_readers(ci, v, n) > 0;
      }
      for (NodeId m : c.members)
        for (ValueId x : g.node(m).inputs) {
          NodeId px = g.value(x).producer;
          if ((px < 0 || chain_of[std::size_t(px)] != ci) && std::find(seen.begin(), seen.end(), x) == seen.end())
            seen.push_back(x), ++inputs;
        }
      for (ValueId x : node.inputs) {
        NodeId px = g.value(x).producer;
        if ((px < 0 || chain_of[std::size_t(px)] != ci) && std::find(seen.begin(), seen.end(), x) == seen.end())
          seen.push_back(x), ++inputs;
      }
      if (!ordered || outputs > FusedProgram::kMaxOutputs || inputs > FusedProgram::kMaxInputs) continue;
      joined = ci;
      break;
    }
    if (joined < 0) {
      joined = int(chains.size());
      chains.push_back({{}, {}, meta, node.phase});
    }
    chains[std::size_t(joined)].members.push_back(n);
    chains[std::size_t(joined)].fns.push_back(*fn);
    chain_of[std::size_t(n)] = joined;
  }

  FusionReport report;
  std::vector<NodeId> moved_to(static_cast<std::size_t>(N), -1);  // a fused-away node's replacement
  for (int ci = 0; ci < int(chains.size()); ++ci) {
    const Chain& c = chains[std::size_t(ci)];
    if (c.members.size() < 2) continue;
    FusedProgram prog;
    std::vector<ValueId> inputs, outputs;
    auto in_chain = [&](ValueId v) {
      NodeId p = g.value(v).producer;
      return p >= 0 && chain_of[std::size_t(p)] == ci;
    };
    for (NodeId m : c.members)
      for (ValueId x : g.node(m).inputs)
        if (!in_chain(x) && std::find(inputs.begin(), inputs.end(), x) == inputs.end()) inputs.push_back(x);
    prog.inputs = int(inputs.size());
    std::vector<ValueId> step_value;
    for (std::size_t s = 0; s < c.members.size(); ++s) {
      const Node& m = g.node(c.members[s]);
      FusedStep st{c.fns[s]};
      for (std::size_t k = 0; k < m.inputs.size(); ++k) {
        ValueId x = m.inputs[k];
        auto it = std::find(step_value.begin(), step_value.end(), x);
        st.args[k] = it != step_value.end() ? prog.inputs + int(it - step_value.begin())
                                            : int(std::find(inputs.begin(), inputs.end(), x) - inputs.begin());
      }
      prog.steps.push_back(st);
      step_value.push_back(m.outputs[0]);
    }
    for (std::size_t s = 0; s < c.members.size(); ++s) {
      ValueId v = step_value[s];
      if (is_root[std::size_t(v)] || outside_readers(ci, v, -1) > 0) {
        prog.outputs.push_back(prog.inputs + int(s));
        outputs.push_back(v);
      } else {
        ++report.values_removed;
        report.bytes_removed += g.value(v).meta.nbytes();
      }
    }
    if (outputs.empty()) continue;  // read by nothing at all: the chain is dead (cannot happen for live nodes)
    auto op = std::make_shared<FusedElementwise>(std::move(prog));
    const NodeId last = c.members.back();
    // The kept values move to the fused node; the other members keep a
    // fresh output nobody reads, so they are dead code.
    std::vector<NodeId> after;
    for (NodeId m : c.members) {
      for (NodeId a : g.node(m).after)
        if (chain_of[std::size_t(a)] != ci && std::find(after.begin(), after.end(), a) == after.end()) after.push_back(a);
      if (m != last) {
        moved_to[std::size_t(m)] = last;
        if (std::find(outputs.begin(), outputs.end(), g.node(m).outputs[0]) != outputs.end()) g.detach_output(m, 0);
      }
    }
    g.replace_node(last, op, inputs, outputs, after);
    ++report.chains;
    report.nodes_fused += int(c.members.size());
  }
  // Ordering edges to a fused-away node now point at its replacement.
  for (NodeId n = 0; n < N; ++n) {
    if (!live[std::size_t(n)]) continue;
    std::vector<NodeId> after = g.node(n).after;
    bool changed = false;
    for (NodeId& a : after)
      if (a >= 0 && a < N && moved_to[std::size_t(a)] >= 0) a = moved_to[std::size_t(a)], changed = true;
    if (!changed) continue;
    std::sort(after.begin(), after.end());
    after.erase(std::unique(after.begin(), after.end()), after.end());
    after.erase(std::remove(after.begin(), after.end(), n), after.end());
    g.set_after(n, std::move(after));
  }
  return report;
}

}  // namespace frugal::ops
