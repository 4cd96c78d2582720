// plan/budget_exact.hpp and plan/budget_exhaustive.hpp: on seeded random
// problems shaped like a training step, the ILP's optimum equals exhaustive
// search's, exhaustive search equals plain enumeration, the greedy never
// beats either, and below the least feasible peak all three find nothing.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <set>
#include <tuple>
#include <vector>

#include <frugal/plan/budget_cbc.hpp>
#include <frugal/plan/budget_cheapen.hpp>
#include <frugal/plan/budget_exact.hpp>
#include <frugal/plan/budget_fit.hpp>
#include <frugal/plan/budget_least.hpp>
#include <frugal/plan/budget_solve.hpp>

// Whether glpk.h is installed must not matter: only FRUGAL_HAVE_GLPK, which
// the build defines together with linking glpk, brings GLPK in.
#if !defined(FRUGAL_HAVE_GLPK) && defined(GLP_MAJOR_VERSION)
#error "plan/budget_ilp.hpp included glpk.h though FRUGAL_HAVE_GLPK is not defined"
#endif

using namespace frugal;
using namespace frugal::plan;

namespace {

struct StepShape {
  int min_layers = 3, max_layers = 7;
  std::int64_t unit = 4096;  // activation sizes are multiples of this (plus `odd` bytes)
  std::int64_t odd = 0;      // add up to this many stray bytes to each size: rows nowhere near round numbers
};

// A step of L layers: forward op k at position k, its backward at 2L-1-k.
// Layer k produces a_k (the next layer's input, needed again by layer k+1's
// backward) and s_k (saved for its own backward). A value is a candidate over
// the idle window between its last forward use and its backward use. Options:
// keep; swap to host (frees the window less the copy times at each end, costs
// the copies the window's compute cannot hide); recompute (frees the whole
// window, costs the producer's time, requires the producer's input kept);
// sometimes spill to NVMe. A few random requirements tie swaps together.
BudgetProblem step_problem(std::uint64_t seed, const StepShape& shape = {}) {
  std::mt19937_64 rng(seed);
  auto uni = [&](double a, double b) { return std::uniform_real_distribution<double>(a, b)(rng); };
  auto pick = [&](int a, int b) { return std::uniform_int_distribution<int>(a, b)(rng); };
  const int L = pick(shape.min_layers, shape.max_layers);
  const bool with_nvme = uni(0, 1) < 0.3 && L <= 5;
  BudgetProblem p;
  p.positions = 2 * L;
  p.op_ms.resize(std::size_t(p.positions));
  for (auto& ms : p.op_ms) ms = uni(0.2, 3.0);
  p.base.assign(std::size_t(p.positions), std::int64_t(pick(1, 8)) * shape.unit * 16);  // parameters
  for (auto& b : p.base) b += std::int64_t(uni(0, 4)) * shape.unit;                  // workspace
  const double host_ms_per_unit = uni(0.05, 0.6), nvme_ms_per_unit = host_ms_per_unit * uni(2, 5);

  struct Value {
    int producer, last_forward, backward, input;  // input: candidate index of the producer's input, or -1
  };
  std::vector<Value> values;
  std::vector<int> a_candidate(std::size_t(L), -1);
  std::int64_t swappable = 0;
  for (int k = 0; k < L; ++k) {
    // s_k: produced at k, needed by backward k at 2L-1-k.
    // a_k: produced at k, read by forward k+1, needed by backward k+1 at 2L-2-k.
    for (int which = 0; which < 2; ++which) {
      const bool is_a = which == 0;
      if (is_a && k == L - 1) continue;  // the output goes straight into the loss
      Value v{k, is_a ? k + 1 : k, is_a ? 2 * L - 2 - k : 2 * L - 1 - k, k > 0 ? a_candidate[std::size_t(k - 1)] : -1};
      const std::int64_t bytes = std::int64_t(pick(1, 24)) * shape.unit + (shape.odd ? std::int64_t(pick(0, int(shape.odd))) : 0);
      for (int t = v.producer; t <= v.backward; ++t) p.base[std::size_t(t)] += bytes;
      if (v.backward - v.last_forward < 2) continue;  // no idle window
      Candidate c;
      c.bytes = std::size_t(bytes);
      c.before = v.last_forward;
      c.after = v.backward;
      c.options.push_back(Option{});
      const Span window{v.last_forward + 1, v.backward - 1};
      double window_ms = 0;
      for (int t = window.first; t <= window.last; ++t) window_ms += p.op_ms[std::size_t(t)];
      auto transfer = [&](Choice kind, double ms_per_unit) {
        const double copy_ms = double(bytes) / double(shape.unit) * ms_per_unit;
        Option o;
        o.choice = kind;
        // Freed once the copy out has run beside the window's first ops, taken back when the fetch starts.
        int out = window.first;
        for (double done = 0; out <= window.last && done < copy_ms; ++out) done += p.op_ms[std::size_t(out)];
        int in = window.last + 1;
        for (double done = 0; in > window.first && done < copy_ms;) done += p.op_ms[std::size_t(--in)];
        o.out_done = out;
        o.in_start = in;
        o.cost_ms = std::max(0.0, 2 * copy_ms - window_ms) + 0.01;
        if (out <= in - 1) o.device.push_back({{out, in - 1}, -bytes});
        (kind == Choice::host ? o.host : o.nvme).push_back({window, bytes});
        return o;
      };
      c.options.push_back(transfer(Choice::host, host_ms_per_unit));
      swappable += bytes;
      Option re;
      re.choice = Choice::recompute;
      re.cost_ms = p.op_ms[std::size_t(v.producer)];
      re.device.push_back({window, -bytes});
      if (v.input >= 0) re.requires_.push_back({v.input, 1u});  // the producer's input must still be there
      c.options.push_back(re);
      if (with_nvme) c.options.push_back(transfer(Choice::nvme, nvme_ms_per_unit));
      if (is_a) a_candidate[std::size_t(k)] = int(p.candidates.size());
      p.candidates.push_back(std::move(c));
    }
  }
  // A few swaps that may not share the copy engine with another's swap.
  const int n = int(p.candidates.size());
  for (int r = 0; r < n / 3 && n > 1; ++r) {
    int i = pick(0, n - 1), c = pick(0, n - 1);
    if (c == i) continue;
    p.candidates[std::size_t(i)].options[1].requires_.push_back({c, ~0u & ~(1u << 1)});
  }
  if (uni(0, 1) < 0.6) p.host_budget = std::max<std::int64_t>(1, std::int64_t(double(swappable) * uni(0.2, 0.7)));
  if (with_nvme) p.nvme_budget = std::max<std::int64_t>(1, std::int64_t(double(swappable) * uni(0.2, 0.7)));
  return p;
}

std::int64_t unconstrained_peak(const BudgetProblem& p) { return *std::max_element(p.base.begin(), p.base.end()); }

// Every choice vector, one by one: the oracle for exhaustive search's pruning.
Solution enumerate_all(const BudgetProblem& p, std::int64_t target) {
  std::vector<int> choice(p.candidates.size(), 0), best;
  double best_cost = std::numeric_limits<double>::infinity();
  for (;;) {
    Evaluation e = evaluate(p, choice);
    if (fits_target(p, e, target) && e.cost_ms < best_cost) best_cost = e.cost_ms, best = choice;
    std::size_t i = 0;
    while (i < choice.size() && ++choice[i] == int(p.candidates[i].options.size())) choice[i++] = 0;
    if (i == choice.size()) break;
  }
  return make_solution(p, best.empty() ? std::vector<int>(p.candidates.size(), 0) : best, target);
}

// The targets worth asking about: the unconstrained peak, the least feasible
// peak, a byte under it, and a few in between.
std::vector<std::int64_t> targets_for(const BudgetProblem& p, std::int64_t least, std::uint64_t seed) {
  std::mt19937_64 rng(seed * 7919 + 1);
  const std::int64_t top = unconstrained_peak(p);
  std::vector<std::int64_t> t{top, least, least - 1, least / 2};
  for (int k = 0; k < 4; ++k) t.push_back(least + std::int64_t(std::uniform_real_distribution<double>(0, 1)(rng) * double(top - least)));
  return t;
}

}  // namespace

TEST_CASE("exhaustive search finds what enumerating every choice finds", "[budget-exact]") {
  int checked = 0;
  for (std::uint64_t seed = 1; seed <= 60; ++seed) {
    BudgetProblem p = step_problem(seed, {.min_layers = 3, .max_layers = 5});
    if (option_combinations(p) > 20000) continue;
    const std::int64_t top = unconstrained_peak(p);
    for (double f : {1.0, 0.9, 0.8, 0.7, 0.6, 0.5}) {
      const std::int64_t target = std::int64_t(double(top) * f);
      Solution ex = solve_exhaustive(p, target), all = enumerate_all(p, target);
      INFO("seed " << seed << " target " << target);
      REQUIRE(ex.feasible == all.feasible);
      if (ex.feasible) REQUIRE(std::fabs(ex.eval.cost_ms - all.eval.cost_ms) <= 1e-9);
      ++checked;
    }
  }
  CHECK(checked >= 100);
}

TEST_CASE("the ILP's optimum is exhaustive search's, and the greedy never beats it", "[budget-exact]") {
  if (!kExactSolverHasGlpk) WARN("built without GLPK: solve_exact is exhaustive search here; install libglpk-dev");
  int feasible = 0, infeasible = 0, greedy_optimal = 0, greedy_feasible = 0;
  for (std::uint64_t seed = 1; seed <= 80; ++seed) {
    BudgetProblem p = step_problem(seed);
    ExactResult least = solve_exhaustive_min_memory(p);
    REQUIRE(least.solution.feasible);
    const std::int64_t m = least.solution.eval.device_peak;
    for (std::int64_t target : targets_for(p, m, seed)) {
      INFO("seed " << seed << ": " << p.candidates.size() << " candidates, " << p.positions << " positions, target "
                   << target << ", least peak " << m);
      p.device_budget = target;
      Solution ex = solve_exhaustive(p, target);
      ExactResult ilp = solve_exact(p, target);
      Solution greedy = solve_greedy(p, target);
      INFO("ILP status: " << ilp.status);
      REQUIRE(ex.feasible == ilp.solution.feasible);
      REQUIRE(ex.feasible == (target >= m));
      if (!ex.feasible) {
        CHECK(ilp.proved_infeasible);
        CHECK_FALSE(greedy.feasible);
        ++infeasible;
        continue;
      }
      ++feasible;
      CHECK(ilp.optimal);
      if (kExactSolverHasGlpk) CHECK(ilp.status == "optimal");  // GLPK's first answer fit: the model, not the re-check, got it right
      CHECK(std::fabs(ilp.solution.eval.cost_ms - ex.eval.cost_ms) <= 1e-9);
      const Evaluation e = evaluate(p, ilp.solution.choice);
      CHECK(e.fits(p));
      CHECK(e.device_peak <= target);
      if (greedy.feasible) {
        ++greedy_feasible;
        CHECK(greedy.eval.cost_ms >= ex.eval.cost_ms - 1e-9);
        if (greedy.eval.cost_ms <= ex.eval.cost_ms + 1e-9) ++greedy_optimal;
      }
    }
  }
  // Both sides of the boundary were asked about, and the greedy is not
  // trivially optimal (else the gap would say nothing).
  CHECK(feasible >= 300);
  CHECK(infeasible >= 150);
  CHECK(greedy_optimal < greedy_feasible);
}

TEST_CASE("below the least feasible peak none of the three finds an answer; at it the exact ones do", "[budget-exact]") {
  for (std::uint64_t seed = 100; seed <= 130; ++seed) {
    BudgetProblem p = step_problem(seed);
    const std::int64_t m = solve_exhaustive_min_memory(p).solution.eval.device_peak;
    INFO("seed " << seed << ", least peak " << m);
    for (std::int64_t target : {m - 1, m - 4096, m * 9 / 10, std::int64_t(0)}) {
      CHECK_FALSE(solve_greedy(p, target).feasible);
      CHECK_FALSE(solve_exhaustive(p, target).feasible);
      ExactResult ilp = solve_exact(p, target);
      CHECK_FALSE(ilp.solution.feasible);
      CHECK(ilp.proved_infeasible);
    }
    CHECK(solve_exhaustive(p, m).feasible);
    ExactResult at = solve_exact(p, m);
    CHECK(at.solution.feasible);
    CHECK(at.solution.eval.device_peak == m);
  }
}

TEST_CASE("the exact least-memory answer has exhaustive search's peak and cost", "[budget-exact]") {
  for (std::uint64_t seed = 200; seed <= 240; ++seed) {
    BudgetProblem p = step_problem(seed);
    ExactResult want = solve_exhaustive_min_memory(p);
    ExactResult got = solve_exact_min_memory(p);
    INFO("seed " << seed << ": " << got.status);
    REQUIRE(got.solution.feasible);
    CHECK(got.optimal);
    CHECK(got.solution.eval.device_peak == want.solution.eval.device_peak);
    CHECK(std::fabs(got.solution.eval.cost_ms - want.solution.eval.cost_ms) <= 1e-9);
    // The greedy's least memory is never below the true least.
    CHECK(solve_min_memory(p).eval.device_peak >= got.solution.eval.device_peak);
  }
}

TEST_CASE("cheapen lowers the cost of a fitting choice and never its fit: peak, limits, requirements", "[budget-exact][cheapen]") {
  int cheaper = 0, reached_optimum = 0;
  for (std::uint64_t seed = 500; seed <= 560; ++seed) {
    BudgetProblem p = step_problem(seed);
    // Every candidate at the option that frees the most device bytes over
    // the step (one of the least-memory search's starts, and dear); at its
    // own peak, and with some room above it, cheapen may only move it to
    // cheaper choices that still fit.
    const std::vector<int> least = transfer_start(p).choice;
    const Evaluation was = evaluate(p, least);
    REQUIRE(fits_target(p, was, was.device_peak));
    for (std::int64_t bound : {was.device_peak, was.device_peak + (unconstrained_peak(p) - was.device_peak) / 3}) {
      INFO("seed " << seed << ", bound " << bound);
      const Solution c = cheapen(p, least, bound);
      REQUIRE(c.feasible);
      CHECK(c.eval.requirements_met);
      CHECK(c.eval.device_peak <= bound);
      CHECK(c.eval.cost_ms <= was.cost_ms + 1e-9);
      cheaper += c.eval.cost_ms < was.cost_ms - 1e-9;
      // Never below the exact optimum for that bound (the oracle).
      const Solution best = solve_exhaustive(p, bound);
      REQUIRE(best.feasible);
      CHECK(c.eval.cost_ms >= best.eval.cost_ms - 1e-9);
      reached_optimum += c.eval.cost_ms <= best.eval.cost_ms + 1e-9;
    }
  }
  // Not vacuous: that start is often dearer than it needs to be.
  CHECK(cheaper > 10);
  WARN("cheapen reached the exact cheapest plan on " << reached_optimum << " of 122 bounds");
}

TEST_CASE("cheapen drops a recomputation the peak does not need and keeps one it does", "[budget-exact][cheapen]") {
  // Positions 0..5; the peak is at 1 (base 100). Candidate 0 frees 30 over
  // [1, 2]: needed to get under 90. Candidate 1 frees 10 over [3, 4], where
  // the base is only 50: not needed at any bound of 90 or more.
  BudgetProblem p;
  p.positions = 6;
  p.base = {40, 100, 80, 50, 50, 40};
  p.op_ms.assign(6, 1.0);
  auto recompute = [](Span s, std::int64_t bytes, double ms) {
    Option o;
    o.choice = Choice::recompute;
    o.cost_ms = ms;
    o.device = {{s, -bytes}};
    return o;
  };
  p.candidates.push_back({0, 30, 0, 3, false, {Option{}, recompute({1, 2}, 30, 2.0)}});
  p.candidates.push_back({1, 10, 2, 5, false, {Option{}, recompute({3, 4}, 10, 5.0)}});
  const Solution c = cheapen(p, {1, 1}, 90);
  REQUIRE(c.feasible);
  CHECK(c.choice == std::vector<int>{1, 0});
  CHECK(c.eval.cost_ms == Approx(2.0));
  CHECK(c.eval.device_peak == 70);
  // A choice that does not fit its bound is returned as it is, not fitting.
  CHECK_FALSE(cheapen(p, {0, 0}, 90).feasible);
}

TEST_CASE("the least-memory lower bound never exceeds the exact least", "[budget-exact][bound]") {
  int below = 0;
  for (std::uint64_t seed = 300; seed <= 380; ++seed) {
    BudgetProblem p = step_problem(seed);
    const std::int64_t least = solve_exhaustive_min_memory(p).solution.eval.device_peak;
    const std::int64_t bound = least_memory_lower_bound(p);
    INFO("seed " << seed << ": least " << least << ", bound " << bound);
    CHECK(bound <= least);
    CHECK(bound >= *std::min_element(p.base.begin(), p.base.end()));  // not vacuous
    below += bound < least;
  }
  WARN("the bound is below the exact least on " << below << " of 81 problems");
}

TEST_CASE("the row-generation bound never exceeds the exact least, and never falls below the relaxation's",
          "[budget-exact][bound]") {
  int tighter = 0, proved = 0;
  for (std::uint64_t seed = 300; seed <= 340; ++seed) {
    BudgetProblem p = step_problem(seed);
    const std::int64_t least = solve_exhaustive_min_memory(p).solution.eval.device_peak;
    const std::int64_t relaxed = least_memory_lower_bound(p);
    // A node limit of 1 stops most runs unproved: their bound is GLPK's
    // least open bound, which must hold as well.
    for (int nodes : {1, 2000}) {
      bool exact = false;
      const std::int64_t rows = least_memory_row_bound(p, nodes, 12, &exact);
      INFO("seed " << seed << ", nodes " << nodes << ": least " << least << ", relaxation " << relaxed << ", rows " << rows);
      CHECK(rows <= least);
      CHECK(rows >= relaxed);
      if (exact) CHECK(rows == least);
      tighter += rows > relaxed;
      proved += exact;
    }
  }
  // Not vacuous where GLPK is there: it closes the gap on many of these.
  if (kExactSolverHasGlpk) CHECK(proved > 20);
  WARN("row generation beat the relaxation " << tighter << " times and proved the least " << proved << " times of 82");
}

TEST_CASE("CBC's least peak is exhaustive search's to a millionth, from any start, and its bound never exceeds it", "[budget-exact][cbc]") {
  if (!kHaveCbc) {
    WARN("built without CBC (coinor-libcbc-dev): nothing to check");
    return;
  }
  int improved = 0, proved = 0;
  for (std::uint64_t seed = 300; seed <= 340; ++seed) {
    for (const std::int64_t odd : {0, 255}) {  // round sizes, and hundreds of MiB with stray bytes
      BudgetProblem p = odd ? step_problem(seed, {.unit = std::int64_t(16) << 20, .odd = odd}) : step_problem(seed);
      const ExactResult ex = solve_exhaustive_min_memory(p);
      REQUIRE(ex.optimal);
      const std::int64_t least = ex.solution.eval.device_peak;
      // From the most naive start that fits: every candidate kept.
      Solution start = make_solution(p, std::vector<int>(p.candidates.size(), 0), std::numeric_limits<std::int64_t>::max());
      if (!start.feasible) continue;  // keep-all breaks a requirement or limit here
      const CbcLeast c = cbc_least_peak(p, start, 2000);
      INFO("seed " << seed << " odd " << odd << ": exhaustive " << least << ", CBC " << c.solution.eval.device_peak
                   << " (" << c.status << "), bound " << c.bound << ", start " << start.eval.device_peak);
      REQUIRE(c.solution.feasible);
      CHECK(fits_target(p, c.solution.eval, c.solution.eval.device_peak));  // in exact bytes, limits and requirements
      CHECK(c.solution.eval.device_peak >= least);
      CHECK(c.solution.eval.device_peak <= start.eval.device_peak);
      CHECK(c.bound <= least);
      // Proved: within a millionth of the exact least (CBC works in doubles).
      if (c.proved) CHECK(c.solution.eval.device_peak - least <= std::int64_t(std::ceil(1e-6 * double(least))));
      improved += c.solution.eval.device_peak < start.eval.device_peak;
      proved += c.proved;
    }
  }
  CHECK(improved > 20);  // not vacuous: keep-all is rarely the least
  CHECK(proved > 40);
  WARN("CBC lowered the start on " << improved << " problems and proved the least on " << proved);
}

TEST_CASE("hundreds of MiB with stray bytes: the ILP's answers fit to the byte at the tightest budget", "[budget-exact]") {
  // Sizes up to 24 x 16 MiB plus up to 255 odd bytes: GLPK's double
  // tolerances are then far coarser than a byte, and exactness rests on
  // re-checking its answers.
  for (std::uint64_t seed = 300; seed <= 330; ++seed) {
    BudgetProblem p = step_problem(seed, {.unit = std::int64_t(16) << 20, .odd = 255});
    ExactResult least = solve_exhaustive_min_memory(p);
    const std::int64_t m = least.solution.eval.device_peak;
    for (std::int64_t target : {m, m + 1, m + 255, m - 1}) {
      ExactResult ilp = solve_exact(p, target);
      Solution ex = solve_exhaustive(p, target);
      INFO("seed " << seed << ", target " << target << ", least " << m << ": " << ilp.status);
      REQUIRE(ilp.solution.feasible == ex.feasible);
      if (!ex.feasible) continue;
      CHECK(ilp.solution.eval.device_peak <= target);
      CHECK(ilp.optimal);
      CHECK(std::fabs(ilp.solution.eval.cost_ms - ex.eval.cost_ms) <= 1e-9);
    }
  }
}

TEST_CASE("options beaten or tied by another are dropped only where nothing needs them", "[budget-exact]") {
  // Candidate 0 must free 10 bytes at position 1. Options 1 and 2 are the
  // same swap, option 3 the same but dearer; candidate 1's only eviction
  // requires candidate 0 to take option 2 (say, a shared copy stream), and
  // the target needs both evictions.
  BudgetProblem p;
  p.positions = 3;
  p.base = {50, 100, 50};
  Candidate c0;
  c0.options.resize(4);
  for (int j = 1; j <= 3; ++j) {
    c0.options[std::size_t(j)].choice = Choice::host;
    c0.options[std::size_t(j)].cost_ms = j == 3 ? 2.0 : 1.0;
    c0.options[std::size_t(j)].device.push_back({{1, 1}, -10});
  }
  Candidate c1;
  c1.options.resize(2);
  c1.options[1].cost_ms = 0.5;
  c1.options[1].device.push_back({{0, 2}, -20});
  c1.options[1].requires_.push_back({0, 1u << 2});
  p.candidates = {c0, c1};
  ExactResult r = solve_exact(p, 70);
  INFO(r.status);
  REQUIRE(r.solution.feasible);
  CHECK(r.optimal);
  CHECK(r.solution.choice == std::vector<int>{2, 1});
  CHECK(r.solution.eval.cost_ms == 1.5);
  // Without the requirement, option 1 (the tie's lower index) serves.
  p.candidates[1].options[1].requires_.clear();
  r = solve_exact(p, 70);
  CHECK(r.solution.choice == std::vector<int>{1, 1});
}

TEST_CASE("exhaustive search refuses a problem with too many combinations, saying what to use", "[budget-exact]") {
  BudgetProblem p;
  p.positions = 4;
  p.base.assign(4, 100);
  for (int i = 0; i < 21; ++i) {
    Candidate c;
    c.options.resize(2);
    c.options[1].device.push_back({{1, 2}, -1});
    p.candidates.push_back(c);
  }
  REQUIRE(option_combinations(p) > kExhaustiveCombinationLimit);
  CHECK_THROWS_WITH(solve_exhaustive(p, 90), Catch::Matchers::Contains("use solve_exact (GLPK)"));
}

TEST_CASE("a problem too big for exhaustive search: GLPK solves it, a build without GLPK names libglpk-dev", "[budget-exact]") {
  BudgetProblem p;
  p.positions = 4;
  p.base = {80, 100, 100, 80};
  for (int i = 0; i < 21; ++i) {
    Candidate c;
    c.options.resize(2);
    c.options[1].device.push_back({{1, 2}, -1});
    p.candidates.push_back(c);
  }
  if (kExactSolverHasGlpk) {
    // Each eviction frees one byte at positions 1 and 2: ten are needed.
    for (int i = 0; i < 21; ++i) p.candidates[std::size_t(i)].options[1].cost_ms = 1 + 0.01 * i;
    ExactResult r = solve_exact(p, 90);
    REQUIRE(r.optimal);
    CHECK(r.solution.choice == std::vector<int>{1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0});
    // Positions 0 and 3 hold 80 whatever is evicted: the 20 cheapest evictions get there.
    ExactResult least = solve_exact_min_memory(p);
    CHECK(least.optimal);
    CHECK(least.solution.eval.device_peak == 80);
    CHECK(std::fabs(least.solution.eval.cost_ms - 21.9) < 1e-9);
  } else {
    CHECK_THROWS_WITH(solve_exact(p, 90), Catch::Matchers::Contains("install libglpk-dev"));
    CHECK_THROWS_WITH(solve_exact_min_memory(p), Catch::Matchers::Contains("install libglpk-dev"));
  }
}

TEST_CASE("FRUGAL_HAVE_GLPK alone decides whether the exact solver uses GLPK", "[budget-exact]") {
#ifdef FRUGAL_HAVE_GLPK
  CHECK(kExactSolverHasGlpk);
#else
  CHECK_FALSE(kExactSolverHasGlpk);  // even where glpk.h is installed
#endif
}

TEST_CASE("FRUGAL_HAVE_CBC alone decides whether the least-memory search uses CBC", "[budget-exact][cbc]") {
#ifdef FRUGAL_HAVE_CBC
  CHECK(kHaveCbc);
#else
  CHECK_FALSE(kHaveCbc);
#endif
}

TEST_CASE("a problem that reads outside its schedule is refused by name", "[budget-exact]") {
  BudgetProblem p;
  p.positions = 3;
  p.base.assign(3, 10);
  Candidate c;
  c.options.resize(2);
  c.options[1].device.push_back({{1, 3}, -5});
  p.candidates.push_back(c);
  CHECK_THROWS_WITH(solve_exact(p, 8), Catch::Matchers::Contains("outside the schedule"));
}

TEST_CASE("the least-memory search's answer is kept per view: the same view gets the search's own answer, a changed one is "
          "searched again",
          "[budget-exact][least][cache]") {
  LeastMemoryCache& cache = LeastMemoryCache::instance();
  for (std::uint64_t seed = 300; seed < 310; ++seed) {
    INFO("seed " << seed);
    BudgetProblem p = step_problem(seed);
    const Solution searched = least_memory_search(p);
    const Solution first = least_memory(p);
    const std::size_t hits = cache.hits();
    const Solution again = least_memory(p);
    CHECK(cache.hits() == hits + 1);
    for (const Solution* s : {&first, &again}) {
      CHECK(s->choice == searched.choice);
      CHECK(s->eval.device_peak == searched.eval.device_peak);
      CHECK(s->feasible == searched.feasible);
    }
    // The search reads no device budget, so another one is the same view;
    // any number it does read makes another key.
    BudgetProblem q = p;
    q.device_budget = p.device_budget / 2 + 1;
    CHECK(least_memory_key(q) == least_memory_key(p));
    const std::string key = least_memory_key(p);
    q = p, q.base.back() += 1;
    CHECK(least_memory_key(q) != key);
    q = p, q.host_budget += 1;
    CHECK(least_memory_key(q) != key);
    q = p, q.nvme_budget += 1;
    CHECK(least_memory_key(q) != key);
    for (std::size_t i = 0; i < p.candidates.size(); ++i)
      for (std::size_t j = 0; j < p.candidates[i].options.size(); ++j) {
        if (p.candidates[i].options[j].device.empty()) continue;
        q = p, q.candidates[i].options[j].device.back().bytes -= 1;
        CHECK(least_memory_key(q) != key);
        q = p, q.candidates[i].options[j].device.back().span.last -= 1;
        CHECK(least_memory_key(q) != key);
      }
  }
}

namespace {

// plan/budget_least.hpp's local search as it was before it judged moves by
// their pieces (commit 65cba79): every tried move evaluated as a whole choice.
Solution improve_by_evaluation(const BudgetProblem& p, Solution s, int max_rounds = 512) {
  const std::size_t n = std::size_t(std::max(p.positions, 0));
  const std::size_t C = p.candidates.size();
  const RequirementRepair repair(p);
  std::vector<std::pair<std::size_t, int>> undo;
  std::size_t start = 0;  // where the scan resumes: the last candidate moved
  for (int round = 0; round < max_rounds && n > 0; ++round) {
    const Evaluation now = evaluate(p, s.choice);
    const Profiles pr = profiles(p, s.choice);
    const std::int64_t peak = now.device_peak;
    const PeakPositions peaks(pr.device, peak);
    const std::vector<int>& at_peak = peaks.at;
    auto at_peak_bytes = [&](const Option& o) { return peaks.bytes(o); };
    bool moved = false;
    for (std::size_t step = 0; step < C && !moved; ++step) {
      const std::size_t i = (start + step) % C;
      const int was = s.choice[i];
      const Option& from = p.candidates[i].options[std::size_t(was)];
      for (int j = 0; j < int(p.candidates[i].options.size()) && !moved; ++j) {
        if (j == was) continue;
        const Option& to = p.candidates[i].options[std::size_t(j)];
        bool frees = false;
        for (int t : at_peak) frees = frees || bytes_at(to.device, t) < bytes_at(from.device, t);
        if (!frees) continue;
        std::vector<int> trial = s.choice;
        trial[i] = j;
        undo.clear();
        if (!repair.repair(trial, i, at_peak_bytes, undo)) continue;
        auto improves = [&](const std::vector<int>& c) {
          const Evaluation e = evaluate(p, c);
          if (!fits_target(p, e, e.device_peak) || e.device_peak > peak) return false;
          if (e.device_peak < peak) return true;
          std::size_t count = 0;
          for (std::int64_t b : profiles(p, c).device) count += b == peak;
          return count < at_peak.size();
        };
        if (improves(trial)) {
          s.choice = std::move(trial);
          moved = true;
          break;
        }
        // Over the host or NVMe limit: make room by moving one candidate that
        // holds bytes there (and nothing at the peak positions) to its option
        // with the fewest bytes at the peak among those holding less there.
        const Evaluation e = evaluate(p, trial);
        const bool host_over = p.host_budget && e.host_peak > p.host_budget;
        const bool nvme_over = p.nvme_budget && e.nvme_peak > p.nvme_budget;
        if (!e.requirements_met || (!host_over && !nvme_over) || e.device_peak > peak) continue;
        for (std::size_t k = 0; k < C && !moved; ++k) {
          if (k == i || trial[k] != s.choice[k]) continue;
          const Option& held = p.candidates[k].options[std::size_t(trial[k])];
          if ((host_over ? held.host : held.nvme).empty()) continue;
          int best = -1;
          std::int64_t best_bytes = 0;
          for (int m = 0; m < int(p.candidates[k].options.size()); ++m) {
            const Option& o = p.candidates[k].options[std::size_t(m)];
            if (m == trial[k] || !(host_over ? o.host : o.nvme).empty() || !may_choose(p, trial, k, m)) continue;
            const std::int64_t b = at_peak_bytes(o);
            if (best < 0 || b < best_bytes) best = m, best_bytes = b;
          }
          if (best < 0) continue;
          std::vector<int> pair = trial;
          pair[k] = best;
          if (improves(pair)) {
            s.choice = std::move(pair);
            moved = true;
          }
        }
      }
      if (moved) start = i;
    }
    if (!moved) break;
  }
  s.eval = evaluate(p, s.choice);
  s.feasible = fits_target(p, s.eval, s.eval.device_peak);
  return s;
}


// cheapen as it was written first: every trial evaluated whole. The
// reference the incremental one must agree with, trial for trial.
Solution cheapen_by_evaluation(const BudgetProblem& p, std::vector<int> choice, std::int64_t bound, int max_rounds = 64,
                               int hold_at = -1, std::int64_t hold_cap = 0) {
  const RequirementRepair repair(p);
  auto fits = [&](const Evaluation& e) { return fits_target(p, e, bound); };
  Evaluation now = evaluate(p, choice);
  if (!fits(now)) return make_solution(p, std::move(choice), bound);
  std::vector<std::pair<std::size_t, int>> undo;
  for (int round = 0; round < max_rounds; ++round) {
    const PeakPositions peaks(profiles(p, choice).device, now.device_peak);
    auto at_high = [&](const Option& o) { return peaks.bytes(o); };
    std::vector<std::size_t> order;
    for (std::size_t i = 0; i < p.candidates.size(); ++i)
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
        std::vector<int> trial = choice;
        trial[i] = j;
        undo.clear();
        if (!repair.repair(trial, i, at_high, undo)) continue;
        const Evaluation e = evaluate(p, trial);
        if (!fits(e) || e.cost_ms >= now.cost_ms - 1e-9) continue;
        if (hold_at >= 0 && profiles(p, trial).device[std::size_t(hold_at)] > hold_cap) continue;
        choice = std::move(trial);
        now = e;
        moved = true;
        break;
      }
    }
    if (!moved) break;
  }
  return make_solution(p, std::move(choice), bound);
}

// undo_unneeded as it was written first: every undo evaluated whole.
Solution undo_unneeded_by_evaluation(const BudgetProblem& p, std::vector<int> choice, std::int64_t bound) {
  std::vector<std::size_t> chosen;
  for (std::size_t i = 0; i < choice.size(); ++i)
    if (choice[i] != 0) chosen.push_back(i);
  std::stable_sort(chosen.begin(), chosen.end(), [&](std::size_t a, std::size_t b) {
    return p.candidates[a].options[std::size_t(choice[a])].cost_ms > p.candidates[b].options[std::size_t(choice[b])].cost_ms;
  });
  for (std::size_t i : chosen) {
    const int was = choice[i];
    if (!may_choose(p, choice, i, 0)) continue;
    choice[i] = 0;
    const Evaluation e = evaluate(p, choice);
    if (!e.requirements_met || e.device_peak > bound) choice[i] = was;
  }
  return make_solution(p, std::move(choice), bound);
}

// detail::move_off_freeing_most as it was written first: each option's
// requirements by walking every candidate, its host and NVMe bytes by
// walking every position.
void move_off_freeing_most_by_walking(const BudgetProblem& p, std::vector<int>& choice,
                                      const std::vector<std::size_t>& order) {
  auto fits = [](const std::vector<std::int64_t>& prof, const std::vector<MemEffect>& add, std::int64_t limit) {
    if (limit == 0 || add.empty()) return true;
    for (std::size_t t = 0; t < prof.size(); ++t)
      if (prof[t] + bytes_at(add, int(t)) > limit) return false;
    return true;
  };
  for (int pass = 0; pass < 2; ++pass)
    for (std::size_t i : order) {
      if (choice[i] != 0) continue;
      const Profiles pr = profiles(p, choice);
      int best = 0;
      double best_freed = 0;
      bool best_free = false;
      for (int j = 1; j < int(p.candidates[i].options.size()); ++j) {
        const Option& o = p.candidates[i].options[std::size_t(j)];
        const double f = -double(device_area(o));
        const bool free = o.requires_.empty();
        if (f < best_freed || (f == best_freed && (best != 0 && (best_free || !free))) || f <= 0) continue;
        if (!may_choose(p, choice, i, j)) continue;
        if (!fits(pr.host, o.host, p.host_budget) || !fits(pr.nvme, o.nvme, p.nvme_budget)) continue;
        best = j, best_freed = f, best_free = free;
      }
      if (best != 0) choice[i] = best;
    }
}

// detail::recompute_between_boundaries as it was written first: each move
// tried on a copy of the choice, its requirements checked by walking all.
void recompute_between_boundaries_by_copying(const BudgetProblem& p, std::vector<int>& choice) {
  const RequirementRepair repair(p);
  std::vector<std::size_t> order;
  for (std::size_t i = 0; i < p.candidates.size(); ++i)
    if (!p.candidates[i].wraps && !p.candidates[i].segment_boundary && choice[i] == 0) order.push_back(i);
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return p.candidates[a].after > p.candidates[b].after; });
  std::vector<std::pair<std::size_t, int>> undo;
  for (std::size_t i : order) {
    const auto& opts = p.candidates[i].options;
    int latest = -1;
    for (int j = 1; j < int(opts.size()); ++j)
      if (opts[std::size_t(j)].choice == Choice::recompute &&
          (latest < 0 || opts[std::size_t(j)].in_start > opts[std::size_t(latest)].in_start))
        latest = j;
    if (latest < 0 || choice[i] == latest) continue;
    std::vector<int> trial = choice;
    trial[i] = latest;
    undo.clear();
    if (!repair.repair(trial, i, plan::detail::kept_on_device_area, undo) || !requirements_met(p, trial)) continue;
    std::int64_t before = device_area(opts[std::size_t(choice[i])]), after = device_area(opts[std::size_t(latest)]);
    for (std::size_t u = 0; u < undo.size(); ++u) {
      const auto [k, old] = undo[u];
      if (k == i || std::any_of(undo.begin(), undo.begin() + std::ptrdiff_t(u), [&](auto& e) { return e.first == k; }))
        continue;
      before += device_area(p.candidates[k].options[std::size_t(old)]);
      after += device_area(p.candidates[k].options[std::size_t(trial[k])]);
    }
    if (after < before) choice = std::move(trial);
  }
}

}  // namespace

TEST_CASE("checkpointing's recomputations, moved in place, are the ones trying each on a copy finds", "[budget][least]") {
  // From nothing evicted, from the offload start's persistents moved off,
  // and from a random choice that may break requirements (where a move is
  // then judged by every requirement, as before).
  std::mt19937_64 rng(3);
  int moved = 0, broken_starts = 0;
  for (std::uint64_t seed = 1; seed <= 60; ++seed) {
    const BudgetProblem p = step_problem(seed, {.min_layers = 4, .max_layers = 16});
    std::vector<int> persistents_off(p.candidates.size(), 0), random(p.candidates.size(), 0);
    std::vector<std::size_t> persistents;
    for (std::size_t i = 0; i < p.candidates.size(); ++i) {
      if (p.candidates[i].wraps) persistents.push_back(i);
      if (rng() % 4 == 0) random[i] = int(rng() % p.candidates[i].options.size());
    }
    plan::detail::move_off_freeing_most(p, persistents_off, persistents);
    broken_starts += !requirements_met(p, random);
    for (const std::vector<int>& from : {std::vector<int>(p.candidates.size(), 0), persistents_off, random}) {
      std::vector<int> fast = from, copied = from;
      plan::detail::recompute_between_boundaries(p, fast);
      recompute_between_boundaries_by_copying(p, copied);
      INFO("seed " << seed);
      CHECK(fast == copied);
      moved += fast != from;
    }
  }
  CHECK(moved > 60);
  CHECK(broken_starts > 10);
}

TEST_CASE("the local search judges a move by its pieces exactly as by evaluating the whole choice", "[budget][least]") {
  // Larger steps than the exact tests: plateaus of equal peaks, long spans.
  for (std::uint64_t seed = 1; seed <= 60; ++seed) {
    BudgetProblem p = step_problem(seed, {.min_layers = 4, .max_layers = 16});
    for (const Solution& start : {solve_min_memory(p), transfer_start(p), checkpoint_start(p), offload_checkpoint_start(p),
                                  make_solution(p, std::vector<int>(p.candidates.size(), 0), unconstrained_peak(p))}) {
      const Solution fast = improve_least_memory(p, start);
      const Solution full = improve_by_evaluation(p, start);
      INFO("seed " << seed);
      CHECK(fast.choice == full.choice);
      CHECK(fast.eval.device_peak == full.eval.device_peak);
      CHECK(fast.feasible == full.feasible);
    }
  }
}

TEST_CASE("cheapen judges a trial by its pieces exactly as by evaluating the whole choice", "[budget][cheapen]") {
  int moved = 0;
  for (std::uint64_t seed = 1; seed <= 40; ++seed) {
    BudgetProblem p = step_problem(seed, {.min_layers = 4, .max_layers = 16});
    if (seed % 2) p.host_budget = std::max<std::int64_t>(1, evaluate(p, transfer_start(p).choice).host_peak / 2);
    for (const Solution& start : {transfer_start(p), improve_least_memory(p, checkpoint_start(p)),
                                  improve_least_memory(p, offload_checkpoint_start(p))}) {
      if (!start.feasible) continue;
      const std::int64_t least = start.eval.device_peak, room = unconstrained_peak(p) - least;
      const int hold_at = p.positions / 2;
      const std::int64_t hold_cap = profiles(p, start.choice).device[std::size_t(hold_at)] + room / 4;
      for (std::int64_t bound : {least, least + room / 5, least + room / 2}) {
        INFO("seed " << seed << ", bound " << bound);
        const Solution fast = cheapen(p, start.choice, bound);
        const Solution full = cheapen_by_evaluation(p, start.choice, bound);
        CHECK(fast.choice == full.choice);
        CHECK(fast.eval.cost_ms == full.eval.cost_ms);
        CHECK(fast.feasible == full.feasible);
        moved += fast.choice != start.choice;
        const Solution held = cheapen(p, start.choice, bound, 64, hold_at, hold_cap);
        CHECK(held.choice == cheapen_by_evaluation(p, start.choice, bound, 64, hold_at, hold_cap).choice);
        CHECK(profiles(p, held.choice).device[std::size_t(hold_at)] <= std::max(hold_cap, profiles(p, start.choice).device[std::size_t(hold_at)]));
      }
    }
  }
  CHECK(moved > 20);  // not vacuous: the starts are dear, and cheapen moves them
}

TEST_CASE("undo_unneeded judges an undo by its pieces exactly as by evaluating the whole choice", "[budget][cheapen]") {
  int undone = 0;
  for (std::uint64_t seed = 1; seed <= 40; ++seed) {
    BudgetProblem p = step_problem(seed, {.min_layers = 4, .max_layers = 16});
    if (seed % 2) p.host_budget = std::max<std::int64_t>(1, evaluate(p, transfer_start(p).choice).host_peak / 2);
    for (const Solution& start : {transfer_start(p), checkpoint_start(p), solve_min_memory(p),
                                  improve_least_memory(p, offload_checkpoint_start(p))}) {
      const std::int64_t least = start.eval.device_peak, room = std::max<std::int64_t>(0, unconstrained_peak(p) - least);
      // Below the start's own peak every undo is refused; above, some pass.
      for (std::int64_t bound : {least - 1, least, least + room / 5, least + room / 2, least + room}) {
        INFO("seed " << seed << ", bound " << bound);
        const Solution fast = undo_unneeded(p, start.choice, bound);
        const Solution full = undo_unneeded_by_evaluation(p, start.choice, bound);
        CHECK(fast.choice == full.choice);
        CHECK(fast.feasible == full.feasible);
        undone += fast.choice != start.choice;
      }
    }
  }
  CHECK(undone > 40);  // not vacuous: the starts evict more than the bounds need
}

TEST_CASE("a move's pieces, a profile's range maximum and its peak positions agree with walking every position",
          "[budget][least]") {
  std::mt19937_64 rng(7);
  for (std::uint64_t seed = 1; seed <= 30; ++seed) {
    BudgetProblem p = step_problem(seed, {.min_layers = 4, .max_layers = 12});
    const std::size_t n = std::size_t(p.positions);
    const std::vector<int> keep(p.candidates.size(), 0);
    for (int trial = 0; trial < 20; ++trial) {
      // A random move of up to three candidates.
      std::vector<int> choice = keep;
      std::vector<std::pair<std::size_t, int>> was, now;
      for (int k = 0; k < 3; ++k) {
        const std::size_t c = std::size_t(rng() % p.candidates.size());
        if (std::any_of(was.begin(), was.end(), [&](auto& w) { return w.first == c; })) continue;
        const int j = int(rng() % p.candidates[c].options.size());
        was.push_back({c, 0});
        now.push_back({c, j});
        choice[c] = j;
      }
      const Profiles before = profiles(p, keep), after = profiles(p, choice);
      for (auto [tier, b, a] : {std::tuple{&Option::device, &before.device, &after.device},
                                std::tuple{&Option::host, &before.host, &after.host},
                                std::tuple{&Option::nvme, &before.nvme, &after.nvme}}) {
        std::vector<std::int64_t> walked(*b);
        for (const DevicePiece& pc : tier_change(p, was, now, tier)) {
          CHECK(pc.bytes != 0);
          for (int t = pc.first; t <= pc.last; ++t) walked[std::size_t(t)] += pc.bytes;
        }
        CHECK(walked == *a);
      }
      const RangeMax most(after.device);
      for (int q = 0; q < 20; ++q) {
        int first = int(rng() % n), last = int(rng() % n);
        if (first > last) std::swap(first, last);
        CHECK(most(first, last) == *std::max_element(after.device.begin() + first, after.device.begin() + last + 1));
        const int at = most.argmax(first, last);
        CHECK((at >= first && at <= last && after.device[std::size_t(at)] == most(first, last)));
      }
      const std::int64_t peak = *std::max_element(after.device.begin(), after.device.end());
      const PeakPositions peaks(after.device, peak);
      for (std::size_t c = 0; c < p.candidates.size(); ++c)
        for (const Option& to : p.candidates[c].options) {
          const Option& from = p.candidates[c].options[std::size_t(choice[c])];
          std::int64_t at_peak = 0;
          bool frees = false;
          for (int t : peaks.at) {
            at_peak += bytes_at(to.device, t);
            frees = frees || bytes_at(to.device, t) < bytes_at(from.device, t);
          }
          CHECK(peaks.bytes(to) == at_peak);
          CHECK(peaks.frees(from, to) == frees);
        }
    }
  }
}

TEST_CASE("moving candidates off the device judges the host and NVMe limits as walking every position does",
          "[budget][least]") {
  int moved = 0;
  for (std::uint64_t seed = 1; seed <= 40; ++seed) {
    BudgetProblem p = step_problem(seed, {.min_layers = 4, .max_layers = 12});
    // No limit, a limit that binds, and one that takes almost nothing.
    const std::int64_t most = std::max<std::int64_t>(1, evaluate(p, transfer_start(p).choice).host_peak);
    for (std::int64_t limit : {std::int64_t(0), most / 2, most / 7 + 1}) {
      p.host_budget = limit;
      std::vector<std::size_t> order(p.candidates.size());
      for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
      plan::detail::sort_by_kept_area(p, order);
      for (const std::vector<int>& from : {std::vector<int>(p.candidates.size(), 0), checkpoint_start(p).choice}) {
        std::vector<int> fast = from, walked = from;
        plan::detail::move_off_freeing_most(p, fast, order);
        move_off_freeing_most_by_walking(p, walked, order);
        INFO("seed " << seed << ", host limit " << limit);
        CHECK(fast == walked);
        moved += fast != from;
        if (limit) CHECK(evaluate(p, fast).host_peak <= std::max(limit, evaluate(p, from).host_peak));
      }
    }
  }
  CHECK(moved > 60);
}

TEST_CASE("what the device, host and NVMe must hold together at a position bounds every choice, and is each position's least",
          "[budget][fit]") {
  std::mt19937_64 rng(5);
  int tight = 0;
  for (std::uint64_t seed = 1; seed <= 60; ++seed) {
    const BudgetProblem p = step_problem(seed, {.min_layers = 2, .max_layers = 10});
    for (TierWeights w : {TierWeights{1, 1, 1}, TierWeights{2, 2, 1}}) {
      auto weighted = [&](const std::vector<MemEffect>& d, const std::vector<MemEffect>& h,
                          const std::vector<MemEffect>& v, int t) {
        return w.device * bytes_at(d, t) + w.host * bytes_at(h, t) + w.nvme * bytes_at(v, t);
      };
      const std::vector<std::int64_t> least = least_bytes_on_all_tiers(p, w);
      REQUIRE(least.size() == std::size_t(p.positions));
      // Each position's least, by walking every option of every candidate.
      for (int t = 0; t < p.positions; ++t) {
        std::int64_t walked = w.device * p.base[std::size_t(t)];
        for (const Candidate& c : p.candidates) {
          std::int64_t fewest = std::numeric_limits<std::int64_t>::max();
          for (const Option& o : c.options) fewest = std::min(fewest, weighted(o.device, o.host, o.nvme, t));
          walked += fewest;
        }
        INFO("seed " << seed << ", position " << t << ", NVMe weight " << w.nvme);
        CHECK(least[std::size_t(t)] == walked);
      }
      // No choice holds less on the three tiers together, at any position.
      std::vector<std::vector<int>> choices = {transfer_start(p).choice, checkpoint_start(p).choice,
                                               solve_min_memory(p).choice, offload_checkpoint_start(p).choice};
      for (int k = 0; k < 20; ++k) {
        std::vector<int> c(p.candidates.size());
        for (std::size_t i = 0; i < c.size(); ++i) c[i] = int(rng() % p.candidates[i].options.size());
        choices.push_back(std::move(c));
      }
      for (const std::vector<int>& c : choices) {
        const Profiles pr = profiles(p, c);
        for (int t = 0; t < p.positions; ++t) {
          const std::size_t u = std::size_t(t);
          const std::int64_t held = w.device * pr.device[u] + w.host * pr.host[u] + w.nvme * pr.nvme[u];
          CHECK(held >= least[u]);
          tight += held == least[u];
        }
      }
    }
  }
  CHECK(tight > 100);  // not a loose bound: choices reach it
}

TEST_CASE("a problem whose tiers together cannot hold it is named infeasible, and one they can hold is not",
          "[budget][fit]") {
  int overflowing = 0, holding = 0;
  for (std::uint64_t seed = 1; seed <= 40; ++seed) {
    BudgetProblem p = step_problem(seed, {.min_layers = 2, .max_layers = 8});
    const std::vector<std::int64_t> alike = least_bytes_on_all_tiers(p);
    const std::int64_t most = *std::max_element(alike.begin(), alike.end());
    p.host_budget = std::max<std::int64_t>(1, most / 4);
    bool nvme = false;
    for (const Candidate& c : p.candidates)
      for (const Option& o : c.options) nvme = nvme || !o.nvme.empty();
    p.nvme_budget = nvme ? std::max<std::int64_t>(1, most / 4) : 0;
    const std::vector<std::int64_t> halved = least_bytes_on_all_tiers(p, {2, 2, 1});
    const std::int64_t most_halved = *std::max_element(halved.begin(), halved.end());
    for (std::int64_t device : {most - p.host_budget - p.nvme_budget - 1, most - p.host_budget - p.nvme_budget,
                                (most_halved - 2 * p.host_budget - p.nvme_budget + 1) / 2,
                                (most_halved - 2 * p.host_budget - p.nvme_budget + 1) / 2 - 1}) {
      p.device_budget = device;
      const bool over_alike = most > device + p.host_budget + p.nvme_budget;
      const bool over_halved = nvme && most_halved > 2 * device + 2 * p.host_budget + p.nvme_budget;
      const std::optional<TiersOverflow> over = tiers_overflow(p);
      INFO("seed " << seed << ", device " << device);
      REQUIRE(over.has_value() == (over_alike || over_halved));
      if (!over) {
        ++holding;
        continue;
      }
      ++overflowing;
      const TierWeights w = over->weights;
      CHECK(w.device == (over_alike ? 1 : 2));  // every byte alike first
      CHECK(over->needed == (over_alike ? most : most_halved));
      CHECK(over->room == w.device * device + w.host * p.host_budget + w.nvme * p.nvme_budget);
      CHECK(over->least_device > device);
      // And indeed no choice fits: the least search's answer breaks a limit.
      const Solution s = least_memory_heuristic(p);
      CHECK(!(s.feasible && s.eval.device_peak <= device));
    }
    p.host_budget = 0;  // no host limit: nothing to sum
    CHECK(!tiers_overflow(p));
  }
  CHECK(overflowing > 40);
  CHECK(holding > 40);
}

TEST_CASE("a profile under additions over spans keeps its range maxima and peak as walking every position does",
          "[budget][cheapen]") {
  std::mt19937_64 rng(11);
  for (std::size_t n : {std::size_t(1), std::size_t(2), std::size_t(7), std::size_t(64), std::size_t(1000)}) {
    std::vector<std::int64_t> walked(n);
    for (auto& v : walked) v = std::int64_t(rng() % 2001) - 1000;
    RangeAddMax most(walked);
    for (int step = 0; step < 300; ++step) {
      int first = int(rng() % n), last = int(rng() % n);
      if (first > last) std::swap(first, last);
      const std::int64_t bytes = std::int64_t(rng() % 2001) - 1000;
      most.add(first, last, bytes);
      for (int t = first; t <= last; ++t) walked[std::size_t(t)] += bytes;
      first = int(rng() % n), last = int(rng() % n);
      if (first > last) std::swap(first, last);
      CHECK(most(first, last) == *std::max_element(walked.begin() + first, walked.begin() + last + 1));
      CHECK(most.peak() == std::max<std::int64_t>(0, *std::max_element(walked.begin(), walked.end())));
    }
  }
  CHECK(RangeAddMax(std::vector<std::int64_t>{}).peak() == 0);
}

TEST_CASE("the greedy on a problem of thousands of candidates ends, meeting every requirement and the host limit",
          "[budget][least]") {
  // Above kBatchMovesAbove candidates the greedy takes several moves a
  // round; its moves once undid each other until the round limit (minutes
  // on a deep model), and together could pass the host limit.
  int batched = 0;
  for (std::uint64_t seed = 1; seed <= 4; ++seed) {
    BudgetProblem p = step_problem(seed, {.min_layers = 560, .max_layers = 700});
    batched += p.candidates.size() > kBatchMovesAbove;
    const Solution least = solve_min_memory(p);
    CHECK(least.eval.requirements_met);
    CHECK((p.host_budget == 0 || least.eval.host_peak <= p.host_budget));
    CHECK((p.nvme_budget == 0 || least.eval.nvme_peak <= p.nvme_budget));
    CHECK(least.eval.device_peak < unconstrained_peak(p));
    // A target between the least and the unconstrained peak is reached.
    const std::int64_t target = (least.eval.device_peak + unconstrained_peak(p)) / 2;
    const Solution s = solve_greedy(p, target);
    CHECK(s.eval.requirements_met);
    CHECK((p.host_budget == 0 || s.eval.host_peak <= p.host_budget));
    CHECK(s.feasible);
    CHECK(s.eval.device_peak <= target);
  }
  CHECK(batched == 4);
}

TEST_CASE("the integer program's size is counted before it is built, and bounds what is built", "[budget][least]") {
  // least_memory_search skips the LP bound and CBC above
  // kIlpCoefficientLimit: the count must never be below the nonzeros
  // build_ilp really holds in its rows of positions (else a program too
  // large for memory could still be built), and must grow with the step.
  std::size_t smallest = std::numeric_limits<std::size_t>::max(), largest = 0;
  for (std::uint64_t seed = 1; seed <= 30; ++seed) {
    BudgetProblem p = step_problem(seed, {.min_layers = 2, .max_layers = 12});
    if (seed % 3 == 0) p.host_budget = 1 << 20;  // host rows too
    const std::size_t counted = plan::detail::ilp_position_coefficients(p);
    const plan::detail::IlpModel m = plan::detail::build_ilp(p, 0, true);
    std::size_t built = 0;
    for (const plan::detail::IlpRow& r : m.rows)
      if (r.tier >= 0) built += r.cols.size();  // (the peak column is added when GLPK loads the rows)
    // Every option's nonzero bytes at every segment, walked: what build_ilp
    // holds before it drops the rows that can never bind.
    std::size_t walked = 0;
    for (int tier = 0; tier < 3; ++tier) {
      std::set<int> ends{0, p.positions};
      for (const Candidate& c : p.candidates)
        for (const Option& o : c.options)
          for (const MemEffect& e : plan::detail::tier_effects(o, tier))
            if (!e.span.empty()) ends.insert(e.span.first), ends.insert(e.span.last + 1);
      for (auto it = ends.begin(); std::next(it) != ends.end(); ++it)
        for (const Candidate& c : p.candidates)
          for (const Option& o : c.options) walked += bytes_at(plan::detail::tier_effects(o, tier), *it) != 0;
    }
    INFO("seed " << seed << ": counted " << counted << ", walked " << walked << ", built " << built);
    CHECK(built <= walked);
    CHECK(walked <= counted);
    CHECK(counted <= 2 * walked);  // an upper bound, not a wild one: it would skip problems CBC can solve
    CHECK(counted < plan::detail::kIlpCoefficientLimit);
    CHECK(built > 0);
    smallest = std::min(smallest, counted);
    largest = std::max(largest, counted);
  }
  CHECK(largest > 4 * smallest);
}
