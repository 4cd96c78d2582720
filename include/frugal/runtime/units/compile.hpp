#pragma once
// Compiled once per program, with the kernels (frugal_add_kernels, or
// <frugal/kernels.hpp>): planning a prepared step and building its Step.
// This code is the same for every model, and compiling it in every file
// that calls compile() would cost each of them seconds.
#include <map>
#include <mutex>

#include "../../plan/budget_solve.hpp"
#include "../calibrate.hpp"
#include "../compile.hpp"

namespace frugal::detail {

// This machine's profile for a backend, calibrated once per process (and
// cached on disk across processes). Only when asked: CompileOptions::calibrate.
inline DeviceProfile machine_profile(Backend& backend, int threads, const std::string& nvme_dir) {
  static std::mutex lock;  // steps may be compiled from several threads
  static std::map<std::string, DeviceProfile> known;
  std::lock_guard guard(lock);
  std::string key = cat(backend.name(), "/", threads, "/", nvme_dir);
  auto it = known.find(key);
  if (it == known.end()) it = known.emplace(key, load_or_calibrate(backend, threads, nvme_dir)).first;
  return it->second;
}

// The rates a budget solve prices its choices with, and whose they are.
struct Pricing {
  std::shared_ptr<plan::CostModel> model;
  std::string source;
};
inline Pricing builtin_pricing(const Backend& backend, const CompileOptions& o) {
  return {std::make_shared<plan::CostModel>(DeviceProfile::defaults(backend.name(), step_threads(o))),
          cat("frugal's built-in ", backend.name(), " rates (CompileOptions::calibrate measures this machine's)")};
}
inline Pricing pricing_for(Backend& backend, const Budget& budget, const CompileOptions& o) {
  if (o.profile) return {std::make_shared<plan::CostModel>(*o.profile), "the DeviceProfile given in CompileOptions::profile"};
  if (const char* forced = std::getenv("FRUGAL_PROFILE"); forced && *forced)
    return {std::make_shared<plan::CostModel>(read_profile_file(forced)), cat("the profile FRUGAL_PROFILE names (", forced, ")")};
  if (o.calibrate)
    return {std::make_shared<plan::CostModel>(machine_profile(backend, step_threads(o), budget.nvme_dir)),
            "this machine's measured rates (CompileOptions::calibrate; cached per machine)"};
  return builtin_pricing(backend, o);
}

Plan plan_prepared(Prepared& p, const Budget& budget, const CompileOptions& o) {
  auto start = plan::plan_unconstrained(*p.c.graph, p.roots, o.plan);
  const bool binding = budget.device > 0 && start.plan.total_bytes() > budget.device;
  // An unconstrained plan makes no choice; its predicted time is priced at
  // the built-in rates, measuring nothing.
  Pricing pricing = binding ? pricing_for(*p.backend, budget, o) : builtin_pricing(*p.backend, o);
  auto solved = plan::solve_budget(p.c.graph, p.roots, budget, plan::prices_from(pricing.model), o.plan, std::move(start));
  p.c.graph = std::move(solved.graph);
  if (binding) p.prices = pricing.model;
  solved.plan.priced_with = pricing.source;
  if (o.verify) {
    auto report = plan::verify(*p.c.graph, solved.plan, p.roots);
    if (!report.ok()) fail("internal error: the planner produced a plan its verifier rejects:\n", report.str());
  }
  return std::move(solved.plan);
}

Step finish(Prepared p, const Budget& budget, const CompileOptions& o) {
  std::shared_ptr<Graph> captured = p.c.graph;
  Plan plan = plan_prepared(p, budget, o);
  Step::Parts parts{std::move(p.c.graph), std::move(plan), p.backend, p.opt, std::move(p.c.inputs),
                    p.loss, std::move(p.outputs), std::move(p.grad_of), o.threads, std::move(p.roots),
                    budget.nvme_dir};
  if (o.replan && !parts.plan.decisions.empty()) {
    // What re-planning needs: the graph before the rewrite, the budget, and
    // a cost model that measured op times can refine.
    auto cm = p.prices;  // the model that priced the plan, refined by measured times
    auto roots = parts.roots;
    auto plan_opts = o.plan;
    bool verify = o.verify;
    parts.replanner = [captured, budget, cm, roots, plan_opts, verify](const plan::OpTimeRecorder& times) {
      cm->set_measured(times);
      auto solved = plan::solve_budget(captured, roots, budget, plan::prices_from(cm), plan_opts);
      if (verify) {
        auto report = plan::verify(*solved.graph, solved.plan, roots);
        if (!report.ok()) fail("internal error: a re-plan was rejected by the verifier:\n", report.str());
      }
      return std::pair{std::move(solved.graph), std::move(solved.plan)};
    };
  }
  return Step(std::move(parts));
}

}  // namespace frugal::detail
