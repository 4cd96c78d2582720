#pragma once
// Fewer forward activations held where the backward starts, within a bound
// on the device peak and at a time cost (PlanOptions::least_saved_activations).
//
// Why: a budget caps the step's peak, and the budget solve makes the step
// as fast as the budget allows, so it keeps every value there is room for.
// The peak of a training step usually sits late in the backward; a value
// made late in the forward and read early in the backward (the last block's
// own activations) then costs no peak, and keeping it saves a
// recomputation. But what the forward leaves for the backward is also what
// a pipeline multiplies by its micro-batches in flight, and what
// torch.utils.checkpoint minimises; a user who needs that number small asks
// for this pass, which trades step time for it without raising the peak
// past the bound (so the plan still fits the same budget).
//
// A greedy over single candidates whose idle window spans the position:
// each round takes the option change (with the requirements it brings,
// RequirementRepair) that frees the most bytes there per millisecond it
// adds, while the choice still fits the bound and the host and NVMe limits.
// Deterministic: candidates and options in index order, ties to the first.
#include <algorithm>
#include <optional>

#include "budget_cheapen.hpp"
#include "budget_exhaustive.hpp"
#include "budget_greedy.hpp"
#include "report.hpp"

namespace frugal::plan {

inline Solution shrink_saved(const BudgetProblem& p, std::vector<int> choice, std::int64_t bound, int at,
                             int max_rounds = 4096) {
  const std::size_t C = p.candidates.size();
  const RequirementRepair repair(p);
  Evaluation now = evaluate(p, choice);
  if (at < 0 || at >= p.positions || !fits_target(p, now, bound)) return make_solution(p, std::move(choice), bound);
  std::vector<std::size_t> spanning;  // only these can change the bytes at `at` by their own option
  for (std::size_t i = 0; i < C; ++i)
    if (p.candidates[i].before < at && at < p.candidates[i].after) spanning.push_back(i);
  std::vector<std::pair<std::size_t, int>> undo;
  for (int round = 0; round < max_rounds; ++round) {
    const Profiles pr = profiles(p, choice);
    const std::int64_t saved = pr.device[std::size_t(at)];
    // Repairs spend memory where the profile is lowest against the bound.
    const PeakPositions peaks(pr.device, now.device_peak);
    auto at_high = [&](const Option& o) { return peaks.bytes(o); };
    std::vector<int> best;
    Evaluation best_eval;
    double best_score = 0;
    std::int64_t best_freed = 0;
    for (std::size_t i : spanning) {
      const auto& opts = p.candidates[i].options;
      const std::int64_t held = bytes_at(opts[std::size_t(choice[i])].device, at);
      for (int j = 0; j < int(opts.size()); ++j) {
        if (j == choice[i] || bytes_at(opts[std::size_t(j)].device, at) >= held) continue;
        std::vector<int> trial = choice;
        trial[i] = j;
        undo.clear();
        if (!repair.repair(trial, i, at_high, undo)) continue;
        const Evaluation e = evaluate(p, trial);
        if (!fits_target(p, e, bound)) continue;
        const std::int64_t freed = saved - profiles(p, trial).device[std::size_t(at)];
        if (freed <= 0) continue;
        const double score = double(freed) / std::max(e.cost_ms - now.cost_ms, 1e-6);
        if (best.empty() || score > best_score || (score == best_score && freed > best_freed)) {
          best = std::move(trial);
          best_eval = e;
          best_score = score;
          best_freed = freed;
        }
      }
    }
    if (best.empty()) break;
    choice = std::move(best);
    now = best_eval;
  }
  return make_solution(p, std::move(choice), bound);
}

// shrink_saved from each start (the priced answer, whose choices depend on
// the machine's rates; the least-memory answer and checkpointing's plan,
// which do not), the one holding the fewest bytes at `at` taken (the
// cheaper on a tie), then made cheaper without holding more there or
// breaking the bound.
inline Solution fewest_saved(const BudgetProblem& p, const std::vector<std::vector<int>>& starts, std::int64_t bound,
                             int at) {
  if (starts.empty()) return Solution{};
  if (at < 0 || at >= p.positions) return make_solution(p, starts.front(), bound);
  std::optional<Solution> best;
  std::int64_t best_saved = 0;
  for (const auto& start : starts) {
    Solution s = shrink_saved(p, start, bound, at);
    if (!s.feasible) continue;
    const std::int64_t saved = profiles(p, s.choice).device[std::size_t(at)];
    if (!best || saved < best_saved || (saved == best_saved && s.eval.cost_ms < best->eval.cost_ms)) {
      best = std::move(s);
      best_saved = saved;
    }
  }
  if (!best) return make_solution(p, starts.front(), bound);
  return cheapen(p, std::move(best->choice), bound, 64, at, best_saved);
}

}  // namespace frugal::plan
