#pragma once
// The plan of one step: the order nodes run in, and where every arena value
// lives. plan/ reasons about sizes only; runtime/ carries the plan out.
#include <map>
#include <optional>
#include <sstream>

#include "../ops/transfer.hpp"
#include "budget.hpp"
#include "budget_problem.hpp"
#include "offload.hpp"
#include "offsets.hpp"
#include "schedule.hpp"

namespace frugal {

struct PlanOptions {
  bool reorder = true;  // run optimizer updates as soon as their gradient is complete
  bool inplace = true;  // let elementwise outputs take over inputs that die
  // Merge chains of elementwise ops, and BatchNorm + ReLU, into one node
  // before planning (ops/fusion.hpp): their intermediate values never
  // exist. The fused step computes the unfused bits (tests/fusion_test.cpp),
  // and the CPU's fused kernel is faster than the unfused kernels it
  // replaces (bench/RESULTS.md, "Operator fusion"), so it is on by default;
  // false plans the graph as captured.
  bool fuse = true;
  // Collectives run beside compute (ops::CollectiveStart) that may be in
  // flight at once: each holds its gradient and scratch until waited.
  int collectives_in_flight = 2;
  // Optimizer offload (ZeRO-Offload, plan/offload.hpp): optimizer state
  // living on the host, where its update runs and reads it in place, so it
  // takes none of the device budget. Unset: the budget solve may choose it
  // for each state where the budget binds. false: never. true: all of it,
  // moved there before planning (compile does, by offload_optimizer_state).
  std::optional<bool> offload_optimizer;
  // ZeRO-Infinity's offload to NVMe (plan/nvme_home.hpp): parameters (the
  // f32 master weights) and optimizer state whose home between steps is the
  // NVMe file (Budget::nvme_dir), so they take neither device nor host
  // memory between their uses. `automatic`: with a directory, the budget
  // solve may choose it for each tensor where the device and host budgets
  // bind, as one more option beside swapping and spilling. The other two pin
  // it for every tensor of a kind (of at least 1 KiB), budget or not.
  plan::NvmeHomeOptions nvme_offload;
  // Whether the budget solve may run a repeatable collective again (stage
  // 3's all-gather of a parameter, before the backward reads it) instead of
  // keeping or swapping what it gathered. Every rank must decide alike: a
  // collective one rank runs and another does not waits forever.
  bool recompute_collectives = true;
  // Under a device budget, hold as few forward activations as the budget
  // allows where the backward starts, at a time cost, instead of keeping
  // every one there is room for (plan/budget_saved.hpp): what a pipeline
  // multiplies by its micro-batches in flight, and what
  // torch.utils.checkpoint minimises. The peak stays within the budget.
  bool least_saved_activations = false;
  // Only whether the step fits the budget, for searches that plan many
  // models or clusters (frugal-plan's largest model): under a binding
  // budget the least-memory plan is returned as soon as it fits, without
  // the priced solves that make it faster (its predicted time is the
  // least-memory plan's, an upper bound on the step's); and a step whose
  // device, host and NVMe limits together cannot hold what it needs at some
  // position (plan/budget_fit.hpp) is refused at once, its
  // BudgetError::smallest_feasible_bytes then a lower bound, not the least
  // budget searched. Over ZeRO stages it tries the highest first and stops
  // at the first that fits. A step compiled with it runs that least-memory plan: exact and
  // within the budget, but slower than the priced plan.
  bool fit_only = false;
  // Refuse at once a step whose device, host and NVMe limits together cannot
  // hold what it needs at some position (fit_only implies it), its
  // BudgetError then carrying a lower bound (smallest_is_lower_bound). Over
  // ZeRO stages left to the planner, every stage is first asked so: a 20T
  // model's stages 0 to 2 need hundreds of TB a rank, and their least-memory
  // searches took minutes each only to say so.
  bool refuse_overflow = false;
};

struct Plan {
  std::vector<NodeId> schedule;
  std::vector<plan::Interval> intervals;              // one per arena buffer
  std::vector<std::size_t> offsets;                   // parallel to intervals
  std::vector<int> buffer_of;                         // by value id; -1 outside the arena
  std::vector<std::optional<std::size_t>> offset_of;  // by value id; nullopt outside the arena
  std::size_t arena_bytes = 0;        // what the arena reserves
  std::size_t peak_bytes = 0;         // the highest byte a step writes: the predicted high-water mark
  std::size_t lower_bound_bytes = 0;  // the most bytes live at once: no placement can beat it
  int peak_position = 0;              // where in the schedule that happens
  std::size_t persistent_bytes = 0;   // parameters and optimizer state kept on the device
  std::map<std::string, std::size_t> persistent_by_kind;

  // Under a budget: persistents whose home is the host (staged into the
  // arena around their uses), and the slower tiers' slots.
  std::size_t offloaded_bytes = 0;
  std::map<std::string, std::size_t> offloaded_by_kind;  // of it: parameters, optimizer state...
  std::vector<std::optional<std::size_t>> tier_offset_of;  // by value id: host pool or NVMe offset
  std::size_t host_bytes = 0;  // the host pool this plan needs
  std::size_t nvme_bytes = 0;  // the NVMe file this plan needs (spills, then the homes below)
  // Persistents whose home between steps is the NVMe file (ZeRO-Infinity,
  // plan/nvme_home.hpp): by value id, the offset of their slots (two: the
  // copy the step reads, and the one its write back fills; one where the
  // update is written back in place), and their bytes (not in
  // offloaded_bytes, which counts the host's).
  std::vector<std::optional<std::size_t>> nvme_home_of;
  int nvme_home_slots = 2;
  std::size_t nvme_home_bytes = 0;
  std::map<std::string, std::size_t> nvme_home_by_kind;
  int transfer_slots = 0;      // copy-engine events
  NodeId original_nodes = 0;   // nodes of the captured graph; a rewrite's own nodes come after
  // Fetches of host-resident persistents that step i starts for step i+1:
  // the fetch at schedule position `fetch` is issued after position `after`
  // of the step before, because nothing touches its destination from there
  // to the end of that step, nor in the next step before the fetch, and its
  // source is final (written back) by then.
  struct EarlyFetch {
    int fetch = 0;
    int after = 0;
  };
  std::vector<EarlyFetch> early_fetches;

  // What the budget solver decided and why (empty without a binding budget).
  struct Decision {
    ValueId value = kNoValue;  // in the graph before the rewrite (same ids after it)
    plan::Choice choice = plan::Choice::keep;
    std::size_t bytes = 0;
    int from = 0, to = 0;  // the window, in positions of the unconstrained schedule
    bool wraps = false;    // between one step and the next
    double cost_ms = 0;
    std::string reason;
  };
  std::vector<Decision> decisions;
  std::size_t budget_bytes = 0;        // the device budget it was solved for (0: none)
  // Fusion before planning (PlanOptions::fuse): fused nodes made (chains,
  // and BatchNorm + ReLU merges), and the bytes of the intermediate values
  // that no longer exist.
  int fused_chains = 0;
  std::size_t fused_away_bytes = 0;
  std::size_t min_feasible_bytes = 0;  // the least device budget this planner meets for the step; 0: not searched (the budget does not bind)
  std::size_t unconstrained_bytes = 0; // the device bytes without any eviction
  double predicted_step_ms = 0;        // the cost model's step time
  // The priced solves found nothing that fits the budget: this is the
  // least-memory plan, less the evictions the budget does not need.
  bool least_memory_fallback = false;
  std::string priced_with;             // whose rates priced the budget's choices (said in the summary)
  // Data parallelism: the ZeRO stage the step runs at (-1: no communicator),
  // and why that one (pinned, or the first that fits and what the lower
  // stages would need).
  int zero_stage = -1;
  std::string zero_reason;
  // Where the gradients' collectives run: beside compute or in place, and
  // why ("" without a communicator).
  std::string collectives;
  // Optimizer state kept on the host with its update run there
  // (PlanOptions::offload_optimizer): how much and why ("" when none).
  std::string optimizer_offload;
  std::size_t count(plan::Choice c) const {
    std::size_t n = 0;
    for (auto& d : decisions) n += d.choice == c;
    return n;
  }

  double arena_ratio() const { return lower_bound_bytes ? double(arena_bytes) / double(lower_bound_bytes) : 1.0; }
  // Device bytes: the arena and the persistents that stay on the device.
  std::size_t total_bytes() const { return arena_bytes + persistent_bytes; }
};

// The order `g` runs in: capture order, or (reorder) each optimizer update
// as soon as it can run. Nodes nothing live depends on are left out.
inline std::vector<NodeId> schedule_of(const Graph& g, std::span<const ValueId> roots, PlanOptions o = {}) {
  std::vector<bool> live = g.live_nodes(roots);
  if (o.reorder) return plan::schedule(g, live, o.collectives_in_flight);
  std::vector<NodeId> s;
  for (NodeId n = 0; n < NodeId(g.num_nodes()); ++n)
    if (live[std::size_t(n)]) s.push_back(n);
  return s;
}

namespace plan {

// Which fetches of host-resident persistents can start in the step before
// (see Plan::early_fetches). Needs the arena placed.
inline void find_early_fetches(const Graph& g, Plan& p, std::span<const ValueId> roots) {
  const int T = int(p.schedule.size());
  std::vector<char> is_root_buffer(p.intervals.size(), 0);
  for (ValueId r : roots)
    if (p.buffer_of[std::size_t(r)] >= 0) is_root_buffer[std::size_t(p.buffer_of[std::size_t(r)])] = 1;
  // Where each persistent is last written back: its home is final from there.
  std::vector<int> written_back(g.num_values(), 0);
  for (int u = 0; u < T; ++u) {
    const Node& m = g.node(p.schedule[std::size_t(u)]);
    auto* w = m.op->as_transfer();
    if (w && w->kind() == ops::TransferKind::write_back_done) written_back[std::size_t(m.inputs[1])] = u;
  }
  for (int t = 0; t < T; ++t) {
    const Node& n = g.node(p.schedule[std::size_t(t)]);
    auto* tr = n.op->as_transfer();
    if (!tr || tr->kind() != ops::TransferKind::fetch_start) continue;
    const ValueId home = n.inputs[0];
    const Value& hv = g.value(home);
    if (!is_persistent(hv.kind)) continue;
    const int own = p.buffer_of[std::size_t(n.outputs[0])];
    const std::size_t lo = p.offsets[std::size_t(own)], hi = lo + p.intervals[std::size_t(own)].bytes;
    int after = written_back[std::size_t(home)];  // the source is final once written back
    bool ok = true;
    for (std::size_t b = 0; b < p.intervals.size() && ok; ++b) {
      const Interval& iv = p.intervals[b];
      if (p.offsets[b] >= hi || lo >= p.offsets[b] + iv.bytes) continue;  // other bytes
      if (is_root_buffer[b]) ok = false;                                   // read after the step
      else if (int(b) != own && iv.first < t) ok = false;  // the next step uses these bytes before the fetch
      else after = std::max(after, iv.last);
    }
    if (ok && after < T - 1) p.early_fetches.push_back({t, after});
  }
}

// Slots in the host pool and the NVMe file for the copies a budget plan
// makes: each lives from its eviction to the last fetch that reads it.
inline void place_tiers(const Graph& g, Plan& p) {
  p.tier_offset_of.assign(g.num_values(), std::nullopt);
  for (ValueKind tier : {ValueKind::host, ValueKind::nvme}) {
    std::vector<Interval> iv;
    std::vector<int> slot_of(g.num_values(), -1);  // by value id: its interval in iv
    for (int t = 0; t < int(p.schedule.size()); ++t) {
      const Node& n = g.node(p.schedule[std::size_t(t)]);
      for (ValueId o : n.outputs)
        if (g.value(o).kind == tier) {
          slot_of[std::size_t(o)] = int(iv.size());
          iv.push_back({o, align_up(std::max<std::size_t>(g.value(o).meta.nbytes(), 1), kTierAlignment),
                        g.value(o).meta.nbytes(), t, t});
        }
      for (ValueId in : n.inputs)
        if (slot_of[std::size_t(in)] >= 0) iv[std::size_t(slot_of[std::size_t(in)])].last = t;
    }
    Placement pl = assign_offsets(iv);
    for (std::size_t i = 0; i < iv.size(); ++i) p.tier_offset_of[std::size_t(iv[i].value)] = pl.offset[i];
    (tier == ValueKind::host ? p.host_bytes : p.nvme_bytes) = pl.arena_bytes;
  }
}

}  // namespace plan

// Plans `g` in the order `schedule`. `roots` stay live to the end of the step.
inline Plan plan_schedule(const Graph& g, std::vector<NodeId> schedule, std::span<const ValueId> roots,
                          bool inplace = true) {
  Plan p;
  p.schedule = std::move(schedule);
  auto buffers = plan::assign_buffers(g, p.schedule, roots, inplace);
  p.intervals = std::move(buffers.intervals);
  p.buffer_of = std::move(buffers.buffer_of);
  auto placement = plan::assign_offsets(p.intervals);
  p.offsets = placement.offset;
  p.arena_bytes = placement.arena_bytes;
  for (std::size_t i = 0; i < p.intervals.size(); ++i)
    p.peak_bytes = std::max(p.peak_bytes, p.offsets[i] + p.intervals[i].used);

  // The lower bound, and where it is reached.
  std::vector<std::ptrdiff_t> live_at(p.schedule.size() + 2, 0);
  for (auto& iv : p.intervals) {
    live_at[std::size_t(iv.first)] += std::ptrdiff_t(iv.bytes);
    live_at[std::size_t(iv.last) + 1] -= std::ptrdiff_t(iv.bytes);
  }
  std::ptrdiff_t cur = 0, best = 0;
  for (std::size_t t = 0; t < p.schedule.size(); ++t)
    if ((cur += live_at[t]) > best) {
      best = cur;
      p.peak_position = int(t);
    }
  p.lower_bound_bytes = std::size_t(best);

  p.offset_of.assign(g.num_values(), std::nullopt);
  for (ValueId v = 0; v < ValueId(g.num_values()); ++v)
    if (p.buffer_of[std::size_t(v)] >= 0) p.offset_of[std::size_t(v)] = p.offsets[std::size_t(p.buffer_of[std::size_t(v)])];
  // A persistent stays on the device unless only transfers read it (its
  // home is then the host, and the arena holds staged copies), or host
  // updates that keep it there (optimizer offload, plan/offload.hpp).
  const std::vector<char> on_host = plan::persistents_on_host(g, p.schedule);
  for (ValueId v = 0; v < ValueId(g.num_values()); ++v) {
    const Value& val = g.value(v);
    if (!is_persistent(val.kind)) continue;
    if (on_host[std::size_t(v)]) {
      p.offloaded_bytes += val.meta.nbytes();
      p.offloaded_by_kind[persistent_category(val.kind)] += val.meta.nbytes();
      continue;
    }
    p.persistent_bytes += val.meta.nbytes();
    p.persistent_by_kind[persistent_category(val.kind)] += val.meta.nbytes();
  }
  plan::place_tiers(g, p);
  plan::find_early_fetches(g, p, roots);
  return p;
}

inline Plan make_plan(const Graph& g, std::span<const ValueId> roots, PlanOptions o = {}) {
  return plan_schedule(g, schedule_of(g, roots, o), roots, o.inplace);
}

}  // namespace frugal
