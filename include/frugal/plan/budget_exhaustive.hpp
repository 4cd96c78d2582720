#pragma once
// The budget problem solved by trying every combination of options: exact by
// construction, so it is the reference the ILP (budget_exact.hpp) and the
// greedy (budget_greedy.hpp) are checked against. A branch is cut when even
// the most frugal options left cannot bring some position under a limit, when
// a requirement between two decided candidates fails, or when it already
// costs as much as the best answer found.
#include <cstdint>
#include <limits>
#include <vector>

#include "../core/error.hpp"
#include "budget_greedy.hpp"

namespace frugal::plan {

// Whether `e` meets `target` on the device and the problem's host and NVMe
// limits (the greedy's meaning of Solution::feasible).
inline bool fits_target(const BudgetProblem& p, const Evaluation& e, std::int64_t target) {
  return e.requirements_met && e.device_peak <= target && (p.host_budget == 0 || e.host_peak <= p.host_budget) &&
         (p.nvme_budget == 0 || e.nvme_peak <= p.nvme_budget);
}

inline Solution make_solution(const BudgetProblem& p, std::vector<int> choice, std::int64_t target) {
  Solution s;
  s.choice = std::move(choice);
  s.eval = evaluate(p, s.choice);
  s.feasible = fits_target(p, s.eval, target);
  return s;
}

// How many choice vectors there are (a double: it overflows integers early).
inline double option_combinations(const BudgetProblem& p) {
  double n = 1;
  for (auto& c : p.candidates) n *= double(c.options.size());
  return n;
}

inline constexpr double kExhaustiveCombinationLimit = double(1u << 20);

namespace detail {

// Bytes an option adds at every position, one dense row per tier.
inline std::vector<std::int64_t> dense_effect(const BudgetProblem& p, const std::vector<MemEffect>& effects) {
  std::vector<std::int64_t> diff(std::size_t(p.positions) + 1, 0), out(std::size_t(p.positions));
  apply_effects(diff, effects, 1);
  std::int64_t run = 0;
  for (std::size_t t = 0; t < out.size(); ++t) out[t] = run += diff[t];
  return out;
}

struct ExhaustiveSearch {
  const BudgetProblem& p;
  std::int64_t target;
  std::size_t n = 0, T = 0;
  // effect[tier][i][j]: dense bytes of option j of candidate i; tier 0 device, 1 host, 2 NVMe.
  std::vector<std::vector<std::vector<std::int64_t>>> effect[3];
  // least[tier][d][t]: the fewest bytes candidates d.. can add at t.
  std::vector<std::vector<std::int64_t>> least[3];
  std::vector<double> cheapest_rest;  // the least cost candidates d.. can add
  std::int64_t limit[3];
  std::vector<std::vector<std::int64_t>> level[3];  // profile after deciding candidates 0..d-1
  // Requirements pointing at candidate d from an option of a candidate decided before it.
  struct Incoming {
    std::size_t from;
    int option;
    std::uint32_t allowed;
  };
  std::vector<std::vector<Incoming>> incoming;
  std::vector<int> choice, best;
  bool found = false;
  double best_cost = std::numeric_limits<double>::infinity();

  ExhaustiveSearch(const BudgetProblem& problem, std::int64_t tgt) : p(problem), target(tgt) {
    n = p.candidates.size();
    T = std::size_t(p.positions);
    limit[0] = target;
    limit[1] = p.host_budget > 0 ? p.host_budget : std::numeric_limits<std::int64_t>::max();
    limit[2] = p.nvme_budget > 0 ? p.nvme_budget : std::numeric_limits<std::int64_t>::max();
    incoming.resize(n);
    for (int tier = 0; tier < 3; ++tier) {
      effect[tier].resize(n);
      least[tier].assign(n + 1, std::vector<std::int64_t>(T, 0));
      level[tier].assign(n + 1, std::vector<std::int64_t>(T, 0));
    }
    cheapest_rest.assign(n + 1, 0);
    for (std::size_t i = 0; i < n; ++i) {
      const auto& opts = p.candidates[i].options;
      for (std::size_t j = 0; j < opts.size(); ++j) {
        effect[0][i].push_back(dense_effect(p, opts[j].device));
        effect[1][i].push_back(dense_effect(p, opts[j].host));
        effect[2][i].push_back(dense_effect(p, opts[j].nvme));
        for (auto& r : opts[j].requires_)
          if (std::size_t(r.candidate) > i) incoming[std::size_t(r.candidate)].push_back({i, int(j), r.allowed});
      }
    }
    for (std::size_t d = n; d-- > 0;) {
      double c = std::numeric_limits<double>::infinity();
      for (auto& o : p.candidates[d].options) c = std::min(c, o.cost_ms);
      cheapest_rest[d] = cheapest_rest[d + 1] + c;
      for (int tier = 0; tier < 3; ++tier)
        for (std::size_t t = 0; t < T; ++t) {
          std::int64_t m = std::numeric_limits<std::int64_t>::max();
          for (auto& e : effect[tier][d]) m = std::min(m, e[t]);
          least[tier][d][t] = least[tier][d + 1][t] + m;
        }
    }
    for (std::size_t t = 0; t < T; ++t) level[0][0][t] = p.base[t];
    choice.assign(n, 0);
  }

  bool within_reach(std::size_t d) const {
    for (int tier = 0; tier < 3; ++tier)
      for (std::size_t t = 0; t < T; ++t)
        if (level[tier][d][t] + least[tier][d][t] > limit[tier]) return false;
    return true;
  }

  // Requirements that candidate d's option j settles, given candidates 0..d-1.
  bool requirements_hold(std::size_t d, int j) const {
    for (auto& r : p.candidates[d].options[std::size_t(j)].requires_) {
      std::size_t c = std::size_t(r.candidate);
      if (c > d) continue;  // checked when c is decided
      int cj = c == d ? j : choice[c];
      if (!((r.allowed >> cj) & 1u)) return false;
    }
    for (auto& in : incoming[d])
      if (choice[in.from] == in.option && !((in.allowed >> j) & 1u)) return false;
    return true;
  }

  void search(std::size_t d, double cost) {
    if (cost + cheapest_rest[d] >= best_cost || !within_reach(d)) return;
    if (d == n) {
      best_cost = cost;
      best = choice;
      found = true;
      return;
    }
    const auto& opts = p.candidates[d].options;
    for (int j = 0; j < int(opts.size()); ++j) {
      if (!requirements_hold(d, j)) continue;
      choice[d] = j;
      for (int tier = 0; tier < 3; ++tier) {
        const auto& e = effect[tier][d][std::size_t(j)];
        for (std::size_t t = 0; t < T; ++t) level[tier][d + 1][t] = level[tier][d][t] + e[t];
      }
      search(d + 1, cost + opts[std::size_t(j)].cost_ms);
    }
    choice[d] = 0;
  }
};

}  // namespace detail

// The cheapest choice vector that fits `target` (device) and the problem's
// host and NVMe limits; feasible=false (every candidate kept) when none does.
inline Solution solve_exhaustive(const BudgetProblem& p, std::int64_t target) {
  double combos = option_combinations(p);
  if (combos > kExhaustiveCombinationLimit)
    fail<BudgetError>("exhaustive budget search: ", p.candidates.size(), " candidates give ", combos,
                      " combinations of options, over its limit of 2^20; use solve_exact (GLPK) or solve_greedy");
  for (auto& c : p.candidates)
    if (c.options.empty())
      fail<BudgetError>("exhaustive budget search: a candidate has no options; options[0] must be keep");
  detail::ExhaustiveSearch s(p, target);
  s.search(0, 0.0);
  return make_solution(p, s.found ? s.best : std::vector<int>(p.candidates.size(), 0), target);
}

}  // namespace frugal::plan
