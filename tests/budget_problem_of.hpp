#pragma once
// A planned step's budget problem, and a choice of it rewritten and
// verified: for tests that pick options by hand (an option the solver may
// or may not take on its own) and check that the plan they make is sound.
#include <catch2/catch.hpp>

#include <frugal/frugal.hpp>
#include <frugal/plan/budget_solve.hpp>
#include <frugal/plan/verify.hpp>

namespace test_support {

// `ps`'s budget problem under `budget`, priced by the CPU's default profile.
inline frugal::plan::BudgetProblem budget_problem_of(const frugal::PlannedStep& ps, const frugal::Budget& budget) {
  using namespace frugal;
  auto cm = std::make_shared<plan::CostModel>(DeviceProfile::defaults("cpu", 1));
  const plan::Prices prices = plan::step_prices(plan::prices_from(cm), *ps.graph, ps.plan.schedule);
  return plan::build_budget_problem(*ps.graph, ps.plan.schedule, ps.roots, budget, prices).problem;
}

// `choice` of `p` rewritten into `ps`'s graph, its plan checked by
// plan::verify; the rewrite, for what the test checks further.
inline frugal::plan::Rewritten verified_rewrite(const frugal::PlannedStep& ps, const frugal::plan::BudgetProblem& p,
                                                const std::vector<int>& choice) {
  using namespace frugal;
  plan::Rewritten rw = plan::rewrite_for_budget(*ps.graph, ps.plan.schedule, p, choice);
  const Plan planned = plan_schedule(*rw.graph, rw.schedule, ps.roots);
  INFO(plan::verify(*rw.graph, planned, ps.roots).str());
  CHECK(plan::verify(*rw.graph, planned, ps.roots).ok());
  return rw;
}

// A hand-picked `choice` that takes candidate `window` off the device (with
// what a recomputation reading it needs): every requirement met, no higher a
// device peak than with the window kept, and its rewrite verified (returned).
inline frugal::plan::Rewritten verified_window_choice(const frugal::PlannedStep& ps,
                                                      const frugal::plan::BudgetProblem& p,
                                                      const std::vector<int>& choice, std::size_t window) {
  using namespace frugal;
  REQUIRE(!choice.empty());
  REQUIRE(plan::requirements_met(p, choice));
  std::vector<int> kept = choice;
  kept[window] = 0;
  CHECK(plan::evaluate(p, choice).device_peak <= plan::evaluate(p, kept).device_peak);
  return verified_rewrite(ps, p, choice);
}

// visit(k, j, r, m) for each recomputation option j of candidate k, each
// requirement r it makes of a window (candidate r.candidate), and each
// option m of that window the requirement allows.
template <class Visit>
void for_each_option_a_recomputation_allows(const frugal::plan::BudgetProblem& p, Visit visit) {
  using namespace frugal;
  for (std::size_t k = 0; k < p.candidates.size(); ++k)
    for (int j = 1; j < int(p.candidates[k].options.size()); ++j) {
      if (p.candidates[k].options[std::size_t(j)].choice != plan::Choice::recompute) continue;
      for (const plan::Requirement& r : p.candidates[k].options[std::size_t(j)].requires_)
        for (int m = 1; m < int(p.candidates[std::size_t(r.candidate)].options.size()); ++m)
          if ((r.allowed >> m) & 1u) visit(k, j, r, m);
    }
}

}  // namespace test_support
