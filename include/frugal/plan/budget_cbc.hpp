#pragma once
// The least device peak of a budget problem by CBC (COIN-OR's branch and
// cut), on the least-peak integer program of budget_ilp.hpp. GLPK proves
// the least on steps of a few dozen ops and not on a 125-op gpt step with a
// small host pool in half an hour; CBC's cuts (mixed-integer rounding,
// two-step MIR, zero-half) close the same program in seconds, which makes
// the least exact on the real steps measured (bench/budget_gap --real).
//
// Started from the local search's answer, so it can only improve on it. Its
// answers are checked in exact bytes (evaluate); one that breaks a host or
// NVMe row within CBC's tolerance is cut off (detail::cut_off) and the
// program solved again. Bounded by branch-and-bound nodes, not seconds, so
// the answer is the same on every machine; a backstop in seconds only stops
// a run that the node limit would let run on far too long.
//
// FRUGAL_HAVE_CBC alone decides whether CBC is used: CMake defines it (and
// links CBC) for every target using frugal::frugal when it finds CBC
// (Debian: coinor-libcbc-dev).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "../core/error.hpp"
#include "budget_ilp.hpp"

#ifdef FRUGAL_HAVE_CBC
#include <Cbc_C_Interface.h>
#endif

namespace frugal::plan {

#ifdef FRUGAL_HAVE_CBC
inline constexpr bool kHaveCbc = true;
#else
inline constexpr bool kHaveCbc = false;
#endif

struct CbcLeast {
  Solution solution;      // the lowest answer that fits in exact bytes (the start, if CBC found none lower)
  // CBC proved the least to within its tolerance: no answer peaks below
  // `bound`, which is at most a millionth below solution's peak. (On rows of
  // GiB with stray bytes CBC's answer can be a few hundred bytes above the
  // exact least; on the real steps measured it is within 72 bytes.)
  bool proved = false;
  std::int64_t bound = 0;  // bytes no answer peaks below (CBC's best possible, less a relative 1e-6 for its tolerance)
  std::string status;
};

#ifdef FRUGAL_HAVE_CBC
namespace detail {

struct CbcAnswer {
  bool has_solution = false;
  bool optimal = false;
  bool infeasible = false;
  std::vector<int> choice;
  double best_possible = 0;  // bytes
};

inline CbcAnswer run_cbc(const BudgetProblem& p, const IlpModel& m, const std::vector<int>& start, int node_limit,
                         double backstop_seconds) {
  Cbc_Model* model = Cbc_newModel();
  Cbc_setLogLevel(model, 0);
  // The whole matrix at once, by columns: Cbc_addRow appends to a
  // column-ordered matrix and copies all of it each time, quadratic in its
  // size (ZeRO stage 0 of a 24-layer 0.5T step on a DGX-2 rank spent
  // minutes there and never reached the solve).
  const int peak_col = m.cols;  // 0-based: binary columns 0..cols-1, then the peak
  const int ncols = m.cols + (m.min_peak ? 1 : 0), nrows = int(m.rows.size());
  std::vector<CoinBigIndex> col_start(std::size_t(ncols) + 1, 0);
  for (const IlpRow& r : m.rows) {
    for (int c : r.cols) ++col_start[std::size_t(c)];  // 1-based: counts land one ahead
    if (r.tier == 0 && m.min_peak) ++col_start[std::size_t(peak_col) + 1];
  }
  for (std::size_t c = 1; c < col_start.size(); ++c) col_start[c] += col_start[c - 1];
  std::vector<CoinBigIndex> fill(col_start.begin(), col_start.end() - 1);
  std::vector<int> index(std::size_t(col_start.back()));
  std::vector<double> value(std::size_t(col_start.back()));
  std::vector<double> row_lb(m.rows.size()), row_ub(m.rows.size());
  constexpr double kInfinity = 1e30;  // Clp's: any bound beyond 1e27 is none
  for (int i = 0; i < nrows; ++i) {
    const IlpRow& r = m.rows[std::size_t(i)];
    auto put = [&](int col, double v) {
      const CoinBigIndex at = fill[std::size_t(col)]++;
      index[std::size_t(at)] = i;
      value[std::size_t(at)] = v;
    };
    for (std::size_t e = 0; e < r.cols.size(); ++e) put(r.cols[e] - 1, double(r.coef[e]) / r.unit);
    if (r.tier == 0 && m.min_peak) put(peak_col, -1.0);
    const double rhs = double(r.rhs) / r.unit;
    row_lb[std::size_t(i)] = r.sense == IlpRow::at_most ? -kInfinity : rhs;
    row_ub[std::size_t(i)] = r.sense == IlpRow::at_least ? kInfinity : rhs;
  }
  std::vector<double> col_lb(std::size_t(ncols), 0.0), col_ub(std::size_t(ncols), 1.0), obj(std::size_t(ncols), 0.0);
  for (int c = 0; c < m.cols; ++c) obj[std::size_t(c)] = m.min_peak ? 0.0 : m.cost[std::size_t(c)];
  for (int b : m.banned) col_ub[std::size_t(b - 1)] = 0.0;
  if (m.min_peak) {
    col_lb[std::size_t(peak_col)] = double(m.peak_floor) / m.peak_unit;
    col_ub[std::size_t(peak_col)] = kInfinity;
    obj[std::size_t(peak_col)] = 1.0;
  }
  Cbc_loadProblem(model, ncols, nrows, col_start.data(), index.data(), value.data(), col_lb.data(), col_ub.data(),
                  obj.data(), row_lb.data(), row_ub.data());
  for (int c = 0; c < m.cols; ++c) Cbc_setInteger(model, c);
  // The start: every binary column (its value 0 or 1); CBC computes the peak.
  std::vector<int> idx;
  std::vector<double> val;
  for (std::size_t i = 0; i < p.candidates.size(); ++i)
    for (std::size_t j = 0; j < p.candidates[i].options.size(); ++j) {
      idx.push_back(m.first_col[i] - 1 + int(j));
      val.push_back(int(j) == start[i] ? 1.0 : 0.0);
    }
  Cbc_setMIPStartI(model, int(idx.size()), idx.data(), val.data());
  if (node_limit > 0) Cbc_setMaximumNodes(model, node_limit);
  Cbc_setMaximumSeconds(model, backstop_seconds);
  Cbc_setParameter(model, "threads", "0");  // one thread: the same search on every machine
  // CBC's preprocessing finds little in these programs and costs most of the
  // time: off, the 64 KiB-host gpt step closes in 2.3 s instead of 6.9 s,
  // resnet-20 in 0.4 s instead of 1.4 s, same optimum.
  Cbc_setParameter(model, "preprocess", "off");
  Cbc_solve(model);
  CbcAnswer a;
  a.optimal = Cbc_isProvenOptimal(model) != 0;
  a.infeasible = Cbc_isProvenInfeasible(model) != 0;
  a.best_possible = Cbc_getBestPossibleObjValue(model) * (m.min_peak ? m.peak_unit : 1.0);
  if (const double* x = Cbc_bestSolution(model)) {
    a.has_solution = true;
    for (std::size_t i = 0; i < p.candidates.size(); ++i) {
      int best = 0;
      double best_x = -1;
      for (std::size_t j = 0; j < p.candidates[i].options.size(); ++j) {
        const double v = x[m.first_col[i] - 1 + int(j)];
        if (v > best_x) best_x = v, best = int(j);
      }
      a.choice.push_back(best);
    }
  }
  Cbc_deleteModel(model);
  return a;
}

}  // namespace detail
#endif  // FRUGAL_HAVE_CBC

// The least device peak, from `start` (an answer that fits the problem's
// host and NVMe limits and requirements): CBC's best answer within
// `node_limit` nodes, or `start` where CBC finds none lower.
inline CbcLeast cbc_least_peak(const BudgetProblem& p, const Solution& start, int node_limit,
                               double backstop_seconds = 60) {
  CbcLeast r;
  r.solution = start;
#ifdef FRUGAL_HAVE_CBC
  if (p.candidates.empty() || p.positions == 0) {
    r.status = "nothing to choose";
    return r;
  }
  detail::IlpModel m = detail::build_ilp(p, 0, true);
  if (!m.infeasible.empty()) {
    r.status = "infeasible: " + m.infeasible;
    return r;
  }
  r.status = cat("not settled after ", detail::kMaxCutRounds, " rounds of cuts");
  const std::int64_t no_device_limit = std::numeric_limits<std::int64_t>::max() / 4;
  for (int round = 0; round < detail::kMaxCutRounds; ++round) {
    const detail::CbcAnswer a = detail::run_cbc(p, m, r.solution.choice, node_limit, backstop_seconds);
    if (!a.has_solution) {
      r.status = a.infeasible ? "CBC: infeasible" : "CBC found no answer within its limits";
      break;
    }
    const Evaluation e = evaluate(p, a.choice);
    if (!fits_target(p, e, e.device_peak)) {  // a host or NVMe row broken within CBC's tolerance
      detail::cut_off(p, m, a.choice, no_device_limit);
      continue;
    }
    if (e.device_peak < r.solution.eval.device_peak) r.solution = make_solution(p, a.choice, e.device_peak);
    const double lb = a.optimal ? std::min(a.best_possible, double(r.solution.eval.device_peak)) : a.best_possible;
    r.bound = std::max<std::int64_t>(0, std::int64_t(std::ceil(lb - 1e-6 * std::abs(lb))));
    r.proved = a.optimal;
    r.status = a.optimal ? "least proved by CBC (to its tolerance)" : cat("node limit of ", node_limit, " reached: best found, not proved");
    break;
  }
#else
  (void)node_limit, (void)backstop_seconds;
  r.status = "built without CBC (coinor-libcbc-dev)";
#endif
  return r;
}

}  // namespace frugal::plan
