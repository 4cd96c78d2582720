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

// Sets back to keep, dearest first, every eviction in `choice` that the
// device peak does not need to stay at or under `bound` (requirements kept).
inline Solution undo_unneeded(const BudgetProblem& p, std::vector<int> choice, std::int64_t bound) {
  Solution s;
  s.choice = std::move(choice);
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
  s.feasible = s.eval.requirements_met && s.eval.device_peak <= bound;
  return s;
}

inline Solution solve_greedy(const BudgetProblem& p, std::int64_t target) {
  Solution s;
  s.choice.assign(p.candidates.size(), 0);
  // Each round lowers the bytes at the current peak; a move may also switch
  // a candidate already evicted to a dearer option that frees more there.
  for (std::size_t round = 0; round <= 4 * p.candidates.size(); ++round) {
    Profiles pr = profiles(p, s.choice);
    int peak = 0;
    for (int t = 1; t < p.positions; ++t)
      if (pr.device[std::size_t(t)] > pr.device[std::size_t(peak)]) peak = t;
    if (p.positions == 0 || pr.device[std::size_t(peak)] <= target) break;
    // A move sets one candidate's option, together with the options its
    // requirements name where those candidates are still kept (a persistent's
    // inner window needs the persistent to live on the host first).
    double best_score = -1;
    std::vector<std::pair<std::size_t, int>> best;
    for (std::size_t i = 0; i < p.candidates.size(); ++i) {
      const auto& opts = p.candidates[i].options;
      for (int j = 1; j < int(opts.size()); ++j) {
        if (j == s.choice[i]) continue;
        const Option& o = opts[std::size_t(j)];
        std::vector<std::pair<std::size_t, int>> move{{i, j}};
        for (auto& r : o.requires_) {
          std::size_t c = std::size_t(r.candidate);
          if ((r.allowed >> s.choice[c]) & 1u) continue;
          if (s.choice[c] != 0) { move.clear(); break; }
          int k = 1;
          while (k < int(p.candidates[c].options.size()) && !((r.allowed >> k) & 1u)) ++k;
          if (k >= int(p.candidates[c].options.size())) { move.clear(); break; }
          move.push_back({c, k});
        }
        if (move.empty()) continue;
        std::vector<int> trial = s.choice;
        bool ok = true;
        std::int64_t saving = 0;
        double cost = 0;
        for (std::size_t m = move.size(); m-- > 0;) {  // requirements first
          auto [c, k] = move[m];
          if ((c != i && trial[c] != 0) || !may_choose(p, trial, c, k)) { ok = false; break; }
          const Option& was = p.candidates[c].options[std::size_t(trial[c])];
          const Option& oc = p.candidates[c].options[std::size_t(k)];
          if (!tier_fits(pr.host, oc.host, p.host_budget) || !tier_fits(pr.nvme, oc.nvme, p.nvme_budget)) { ok = false; break; }
          trial[c] = k;
          saving += bytes_at(was.device, peak) - bytes_at(oc.device, peak);
          cost += oc.cost_ms - was.cost_ms;
        }
        if (!ok || saving <= 0) continue;
        double score = double(saving) / (std::max(cost, 0.0) + 1e-3);
        if (score > best_score) {
          best_score = score;
          best = move;
        }
      }
    }
    if (best_score < 0) break;  // nothing frees bytes at the peak: this is as low as it goes
    for (auto [c, k] : best) s.choice[c] = k;
  }
  // Undo what the target does not need, dearest first.
  s = undo_unneeded(p, std::move(s.choice), std::max(target, evaluate(p, s.choice).device_peak));
  s.feasible = s.eval.requirements_met && s.eval.device_peak <= target &&
               (p.host_budget == 0 || s.eval.host_peak <= p.host_budget) &&
               (p.nvme_budget == 0 || s.eval.nvme_peak <= p.nvme_budget);
  return s;
}

// The least device memory the options reach (and a cheap way to reach it).
inline Solution solve_min_memory(const BudgetProblem& p) { return solve_greedy(p, 0); }

}  // namespace frugal::plan
