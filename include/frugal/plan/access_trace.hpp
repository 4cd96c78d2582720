#pragma once
// The tensor accesses of planned steps, in schedule order, as a trace a
// memory-manager simulation replays (plan/paging_sim.hpp): each op's time
// and the tensors it reads and writes, each tensor's bytes, and where each
// activation dies. Several steps (say, one per sequence length) append into
// one trace; persistents (parameters, optimizer state, buffers) are the
// same tensors in every step, matched by name, and activations are new in
// each.
#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "../core/error.hpp"
#include "cost_model.hpp"
#include "plan.hpp"
#include "report.hpp"

namespace frugal::plan {

struct TraceTensor {
  std::size_t bytes = 0;
  bool persistent = false;  // lives across steps (parameters, optimizer state, buffers)
  bool from_host = false;   // starts on the host: persistents and the step's inputs; else made by its first writer
  std::string name;
};

struct TraceOp {
  double ms = 0;  // compute time
  std::vector<int> reads, writes;
  std::vector<int> dies;  // activations read or written here for the last time
  int step = 0;           // which appended step the op belongs to
};

struct AccessTrace {
  std::vector<TraceTensor> tensors;
  std::vector<TraceOp> ops;
  int steps = 0;

  // The bytes op i reads and writes, each tensor once.
  std::size_t op_bytes(std::size_t i) const {
    std::vector<int> seen;
    std::size_t need = 0;
    for (const auto* list : {&ops[i].reads, &ops[i].writes})
      for (int t : *list)
        if (std::find(seen.begin(), seen.end(), t) == seen.end()) {
          seen.push_back(t);
          need += tensors[std::size_t(t)].bytes;
        }
    return need;
  }
  // The op that reads and writes the most bytes (the first such), and
  // those bytes: what whole-tensor management needs on the device at least.
  std::size_t largest_op() const {
    std::size_t at = 0, most = 0;
    for (std::size_t i = 0; i < ops.size(); ++i)
      if (const std::size_t b = op_bytes(i); b > most) most = b, at = i;
    return at;
  }
  std::size_t largest_op_bytes() const { return ops.empty() ? 0 : op_bytes(largest_op()); }

  // The most bytes live at once: every persistent touched so far plus the
  // live activations. What the device needs to run the trace with no
  // transfer at all.
  std::size_t footprint() const {
    std::vector<char> seen(tensors.size(), 0);
    std::size_t persistent = 0, live = 0, most = 0;
    for (const TraceOp& op : ops) {
      for (const auto* list : {&op.reads, &op.writes})
        for (int t : *list)
          if (!seen[std::size_t(t)]) {
            seen[std::size_t(t)] = 1;
            (tensors[std::size_t(t)].persistent ? persistent : live) += tensors[std::size_t(t)].bytes;
          }
      most = std::max(most, persistent + live);
      for (int t : op.dies) live -= tensors[std::size_t(t)].bytes;
    }
    return most;
  }
};

// What a node writes: its outputs and scratch, and the inputs it updates
// in place (an optimizer's parameters and state: written, so evicting them
// later costs a write-back).
inline std::vector<ValueId> written_by(const Node& n) {
  std::vector<ValueId> written(n.outputs.begin(), n.outputs.end());
  for (int k : n.op->mutated_inputs()) written.push_back(n.inputs[std::size_t(k)]);
  return written;
}

// Appends one step: the graph as planned with no budget (plan_unconstrained
// or an unconstrained compile), ops priced by `cm`. Values are whole
// tensors (a view and its base are one allocation only in the arena, so
// each is traced as its own). Every activation dies at its last access, a
// step's loss too (its copy to the caller is not traced; PagedStep::trace()
// keeps the results to the step's end, as that manager does).
inline void append_step(AccessTrace& trace, const Graph& g, const Plan& p, const CostModel& cm) {
  std::map<std::string, int> by_name;
  for (std::size_t i = 0; i < trace.tensors.size(); ++i)
    if (trace.tensors[i].persistent) by_name[trace.tensors[i].name] = int(i);
  std::vector<int> id(g.num_values(), -1);
  auto tensor_of = [&](ValueId v) {
    if (id[std::size_t(v)] >= 0) return id[std::size_t(v)];
    const Value& val = g.value(v);
    const bool persistent = is_persistent(val.kind);
    const std::string name = cat(describe_value(g, v), "#", persistent ? 0 : trace.steps);
    if (persistent) {
      if (auto it = by_name.find(name); it != by_name.end()) return id[std::size_t(v)] = it->second;
    }
    trace.tensors.push_back({val.meta.nbytes(), persistent, persistent || val.producer < 0, name});
    id[std::size_t(v)] = int(trace.tensors.size()) - 1;
    if (persistent) by_name[name] = id[std::size_t(v)];
    return id[std::size_t(v)];
  };
  const std::size_t first = trace.ops.size();
  std::vector<int> last_use(g.num_values(), -1);
  for (std::size_t t = 0; t < p.schedule.size(); ++t) {
    const Node& n = g.node(p.schedule[t]);
    TraceOp op;
    op.ms = cm.op_ms(g, p.schedule[t]);
    op.step = trace.steps;
    for (ValueId v : n.inputs) {
      op.reads.push_back(tensor_of(v));
      last_use[std::size_t(v)] = int(t);
    }
    for (ValueId v : written_by(n)) {
      op.writes.push_back(tensor_of(v));
      last_use[std::size_t(v)] = int(t);
    }
    trace.ops.push_back(std::move(op));
  }
  for (ValueId v = 0; v < ValueId(g.num_values()); ++v)
    if (last_use[std::size_t(v)] >= 0 && !is_persistent(g.value(v).kind))
      trace.ops[first + std::size_t(last_use[std::size_t(v)])].dies.push_back(id[std::size_t(v)]);
  ++trace.steps;
}

}  // namespace frugal::plan
