#pragma once
// The budget solve: from a graph and a device budget to a plan that fits it.
//
// 1. Plan the step unconstrained. If it fits, that is the plan (and the
//    smallest feasible budget is not searched for).
// 2. Build the budget problem and find the least device memory its options
//    reach, reading no price (budget_least.hpp): exactly on steps of up to
//    kExactPositions ops, else by the greedy and a local search, closed by
//    CBC where the lower bound does not already prove it. That plan's
//    device bytes are the smallest feasible budget, the same under every
//    DeviceProfile: below it, compile fails naming it; at it or above, this
//    plan is the fallback, so every such budget compiles on every machine.
// 3. Solve for the budget with the prices (exactly on small steps, greedily
//    otherwise), rewrite, plan, and check the real arena (offsets leave gaps
//    the abstract problem does not see); tighten the target to the
//    solution's own peak less the overshoot and retry a few times (a greedy
//    answer made cheaper by cheapen). Else take the least-memory plan with
//    every eviction the budget does not need undone, dearest first, and the
//    rest at their cheapest options that fit (budget_cheapen.hpp); else the
//    least-memory plan itself.
//    Prices choose among plans that fit; they never decide whether one
//    exists.
#include <numeric>
#include <optional>

#include "budget_cheapen.hpp"
#include "budget_exact.hpp"
#include "budget_fit.hpp"
#include "budget_greedy.hpp"
#include "budget_least.hpp"
#include "budget_saved.hpp"
#include "cost_model.hpp"
#include "nvme_home.hpp"
#include "plan.hpp"
#include "report.hpp"
#include "rewrite.hpp"

namespace frugal::plan {

struct BudgetedPlan {
  std::shared_ptr<Graph> graph;  // the graph the plan runs: the input, or its rewrite
  Plan plan;
};

// The op times and transfer prices the solver works with.
struct PriceModel {
  std::function<double(const Graph&, NodeId)> op_ms;
  std::function<double(std::size_t)> copy_ms, nvme_write_ms, nvme_read_ms;
  double overlap_slowdown = 0.1;
  std::function<double(double)> host_update_ms;  // an update's traffic (bytes) on the host; empty: free
};

// The solver's prices from a cost model (the profile's roofline, or
// measured medians where a step has been timed).
inline PriceModel prices_from(std::shared_ptr<const CostModel> cm) {
  PriceModel m;
  m.op_ms = [cm](const Graph& g, NodeId n) { return cm->op_ms(g, n); };
  m.copy_ms = [cm](std::size_t b) { return cm->copy_ms(b); };
  bool nvme = cm->profile().nvme_write_bytes > 0 && cm->profile().nvme_read_bytes > 0;
  m.nvme_write_ms = [cm, nvme](std::size_t b) { return nvme ? cm->nvme_write_ms(b) : cm->copy_ms(b) * 20; };
  m.nvme_read_ms = [cm, nvme](std::size_t b) { return nvme ? cm->nvme_read_ms(b) : cm->copy_ms(b) * 20; };
  m.overlap_slowdown = cm->profile().overlap_slowdown;
  if (cm->profile().host_update_bytes > 0)
    m.host_update_ms = [rate = cm->profile().host_update_bytes](double bytes) { return bytes / rate * 1e3; };
  return m;
}

// The budget problem's prices for a schedule: each op's time by position,
// and the model's transfer prices.
inline Prices step_prices(const PriceModel& price, const Graph& g, std::span<const NodeId> schedule) {
  Prices p{{}, price.copy_ms, price.nvme_write_ms, price.nvme_read_ms, price.overlap_slowdown, price.host_update_ms};
  p.op_ms.reserve(schedule.size());
  for (NodeId n : schedule) p.op_ms.push_back(price.op_ms(g, n));
  return p;
}

// Where the device's bytes go at a plan's peak, by category, and what the
// host and NVMe tiers hold: which of them a user must shrink, or give more.
inline std::string peak_breakdown(const Graph& g, const Plan& plan) {
  const Breakdown b = at_peak(g, plan);
  std::string parts;
  for (const std::string& c : categories())
    if (auto it = b.bytes.find(c); it != b.bytes.end() && it->second)
      parts += cat(parts.empty() ? "" : ", ", c, " ", format_bytes(it->second));
  return cat(parts, "; beside it the host holds ", format_bytes(plan.host_bytes + plan.offloaded_bytes),
             " and NVMe ", format_bytes(plan.nvme_bytes));
}
inline std::string largest_consumers(const Graph& g, const Plan& plan, std::size_t count = 5) {
  std::vector<std::pair<std::size_t, std::string>> big;
  for (ValueId v = 0; v < ValueId(g.num_values()); ++v) {
    const Value& val = g.value(v);
    if (is_persistent(val.kind)) big.push_back({val.meta.nbytes(), describe_value(g, v)});
  }
  for (auto& iv : plan.intervals)
    if (iv.first <= plan.peak_position && plan.peak_position <= iv.last) big.push_back({iv.bytes, describe_value(g, iv.value)});
  std::sort(big.begin(), big.end(), [](auto& x, auto& y) { return x.first > y.first; });
  std::string list;
  for (std::size_t i = 0; i < std::min(count, big.size()); ++i) list += cat("\n  ", format_bytes(big[i].first), "  ", big[i].second);
  return list;
}

// The bound to solve for after solution `s`, solved for `bound`, realized
// as `realized` above the budget. The abstract problem counts live bytes (its
// peak is the realized plan's live-bytes lower bound plus its persistents,
// exactly); the arena adds the gaps its offsets leave. Tighten below what the
// solution reached, not below the bound: a solution with room under the
// bound (its evictions come in whole tensors) is otherwise found again and
// again, its overshoot unchanged, until the attempts run out.
inline std::int64_t below_overshoot(std::int64_t bound, const Solution& s, const Plan& realized) {
  const std::int64_t overshoot = std::int64_t(realized.total_bytes() - realized.budget_bytes);
  return std::min(bound, s.eval.device_peak) - overshoot - std::int64_t(kAlignment);
}

// The step planned with no eviction: what every budget solve starts from.
struct Unconstrained {
  std::vector<NodeId> schedule;
  Plan plan;
};
inline Unconstrained plan_unconstrained(const Graph& g, std::span<const ValueId> roots, PlanOptions o = {}) {
  std::vector<NodeId> schedule = schedule_of(g, roots, o);
  Plan base = plan_schedule(g, schedule, roots, o.inplace);
  return {std::move(schedule), std::move(base)};
}

// Solves from `start` (plan_unconstrained of g), so a caller that already
// planned the step unconstrained (to see whether the budget binds) does not
// plan it twice.
inline BudgetedPlan solve_budget(std::shared_ptr<Graph> g, std::span<const ValueId> roots, const Budget& budget,
                                 const PriceModel& price, PlanOptions o, Unconstrained start) {
  std::vector<NodeId> schedule = std::move(start.schedule);
  Plan base = std::move(start.plan);
  double base_ms = 0;
  for (NodeId n : schedule) base_ms += price.op_ms(*g, n);
  base.unconstrained_bytes = base.total_bytes();
  base.predicted_step_ms = base_ms;
  base.budget_bytes = budget.device;
  const bool shrink = o.least_saved_activations && budget.device > 0;
  const bool pinned = o.nvme_offload.pinned();
  if (o.nvme_offload.slots != 1 && o.nvme_offload.slots != 2)
    fail("PlanOptions::nvme_offload.slots is ", o.nvme_offload.slots,
         ": a tensor living on NVMe takes 2 slots (a failed step leaves the state it started from) or 1 (written "
         "back in place, as ZeRO-Infinity does)");
  if (pinned && budget.nvme_dir.empty())
    fail("PlanOptions::nvme_offload pins ", o.nvme_offload.optimizer_state ? "the optimizer state" : "the parameters",
         " to NVMe, but the budget names no NVMe directory: set Budget::nvme_dir (--nvme-dir)");
  const bool binding = budget.device > 0 && (base.total_bytes() > budget.device || shrink);
  if (!binding && !pinned) {
    base.min_feasible_bytes = 0;  // not searched: no eviction was needed (the summary says so)
    return {g, std::move(base)};
  }

  const Prices prices = step_prices(price, *g, schedule);
  BuiltProblem built = build_budget_problem(*g, schedule, roots, budget, prices, o.inplace,
                                            !o.offload_optimizer.has_value() && !o.nvme_offload.optimizer_state,
                                            o.recompute_collectives, o.nvme_offload);
  const BudgetProblem& problem = built.problem;

  auto realize = [&](const Solution& s) {
    // The pinned NVMe homes replace what the solve chose for those tensors
    // with an option that holds them on the device no longer.
    const std::vector<int> choice = pinned ? pin_nvme_homes(problem, *g, s.choice, o.nvme_offload) : s.choice;
    Rewritten rw = rewrite_for_budget(*g, schedule, problem, choice);
    Plan p = plan_schedule(*rw.graph, rw.schedule, roots, o.inplace);
    p.transfer_slots = rw.transfer_slots;
    p.original_nodes = NodeId(g->num_nodes());
    for (auto& d : rw.decisions) p.decisions.push_back({d.value, d.choice, d.bytes, d.from, d.to, d.wraps, d.cost_ms, d.reason});
    place_nvme_homes(*rw.graph, p, o.nvme_offload.slots);
    p.predicted_step_ms = base_ms + (choice == s.choice ? s.eval.cost_ms : evaluate(problem, choice).cost_ms);
    p.unconstrained_bytes = base.total_bytes();
    p.budget_bytes = budget.device;
    return BudgetedPlan{std::move(rw.graph), std::move(p)};
  };
  if (!binding) {  // only the pinned homes move
    BudgetedPlan bp = realize(make_solution(problem, std::vector<int>(problem.candidates.size(), 0),
                                            std::numeric_limits<std::int64_t>::max()));
    bp.plan.min_feasible_bytes = 0;
    return bp;
  }

  const bool exact = problem.positions <= kExactPositions &&
                     (kExactSolverHasGlpk || option_combinations(problem) <= kExhaustiveCombinationLimit);
  auto solve_for = [&](std::int64_t target) {
    if (exact) {
      ExactResult r = solve_exact(problem, target, 10);
      if (r.solution.feasible || r.proved_infeasible) return r.solution;
    }
    Solution s = solve_greedy(problem, target);
    return s.feasible ? cheapen(problem, std::move(s.choice), target) : s;
  };
  if (o.fit_only || o.refuse_overflow)
    if (const std::optional<TiersOverflow> over = tiers_overflow(problem)) {
      const bool halved = over->weights.nvme < over->weights.device;
      const auto bytes = [&](std::int64_t b) { return format_bytes(std::size_t(b / over->weights.device)); };
      BudgetError e(
          cat("device budget ", format_bytes(budget.device), " (", budget.device, " bytes) is infeasible: at position ",
              over->position, " of the step's ", problem.positions, " the device, the host pool",
              budget.nvme_dir.empty()                 ? ""
              : halved && o.nvme_offload.slots == 2 ? " and half of NVMe (a tensor living there takes two slots)"
              : halved                                ? " and NVMe (each byte there weighted half)"
                                                      : " and NVMe",
              " together must hold at least ", bytes(over->needed),
              " whatever is recomputed, swapped or spilled, and they give ", bytes(over->room),
              ". Give more host memory", budget.nvme_dir.empty() ? "" : " or NVMe",
              ", or shard the step over more ranks (a higher ZeRO stage)",
              halved && o.nvme_offload.slots == 2
                  ? ", or write the tensors living on NVMe back in place (PlanOptions::nvme_offload.slots = 1, "
                    "--nvme-slots 1: one slot each, but a step that fails part way leaves them part updated)"
                  : "",
              ". (A feasibility check: "
              "the least device budget was not searched; it is at least ",
              over->least_device, " bytes.)"),
          std::size_t(std::max<std::int64_t>(over->least_device, 0)), base.total_bytes());
      e.smallest_is_lower_bound = true;
      throw e;
    }
  // The least memory, from the price-free view of the problem; its choices
  // mapped back to the priced options they are (same placement, real costs).
  const MemoryView view = memory_view(problem);
  const std::vector<int> least_choice = full_choice(view, least_memory(view.problem).choice);
  BudgetedPlan least = realize(make_solution(problem, least_choice, std::numeric_limits<std::int64_t>::max()));
  const std::size_t min_feasible = least.plan.total_bytes();
  if (budget.device < min_feasible)
    throw BudgetError(cat("device budget ", format_bytes(budget.device), " (", budget.device,
                      " bytes) is infeasible: the smallest feasible budget is ", min_feasible, " bytes (",
                      format_bytes(min_feasible), "), with every activation this planner can recompute, swap",
                      budget.nvme_dir.empty() ? "" : " or spill", " moved off the device",
                      budget.host ? cat(" and a host pool of at most ", format_bytes(budget.host)) : std::string(),
                      "; unconstrained the step needs ", format_bytes(base.total_bytes()),
                      " (the same on every machine: no measured speed enters it). Give a device budget of at least ",
                      min_feasible, " bytes", budget.host ? ", or a larger host pool" : "",
                      ". That plan's peak holds ", peak_breakdown(*least.graph, least.plan),
                      ". Largest consumers at that peak:", largest_consumers(*least.graph, least.plan)),
                      min_feasible, base.total_bytes());
  least.plan.min_feasible_bytes = min_feasible;
  if (o.fit_only) return least;  // it fits: whether was the question

  // With least_saved_activations, a plan that fits is realized with fewer
  // activations held where the backward starts, its live bytes bounded by
  // the budget, else by the bound it was solved for, else by its own peak
  // (the arena adds the gaps its offsets leave); else it stays as it was.
  const int backward_at = backward_start(*g, schedule);
  const std::vector<int> checkpointed = shrink ? checkpoint_start(problem).choice : std::vector<int>{};
  auto fewer_saved = [&](BudgetedPlan fitted, const Solution& s, std::int64_t bound) {
    if (!shrink) return fitted;
    for (std::int64_t b : {std::int64_t(budget.device), bound, s.eval.device_peak}) {
      if (b > std::int64_t(budget.device)) continue;
      Solution fewer = fewest_saved(problem, {s.choice, least_choice, checkpointed}, b, backward_at);
      if (!fewer.feasible || fewer.choice == s.choice) continue;
      BudgetedPlan bp = realize(fewer);
      if (bp.plan.total_bytes() <= budget.device) {
        bp.plan.min_feasible_bytes = fitted.plan.min_feasible_bytes;
        bp.plan.least_memory_fallback = fitted.plan.least_memory_fallback;
        return bp;
      }
    }
    return fitted;
  };

  std::int64_t target = std::int64_t(budget.device);
  for (int attempt = 0; attempt < 6 && target > 0; ++attempt) {
    Solution s = solve_for(target);
    if (!s.feasible) break;
    BudgetedPlan bp = realize(s);
    if (bp.plan.total_bytes() <= budget.device) {
      bp.plan.min_feasible_bytes = min_feasible;
      return fewer_saved(std::move(bp), s, target);
    }
    target = below_overshoot(target, s, bp.plan);
  }
  // The priced solves found nothing that fits: the least-memory plan with
  // what this budget does not need undone (dearest first) and each
  // remaining eviction at its cheapest option that still fits, first with
  // the budget's room above the least, then at the least itself (the
  // price-free search may keep recomputations its final peak no longer
  // needs); else the least-memory plan as it is.
  // A relaxed plan whose arena overshoots the budget (the gaps its offsets
  // leave) is relaxed again below it, as the priced solves are: stepping
  // straight down to the least would throw away all the room (on
  // ZeRO-Infinity's 0.5T at 4 layers a 32 GB budget's relaxed plan realized
  // 34.7 GB; the least, kept instead, ran twice as long).
  const std::int64_t least_peak = evaluate(problem, least_choice).device_peak;
  const std::int64_t room = std::int64_t(budget.device) - std::int64_t(min_feasible);
  // The relaxed plan for `bound` if it fits; else, in *next (where given),
  // the bound to try next.
  auto relaxed_within = [&](std::int64_t bound, std::int64_t* next) -> std::optional<BudgetedPlan> {
    Solution relaxed = cheapen(problem, undo_unneeded(problem, least_choice, bound).choice, bound);
    if (!relaxed.feasible || relaxed.choice == least_choice) return std::nullopt;
    BudgetedPlan bp = realize(relaxed);
    if (bp.plan.total_bytes() <= budget.device) {
      bp.plan.min_feasible_bytes = min_feasible;
      bp.plan.least_memory_fallback = true;
      return fewer_saved(std::move(bp), relaxed, bound);
    }
    if (next) *next = below_overshoot(bound, relaxed, bp.plan);
    return std::nullopt;
  };
  if (room > 0) {
    std::int64_t bound = least_peak + room;
    for (int attempt = 0; attempt < 6 && bound > least_peak; ++attempt) {
      std::int64_t next = least_peak;  // nothing came out to tighten below: on to the least
      if (auto bp = relaxed_within(bound, &next)) return std::move(*bp);
      bound = next;
    }
  }
  if (auto bp = relaxed_within(least_peak, nullptr)) return std::move(*bp);
  least.plan.least_memory_fallback = true;
  return fewer_saved(std::move(least), make_solution(problem, least_choice, least_peak), least_peak);
}

inline BudgetedPlan solve_budget(std::shared_ptr<Graph> g, std::span<const ValueId> roots, const Budget& budget,
                                 const PriceModel& price, PlanOptions o = {}) {
  Unconstrained start = plan_unconstrained(*g, roots, o);
  return solve_budget(std::move(g), roots, budget, price, o, std::move(start));
}

}  // namespace frugal::plan
