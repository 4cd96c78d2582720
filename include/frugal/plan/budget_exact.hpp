#pragma once
// The exact budget solver: the budget problem as a 0/1 integer program,
// solved by GLPK's branch and cut, so the greedy's gap to the optimum can be
// measured on graphs of a few dozen nodes.
//
//   x[i][j] = 1 when candidate i takes option j     (binary)
//   sum_j x[i][j] = 1                                for every candidate
//   base[t] + sum x[i][j] * device(i,j,t) <= target  for every position t
//   sum x[i][j] * host(i,j,t) <= host budget         (and NVMe alike), when set
//   x[i][j] <= sum_{k allowed} x[c][k]               for each requirement
//   minimise sum x[i][j] * cost_ms(i,j)
//
// A position's row is only written for the position with the most base bytes
// among those that every effect covers alike, and not at all when no choice
// could break it. GLPK works in doubles and accepts a row broken within its
// tolerance, so each answer is checked in exact bytes (evaluate); a row it
// breaks is tightened by the bytes it breaks it by and the model solved
// again. Such an answer is still called optimal when it costs no more than
// the first model's bound, which no choice that truly fits can beat.
//
// Without GLPK (libglpk-dev), solve_exact falls back to exhaustive search
// where that is small enough. Define FRUGAL_NO_GLPK to build without it
// even where glpk.h is installed.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "../core/bytes.hpp"
#include "../core/error.hpp"
#include "budget_exhaustive.hpp"

#if defined(FRUGAL_HAVE_GLPK) || (!defined(FRUGAL_NO_GLPK) && __has_include(<glpk.h>))
#include <glpk.h>
#define FRUGAL_EXACT_WITH_GLPK 1
#else
#define FRUGAL_EXACT_WITH_GLPK 0
#endif

namespace frugal::plan {

inline constexpr bool kExactSolverHasGlpk = FRUGAL_EXACT_WITH_GLPK;

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

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

#if FRUGAL_EXACT_WITH_GLPK

struct IlpRow {
  std::vector<int> cols;  // GLPK columns, 1-based
  std::vector<std::int64_t> coef;
  std::int64_t rhs = 0;
  bool equality = false;
  int tier = -1;  // 0 device, 1 host, 2 NVMe; -1 for choice and requirement rows (unscaled)
  int position = -1;
  double unit = 1;  // bytes per model unit for a tier row: a power of two, so scaling is exact
};

struct IlpModel {
  std::vector<int> first_col;  // per candidate, the column of its option 0
  int cols = 0;                // binary columns; in min-peak mode column cols+1 is the peak
  std::vector<double> cost;    // per binary column
  std::vector<IlpRow> rows;
  bool min_peak = false;
  double peak_unit = 1;        // bytes per unit of the peak column and of every device row in min-peak mode
  std::int64_t peak_floor = 0; // no answer peaks below this
  std::string infeasible;      // set when a row cannot hold whatever is chosen
};

inline const std::vector<MemEffect>& tier_effects(const Option& o, int tier) {
  return tier == 0 ? o.device : tier == 1 ? o.host : o.nvme;
}

inline double pow2_at_least(double v) { return v <= 1 ? 1.0 : std::exp2(std::ceil(std::log2(v))); }

// The model for `target`, or (min_peak) for the least device peak.
inline IlpModel build_ilp(const BudgetProblem& p, std::int64_t target, bool min_peak) {
  IlpModel m;
  m.min_peak = min_peak;
  const std::size_t n = p.candidates.size();
  for (auto& c : p.candidates) {
    m.first_col.push_back(m.cols + 1);
    for (auto& o : c.options) {
      m.cost.push_back(o.cost_ms);
      ++m.cols;
    }
  }
  for (std::size_t i = 0; i < n; ++i) {
    IlpRow r;
    r.equality = true;
    r.rhs = 1;
    for (std::size_t j = 0; j < p.candidates[i].options.size(); ++j) {
      r.cols.push_back(m.first_col[i] + int(j));
      r.coef.push_back(1);
    }
    m.rows.push_back(std::move(r));
  }
  for (std::size_t i = 0; i < n; ++i) {
    const auto& opts = p.candidates[i].options;
    for (std::size_t j = 0; j < opts.size(); ++j)
      for (auto& req : opts[j].requires_) {
        const std::size_t c = std::size_t(req.candidate);
        IlpRow r;
        r.cols.push_back(m.first_col[i] + int(j));
        r.coef.push_back(1);
        if (c != i) {
          for (std::size_t k = 0; k < p.candidates[c].options.size() && k < 32; ++k)
            if ((req.allowed >> k) & 1u) {
              r.cols.push_back(m.first_col[c] + int(k));
              r.coef.push_back(-1);
            }
        } else if ((req.allowed >> j) & 1u) {
          continue;  // an option that allows itself
        }
        m.rows.push_back(std::move(r));
      }
  }

  struct Segment {
    int position;
    std::int64_t base;
    std::vector<std::int64_t> coef;  // per column
    std::int64_t least, most;        // the fewest and most bytes the candidates can add
  };
  const std::int64_t limits[3] = {target, p.host_budget, p.nvme_budget};
  std::vector<IlpRow> device_rows;
  for (int tier = 0; tier < 3; ++tier) {
    if (tier > 0 && limits[tier] == 0) continue;
    // Between two consecutive span ends every option's effect is the same.
    std::vector<int> cuts{0, p.positions};
    for (auto& c : p.candidates)
      for (auto& o : c.options)
        for (auto& e : tier_effects(o, tier))
          if (!e.span.empty()) {
            cuts.push_back(e.span.first);
            cuts.push_back(e.span.last + 1);
          }
    std::sort(cuts.begin(), cuts.end());
    cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
    std::vector<Segment> segments;
    for (std::size_t k = 0; k + 1 < cuts.size(); ++k) {
      Segment s;
      s.position = cuts[k];
      if (tier == 0)
        for (int t = cuts[k]; t < cuts[k + 1]; ++t)
          if (p.base[std::size_t(t)] > p.base[std::size_t(s.position)]) s.position = t;
      s.base = tier == 0 ? p.base[std::size_t(s.position)] : 0;
      s.least = s.most = 0;
      for (auto& c : p.candidates) {
        std::int64_t lo = std::numeric_limits<std::int64_t>::max(), hi = std::numeric_limits<std::int64_t>::min();
        for (auto& o : c.options) {
          std::int64_t b = bytes_at(tier_effects(o, tier), s.position);
          s.coef.push_back(b);
          lo = std::min(lo, b);
          hi = std::max(hi, b);
        }
        s.least += lo;
        s.most += hi;
      }
      segments.push_back(std::move(s));
    }
    if (tier == 0 && min_peak) {
      for (auto& s : segments) m.peak_floor = std::max(m.peak_floor, s.base + s.least);
    }
    for (auto& s : segments) {
      IlpRow r;
      r.tier = tier;
      r.position = s.position;
      if (tier == 0 && min_peak) {
        if (s.base + s.most <= m.peak_floor) continue;  // never above the floor: never the peak
        r.rhs = -s.base;
      } else {
        r.rhs = limits[tier] - s.base;
        if (s.most <= r.rhs) continue;  // holds whatever is chosen
        if (s.least > r.rhs) {
          const char* what = tier == 0 ? "device" : tier == 1 ? "host" : "NVMe";
          const std::int64_t need = s.base + s.least;
          m.infeasible = cat("position ", s.position, " needs at least ", need, " ", what, " bytes (",
                             format_bytes(std::size_t(std::max<std::int64_t>(need, 0))),
                             ") whatever is evicted, over the limit of ", limits[tier]);
          return m;
        }
      }
      std::int64_t scale = 1;
      for (std::size_t col = 0; col < s.coef.size(); ++col)
        if (s.coef[col] != 0) {
          r.cols.push_back(int(col) + 1);
          r.coef.push_back(s.coef[col]);
          scale = std::max<std::int64_t>(scale, std::llabs(s.coef[col]));
        }
      // Coefficients near 1: GLPK's tolerances are relative to them.
      r.unit = pow2_at_least(double(scale));
      if (tier == 0 && min_peak) {
        device_rows.push_back(std::move(r));
      } else {
        m.rows.push_back(std::move(r));
      }
    }
  }
  if (min_peak) {
    // The peak column is shared by every device row, so they share one unit.
    double unit = pow2_at_least(double(std::max<std::int64_t>(1, m.peak_floor)));
    for (auto& r : device_rows) {
      r.unit = unit;
      m.rows.push_back(std::move(r));
    }
    m.peak_unit = unit;
  }
  return m;
}

struct GlpkAnswer {
  int ret = 0;     // glp_intopt's return code
  int status = 0;  // glp_mip_status
  std::vector<int> choice;
  double objective = 0;  // ms, or bytes of peak in min-peak mode
  bool has_solution() const { return ret == 0 || ret == GLP_ETMLIM ? status == GLP_OPT || status == GLP_FEAS : false; }
  bool proved_infeasible() const { return ret == GLP_ENOPFS || (ret == 0 && status == GLP_NOFEAS); }
};

// One branch-and-cut run, with each tier row's bound lowered by tighten[row] bytes.
inline GlpkAnswer run_glpk(const BudgetProblem& p, const IlpModel& m, const std::vector<std::int64_t>& tighten,
                           double seconds) {
  glp_prob* lp = glp_create_prob();
  glp_set_obj_dir(lp, GLP_MIN);
  const int ncols = m.cols + (m.min_peak ? 1 : 0);
  if (ncols > 0) glp_add_cols(lp, ncols);
  for (int c = 1; c <= m.cols; ++c) {
    glp_set_col_kind(lp, c, GLP_BV);
    glp_set_obj_coef(lp, c, m.min_peak ? 0.0 : m.cost[std::size_t(c - 1)]);
  }
  if (m.min_peak) {
    glp_set_col_bnds(lp, ncols, GLP_LO, double(m.peak_floor) / m.peak_unit, 0);
    glp_set_obj_coef(lp, ncols, 1);
  }
  std::vector<int> ia{0}, ja{0};
  std::vector<double> ar{0};
  if (!m.rows.empty()) glp_add_rows(lp, int(m.rows.size()));
  for (std::size_t k = 0; k < m.rows.size(); ++k) {
    const IlpRow& r = m.rows[k];
    const int row = int(k) + 1;
    const double rhs = double(r.rhs - tighten[k]) / r.unit;
    glp_set_row_bnds(lp, row, r.equality ? GLP_FX : GLP_UP, rhs, rhs);
    for (std::size_t e = 0; e < r.cols.size(); ++e) {
      ia.push_back(row);
      ja.push_back(r.cols[e]);
      ar.push_back(double(r.coef[e]) / r.unit);
    }
    if (r.tier == 0 && m.min_peak) {
      ia.push_back(row);
      ja.push_back(ncols);
      ar.push_back(-1.0);
    }
  }
  if (ia.size() > 1) glp_load_matrix(lp, int(ia.size()) - 1, ia.data(), ja.data(), ar.data());
  glp_iocp parm;
  glp_init_iocp(&parm);
  parm.presolve = GLP_ON;
  parm.msg_lev = GLP_MSG_OFF;
  parm.tm_lim = int(std::clamp(seconds * 1000.0, 1.0, 2.0e9));
  GlpkAnswer a;
  a.ret = glp_intopt(lp, &parm);
  a.status = glp_mip_status(lp);
  if (a.has_solution()) {
    for (std::size_t i = 0; i < p.candidates.size(); ++i) {
      int best = 0;
      double best_x = -1;
      for (std::size_t j = 0; j < p.candidates[i].options.size(); ++j) {
        double x = glp_mip_col_val(lp, m.first_col[i] + int(j));
        if (x > best_x) best_x = x, best = int(j);
      }
      a.choice.push_back(best);
    }
    a.objective = glp_mip_obj_val(lp) * (m.min_peak ? m.peak_unit : 1.0);
  }
  glp_delete_prob(lp);
  return a;
}

// Bytes by which `choice` breaks each tier row (0 where it holds).
inline std::int64_t tighten_broken_rows(const BudgetProblem& p, const IlpModel& m, const std::vector<int>& choice,
                                        std::int64_t target, std::vector<std::int64_t>& tighten) {
  const Profiles pr = profiles(p, choice);
  const std::int64_t limits[3] = {target, p.host_budget, p.nvme_budget};
  std::int64_t worst = 0;
  for (std::size_t k = 0; k < m.rows.size(); ++k) {
    const IlpRow& r = m.rows[k];
    if (r.tier < 0) continue;
    const auto& prof = r.tier == 0 ? pr.device : r.tier == 1 ? pr.host : pr.nvme;
    const std::int64_t over = prof[std::size_t(r.position)] - limits[r.tier];
    if (over > 0) {
      tighten[k] += over;
      worst = std::max(worst, over);
    }
  }
  return worst;
}

inline constexpr int kTightenRounds = 5;

#endif  // FRUGAL_EXACT_WITH_GLPK

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
inline ExactResult solve_exact(const BudgetProblem& p, std::int64_t target, double time_limit_s = 20) {
  detail::check_budget_problem(p);
  const auto t0 = std::chrono::steady_clock::now();
  const std::size_t n = p.candidates.size();
  ExactResult r;
#if FRUGAL_EXACT_WITH_GLPK
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
    std::vector<std::int64_t> tighten(m.rows.size(), 0);
    double bound = 0;
    bool bounded = false;
    std::int64_t missed = 0;  // the most bytes a GLPK answer broke a row by
    for (int round = 0; round < detail::kTightenRounds; ++round) {
      const double left = time_limit_s - detail::seconds_since(t0);
      if (left <= 0) {
        r.status = cat("time limit of ", time_limit_s, " s reached while re-solving with tightened rows");
        break;
      }
      detail::GlpkAnswer a = detail::run_glpk(p, m, tighten, left);
      if (!a.has_solution()) {
        if (a.proved_infeasible() && round == 0) {
          r.proved_infeasible = true;
          r.status = "infeasible: GLPK proved that no choice of options fits the budget";
        } else if (a.proved_infeasible()) {
          r.status = cat("not settled: GLPK's answers broke the budget by up to ", missed,
                         " bytes (its tolerance), and with the rows tightened by that it finds none");
        } else if (a.ret == GLP_ETMLIM) {
          r.status = cat("time limit of ", time_limit_s, " s reached before GLPK found an answer");
        } else {
          r.status = cat("GLPK failed: glp_intopt returned ", a.ret, ", glp_mip_status ", a.status);
        }
        break;
      }
      if (round == 0 && a.status == GLP_OPT) {
        bound = a.objective;
        bounded = true;
      }
      Solution s = make_solution(p, a.choice, target);
      if (s.feasible) {
        r.solution = std::move(s);
        const bool at_bound = bounded && r.solution.eval.cost_ms <= bound + 1e-9 * (1 + std::fabs(bound));
        r.optimal = a.status == GLP_OPT && at_bound;
        if (r.optimal)
          r.status = round == 0 ? "optimal"
                                : cat("optimal (GLPK's first answer broke the budget by ", missed,
                                      " bytes; re-solved with those rows tightened, at the first bound)");
        else if (a.status == GLP_OPT)
          r.status = cat("feasible, not proved optimal: ", r.solution.eval.cost_ms - bound,
                         " ms above the bound after tightening rows by up to ", missed, " bytes");
        else
          r.status = cat("time limit of ", time_limit_s, " s: the best answer found, not proved optimal");
        break;
      }
      if (!s.eval.requirements_met) {
        r.status = "GLPK's answer breaks a requirement (a bug in the model)";
        break;
      }
      missed = std::max(missed, detail::tighten_broken_rows(p, m, a.choice, target, tighten));
      r.status = cat("not settled: GLPK's answers still broke the budget after ", detail::kTightenRounds,
                     " tightenings");
    }
  }
  if (!r.solution.feasible && !r.proved_infeasible && option_combinations(p) <= kExhaustiveCombinationLimit) {
    r.solution = solve_exhaustive(p, target);
    r.optimal = r.solution.feasible;
    r.proved_infeasible = !r.solution.feasible;
    r.status += "; settled by exhaustive search";
  }
#else
  if (option_combinations(p) > kExhaustiveCombinationLimit)
    fail<BudgetError>("the exact budget solver needs GLPK for ", n, " candidates (", option_combinations(p),
                      " combinations of options): install libglpk-dev (apt-get install libglpk-dev) and rebuild");
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
inline ExactResult solve_exact_min_memory(const BudgetProblem& p, double time_limit_s = 20) {
  detail::check_budget_problem(p);
  const auto t0 = std::chrono::steady_clock::now();
  ExactResult r;
#if FRUGAL_EXACT_WITH_GLPK
  const std::size_t n = p.candidates.size();
  detail::IlpModel m = detail::build_ilp(p, 0, true);
  if (!m.infeasible.empty()) {
    r.proved_infeasible = true;
    r.status = "infeasible: " + m.infeasible;
    r.solution = make_solution(p, std::vector<int>(n, 0), 0);
    r.seconds = detail::seconds_since(t0);
    return r;
  }
  detail::GlpkAnswer a = detail::run_glpk(p, m, std::vector<std::int64_t>(m.rows.size(), 0), time_limit_s);
  if (!a.has_solution()) {
    r.proved_infeasible = a.proved_infeasible();
    r.status = r.proved_infeasible ? "infeasible: no choice of options meets the requirements and the host and NVMe limits"
                                   : cat("GLPK found no answer: glp_intopt returned ", a.ret);
    r.solution = make_solution(p, std::vector<int>(n, 0), 0);
    r.seconds = detail::seconds_since(t0);
    return r;
  }
  // An upper bound that fits in exact bytes: GLPK's answer, else the greedy's.
  Solution upper = make_solution(p, a.choice, 0);
  if (!fits_target(p, upper.eval, upper.eval.device_peak)) upper = solve_min_memory(p);
  if (!fits_target(p, upper.eval, upper.eval.device_peak)) {
    r.status = "not settled: neither GLPK's nor the greedy's least-memory answer meets the host and NVMe limits";
    r.solution = upper;
    r.seconds = detail::seconds_since(t0);
    return r;
  }
  // Prove nothing fits one byte lower (or find what does).
  std::int64_t peak = upper.eval.device_peak;
  bool proved_least = false;
  for (int round = 0; round < 8; ++round) {
    ExactResult lower = solve_exact(p, peak - 1, time_limit_s - detail::seconds_since(t0));
    if (lower.solution.feasible) {
      peak = lower.solution.eval.device_peak;
      continue;
    }
    proved_least = lower.proved_infeasible;
    break;
  }
  r = solve_exact(p, peak, time_limit_s - detail::seconds_since(t0));
  r.optimal = r.optimal && proved_least;
  if (!proved_least) r.status = "least device peak not proved: " + r.status;
#else
  r = solve_exhaustive_min_memory(p);
#endif
  r.seconds = detail::seconds_since(t0);
  return r;
}

}  // namespace frugal::plan
