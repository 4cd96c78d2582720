#pragma once
// Parameters and optimizer state whose home between steps is the NVMe file
// (ZeRO-Infinity's offload to NVMe), in the plan's terms.
//
// The budget solve chooses it per tensor (plan::Choice::nvme_home) where the
// device and host budgets leave no room, or PlanOptions::nvme_offload pins
// it; the rewrite then stages the tensor into the arena before its first use
// and writes it back after its update, as for a tensor whose home is the
// host. This file gives each such tensor its slots in the NVMe file: two,
// one holding the bytes the step reads and one its write back fills, which
// the executor swaps only once the step has succeeded, so a step that fails
// part way leaves the state it started from intact (runtime/executor.hpp);
// or, where NvmeHomeOptions::slots is 1, one, written back in place.
#include <algorithm>
#include <vector>

#include "plan.hpp"
#include "report.hpp"

namespace frugal::plan {

// After planning a rewritten graph whose `decisions` home some persistents
// on NVMe: their slots after the plan's spill slots, their bytes moved from
// the host's count to the NVMe homes', and no early fetch from them (the
// slot a next step reads is only known once this step has succeeded).
inline void place_nvme_homes(const Graph& g, Plan& p, int slots = 2) {
  p.nvme_home_of.assign(g.num_values(), std::nullopt);
  p.nvme_home_slots = slots;
  for (const Plan::Decision& d : p.decisions) {
    if (d.choice != Choice::nvme_home || p.nvme_home_of[std::size_t(d.value)]) continue;
    const Value& val = g.value(d.value);
    const std::size_t slot = align_up(std::max<std::size_t>(val.meta.nbytes(), 1), kTierAlignment);
    p.nvme_home_of[std::size_t(d.value)] = p.nvme_bytes;
    p.nvme_bytes += std::size_t(slots) * slot;
    p.nvme_home_bytes += val.meta.nbytes();
    const std::string kind = persistent_category(val.kind);
    p.nvme_home_by_kind[kind] += val.meta.nbytes();
    // Only transfers read it, so plan_schedule counted it as the host's.
    auto it = p.offloaded_by_kind.find(kind);
    if (it == p.offloaded_by_kind.end() || it->second < val.meta.nbytes() || p.offloaded_bytes < val.meta.nbytes())
      fail("internal error: ", describe_value(g, d.value), " lives on NVMe but the plan does not count it off the device");
    p.offloaded_bytes -= val.meta.nbytes();
    if ((it->second -= val.meta.nbytes()) == 0) p.offloaded_by_kind.erase(it);
  }
  std::erase_if(p.early_fetches, [&](const Plan::EarlyFetch& e) {
    const ValueId from = g.node(p.schedule[std::size_t(e.fetch)]).inputs[0];
    return std::size_t(from) < p.nvme_home_of.size() && p.nvme_home_of[std::size_t(from)].has_value();
  });
}

// The pinned homes (PlanOptions::nvme_offload): for each wrap-around
// candidate of a pinned kind whose chosen option leaves it elsewhere, the
// NVMe option that holds it on the device no longer than the chosen one
// does (so the device peak cannot rise), the cheapest of those.
inline std::vector<int> pin_nvme_homes(const BudgetProblem& problem, const Graph& g, std::vector<int> choice,
                                       const NvmeHomeOptions& pins) {
  auto held = [](const Option& o, int T) {  // the device positions it holds the value at
    if (o.choice == Choice::keep) return std::pair{0, T - 1};
    return std::pair{o.in_start, o.out_done};
  };
  for (std::size_t c = 0; c < problem.candidates.size(); ++c) {
    const Candidate& cand = problem.candidates[c];
    if (!cand.wraps) continue;
    if (!pins.pins(g.value(cand.value).kind)) continue;
    const Option& now = cand.options[std::size_t(choice[c])];
    if (now.choice == Choice::nvme_home) continue;
    const auto [from, to] = held(now, problem.positions);
    int best = -1;
    for (std::size_t j = 1; j < cand.options.size(); ++j) {
      const Option& o = cand.options[j];
      if (o.choice != Choice::nvme_home || o.in_start < from || o.out_done > to) continue;
      if (best < 0 || o.cost_ms < cand.options[std::size_t(best)].cost_ms) best = int(j);
    }
    if (best >= 0) choice[c] = best;
  }
  return choice;
}

}  // namespace frugal::plan
