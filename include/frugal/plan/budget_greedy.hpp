#pragma once
// The heuristic budget solver. While the device peak is over the target, it
// evicts, at the peak position, the candidate whose option frees the most
// bytes there per millisecond it costs (Capuchin's "memory saving per
// second"). Then it walks the choices back, dearest first, and undoes every
// one the target does not need. With target 0 it finds the least device
// memory its options can reach.
#include <limits>

#include "budget_problem.hpp"

namespace frugal::plan {

struct Solution {
  std::vector<int> choice;  // option index per candidate
  Evaluation eval;
  bool feasible = false;  // eval.fits() for the target it was solved for
};

// Whether candidate i may switch to option j under `choice`: j's own
// requirements hold, and no other chosen option forbids it.
inline bool may_choose(const BudgetProblem& p, const std::vector<int>& choice, std::size_t i, int j) {
  for (auto& r : p.candidates[i].options[std::size_t(j)].requires_)
    if (!((r.allowed >> choice[std::size_t(r.candidate)]) & 1u)) return false;
  for (std::size_t k = 0; k < p.candidates.size(); ++k) {
    if (k == i) continue;
    for (auto& r : p.candidates[k].options[std::size_t(choice[k])].requires_)
      if (std::size_t(r.candidate) == i && !((r.allowed >> j) & 1u)) return false;
  }
  return true;
}

inline std::int64_t bytes_at(const std::vector<MemEffect>& effects, int t) {
  std::int64_t b = 0;
  for (auto& e : effects)
    if (e.span.contains(t)) b += e.bytes;
  return b;
}

// Whether adding `o` keeps a tier's profile within its limit (0: none).
inline bool tier_fits(const std::vector<std::int64_t>& prof, const std::vector<MemEffect>& add, std::int64_t limit) {
  if (limit == 0 || add.empty()) return true;
  for (std::size_t t = 0; t < prof.size(); ++t)
    if (prof[t] + bytes_at(add, int(t)) > limit) return false;
  return true;
}

inline Solution solve_greedy(const BudgetProblem& p, std::int64_t target) {
  Solution s;
  s.choice.assign(p.candidates.size(), 0);
  for (std::size_t round = 0; round <= p.candidates.size(); ++round) {
    Profiles pr = profiles(p, s.choice);
    int peak = 0;
    for (int t = 1; t < p.positions; ++t)
      if (pr.device[std::size_t(t)] > pr.device[std::size_t(peak)]) peak = t;
    if (p.positions == 0 || pr.device[std::size_t(peak)] <= target) break;
    double best_score = -1;
    std::size_t best_i = 0;
    int best_j = 0;
    for (std::size_t i = 0; i < p.candidates.size(); ++i) {
      if (s.choice[i] != 0) continue;
      const auto& opts = p.candidates[i].options;
      for (int j = 1; j < int(opts.size()); ++j) {
        const Option& o = opts[std::size_t(j)];
        std::int64_t saving = -bytes_at(o.device, peak);
        if (saving <= 0) continue;
        if (!may_choose(p, s.choice, i, j)) continue;
        if (!tier_fits(pr.host, o.host, p.host_budget) || !tier_fits(pr.nvme, o.nvme, p.nvme_budget)) continue;
        double score = double(saving) / (o.cost_ms + 1e-3);
        if (score > best_score) {
          best_score = score;
          best_i = i;
          best_j = j;
        }
      }
    }
    if (best_score < 0) break;  // nothing frees bytes at the peak: this is as low as it goes
    s.choice[best_i] = best_j;
  }
  // Undo what the target does not need, dearest first.
  std::int64_t bound = std::max(target, evaluate(p, s.choice).device_peak);
  std::vector<std::size_t> chosen;
  for (std::size_t i = 0; i < s.choice.size(); ++i)
    if (s.choice[i] != 0) chosen.push_back(i);
  std::stable_sort(chosen.begin(), chosen.end(), [&](std::size_t a, std::size_t b) {
    return p.candidates[a].options[std::size_t(s.choice[a])].cost_ms >
           p.candidates[b].options[std::size_t(s.choice[b])].cost_ms;
  });
  for (std::size_t i : chosen) {
    int was = s.choice[i];
    if (!may_choose(p, s.choice, i, 0)) continue;
    s.choice[i] = 0;
    Evaluation e = evaluate(p, s.choice);
    if (!e.requirements_met || e.device_peak > bound) s.choice[i] = was;
  }
  s.eval = evaluate(p, s.choice);
  s.feasible = s.eval.requirements_met && s.eval.device_peak <= target &&
               (p.host_budget == 0 || s.eval.host_peak <= p.host_budget) &&
               (p.nvme_budget == 0 || s.eval.nvme_peak <= p.nvme_budget);
  return s;
}

// The least device memory the options reach (and a cheap way to reach it).
inline Solution solve_min_memory(const BudgetProblem& p) { return solve_greedy(p, 0); }

}  // namespace frugal::plan
