#pragma once
// capture -> autograd -> optimizer ops -> plan -> Step.
#include <algorithm>
#include <map>
#include <mutex>
#include <omp.h>

#include "../graph/capture.hpp"
#include "../ops/all.hpp"
#include "../plan/budget_solve.hpp"
#include "../plan/cost_model.hpp"
#include "calibrate.hpp"
#include "loss_scaling.hpp"
#include "step.hpp"

namespace frugal {

struct InputSpec {
  TensorMeta meta;
  std::string name;
};

// Declares a step input of element type T, e.g. input<float>({256, 784}).
template <class T>
InputSpec input(Shape shape, std::string name = "") {
  return {{dtype_of<T>(), std::move(shape)}, std::move(name)};
}

struct CompileOptions {
  std::string backend = "cpu";
  int threads = 0;          // 0: leave the process's setting alone
  bool keep_grads = false;  // keep parameter gradients readable with step.grad(p)
  PlanOptions plan;         // planner switches (reordering, in-place)
  bool verify = true;       // run the independent plan verifier on every plan
  // Dynamic loss scaling for f16 training (optim::LossScaler, which the
  // caller keeps alive while the step lives); training steps only.
  LossScalerBase* loss_scaler = nullptr;
  // The rates the budget solver prices its choices with. Null: the cached
  // calibration of this machine (runtime/calibrate.hpp), measured once.
  const DeviceProfile* profile = nullptr;
  // Under a binding budget, time the ops of the first steps and re-plan
  // once if the predicted step time is off by more than 20%.
  bool replan = true;
};

namespace detail {

template <class Fn, std::size_t... I>
auto call_with(Fn& fn, const std::vector<Var>& v, std::index_sequence<I...>) {
  return fn(v[I]...);
}

// Calls fn with as many Vars as it takes (0 to 6).
template <class Fn>
auto call_with_vars(Fn& fn, const std::vector<Var>& v) {
  auto try_n = [&]<std::size_t N>(std::integral_constant<std::size_t, N>) {
    if (v.size() != N) fail("compile: the step function takes ", N, " inputs but ", v.size(), " were declared");
    return call_with(fn, v, std::make_index_sequence<N>{});
  };
  if constexpr (std::is_invocable_v<Fn&>) return try_n(std::integral_constant<std::size_t, 0>{});
  else if constexpr (std::is_invocable_v<Fn&, Var>) return try_n(std::integral_constant<std::size_t, 1>{});
  else if constexpr (std::is_invocable_v<Fn&, Var, Var>) return try_n(std::integral_constant<std::size_t, 2>{});
  else if constexpr (std::is_invocable_v<Fn&, Var, Var, Var>) return try_n(std::integral_constant<std::size_t, 3>{});
  else if constexpr (std::is_invocable_v<Fn&, Var, Var, Var, Var>)
    return try_n(std::integral_constant<std::size_t, 4>{});
  else if constexpr (std::is_invocable_v<Fn&, Var, Var, Var, Var, Var>)
    return try_n(std::integral_constant<std::size_t, 5>{});
  else if constexpr (std::is_invocable_v<Fn&, Var, Var, Var, Var, Var, Var>)
    return try_n(std::integral_constant<std::size_t, 6>{});
  else
    static_assert(sizeof(Fn) == 0, "the step function must take 0 to 6 Vars");
}

struct Captured {
  std::shared_ptr<Graph> graph;
  std::vector<ValueId> inputs;
  std::vector<Var> results;
};

template <class Fn>
Captured capture(Fn& fn, const std::vector<InputSpec>& specs) {
  Captured c{std::make_shared<Graph>(), {}, {}};
  CaptureScope scope(*c.graph);
  std::vector<Var> vars;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    std::string name = specs[i].name.empty() ? cat("input", i) : specs[i].name;
    ValueId id = c.graph->add_input(specs[i].meta, name);
    c.inputs.push_back(id);
    vars.push_back({c.graph.get(), id});
  }
  auto r = call_with_vars(fn, vars);
  if constexpr (std::is_same_v<decltype(r), Var>) c.results = {r};
  else c.results = std::vector<Var>(r.begin(), r.end());
  for (auto& v : c.results)
    if (v.graph != c.graph.get()) fail("compile: the step function returned a Var from another capture");
  return c;
}

// Everything compile() decides before memory exists: the captured graph,
// which values must survive the step, and what the step reports.
struct Prepared {
  Captured c;
  std::vector<ValueId> roots;
  Optimizer* opt = nullptr;
  ValueId loss = kNoValue;
  std::vector<ValueId> outputs;
  std::map<const void*, ValueId> grad_of;
};

// The solver's prices from a cost model (the profile's roofline, or
// measured medians where a step has been timed).
inline plan::PriceModel prices_from(std::shared_ptr<const plan::CostModel> cm) {
  plan::PriceModel m;
  m.op_ms = [cm](const Graph& g, NodeId n) { return cm->op_ms(g, n); };
  m.copy_ms = [cm](std::size_t b) { return cm->copy_ms(b); };
  bool nvme = cm->profile().nvme_write_bytes > 0 && cm->profile().nvme_read_bytes > 0;
  m.nvme_write_ms = [cm, nvme](std::size_t b) { return nvme ? cm->nvme_write_ms(b) : cm->copy_ms(b) * 20; };
  m.nvme_read_ms = [cm, nvme](std::size_t b) { return nvme ? cm->nvme_read_ms(b) : cm->copy_ms(b) * 20; };
  m.overlap_slowdown = cm->profile().overlap_slowdown;
  return m;
}

// This machine's profile for a backend, calibrated once per process (and
// cached on disk across processes).
inline DeviceProfile machine_profile(Backend& backend, int threads, const std::string& nvme_dir) {
  static std::mutex lock;  // steps may be compiled from several threads
  static std::map<std::string, DeviceProfile> known;
  std::lock_guard guard(lock);
  std::string key = cat(backend.name(), "/", threads, "/", nvme_dir);
  auto it = known.find(key);
  if (it == known.end()) it = known.emplace(key, load_or_calibrate(backend, threads, nvme_dir)).first;
  return it->second;
}

// The threads a step will run with: the option, or the process's OpenMP setting.
inline int step_threads(const CompileOptions& o) { return o.threads > 0 ? o.threads : std::max(1, omp_get_max_threads()); }

// The cost model a budget solve uses: the given profile, or this machine's.
inline std::shared_ptr<plan::CostModel> cost_model_for(Backend& backend, const Budget& budget,
                                                       const CompileOptions& o) {
  if (o.profile) return std::make_shared<plan::CostModel>(*o.profile);
  return std::make_shared<plan::CostModel>(machine_profile(backend, step_threads(o), budget.nvme_dir));
}

// Plans the prepared step within `budget` (rewriting its graph when the
// budget forces evictions), and verifies the plan.
inline Plan plan_prepared(Prepared& p, const Budget& budget, const CompileOptions& o,
                          std::shared_ptr<const plan::CostModel> cm = nullptr) {
  if (!cm && budget.device > 0 && make_plan(*p.c.graph, p.roots, o.plan).total_bytes() > budget.device) {
    auto backend = make_backend(o.backend);
    cm = cost_model_for(*backend, budget, o);
  }
  if (!cm) cm = std::make_shared<plan::CostModel>(DeviceProfile::defaults(o.backend, step_threads(o)));
  auto solved = plan::solve_budget(p.c.graph, p.roots, budget, prices_from(cm), o.plan);
  p.c.graph = std::move(solved.graph);
  if (o.verify) {
    auto report = plan::verify(*p.c.graph, solved.plan, p.roots);
    if (!report.ok()) fail("internal error: the planner produced a plan its verifier rejects:\n", report.str());
  }
  return std::move(solved.plan);
}

inline Step finish(Prepared p, const Budget& budget, const CompileOptions& o) {
  std::shared_ptr<Graph> captured = p.c.graph;
  Plan plan = plan_prepared(p, budget, o);
  auto backend = make_backend(o.backend);
  Step::Parts parts{std::move(p.c.graph), std::move(plan), std::move(backend), p.opt, std::move(p.c.inputs),
                    p.loss, std::move(p.outputs), std::move(p.grad_of), o.threads, std::move(p.roots),
                    budget.nvme_dir};
  if (o.replan && !parts.plan.decisions.empty()) {
    // What re-planning needs: the graph before the rewrite, the budget, and
    // a cost model that measured op times can refine.
    auto cm = cost_model_for(*parts.backend, budget, o);
    auto roots = parts.roots;
    auto plan_opts = o.plan;
    bool verify = o.verify;
    parts.replanner = [captured, budget, cm, roots, plan_opts, verify](const plan::OpTimeRecorder& times) {
      cm->set_measured(times);
      auto solved = plan::solve_budget(captured, roots, budget, prices_from(cm), plan_opts);
      if (verify) {
        auto report = plan::verify(*solved.graph, solved.plan, roots);
        if (!report.ok()) fail("internal error: a re-plan was rejected by the verifier:\n", report.str());
      }
      return std::pair{std::move(solved.graph), std::move(solved.plan)};
    };
  }
  return Step(std::move(parts));
}

inline Var single_loss(const Captured& c) {
  if (c.results.size() != 1) fail("compile: the step function must return exactly one loss Var");
  return c.results[0];
}

template <class Fn>
Prepared prepare_training(Fn& fn, const std::vector<InputSpec>& specs, Optimizer& opt, const CompileOptions& o) {
  auto c = capture(fn, specs);
  Var loss = single_loss(c);
  Graph& g = *c.graph;
  CaptureScope scope(g);
  // Parameters the optimizer owns and the loss reads; the rest stay frozen.
  std::vector<Var> wrt;
  std::vector<std::size_t> index;
  for (std::size_t i = 0; i < opt.params().size(); ++i) {
    const Tensor& p = opt.params()[i];
    for (ValueId v : g.values_of_kind(ValueKind::parameter))
      if (g.value(v).external.raw() == p.raw()) {
        wrt.push_back({&g, v});
        index.push_back(i);
      }
  }
  // Under loss scaling, gradients are taken of loss * scale and every
  // update is guarded by one overflow check over all of them.
  SkippableOptimizer* skippable = nullptr;
  if (o.loss_scaler) {
    skippable = dynamic_cast<SkippableOptimizer*>(&opt);
    if (!skippable)
      fail("compile: CompileOptions::loss_scaler needs an optimizer whose updates can be skipped "
           "(a SkippableOptimizer: optim::AdamW, optim::SGD)");
  }
  auto grads = grad(o.loss_scaler ? o.loss_scaler->scale_loss(loss) : loss, wrt);
  Prepared p{std::move(c), {loss.id}, &opt, loss.id, {}, {}};
  std::vector<Var> present;
  for (std::size_t k = 0; k < wrt.size(); ++k) {
    if (!grads[k]) continue;  // the loss does not depend on it
    present.push_back(*grads[k]);
    if (o.keep_grads) {
      p.roots.push_back(grads[k]->id);
      p.grad_of[g.value(wrt[k].id).external.raw()] = grads[k]->id;
    }
  }
  Phase previous = g.set_phase(Phase::optimizer);
  std::optional<ops::UpdateGuard> guard;
  if (o.loss_scaler && !present.empty()) guard = o.loss_scaler->check_gradients(present);
  for (std::size_t k = 0; k < wrt.size(); ++k) {
    if (!grads[k]) continue;
    if (guard) skippable->append_guarded_update(wrt[k], *grads[k], index[k], *guard);
    else opt.append_update(wrt[k], *grads[k], index[k]);
  }
  if (guard) {
    skippable->append_guarded_step_end(*guard);
    o.loss_scaler->append_scale_update(*guard);  // last: after every reader of the scale
  }
  g.set_phase(previous);
  return p;
}

}  // namespace detail

// A training step: fn(inputs...) returns the loss; its gradients update
// opt's parameters with opt's rule, all inside the one captured graph.
template <class Fn>
Step compile(Fn&& fn, std::vector<InputSpec> specs, Optimizer& opt, Budget budget = {}, CompileOptions o = {}) {
  return detail::finish(detail::prepare_training(fn, specs, opt, o), budget, o);
}

// What compile() would plan, without allocating the arena or running
// anything: for tools that explain or estimate memory.
struct PlannedStep {
  std::shared_ptr<const Graph> graph;
  Plan plan;
  std::vector<ValueId> roots;
  std::size_t input_bytes = 0;  // the step's inputs, which the caller also holds on the host
};

template <class Fn>
PlannedStep plan_training(Fn&& fn, std::vector<InputSpec> specs, Optimizer& opt, CompileOptions o = {},
                          Budget budget = {}) {
  auto p = detail::prepare_training(fn, specs, opt, o);
  Plan plan = detail::plan_prepared(p, budget, o);
  std::size_t in = 0;
  for (auto& s : specs) in += s.meta.nbytes();
  return {std::move(p.c.graph), std::move(plan), std::move(p.roots), in};
}

// Loss and gradients for `wrt` (parameters the function reads), no update:
// for checking gradients and for custom training loops.
template <class Fn>
Step compile_gradients(Fn&& fn, std::vector<InputSpec> specs, std::vector<Tensor> wrt, Budget budget = {},
                       CompileOptions o = {}) {
  if (o.loss_scaler) fail("compile_gradients: CompileOptions::loss_scaler applies to training steps (compile)");
  auto c = detail::capture(fn, specs);
  Var loss = detail::single_loss(c);
  Graph& g = *c.graph;
  CaptureScope scope(g);
  std::vector<Var> vars;
  for (auto& t : wrt) {
    ValueId found = kNoValue;
    for (const ValueKind k : {ValueKind::parameter, ValueKind::state})
      for (ValueId v : g.values_of_kind(k))
        if (g.value(v).external.raw() == t.raw()) found = v;
    if (found == kNoValue)
      fail("compile_gradients: a tensor of shape ", t.shape().str(), " was asked for but the function never reads it");
    vars.push_back({&g, found});
  }
  auto grads = grad(loss, vars);
  std::vector<ValueId> roots{loss.id};
  std::map<const void*, ValueId> grad_of;
  for (std::size_t k = 0; k < vars.size(); ++k) {
    if (!grads[k]) continue;
    roots.push_back(grads[k]->id);
    grad_of[wrt[k].raw()] = grads[k]->id;
  }
  return detail::finish({std::move(c), std::move(roots), nullptr, loss.id, {}, std::move(grad_of)}, budget, o);
}

// What compile_inference() would plan, without allocating anything.
template <class Fn>
PlannedStep plan_inference(Fn&& fn, std::vector<InputSpec> specs, CompileOptions o = {}, Budget budget = {}) {
  auto c = detail::capture(fn, specs);
  std::vector<ValueId> outs;
  for (auto& v : c.results) outs.push_back(v.id);
  detail::Prepared p{std::move(c), outs, nullptr, kNoValue, outs, {}};
  Plan plan = detail::plan_prepared(p, budget, o);
  std::size_t in = 0;
  for (auto& s : specs) in += s.meta.nbytes();
  return {std::move(p.c.graph), std::move(plan), std::move(p.roots), in};
}

// Forward only: fn returns one Var or a std::vector<Var>; after run() they
// are in step.output(i).
template <class Fn>
Step compile_inference(Fn&& fn, std::vector<InputSpec> specs, Budget budget = {}, CompileOptions o = {}) {
  if (o.loss_scaler) fail("compile_inference: CompileOptions::loss_scaler applies to training steps (compile)");
  auto c = detail::capture(fn, specs);
  std::vector<ValueId> outs;
  for (auto& v : c.results) outs.push_back(v.id);
  return detail::finish({std::move(c), outs, nullptr, kNoValue, outs, {}}, budget, o);
}

}  // namespace frugal
