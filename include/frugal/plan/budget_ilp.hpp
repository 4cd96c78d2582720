#pragma once
// The budget problem as a 0/1 integer program for GLPK (budget_exact.hpp
// drives it):
//
//   x[i][j] = 1 when candidate i takes option j     (binary)
//   sum_j x[i][j] = 1                                for every candidate
//   base[t] + sum x[i][j] * device(i,j,t) <= target  for every position t
//   sum x[i][j] * host(i,j,t) <= host budget         (and NVMe alike), when set
//   x[i][j] <= sum_{k allowed} x[c][k]               for each requirement
//   minimise sum x[i][j] * cost_ms(i,j)
//
// or, in min-peak mode, minimise a peak column z with base[t] + ... <= z.
//
// A position's row is only written for the position with the most base bytes
// among those that every effect covers alike, and not at all when no choice
// could break it. Options that another option of the same candidate beats on
// every count are fixed to 0. A row's bytes come in steps of the gcd of its
// coefficients, so its bound is rounded down to a step: exact for integer
// answers, and it both tightens the relaxation and makes a broken row broken
// by a whole step rather than within GLPK's tolerance.
//
// GLPK works in doubles and accepts a row broken within its tolerance (tens
// of bytes on rows of hundreds of MiB), so each answer is checked in exact
// bytes (evaluate). When it breaks row k, no answer that fits can match or
// exceed it, candidate by candidate, on row k's coefficients; so the cut
//   sum over i of x[i][j] for the j with coef_k(i,j) < coef_k(i, answer_i)  >= 1
// removes it and nothing that fits (cut_off). The model stays a relaxation of
// the exact problem, so GLPK's proofs (optimal, infeasible) hold for it too.
//
// FRUGAL_HAVE_GLPK alone decides whether GLPK is used: CMake defines it (and
// links glpk) for every target using frugal::frugal when it finds GLPK, and
// scripts/quick-test does where libglpk is installed. Whether glpk.h happens
// to be on the include path does not matter, so no translation unit uses
// GLPK while another, or the link line, does not.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "../core/bytes.hpp"
#include "../core/error.hpp"
#include "budget_exhaustive.hpp"

#ifdef FRUGAL_HAVE_GLPK
#include <glpk.h>
#endif

namespace frugal::plan {

#ifdef FRUGAL_HAVE_GLPK
inline constexpr bool kExactSolverHasGlpk = true;
#else
inline constexpr bool kExactSolverHasGlpk = false;
#endif

#if defined(FRUGAL_HAVE_GLPK) || defined(FRUGAL_HAVE_CBC)
namespace detail {

struct IlpRow {
  std::vector<int> cols;  // GLPK columns, 1-based
  std::vector<std::int64_t> coef;
  std::int64_t rhs = 0;
  enum Sense { at_most, exactly, at_least } sense = at_most;
  int tier = -1;  // 0 device, 1 host, 2 NVMe; -1 for choice, requirement and cut rows (unscaled)
  int position = -1;
  double unit = 1;  // bytes per model unit for a tier row: a power of two, so scaling is exact
};

struct IlpModel {
  std::vector<int> first_col;  // per candidate, the column of its option 0
  int cols = 0;                // binary columns; in min-peak mode column cols+1 is the peak
  std::vector<double> cost;    // per binary column
  std::vector<IlpRow> rows;
  std::vector<int> banned;     // columns of dominated options, fixed to 0
  bool min_peak = false;
  double peak_unit = 1;        // bytes per unit of the peak column and of every device row in min-peak mode
  std::int64_t peak_floor = 0; // no answer peaks below this
  std::string infeasible;      // set when a row cannot hold whatever is chosen
};

inline const std::vector<MemEffect>& tier_effects(const Option& o, int tier) {
  return tier == 0 ? o.device : tier == 1 ? o.host : o.nvme;
}

inline double pow2_at_least(double v) { return v <= 1 ? 1.0 : std::exp2(std::ceil(std::log2(v))); }

// Option j of a candidate is dominated by its option k when k costs no more,
// holds no more bytes of any tier at any position, requires nothing j does
// not, and every requirement on the candidate that allows j allows k: any
// answer taking j takes k as well or better. (Ties: the lower index stays.)
inline void ban_dominated_options(const BudgetProblem& p, IlpModel& m) {
  const std::size_t n = p.candidates.size();
  // allowing[i]: the masks of every requirement on candidate i.
  std::vector<std::vector<std::uint32_t>> allowing(n);
  for (auto& c : p.candidates)
    for (auto& o : c.options)
      for (auto& r : o.requires_) allowing[std::size_t(r.candidate)].push_back(r.allowed);
  for (std::size_t i = 0; i < n; ++i) {
    const auto& opts = p.candidates[i].options;
    std::vector<std::vector<std::int64_t>> dense[3];
    for (auto& o : opts)
      for (int tier = 0; tier < 3; ++tier) dense[tier].push_back(dense_effect(p, tier_effects(o, tier)));
    auto dominates = [&](std::size_t k, std::size_t j) {
      if (j >= 32 || k >= 32 || opts[k].cost_ms > opts[j].cost_ms) return false;
      bool strictly = opts[k].cost_ms < opts[j].cost_ms || k < j;
      for (int tier = 0; tier < 3; ++tier)
        for (int t = 0; t < p.positions; ++t) {
          const auto bk = dense[tier][k][std::size_t(t)], bj = dense[tier][j][std::size_t(t)];
          if (bk > bj) return false;
          strictly = strictly || bk < bj;
        }
      for (auto& rk : opts[k].requires_) {
        bool also_j = false;
        for (auto& rj : opts[j].requires_) also_j = also_j || (rj.candidate == rk.candidate && rj.allowed == rk.allowed);
        if (!also_j) return false;
      }
      for (std::uint32_t mask : allowing[i])
        if (((mask >> j) & 1u) && !((mask >> k) & 1u)) return false;
      return strictly;
    };
    for (std::size_t j = 0; j < opts.size(); ++j)
      for (std::size_t k = 0; k < opts.size(); ++k)
        if (k != j && dominates(k, j)) {
          m.banned.push_back(m.first_col[i] + int(j));
          break;
        }
  }
}

// Where some option's effect on a tier begins or ends, with 0 and the
// step's end, sorted: between two consecutive ones every option's effect is
// the same (one row of positions each).
inline std::vector<int> segment_ends(const BudgetProblem& p, int tier) {
  std::vector<int> cuts{0, p.positions};
  for (auto& c : p.candidates)
    for (auto& o : c.options)
      for (auto& e : tier_effects(o, tier))
        if (!e.span.empty()) cuts.push_back(e.span.first), cuts.push_back(e.span.last + 1);
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  return cuts;
}

// The coefficients build_ilp would hold in its rows of positions: for each
// tier, every option's effect counted once per segment (between two span
// ends) it covers. Counted without building anything, so that a problem
// whose model would not fit in memory is never built: the step of a
// 1T-parameter GPT (14,000 candidates over 8,000 positions, its persistent
// state in every row) needed hundreds of millions, over 24 GB.
inline std::size_t ilp_position_coefficients(const BudgetProblem& p) {
  std::size_t total = 0;
  for (int tier = 0; tier < 3; ++tier) {
    const std::vector<int> cuts = segment_ends(p, tier);
    for (auto& c : p.candidates)
      for (auto& o : c.options)
        for (auto& e : tier_effects(o, tier))
          if (!e.span.empty())
            total += std::size_t(std::lower_bound(cuts.begin(), cuts.end(), e.span.last + 1) -
                                 std::lower_bound(cuts.begin(), cuts.end(), e.span.first));
  }
  return total;
}
// Above it, the integer program of a problem is not built (its LP bound and
// CBC's search are skipped; the local search's answer stands): build_ilp
// holds only nonzeros, so this bounds its memory and GLPK's or CBC's (about
// 1 GB), far above the largest step the suite and bench/budget_gap solve
// exactly.
inline constexpr std::size_t kIlpCoefficientLimit = std::size_t(20) << 20;

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
    r.sense = IlpRow::exactly;
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

  ban_dominated_options(p, m);

  struct Segment {
    int position;
    std::int64_t base;
    std::vector<std::pair<int, std::int64_t>> coef;  // the nonzero ones, by column (0-based)
    std::int64_t least, most;        // the fewest and most bytes the candidates can add
  };
  const std::int64_t limits[3] = {target, p.host_budget, p.nvme_budget};
  std::vector<IlpRow> device_rows;
  for (int tier = 0; tier < 3; ++tier) {
    if (tier > 0 && limits[tier] == 0) continue;
    const std::vector<int> cuts = segment_ends(p, tier);
    std::vector<Segment> segments;
    for (std::size_t k = 0; k + 1 < cuts.size(); ++k) {
      Segment s;
      s.position = cuts[k];
      if (tier == 0)
        for (int t = cuts[k]; t < cuts[k + 1]; ++t)
          if (p.base[std::size_t(t)] > p.base[std::size_t(s.position)]) s.position = t;
      s.base = tier == 0 ? p.base[std::size_t(s.position)] : 0;
      s.least = s.most = 0;
      int col = 0;
      for (auto& c : p.candidates) {
        std::int64_t lo = std::numeric_limits<std::int64_t>::max(), hi = std::numeric_limits<std::int64_t>::min();
        for (auto& o : c.options) {
          std::int64_t b = bytes_at(tier_effects(o, tier), s.position);
          if (b != 0) s.coef.push_back({col, b});
          ++col;
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
      for (auto [col, b] : s.coef) {
        r.cols.push_back(col + 1);
        r.coef.push_back(b);
        scale = std::max<std::int64_t>(scale, std::llabs(b));
      }
      // Coefficients near 1: GLPK's tolerances are relative to them.
      r.unit = pow2_at_least(double(scale));
      if (!(tier == 0 && min_peak)) {
        // The row's bytes come in steps of the gcd of its coefficients: round
        // its bound down to a step, so that an answer breaking it breaks it by
        // a whole step, more than GLPK's tolerance unless the step is tiny.
        std::int64_t g = 0;
        for (std::int64_t c : r.coef) g = std::gcd(g, std::llabs(c));
        if (g > 1) r.rhs = (r.rhs >= 0 ? r.rhs / g : -((-r.rhs + g - 1) / g)) * g;
      }
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

// Adds a cut for every tier row `choice` breaks in exact bytes (see the top
// of this file), or, if it breaks none, one that removes `choice` alone.
// Returns the most bytes it breaks a row by.
inline std::int64_t cut_off(const BudgetProblem& p, IlpModel& m, const std::vector<int>& choice, std::int64_t target) {
  const Profiles pr = profiles(p, choice);
  const std::int64_t limits[3] = {target, p.host_budget, p.nvme_budget};
  std::int64_t worst = 0;
  std::vector<IlpRow> cuts;
  for (const IlpRow& r : m.rows) {
    if (r.tier < 0) continue;
    const auto& prof = r.tier == 0 ? pr.device : r.tier == 1 ? pr.host : pr.nvme;
    const std::int64_t over = prof[std::size_t(r.position)] - limits[r.tier];
    if (over <= 0) continue;
    worst = std::max(worst, over);
    std::vector<std::int64_t> coef(std::size_t(m.cols), 0);
    for (std::size_t e = 0; e < r.cols.size(); ++e) coef[std::size_t(r.cols[e] - 1)] = r.coef[e];
    IlpRow cut;
    cut.sense = IlpRow::at_least;
    cut.rhs = 1;
    for (std::size_t i = 0; i < p.candidates.size(); ++i) {
      const int chosen = m.first_col[i] + choice[i];
      for (std::size_t j = 0; j < p.candidates[i].options.size(); ++j) {
        const int col = m.first_col[i] + int(j);
        if (coef[std::size_t(col - 1)] < coef[std::size_t(chosen - 1)]) {
          cut.cols.push_back(col);
          cut.coef.push_back(1);
        }
      }
    }
    cuts.push_back(std::move(cut));
  }
  if (cuts.empty()) {  // broke no row in bytes (a requirement, by rounding): remove this answer only
    IlpRow cut;
    cut.sense = IlpRow::at_most;
    cut.rhs = std::int64_t(p.candidates.size()) - 1;
    for (std::size_t i = 0; i < p.candidates.size(); ++i) {
      cut.cols.push_back(m.first_col[i] + choice[i]);
      cut.coef.push_back(1);
    }
    cuts.push_back(std::move(cut));
  }
  for (auto& c : cuts) m.rows.push_back(std::move(c));
  return worst;
}

inline constexpr int kMaxCutRounds = 50;

}  // namespace detail
#endif  // FRUGAL_HAVE_GLPK || FRUGAL_HAVE_CBC

#ifdef FRUGAL_HAVE_GLPK
namespace detail {

struct GlpkAnswer {
  int ret = 0;     // glp_intopt's return code
  int status = 0;  // glp_mip_status
  std::vector<int> choice;
  double objective = 0;  // ms, or bytes of peak in min-peak mode
  // The least bound among the subproblems still open when the search last
  // reported, in the objective's units (bytes in min-peak mode): a lower
  // bound on the optimum when a limit stopped the search unproved.
  double open_bound = 0;
  bool open_bound_seen = false;
  bool has_solution() const {
    return ret == 0 || ret == GLP_ETMLIM || ret == GLP_ESTOP ? status == GLP_OPT || status == GLP_FEAS : false;
  }
  bool proved_infeasible() const { return ret == GLP_ENOPFS || (ret == 0 && status == GLP_NOFEAS); }
};

// Stops branch and cut once it has made `node_limit` nodes (when
// positive): a bound on work that, unlike a time limit, ends at the same
// node on every machine. Records the least open bound as it goes.
struct SearchWatch {
  int node_limit = 0;
  double open_bound = 0;
  bool seen = false;
};
inline void watch_search(glp_tree* tree, void* info) {
  auto* w = static_cast<SearchWatch*>(info);
  if (const int best = glp_ios_best_node(tree)) {
    w->open_bound = glp_ios_node_bound(tree, best);
    w->seen = true;
  }
  int active = 0, current = 0, total = 0;
  glp_ios_tree_size(tree, &active, &current, &total);
  if (w->node_limit > 0 && total > w->node_limit) glp_ios_terminate(tree);
}

// The model as a GLPK problem (binary columns; the caller deletes it).
inline glp_prob* glpk_problem(const IlpModel& m) {
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
    const double rhs = double(r.rhs) / r.unit;
    glp_set_row_bnds(lp, row, r.sense == IlpRow::exactly ? GLP_FX : r.sense == IlpRow::at_least ? GLP_LO : GLP_UP, rhs, rhs);
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
  for (int c : m.banned) glp_set_col_bnds(lp, c, GLP_FX, 0, 0);
  return lp;
}

// The optimum of the model's linear relaxation (every binary column let
// take any value in [0, 1]), in bytes of peak in min-peak mode: a lower
// bound on the integer optimum. False when the simplex proves nothing.
inline bool run_glpk_relaxation(const BudgetProblem&, const IlpModel& m, double& objective) {
  glp_prob* lp = glpk_problem(m);
  for (int c = 1; c <= m.cols; ++c) {
    glp_set_col_kind(lp, c, GLP_CV);
    if (std::find(m.banned.begin(), m.banned.end(), c) == m.banned.end()) glp_set_col_bnds(lp, c, GLP_DB, 0, 1);
  }
  glp_smcp parm;
  glp_init_smcp(&parm);
  parm.msg_lev = GLP_MSG_OFF;
  parm.presolve = GLP_ON;
  const int ret = glp_simplex(lp, &parm);
  const bool ok = ret == 0 && glp_get_status(lp) == GLP_OPT;
  if (ok) objective = glp_get_obj_val(lp) * (m.min_peak ? m.peak_unit : 1.0);
  glp_delete_prob(lp);
  return ok;
}

// One branch-and-cut run, for at most `seconds` and (when positive) at most
// `node_limit` branch-and-bound nodes.
inline GlpkAnswer run_glpk(const BudgetProblem& p, const IlpModel& m, double seconds, int node_limit = 0) {
  glp_prob* lp = glpk_problem(m);
  glp_iocp parm;
  glp_init_iocp(&parm);
  parm.presolve = GLP_ON;
  parm.msg_lev = GLP_MSG_OFF;
  parm.tm_lim = int(std::clamp(seconds * 1000.0, 1.0, 2.0e9));
  SearchWatch watch{node_limit};
  parm.cb_func = watch_search;
  parm.cb_info = &watch;
  GlpkAnswer a;
  a.ret = glp_intopt(lp, &parm);
  a.status = glp_mip_status(lp);
  a.open_bound = watch.open_bound * (m.min_peak ? m.peak_unit : 1.0);
  a.open_bound_seen = watch.seen;
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

}  // namespace detail
#endif  // FRUGAL_HAVE_GLPK

}  // namespace frugal::plan
