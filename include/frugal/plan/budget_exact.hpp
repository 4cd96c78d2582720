#pragma once
// The exact budget solver: the cheapest choice of options that fits a
// budget, or the least device peak any choice reaches, proved by GLPK's
// branch and cut on the integer program of budget_ilp.hpp, so the greedy's
// gap to the optimum can be measured on graphs of a few dozen nodes. GLPK's
// answers are checked in exact bytes; one that breaks a row within GLPK's
// tolerance is cut off and the model solved again.
//
// Without GLPK (libglpk-dev), both fall back to exhaustive search where that
// is small enough (budget_exhaustive.hpp), and otherwise refuse.
#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "../core/error.hpp"
#include "budget_exhaustive.hpp"
#include "budget_ilp.hpp"

namespace frugal::plan {

struct ExactResult {
  Solution solution;
  bool optimal = false;            // feasible, and proved the cheapest
  bool proved_infeasible = false;  // proved that nothing fits (solution.feasible is then false)
  std::string status;              // what was proved, or why nothing was
  double seconds = 0;
};

namespace detail {

// Rejects a problem its solvers would read out of bounds.
inline void check_budget_problem(const BudgetProblem& p) {
  if (p.positions < 0 || p.base.size() != std::size_t(p.positions))
    fail<BudgetError>("budget problem: ", p.base.size(), " base byte counts for ", p.positions,
                      " positions; give one per position");
  const int n = int(p.candidates.size());
  for (int i = 0; i < n; ++i) {
    const auto& opts = p.candidates[std::size_t(i)].options;
    if (opts.empty()) fail<BudgetError>("budget problem: candidate ", i, " has no options; options[0] must be keep");
    for (std::size_t j = 0; j < opts.size(); ++j) {
      for (auto* effects : {&opts[j].device, &opts[j].host, &opts[j].nvme})
        for (auto& e : *effects)
          if (!e.span.empty() && (e.span.first < 0 || e.span.last >= p.positions))
            fail<BudgetError>("budget problem: candidate ", i, " option ", j, " has an effect over positions [",
                              e.span.first, ", ", e.span.last, "] outside the schedule's 0..", p.positions - 1);
      for (auto& r : opts[j].requires_)
        if (r.candidate < 0 || r.candidate >= n)
          fail<BudgetError>("budget problem: candidate ", i, " option ", j, " requires candidate ", r.candidate,
                            ", but there are ", n);
    }
  }
}

inline void require_small_without_glpk(const BudgetProblem& p) {
  if (option_combinations(p) > kExhaustiveCombinationLimit)
    fail<BudgetError>("the exact budget solver needs GLPK for ", p.candidates.size(), " candidates (",
                      option_combinations(p), " combinations of options, over exhaustive search's 2^20): "
                      "install libglpk-dev (apt-get install libglpk-dev) and rebuild");
}

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace detail

// The cheapest answer at the least device peak, found by exhaustive search
// (a bisection on the target): the reference for solve_exact_min_memory, and
// its stand-in without GLPK.
inline ExactResult solve_exhaustive_min_memory(const BudgetProblem& p) {
  std::int64_t hi = 0;  // every candidate at its most expensive option in bytes: no answer peaks above it
  std::int64_t lo = 0;  // every candidate at its most frugal: no answer peaks below it
  for (int t = 0; t < p.positions; ++t) {
    std::int64_t most = p.base[std::size_t(t)], least = most;
    for (auto& c : p.candidates) {
      std::int64_t mx = std::numeric_limits<std::int64_t>::min(), mn = std::numeric_limits<std::int64_t>::max();
      for (auto& o : c.options) {
        std::int64_t b = bytes_at(o.device, t);
        mx = std::max(mx, b);
        mn = std::min(mn, b);
      }
      most += mx;
      least += mn;
    }
    hi = std::max(hi, most);
    lo = std::max(lo, least);
  }
  ExactResult r;
  Solution best = solve_exhaustive(p, hi);
  if (!best.feasible) {
    r.solution = best;
    r.proved_infeasible = true;
    r.status = "infeasible: no choice of options meets the requirements and the host and NVMe limits";
    return r;
  }
  hi = best.eval.device_peak;
  lo = std::min(lo, hi);
  while (lo < hi) {  // invariant: hi fits, nothing below lo does
    std::int64_t mid = lo + (hi - lo) / 2;
    Solution s = solve_exhaustive(p, mid);
    if (s.feasible) {
      hi = s.eval.device_peak;
      best = s;
    } else {
      lo = mid + 1;
    }
  }
  r.solution = solve_exhaustive(p, hi);
  r.optimal = true;
  r.status = "optimal (exhaustive search; built without GLPK)";
  return r;
}

// The cheapest choice vector whose device peak is at most `target` and that
// meets the problem's host and NVMe limits and every requirement.
// `node_limit` (when positive) bounds each GLPK run by branch-and-bound
// nodes, so that an answer left unproved is the same on every machine.
inline ExactResult solve_exact(const BudgetProblem& p, std::int64_t target, double time_limit_s = 20, int node_limit = 0) {
  detail::check_budget_problem(p);
  const auto t0 = std::chrono::steady_clock::now();
  const std::size_t n = p.candidates.size();
  ExactResult r;
#ifdef FRUGAL_HAVE_GLPK
  detail::IlpModel m = detail::build_ilp(p, target, false);
  if (n == 0) {  // nothing to choose (and nothing for GLPK to solve)
    r.solution = make_solution(p, {}, target);
    r.optimal = r.solution.feasible;
    r.proved_infeasible = !r.solution.feasible;
    r.status = r.optimal ? "optimal (nothing to choose)" : "infeasible: the base bytes alone exceed the target";
  } else if (!m.infeasible.empty()) {
    r.proved_infeasible = true;
    r.status = "infeasible: " + m.infeasible;
  } else {
    std::int64_t missed = 0;  // the most bytes a GLPK answer broke a row by
    int cuts = 0;
    auto after_cuts = [&] {
      return cuts == 0 ? std::string()
                       : cat(" (after ", cuts, " rounds cutting off answers that broke a row by up to ", missed,
                             " bytes, within GLPK's tolerance)");
    };
    r.status = cat("not settled: GLPK's answers still broke the budget in exact bytes after ", detail::kMaxCutRounds,
                   " rounds of cuts");
    for (int round = 0; round < detail::kMaxCutRounds; ++round) {
      const double left = time_limit_s - detail::seconds_since(t0);
      if (left <= 0) {
        r.status = cat("time limit of ", time_limit_s, " s reached", after_cuts());
        break;
      }
      detail::GlpkAnswer a = detail::run_glpk(p, m, left, node_limit);
      if (!a.has_solution()) {
        if (a.proved_infeasible()) {
          r.proved_infeasible = true;
          r.status = "infeasible: GLPK proved that no choice of options fits the budget" + after_cuts();
        } else if (a.ret == GLP_ESTOP) {
          r.status = cat("node limit of ", node_limit, " reached before GLPK found an answer", after_cuts());
        } else if (a.ret == GLP_ETMLIM) {
          r.status = cat("time limit of ", time_limit_s, " s reached before GLPK found an answer", after_cuts());
        } else {
          r.status = cat("GLPK failed: glp_intopt returned ", a.ret, ", glp_mip_status ", a.status);
        }
        break;
      }
      Solution s = make_solution(p, a.choice, target);
      if (s.feasible) {
        r.solution = std::move(s);
        r.optimal = a.status == GLP_OPT;
        r.status = r.optimal ? "optimal" + after_cuts()
                   : a.ret == GLP_ESTOP
                       ? cat("node limit of ", node_limit, ": the best answer found, not proved optimal", after_cuts())
                       : cat("time limit of ", time_limit_s, " s: the best answer found, not proved optimal", after_cuts());
        break;
      }
      missed = std::max(missed, detail::cut_off(p, m, a.choice, target));
      ++cuts;
    }
  }
  if (!r.solution.feasible && !r.proved_infeasible && option_combinations(p) <= kExhaustiveCombinationLimit) {
    r.solution = solve_exhaustive(p, target);
    r.optimal = r.solution.feasible;
    r.proved_infeasible = !r.solution.feasible;
    r.status += "; settled by exhaustive search";
  }
#else
  (void)time_limit_s;  // exhaustive search is only tried where it is quick
  (void)node_limit;
  detail::require_small_without_glpk(p);
  r.solution = solve_exhaustive(p, target);
  r.optimal = r.solution.feasible;
  r.proved_infeasible = !r.solution.feasible;
  r.status = r.solution.feasible ? "optimal (exhaustive search; built without GLPK)"
                                 : "infeasible (exhaustive search; built without GLPK)";
#endif
  if (r.solution.choice.size() != n) r.solution = make_solution(p, std::vector<int>(n, 0), target);
  r.seconds = detail::seconds_since(t0);
  return r;
}

// The cheapest answer among those with the least device peak: that peak is
// the smallest feasible device budget. optimal=true when both are proved.
inline ExactResult solve_exact_min_memory(const BudgetProblem& p, double time_limit_s = 20, int node_limit = 0) {
  detail::check_budget_problem(p);
  const auto t0 = std::chrono::steady_clock::now();
  ExactResult r;
#ifdef FRUGAL_HAVE_GLPK
  const std::size_t n = p.candidates.size();
  const std::vector<int> keep_all(n, 0);
  auto done = [&](ExactResult res) {
    res.seconds = detail::seconds_since(t0);
    return res;
  };
  // An answer that fits in exact bytes, as low as can be found cheaply:
  // GLPK's least-peak answer, else the greedy's, else any at all.
  detail::IlpModel m = detail::build_ilp(p, 0, true);
  if (!m.infeasible.empty()) {
    r.proved_infeasible = true;
    r.status = "infeasible: " + m.infeasible;
    r.solution = make_solution(p, keep_all, 0);
    return done(r);
  }
  Solution upper;
  detail::GlpkAnswer a = detail::run_glpk(p, m, time_limit_s, node_limit);
  if (a.has_solution()) upper = make_solution(p, a.choice, 0);
  if (!a.has_solution() || !fits_target(p, upper.eval, upper.eval.device_peak)) {
    upper = solve_min_memory(p);
    if (!fits_target(p, upper.eval, upper.eval.device_peak)) {
      ExactResult any = solve_exact(p, std::numeric_limits<std::int64_t>::max() / 4,
                                    time_limit_s - detail::seconds_since(t0), node_limit);
      if (!any.solution.feasible) return done(any);
      upper = any.solution;
    }
  }
  // Then prove that nothing fits a byte lower, or go lower.
  std::int64_t peak = upper.eval.device_peak;
  bool proved_least = false;
  std::string why_not;
  for (int round = 0; round < 16; ++round) {
    ExactResult lower = solve_exact(p, peak - 1, time_limit_s - detail::seconds_since(t0), node_limit);
    if (lower.solution.feasible) {
      peak = lower.solution.eval.device_peak;
      continue;
    }
    proved_least = lower.proved_infeasible;
    why_not = lower.status;
    break;
  }
  r = solve_exact(p, peak, time_limit_s - detail::seconds_since(t0), node_limit);
  r.optimal = r.optimal && proved_least;
  if (!proved_least) r.status = cat("least device peak not proved (a byte lower: ", why_not, "); at this one: ", r.status);
  return done(r);
#else
  (void)time_limit_s;
  (void)node_limit;
  detail::require_small_without_glpk(p);
  r = solve_exhaustive_min_memory(p);
  r.seconds = detail::seconds_since(t0);
  return r;
#endif
}

}  // namespace frugal::plan
