#pragma once
// The budget problem in the abstract: a fixed schedule of positions, the
// device bytes live at each with nothing evicted, and candidates (a value
// over one idle window between two of its uses) that can each be kept or
// evicted by one of a few options. An option changes device bytes over some
// spans, occupies host or NVMe bytes over some spans, and adds step time.
// The heuristic solver (budget_greedy.hpp) and the exact one
// (budget_exact.hpp) solve this same problem, so their gap is measurable;
// budget_solve.hpp builds it from a graph and turns an answer into a plan.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "../graph/value.hpp"

namespace frugal::plan {

// Positions [first, last] of the schedule, inclusive; empty when last < first.
struct Span {
  int first = 0;
  int last = -1;
  bool empty() const { return last < first; }
  bool contains(int t) const { return first <= t && t <= last; }
};

// `bytes` more (or, negative, fewer) over a span.
struct MemEffect {
  Span span;
  std::int64_t bytes = 0;
};

// host_update: optimizer state that lives on the host, where its update
// runs and reads it in place (ZeRO-Offload; plan/offload.hpp).
// nvme_home: a parameter or optimizer state that lives in the NVMe file
// between steps, read before its first use and written back after its
// update (ZeRO-Infinity; plan/nvme_home.hpp).
enum class Choice : std::uint8_t { keep, recompute, host, nvme, host_update, nvme_home };

inline const char* choice_name(Choice c) {
  switch (c) {
    case Choice::keep: return "keep";
    case Choice::recompute: return "recompute";
    case Choice::host: return "swap to host";
    case Choice::nvme: return "spill to NVMe";
    case Choice::host_update: return "update on the host";
    case Choice::nvme_home: return "lives on NVMe";
  }
  return "?";
}

// Whether `kind` may live on NVMe between steps: a trained parameter (the
// f32 master weights) or an optimizer state, the two ZeRO-Infinity moves.
inline bool may_live_on_nvme(ValueKind kind) { return kind == ValueKind::parameter || kind == ValueKind::state; }

// Which parameters and optimizer state the budget problem may home on NVMe
// (PlanOptions::nvme_offload, given a directory): the kinds pinned there
// (offered no other home), and with `automatic` any where that helps.
// `slots`: the NVMe bytes each such tensor takes, in copies of it. 2 keeps
// the copy a step read until the step has succeeded, so a step that fails
// part way leaves the state it started from. 1 writes the update back in
// place, as ZeRO-Infinity does: half the NVMe, but a step that fails after
// its first write back leaves the state part updated, and the step then
// refuses to run or hand its tensors back until it is compiled again and
// a checkpoint loaded (runtime/executor.hpp).
struct NvmeHomeOptions {
  bool optimizer_state = false;
  bool parameters = false;
  bool automatic = true;
  int slots = 2;
  bool pins(ValueKind k) const {
    return (k == ValueKind::state && optimizer_state) || (k == ValueKind::parameter && parameters);
  }
  bool pinned() const { return optimizer_state || parameters; }
};

// Candidate `candidate` must take one of the options whose bit is set in
// `allowed` (bit j for option j).
struct Requirement {
  int candidate = 0;
  std::uint32_t allowed = 1;
};

struct Option {
  Choice choice = Choice::keep;
  double cost_ms = 0;              // step time it adds (exposed transfer, recomputation)
  std::vector<MemEffect> device;   // change of device bytes
  std::vector<MemEffect> host;     // host pool bytes held
  std::vector<MemEffect> nvme;     // NVMe bytes held
  std::vector<Requirement> requires_;
  // Placement details the rewrite needs (positions of the transfer's start
  // and end, or of the recomputation), in schedule positions.
  int out_done = -1;   // evict copy finished before this position runs
  int in_start = -1;   // fetch starts (or a recomputation runs) before this position runs
  int in_done = -1;    // fetch complete before this position runs; -1: the use after the window
  // A recomputation's clones of producers of inputs that are dead where it
  // runs, in schedule order, made for it alone (node ids of the graph).
  std::vector<NodeId> inline_nodes;
  std::string reason;  // why it is priced as it is, for the plan's record
  // Its memory effects follow from the schedule alone, not from any price:
  // keep, recompute, and a transfer placed just in time (evicted right after
  // the use before the window, fetched right before the use after it). The
  // least-memory search (budget_least.hpp) reads only these options, so the
  // smallest feasible budget is the same under every DeviceProfile.
  bool price_free = false;
};

struct Candidate {
  ValueId value = kNoValue;
  std::size_t bytes = 0;
  int before = 0;  // the use before the idle window (or the producer); for a persistent's wrap-around, the last use
  int after = 0;   // the use after it (for a wrap-around, the first use of the next step)
  bool wraps = false;  // a persistent value between the end of one step and its first use in the next
  std::vector<Option> options;  // options[0] is keep: no effect, no cost (and price_free)
  // An activation at which the forward's dataflow narrows to this one value
  // (the residual stream between blocks, a link of a chain): keeping only
  // such values and recomputing the rest is checkpointing's plan, one of
  // the least-memory search's starts (budget_least.hpp). From the graph's
  // structure alone, never from a price.
  bool segment_boundary = false;
};

struct BudgetProblem {
  int positions = 0;
  std::vector<std::int64_t> base;  // device bytes live at each position with every candidate kept
  std::vector<double> op_ms;       // predicted time of each position
  std::vector<Candidate> candidates;
  std::int64_t device_budget = 0;  // the bound on max_t device bytes
  std::int64_t host_budget = 0;    // 0: no limit
  std::int64_t nvme_budget = 0;    // 0: no limit (the NVMe options exist only where a directory was given)
};

// What a choice vector (one option index per candidate) does.
struct Evaluation {
  std::int64_t device_peak = 0;
  int peak_position = 0;
  std::int64_t host_peak = 0;
  std::int64_t nvme_peak = 0;
  double cost_ms = 0;
  bool requirements_met = true;
  bool fits(const BudgetProblem& p) const {
    return requirements_met && device_peak <= p.device_budget && (p.host_budget == 0 || host_peak <= p.host_budget) &&
           (p.nvme_budget == 0 || nvme_peak <= p.nvme_budget);
  }
};

// Bytes of each tier at each position under `choice`.
struct Profiles {
  std::vector<std::int64_t> device, host, nvme;
};

inline void apply_effects(std::vector<std::int64_t>& diff, const std::vector<MemEffect>& effects, int sign) {
  for (auto& e : effects) {
    if (e.span.empty()) continue;
    diff[std::size_t(e.span.first)] += sign * e.bytes;
    diff[std::size_t(e.span.last) + 1] -= sign * e.bytes;
  }
}

inline Profiles profiles(const BudgetProblem& p, const std::vector<int>& choice) {
  const std::size_t n = std::size_t(p.positions);
  std::vector<std::int64_t> dd(n + 1, 0), hd(n + 1, 0), nd(n + 1, 0);
  for (std::size_t i = 0; i < p.candidates.size(); ++i) {
    const Option& o = p.candidates[i].options[std::size_t(choice[i])];
    apply_effects(dd, o.device, 1);
    apply_effects(hd, o.host, 1);
    apply_effects(nd, o.nvme, 1);
  }
  Profiles pr{std::vector<std::int64_t>(n), std::vector<std::int64_t>(n), std::vector<std::int64_t>(n)};
  std::int64_t d = 0, h = 0, v = 0;
  for (std::size_t t = 0; t < n; ++t) {
    d += dd[t], h += hd[t], v += nd[t];
    pr.device[t] = p.base[t] + d;
    pr.host[t] = h;
    pr.nvme[t] = v;
  }
  return pr;
}

inline bool requirements_met(const BudgetProblem& p, const std::vector<int>& choice) {
  for (std::size_t i = 0; i < p.candidates.size(); ++i)
    for (auto& r : p.candidates[i].options[std::size_t(choice[i])].requires_)
      if (!((r.allowed >> choice[std::size_t(r.candidate)]) & 1u)) return false;
  return true;
}

inline Evaluation evaluate(const BudgetProblem& p, const std::vector<int>& choice) {
  Evaluation e;
  Profiles pr = profiles(p, choice);
  for (int t = 0; t < p.positions; ++t) {
    if (pr.device[std::size_t(t)] > e.device_peak) {
      e.device_peak = pr.device[std::size_t(t)];
      e.peak_position = t;
    }
    e.host_peak = std::max(e.host_peak, pr.host[std::size_t(t)]);
    e.nvme_peak = std::max(e.nvme_peak, pr.nvme[std::size_t(t)]);
  }
  for (std::size_t i = 0; i < p.candidates.size(); ++i) e.cost_ms += p.candidates[i].options[std::size_t(choice[i])].cost_ms;
  e.requirements_met = requirements_met(p, choice);
  return e;
}

}  // namespace frugal::plan
