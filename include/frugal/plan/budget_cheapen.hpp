#pragma once
// Lowers the step time of a choice that fits, without raising its device
// peak above a bound or leaving the host and NVMe limits: each eviction,
// dearest first, is tried at every cheaper option of its own (keep, a
// recomputation that re-creates fewer inputs, a transfer that hides behind
// compute), together with what the requirements then ask of others
// (RequirementRepair), and the first trial that lowers the summed cost
// while still fitting is taken.
//
// Why: the least-memory search reads no price (budget_least.hpp), so its
// answer may keep recomputations that the final peak no longer needs, or
// pick the dearer of two that free the same bytes there. At the smallest
// feasible budget that answer is the plan, and its time is the user's step
// time. This pass only chooses among plans that fit; it never decides
// whether one exists, so feasibility stays price-free (DESIGN.md, inv. 4).
#include <algorithm>
#include <numeric>

#include "budget_exhaustive.hpp"
#include "budget_greedy.hpp"

namespace frugal::plan {

// With `hold_at` >= 0, a trial must also leave at most `hold_cap` device
// bytes at that position (least_saved_activations: cheaper, but holding no
// more where the backward starts).
inline Solution cheapen(const BudgetProblem& p, std::vector<int> choice, std::int64_t bound, int max_rounds = 64,
                        int hold_at = -1, std::int64_t hold_cap = 0) {
  const std::size_t C = p.candidates.size();
  const RequirementRepair repair(p);
  auto fits = [&](const Evaluation& e) { return fits_target(p, e, bound); };
  Evaluation now = evaluate(p, choice);
  if (!fits(now)) return make_solution(p, std::move(choice), bound);
  std::vector<std::pair<std::size_t, int>> undo, was_list, now_list;
  std::vector<DevicePiece> pieces;  // scratch of the trials' verdicts
  std::vector<std::pair<int, std::int64_t>> events;
  // The profiles' range maxima, and the device profile itself (the peak
  // positions and hold_at read it), updated by each move taken (built
  // again from every candidate per move, they were most of this pass's
  // time on a 1T-parameter step).
  Profiles pr = profiles(p, choice);
  RangeAddMax device_max(pr.device), host_max(pr.host), nvme_max(pr.nvme);
  std::vector<std::int64_t> device = std::move(pr.device);
  auto take = [&](RangeAddMax& most, std::vector<MemEffect> Option::*tier) {
    tier_change_into(pieces, events, p, was_list, now_list, tier);
    for (const DevicePiece& pc : pieces) most.add(pc.first, pc.last, pc.bytes);
  };
  for (int round = 0; round < max_rounds; ++round) {
    // Repairs move a candidate to its option holding the fewest bytes where
    // the profile is highest (at the round's start), so they spend memory
    // where there is room.
    const PeakPositions peaks(device, device_max.peak());
    auto at_high = [&](const Option& o) { return peaks.bytes(o); };
    // A trial is judged by what it changes alone (was_list -> now_list),
    // from a choice that fits: the same verdict as evaluating it whole,
    // which on a deep model's thousands of candidates was most of a
    // budgeted compile's time.
    auto rises_past = [&](std::vector<MemEffect> Option::*tier, const RangeAddMax& most, std::int64_t limit) {
      tier_change_into(pieces, events, p, was_list, now_list, tier);
      for (const DevicePiece& pc : pieces)
        if (pc.bytes > 0 && most(pc.first, pc.last) + pc.bytes > limit) return true;
      return false;
    };
    auto trial_fits = [&](const std::vector<int>& trial) {
      for (auto [c, k] : now_list)
        if (!repair.may_choose(trial, c, k)) return false;
      if (rises_past(&Option::device, device_max, bound)) return false;
      if (hold_at >= 0) {
        std::int64_t held = device[std::size_t(hold_at)];
        for (const DevicePiece& pc : pieces)
          if (pc.first <= hold_at && hold_at <= pc.last) held += pc.bytes;
        if (held > hold_cap) return false;
      }
      return !(p.host_budget && rises_past(&Option::host, host_max, p.host_budget)) &&
             !(p.nvme_budget && rises_past(&Option::nvme, nvme_max, p.nvme_budget));
    };
    std::vector<std::size_t> order;
    for (std::size_t i = 0; i < C; ++i)
      if (p.candidates[i].options[std::size_t(choice[i])].cost_ms > 0) order.push_back(i);
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      return p.candidates[a].options[std::size_t(choice[a])].cost_ms > p.candidates[b].options[std::size_t(choice[b])].cost_ms;
    });
    bool moved = false;
    for (std::size_t i : order) {
      const auto& opts = p.candidates[i].options;
      const double was_cost = opts[std::size_t(choice[i])].cost_ms;
      std::vector<int> cheaper;
      for (int j = 0; j < int(opts.size()); ++j)
        if (j != choice[i] && opts[std::size_t(j)].cost_ms < was_cost) cheaper.push_back(j);
      std::stable_sort(cheaper.begin(), cheaper.end(),
                       [&](int a, int b) { return opts[std::size_t(a)].cost_ms < opts[std::size_t(b)].cost_ms; });
      for (int j : cheaper) {
        // The trial is made in `choice` itself and undone where it fails:
        // a copy per trial was a deep step's thousands of candidates, each
        // trial.
        const int had = choice[i];
        choice[i] = j;
        undo.clear();
        const bool repaired = repair.repair(choice, i, at_high, undo);
        was_list.assign(1, {i, had});
        for (auto [c, old] : undo)
          if (std::none_of(was_list.begin(), was_list.end(), [&](auto& w) { return w.first == c; }))
            was_list.push_back({c, old});
        now_list.clear();
        double saved = 0;
        for (auto [c, old] : was_list) {
          now_list.push_back({c, choice[c]});
          saved += p.candidates[c].options[std::size_t(old)].cost_ms - p.candidates[c].options[std::size_t(choice[c])].cost_ms;
        }
        if (!repaired || saved <= 1e-9 || !trial_fits(choice)) {
          for (auto it = undo.rbegin(); it != undo.rend(); ++it) choice[it->first] = it->second;
          choice[i] = had;
          continue;
        }
        take(host_max, &Option::host);
        take(nvme_max, &Option::nvme);
        take(device_max, &Option::device);
        for (const DevicePiece& pc : pieces)
          for (int t = pc.first; t <= pc.last; ++t) device[std::size_t(t)] += pc.bytes;
        moved = true;
        break;
      }
    }
    if (!moved) break;
  }
  return make_solution(p, std::move(choice), bound);
}

}  // namespace frugal::plan
