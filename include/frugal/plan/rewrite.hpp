#pragma once
// Turns a solved budget problem into graph changes: transfer nodes and
// recomputations, in a schedule that interleaves them with the original ops.
// The rewritten graph is planned like any other (liveness, offsets, the
// verifier), which is what makes its memory exact: the planner's usual
// machinery sees the evicted value die at its eviction and the fetched or
// recomputed copy born just before its reader.
//
// Readers after an evicted window read the new copy; readers of a view of it
// (a reshape) read a clone of that view over the new copy. A recomputation
// is a second node sharing the original op, so it computes the same bits
// (random ops key their streams by op and step, not by node).
#include <map>
#include <memory>

#include "budget_build.hpp"
#include "report.hpp"

namespace frugal::plan {

// One decision of the budget solver, as the plan records it.
struct BudgetDecision {
  ValueId value = kNoValue;
  Choice choice = Choice::keep;
  std::size_t bytes = 0;
  int from = 0, to = 0;  // the window, in positions of the unconstrained schedule
  bool wraps = false;    // between steps (a persistent kept on the host)
  double cost_ms = 0;
  std::string reason;
};

struct Rewritten {
  std::shared_ptr<Graph> graph;
  std::vector<NodeId> schedule;
  int transfer_slots = 0;
  std::vector<BudgetDecision> decisions;
};

inline Rewritten rewrite_for_budget(const Graph& g, const std::vector<NodeId>& schedule, const BudgetProblem& p,
                                    const std::vector<int>& choice) {
  const int T = int(schedule.size());
  Rewritten r;
  r.graph = std::make_shared<Graph>(g);
  Graph& h = *r.graph;

  enum Act : std::uint8_t { fetch_start, fetch_done, recompute, evict_start, drop, write_back_start, evict_done, write_back_done };
  // Actions by position: before the op runs (fetches, recomputations) and
  // after it (evictions, write backs), each in this order.
  std::vector<std::vector<std::pair<Act, int>>> before(static_cast<std::size_t>(T)), after(static_cast<std::size_t>(T));
  std::vector<char> offloaded(g.num_values(), 0);  // persistents whose home is the host
  std::vector<char> updated_on_host(g.num_values(), 0);  // optimizer state read there by its update
  for (std::size_t c = 0; c < p.candidates.size(); ++c) {
    if (choice[c] == 0) continue;
    const Candidate& cand = p.candidates[c];
    const Option& o = cand.options[std::size_t(choice[c])];
    const Value& val = g.value(cand.value);
    const bool persistent = is_persistent(val.kind);
    r.decisions.push_back({cand.value, o.choice, cand.bytes, cand.before, cand.after, cand.wraps, o.cost_ms, o.reason});
    const int ci = int(c);
    if (o.choice == Choice::host_update) {  // no copy: the update reads it where it lives
      updated_on_host[std::size_t(cand.value)] = 1;
      continue;
    }
    if (o.choice == Choice::recompute) {  // before its reader, or earlier for a deeper recomputation
      before[std::size_t(o.in_start >= 0 ? o.in_start : cand.after)].push_back({recompute, ci});
      continue;
    }
    before[std::size_t(o.in_start)].push_back({fetch_start, ci});
    before[std::size_t(o.in_done >= 0 ? o.in_done : cand.after)].push_back({fetch_done, ci});
    if (persistent && cand.wraps) {
      offloaded[std::size_t(cand.value)] = 1;
      bool dirty = false;
      for (int t = 0; t < T; ++t)
        for (int mi : g.node(schedule[std::size_t(t)]).op->mutated_inputs())
          if (g.node(schedule[std::size_t(t)]).inputs[std::size_t(mi)] == cand.value) dirty = true;
      if (dirty) {  // its update changed the staged copy: return it home
        after[std::size_t(cand.before)].push_back({write_back_start, ci});
        after[std::size_t(o.out_done)].push_back({write_back_done, ci});
      }
    } else if (persistent) {
      after[std::size_t(cand.before)].push_back({drop, ci});
    } else {
      after[std::size_t(cand.before)].push_back({evict_start, ci});
      after[std::size_t(o.out_done)].push_back({evict_done, ci});
    }
  }
  // Recomputations before one position run in the order of the ops they
  // repeat, so a chain's clone exists before the recomputation reading it.
  std::vector<int> pos_of(g.num_nodes(), -1);
  for (int t = 0; t < T; ++t) pos_of[std::size_t(schedule[std::size_t(t)])] = t;
  auto producer_pos = [&](int c) { return pos_of[std::size_t(g.value(p.candidates[std::size_t(c)].value).producer)]; };
  for (auto* lists : {&before, &after})
    for (auto& l : *lists)
      std::stable_sort(l.begin(), l.end(), [&](auto& x, auto& y) {
        if (x.first != y.first) return x.first < y.first;
        return x.first == recompute && producer_pos(x.second) < producer_pos(y.second);
      });

  // The copy of each value that readers use now; kNoValue while it is off the device.
  std::vector<ValueId> cur(g.num_values());
  for (ValueId v = 0; v < ValueId(g.num_values()); ++v) cur[std::size_t(v)] = offloaded[std::size_t(v)] ? kNoValue : v;
  std::vector<ValueId> tier_copy(p.candidates.size(), kNoValue), staged(p.candidates.size(), kNoValue);
  std::vector<NodeId> last_transfer(p.candidates.size(), -1);
  std::map<ValueId, std::pair<ValueId, ValueId>> view_clone;  // view -> (copy it was made over, its clone)

  auto emit = [&](std::shared_ptr<const Op> op, std::vector<ValueId> in, Phase phase, std::vector<NodeId> order = {}) {
    auto out = h.apply_ordered(std::move(op), std::move(in), phase, std::move(order));
    r.schedule.push_back(h.last_node());
    return out;
  };
  // The copy of `x` a reader at this point must use.
  std::function<ValueId(ValueId, Phase)> resolve = [&](ValueId x, Phase phase) -> ValueId {
    ValueId root = view_root(g, x);
    if (cur[std::size_t(root)] == root) return x;
    if (cur[std::size_t(root)] == kNoValue)
      fail("internal error: the budget plan reads ", describe_value(g, root), " while it is off the device");
    if (x == root) return cur[std::size_t(root)];
    const Node& vn = g.node(g.value(x).producer);
    ValueId base = resolve(vn.inputs[0], phase);
    auto it = view_clone.find(x);
    if (it != view_clone.end() && it->second.first == base) return it->second.second;
    std::vector<ValueId> in = vn.inputs;
    in[0] = base;
    ValueId clone = emit(vn.op, in, phase)[0];
    view_clone[x] = {base, clone};
    return clone;
  };
  // A start takes a new copy-engine slot; its done names the same slot.
  auto start_op = [&](ops::TransferKind k, int c) {
    return std::make_shared<ops::Transfer>(k, r.transfer_slots++, describe_value(g, p.candidates[std::size_t(c)].value));
  };
  auto done_op = [&](ops::TransferKind k, int c) {
    int slot = static_cast<const ops::Transfer&>(*h.node(last_transfer[std::size_t(c)]).op).slot();
    return std::make_shared<ops::Transfer>(k, slot, describe_value(g, p.candidates[std::size_t(c)].value));
  };

  for (int t = 0; t < T; ++t) {
    const NodeId orig = schedule[std::size_t(t)];
    const Phase phase = g.node(orig).phase;
    for (auto [act, c] : before[std::size_t(t)]) {
      const Candidate& cand = p.candidates[std::size_t(c)];
      const ValueId v = cand.value;
      const bool persistent = is_persistent(g.value(v).kind);
      if (act == fetch_start) {
        ValueId from = persistent ? v : tier_copy[std::size_t(c)];
        std::vector<NodeId> order;
        if (!persistent) order.push_back(last_transfer[std::size_t(c)]);  // the eviction is complete
        staged[std::size_t(c)] = emit(start_op(ops::TransferKind::fetch_start, c), {from}, phase, order)[0];
        last_transfer[std::size_t(c)] = h.last_node();
      } else if (act == fetch_done) {
        ValueId from = persistent ? v : tier_copy[std::size_t(c)];
        cur[std::size_t(v)] = emit(done_op(ops::TransferKind::fetch_done, c), {staged[std::size_t(c)], from}, phase)[0];
      } else if (act == recompute) {
        // Inputs dead here are re-created first, for this recomputation
        // alone: readers see their clones only until it has run.
        const Option& o = cand.options[std::size_t(choice[std::size_t(c)])];
        std::vector<std::pair<ValueId, ValueId>> restore;  // (value, the copy readers used before)
        for (NodeId dead : o.inline_nodes) {
          const Node& dn = g.node(dead);
          std::vector<ValueId> in;
          for (ValueId x : dn.inputs) in.push_back(resolve(x, phase));
          std::vector<ValueId> out = emit(dn.op, in, phase);
          for (std::size_t k = 0; k < dn.outputs.size() && k < out.size(); ++k) {
            restore.push_back({dn.outputs[k], cur[std::size_t(dn.outputs[k])]});
            cur[std::size_t(dn.outputs[k])] = out[k];
          }
        }
        const Node& n = g.node(g.value(v).producer);
        std::vector<ValueId> in;
        for (ValueId x : n.inputs) in.push_back(resolve(x, phase));
        std::vector<ValueId> out = emit(n.op, in, phase);
        for (auto it = restore.rbegin(); it != restore.rend(); ++it) cur[std::size_t(it->first)] = it->second;
        for (std::size_t k = 0; k < n.outputs.size() && k < out.size(); ++k)
          if (n.outputs[k] == v) cur[std::size_t(v)] = out[k];
      }
    }
    // The op itself, reading the copies on the device now.
    const Node& node = g.node(orig);
    for (std::size_t i = 0; i < node.inputs.size(); ++i) {
      ValueId use = resolve(node.inputs[i], phase);
      if (use != node.inputs[i]) h.set_input(orig, i, use);
    }
    r.schedule.push_back(orig);
    for (auto [act, c] : after[std::size_t(t)]) {
      const Candidate& cand = p.candidates[std::size_t(c)];
      const ValueId v = cand.value;
      const Choice ch = cand.options[std::size_t(choice[std::size_t(c)])].choice;
      if (act == evict_start) {
        ValueId copy = emit(start_op(ops::TransferKind::evict_start, c), {cur[std::size_t(v)]}, phase)[0];
        h.value(copy).kind = ch == Choice::nvme ? ValueKind::nvme : ValueKind::host;
        tier_copy[std::size_t(c)] = copy;
        last_transfer[std::size_t(c)] = h.last_node();
      } else if (act == evict_done) {
        emit(done_op(ops::TransferKind::evict_done, c), {cur[std::size_t(v)], tier_copy[std::size_t(c)]}, phase);
        last_transfer[std::size_t(c)] = h.last_node();
        cur[std::size_t(v)] = kNoValue;
      } else if (act == drop) {
        cur[std::size_t(v)] = kNoValue;
      } else if (act == write_back_start) {
        emit(start_op(ops::TransferKind::write_back_start, c), {cur[std::size_t(v)], v}, phase, {orig});
        last_transfer[std::size_t(c)] = h.last_node();
      } else if (act == write_back_done) {
        emit(done_op(ops::TransferKind::write_back_done, c), {cur[std::size_t(v)], v}, phase,
             {last_transfer[std::size_t(c)]});
        cur[std::size_t(v)] = kNoValue;
      }
    }
  }
  run_updates_on_host(h, schedule, updated_on_host);
  return r;
}

}  // namespace frugal::plan
