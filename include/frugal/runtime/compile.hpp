#pragma once
// capture -> autograd -> optimizer ops -> plan -> Step.
#include <algorithm>
#include <functional>
#include <map>
#include <tuple>
#include <optional>

#include "../graph/capture.hpp"
#include "../graph/modes.hpp"
#include "../ops/collective.hpp"
#include "../ops/zero.hpp"
#include "../plan/budget.hpp"
#include "../plan/cost_model.hpp"
#include "../plan/device_profile.hpp"
#include "loss_scaling.hpp"
#include "step.hpp"

namespace frugal {

struct PlannedStep;

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
  BackendOptions backend_options;  // e.g. the CPU's convolution engine, kernels for the program's own ops
  // A backend the caller made (make_backend, or a Backend of its own), used
  // instead of making one from `backend` and `backend_options`; steps may
  // share it.
  std::shared_ptr<Backend> use_backend;
  int threads = 0;          // 0: leave the process's setting alone
  bool keep_grads = false;  // keep parameter gradients readable with step.grad(p)
  PlanOptions plan;         // planner switches (reordering, in-place)
  bool verify = true;       // run the independent plan verifier on every plan
  // Dynamic loss scaling for f16 training (optim::LossScaler, which the
  // caller keeps alive while the step lives); training steps only.
  LossScalerBase* loss_scaler = nullptr;
  // The rates the budget solver prices its choices with. Null: the file
  // named by FRUGAL_PROFILE if set, else this machine's calibration when
  // `calibrate` is on, else the backend's built-in rates. The plan summary
  // says which priced it.
  const DeviceProfile* profile = nullptr;
  // Under a binding budget, measure this machine's rates (about a second,
  // then cached per machine in ~/.cache/frugal or FRUGAL_CACHE_DIR) instead
  // of using the built-in ones. Off by default: compile does nothing on the
  // machine beyond planning unless asked to.
  bool calibrate = false;
  // Under a binding budget, time the ops of the first steps and re-plan
  // once if the predicted step time is off by more than 20%.
  bool replan = true;
  // Gradient clipping by global norm, as torch.nn.utils.clip_grad_norm_
  // (0: off): every gradient is multiplied by min(clip_grad_norm /
  // (total_norm + 1e-6), 1) before the updates; step.grad_norm() reads the
  // norm before clipping (keep_grads keeps the unclipped gradients). All gradients must then be complete before the
  // first update, so they are all live at once (ops/grad_clipping.hpp).
  // Training steps only.
  double clip_grad_norm = 0;
  // Skip the update when the loss or any gradient is not finite, for any
  // dtype: parameters, optimizer state and the count of steps taken stay
  // bitwise as they were; step.skipped_steps() counts the skips
  // (runtime/non_finite_guard.hpp). Needs a SkippableOptimizer (AdamW,
  // SGD); a loss_scaler already skips on overflow. Training steps only.
  bool skip_non_finite = false;
  // The mode modules run in inside this step (dropout on or off, batch norm
  // on batch or running statistics). Unset: a training step (compile,
  // compile_gradients) runs each module as its train()/eval() flag says when
  // the step is compiled, and run() fails if a flag was changed since; an
  // inference step (compile_inference) runs every module in eval mode, as
  // under PyTorch's model.eval(), and leaves the flags alone. true/false:
  // every module runs in train/eval mode in this step, whatever its flag.
  std::optional<bool> training;
  // Data parallelism (ZeRO stage 0): every rank runs the step on its own
  // share of the global batch, and each parameter's gradient is averaged
  // over the communicator's ranks (ops::AllReduceMean: summed in rank order,
  // so every rank gets the same bits, then divided by the rank count)
  // before clipping, the loss scaler's check and the update: every rank
  // applies the same update. The loss run() returns is this rank's own.
  // dist::Mpi::world() under mpirun; dist::local() runs the same graph on
  // one rank. Null: no collectives. Training steps only.
  std::shared_ptr<Communicator> communicator;
  // ZeRO sharding over the communicator's ranks (ops/zero.hpp): 0 keeps
  // everything whole on every rank; 1 keeps each rank's optimizer state for
  // one shard of every parameter (1/ranks of it), updates that shard and
  // all-gathers the parameter; 2 also reduces each gradient straight to the
  // shard (a reduce-scatter instead of the all-reduce). Every stage gives
  // the same bits. 3 also keeps only the shard of each parameter: the step
  // reads each parameter gathered from the ranks' shards (a value the
  // planner keeps, swaps or frees like an activation) and trains the shard;
  // the module's tensors then hold the parameters as of compile until
  // step.gather_parameters() writes the trained ones into them (every rank
  // calls it). Unset: stage 0 if it fits the device budget with nothing
  // evicted, else the stage whose plan fits and is predicted fastest; the
  // plan says why (Plan::zero_stage, zero_reason). Stages 2 and 3 do not combine with clip_grad_norm,
  // skip_non_finite, a loss_scaler or keep_grads (they need whole
  // gradients); auto then stops at 1. Needs a communicator.
  // The first step compiled on an optimizer over a communicator fixes the
  // optimizer's stage (Optimizer::zero_stage): later steps on it, unset,
  // take that stage whatever their budget would pick (a BudgetError if it
  // does not fit), and a pin of another stage is refused.
  std::optional<int> zero_stage;
  // Gradient accumulation: each run() is one micro-batch of the inputs'
  // shapes; its gradients are added into accumulators (persistent buffers,
  // one per parameter gradient, inside the budget), and every `accumulate`-th
  // run averages them over the micro-batches and applies the update (after
  // the communicator's averaging, clipping). The runs between skip the
  // update and its collectives, and do not count as steps taken (AdamW's
  // bias correction counts updates). A global batch of accumulate x ranks x
  // rows. Needs a SkippableOptimizer (AdamW, SGD); not with a loss_scaler or
  // skip_non_finite yet. Training steps only.
  int accumulate = 1;
  // Data parallelism: each gradient's collective starts as soon as the
  // backward completes the gradient and runs on a thread of the step's own
  // while the backward goes on (at most PlanOptions::collectives_in_flight
  // at once, their buffers inside the budget); the update waits for it.
  // Needs a communicator that may be called from that thread
  // (Communicator::serialized_threads: dist::Mpi under
  // MPI_THREAD_SERIALIZED), and a budget that does not bind (in flight,
  // gradients live longer). Unset: beside compute where that thread has a
  // core of its own, which the ranks' compute threads leave free (on the
  // CPU, the communication is CPU work too: sharing a core, it only slows
  // the backward down). false: each collective runs where it is scheduled,
  // on the step's thread. The same bits either way; the plan says which
  // and why (Plan::collectives).
  std::optional<bool> overlap_collectives;
  // Beside compute, gradients are reduced in buckets: consecutive gradients
  // (in the order the backward completes them, one dtype) until a bucket
  // holds at least this many bytes; whole gradients all-reduced, and at
  // ZeRO stages 2 and 3 sharded ones reduce-scattered, each kind in its own
  // buckets. One collective per bucket: fewer messages; a bucket waits for
  // its last gradient. 0: one per gradient.
  std::size_t bucket_bytes = std::size_t(1) << 20;
  // Optimizer offload (ZeRO-Offload): the optimizer state lives on the
  // host, where its update runs (the backend's fused update, on the CPU)
  // and reads and writes it in place, so the state takes none of the device
  // budget and is never copied. true: all of it; false: none; unset: the
  // budget solve moves state there where the budget binds (free on the CPU
  // backend, whose device memory is host memory). With ZeRO stages 1-3 it is
  // each rank's shard. The same bits either way; Plan::optimizer_offload
  // says how much went and why. The CUDA backend cannot run it yet.
  std::optional<bool> offload_optimizer;
};

namespace detail {

template <class Fn, std::size_t... I>
auto call_with(Fn& fn, const std::vector<Var>& v, std::index_sequence<I...>) {
  return fn(v[I]...);
}

// How many Vars a step function takes, read from its signature without
// calling it: std::is_invocable instantiates a generic lambda's body (a hard
// error, not a substitution failure, when the body does not compile for the
// Vars tried), and fell through to a "must take 0 to 6 Vars" that hid the
// real mistake. A generic lambda has no one signature, so it is refused with
// one static_assert.
template <class Sig>
struct StepSignature {
  static constexpr bool known = false;
};
template <class R, class... A>
struct StepSignature<R(A...)> {
  static constexpr bool known = true;
  static constexpr std::size_t arity = sizeof...(A);
  static constexpr bool all_vars = (std::is_same_v<std::remove_cvref_t<A>, Var> && ...);
  static constexpr bool takes_tensor = (std::is_same_v<std::remove_cvref_t<A>, Tensor> || ...);
};
template <class R, class... A> struct StepSignature<R (*)(A...)> : StepSignature<R(A...)> {};
template <class R, class C, class... A> struct StepSignature<R (C::*)(A...)> : StepSignature<R(A...)> {};
template <class R, class C, class... A> struct StepSignature<R (C::*)(A...) const> : StepSignature<R(A...)> {};
template <class R, class C, class... A> struct StepSignature<R (C::*)(A...) noexcept> : StepSignature<R(A...)> {};
template <class R, class C, class... A> struct StepSignature<R (C::*)(A...) const noexcept> : StepSignature<R(A...)> {};

template <class Fn, class = void>
struct StepFunction : StepSignature<void> {};  // no single operator(): a generic lambda, or not callable
template <class Fn>
struct StepFunction<Fn, std::void_t<decltype(&Fn::operator())>> : StepSignature<decltype(&Fn::operator())> {};
template <class Fn>
  requires std::is_function_v<std::remove_pointer_t<Fn>>
struct StepFunction<Fn, void> : StepSignature<std::remove_pointer_t<Fn>> {};

// Calls fn with the declared inputs' Vars.
template <class Fn>
auto call_with_vars(Fn& fn, const std::vector<Var>& v) {
  using S = StepFunction<std::remove_cvref_t<Fn>>;
  if constexpr (!S::known) {
    // Also reached when the function's body did not compile (its type then
    // has no usable operator()), so the message points at that error too.
    static_assert(S::known,
                  "frugal: compile cannot read the step function's parameters: write them as named Vars, e.g. "
                  "[&](Var x, Var y) { ... }; generic lambdas (auto parameters) are not supported, because "
                  "compile must know how many inputs the function takes. If an error above is inside the "
                  "step function's body, fix that one first");
    return Var{};
  } else if constexpr (S::takes_tensor) {
    static_assert(!S::takes_tensor,
                  "frugal: a step function parameter is a Tensor; the step function takes Vars (symbolic "
                  "tensors, one per declared input), and the data goes to step.run(tensors...)");
    return Var{};
  } else if constexpr (!S::all_vars) {
    static_assert(S::all_vars, "frugal: every parameter of the step function must be a Var");
    return Var{};
  } else {
    if (v.size() != S::arity)
      fail("compile: the step function takes ", S::arity, " inputs but ", v.size(), " were declared");
    return call_with(fn, v, std::make_index_sequence<S::arity>{});
  }
}

// ZeRO stage 3: a parameter the step reads gathered from the ranks' shards
// (params()[index] of the optimizer), and the shard it trains instead.
struct GatheredParameter {
  std::size_t index = 0;
  ValueId shard = kNoValue, whole = kNoValue;
  ZeroShard s;
};

struct Captured {
  std::shared_ptr<Graph> graph;
  std::vector<ValueId> inputs;
  std::vector<Var> results;
  std::vector<ModeRead> modes;  // the modules' flags the capture read (none when it forced a mode)
  std::shared_ptr<std::vector<GatheredParameter>> gathered;  // stage 3's, in the order first read
};

// Everything compile() decides before memory exists: the captured graph,
// which values must survive the step, and what the step reports.
struct Prepared {
  std::shared_ptr<Backend> backend;
  Captured c;
  std::vector<ValueId> roots;
  Optimizer* opt = nullptr;
  ValueId loss = kNoValue;
  std::vector<ValueId> outputs;
  std::map<const void*, ValueId> grad_of;
  std::shared_ptr<plan::CostModel> prices;  // set by plan_prepared when the budget binds
  ValueId grad_norm = kNoValue;             // CompileOptions::clip_grad_norm's total norm
  Tensor skip_stats;                        // CompileOptions::skip_non_finite's counts
  std::function<void()> gather_parameters;  // stage 3: the shards into the module's tensors
  std::shared_ptr<const Optimizer::Layout> optimizer_layout;  // the state and shards a training step trains
};

// Only calling the user's function is compiled where compile() is called:
// capturing, autograd, planning and building the step are the same code for
// every model, so a program compiles them once, with the kernels
// (runtime/units/compile.hpp, through frugal_add_kernels or
// <frugal/kernels.hpp>), not in every file that calls compile().

// The backend a step runs on, made once per compile: its kernel table sizes
// the graph's scratch space as the graph is captured.
std::shared_ptr<Backend> backend_for(const CompileOptions& o);
// A graph for `backend` with the declared inputs, and their Vars.
Captured start_capture(const std::vector<InputSpec>& specs, const std::shared_ptr<const Backend>& backend,
                       std::vector<Var>& vars);
// Checks what the step function returned.
void end_capture(Captured& c);

// `training`: the mode every module runs in (CompileOptions::training, or
// eval for inference), or unset to follow and record the modules' flags.
// `before`, when given, prepares the graph before fn runs (stage 3's
// parameter source).
template <class Fn>
Captured capture(Fn& fn, const std::vector<InputSpec>& specs, const std::shared_ptr<const Backend>& backend,
                 std::optional<bool> training, const std::function<void(Captured&)>& before = {}) {
  std::vector<Var> vars;
  Captured c = start_capture(specs, backend, vars);
  if (before) before(c);
  CaptureScope scope(*c.graph);
  CaptureModes modes{training, {}};
  ModeScope mode_scope(modes);
  auto r = call_with_vars(fn, vars);
  c.modes = std::move(modes.reads);
  using R = decltype(r);
  if constexpr (std::is_same_v<R, Var>) c.results = {r};
  else if constexpr (std::is_same_v<R, std::vector<Var>>) c.results = std::move(r);
  else if constexpr (requires { std::tuple_size<R>::value; })  // {loss, extras...}
    std::apply(
        [&](const auto&... v) {
          static_assert((std::is_same_v<std::decay_t<decltype(v)>, Var> && ...),
                        "frugal: a step function returning a tuple must return only Vars (the loss, then extra outputs)");
          (c.results.push_back(v), ...);
        },
        r);
  else
    static_assert(std::is_same_v<R, Var>,
                  "frugal: the step function must return a Var (the loss, or the output), a std::vector<Var> "
                  "or a std::tuple of Vars (the loss, then extra outputs); a Tensor is data, not a value of the captured graph");
  end_capture(c);
  return c;
}

// Plans the prepared step within `budget` (rewriting its graph when the
// budget forces evictions), and verifies the plan. The step is planned
// unconstrained once; only a binding budget goes on to the solver.
Plan plan_prepared(Prepared& p, const Budget& budget, const CompileOptions& o);
// The Step that runs the prepared graph as planned within `budget`.
Step finish(Prepared p, const Budget& budget, const CompileOptions& o);
// A captured loss, its gradients and opt's updates, all in one graph.
Prepared prepare_training(std::shared_ptr<Backend> backend, Captured c, Optimizer& opt, const CompileOptions& o);
// A captured loss and the gradients for `wrt`, no update.
Prepared prepare_gradients(std::shared_ptr<Backend> backend, Captured c, const std::vector<Tensor>& wrt,
                           const CompileOptions& o);
// A captured forward pass whose results are the step's outputs.
Prepared prepare_inference(std::shared_ptr<Backend> backend, Captured c, const CompileOptions& o);
// What plan_training and plan_inference return.
PlannedStep planned(Prepared p, const std::vector<InputSpec>& specs, const Budget& budget, const CompileOptions& o);

// Under ZeRO stage 3, makes the parameters the optimizer trains read
// gathered from this rank's shards (Graph::set_parameter_source).
void gather_parameters_from_shards(Captured& c, Optimizer& opt, const CompileOptions& o, const std::string& backend);

template <class Fn>
Prepared prepare_training(Fn& fn, const std::vector<InputSpec>& specs, Optimizer& opt, const CompileOptions& o) {
  auto backend = backend_for(o);
  auto c = capture(fn, specs, backend, o.training, [&](Captured& c) { gather_parameters_from_shards(c, opt, o, backend->name()); });
  return prepare_training(std::move(backend), std::move(c), opt, o);
}

// A training step of `opt` prepared with the options given (their ZeRO stage set).
using PrepareTraining = std::function<Prepared(const CompileOptions&)>;
// The training step planned within `budget` at the ZeRO stage the options
// pin, or else at the one opt's steps train (Optimizer::zero_stage), or
// else at the one the planner picks (CompileOptions::zero_stage).
Step finish_training(const PrepareTraining& prepare, Optimizer& opt, const Budget& budget, const CompileOptions& o);
PlannedStep planned_training(const PrepareTraining& prepare, const Optimizer& opt, const std::vector<InputSpec>& specs,
                             const Budget& budget, const CompileOptions& o);

}  // namespace detail

// A training step: fn(inputs...) returns the loss; its gradients update
// opt's parameters with opt's rule, all inside the one captured graph. fn
// may also return {loss, extras...} (a std::tuple or std::vector of Vars):
// the extras (accuracy, logits) are kept to the end of the step and read
// with step.output(i) after run, extras[i] in output(i).
template <class Fn>
Step compile(Fn&& fn, std::vector<InputSpec> specs, Optimizer& opt, Budget budget = {}, CompileOptions o = {}) {
  return detail::finish_training([&](const CompileOptions& os) { return detail::prepare_training(fn, specs, opt, os); },
                                 opt, budget, o);
}

// What compile() would plan, without allocating the arena or running
// anything: for tools that explain or estimate memory.
struct PlannedStep {
  std::shared_ptr<const Graph> graph;
  Plan plan;
  std::vector<ValueId> roots;
  std::size_t input_bytes = 0;  // the step's inputs, which the caller also holds on the host
  // The backend keeps device copies of the persistents it holds on the
  // device (a GPU): each step's copies are its own, not shared with other
  // steps reading the same tensors.
  bool device_copies = false;
  std::vector<ValueId> inputs;   // the step's inputs, in the order it takes them
  ValueId loss = kNoValue;       // a training step's loss
  std::vector<ValueId> outputs;  // an inference step's outputs
  // A training step's optimizer state and stage-3 shards (a step made from
  // this plan, PagedStep, hands them to Optimizer::trains).
  std::shared_ptr<const Optimizer::Layout> optimizer_layout;
};

// Arguments in compile()'s order: function, inputs, [optimizer,] budget, options.
template <class Fn>
PlannedStep plan_training(Fn&& fn, std::vector<InputSpec> specs, Optimizer& opt, Budget budget = {},
                          CompileOptions o = {}) {
  return detail::planned_training(
      [&](const CompileOptions& os) { return detail::prepare_training(fn, specs, opt, os); }, opt, specs, budget, o);
}

namespace detail {
// The options only a training step (compile) has a use for, refused by name
// where `fn` builds a step without an update.
inline void refuse_training_options(const CompileOptions& o, const char* fn) {
  if (o.loss_scaler) fail(fn, ": CompileOptions::loss_scaler applies to training steps (compile)");
  if (o.clip_grad_norm != 0 || o.skip_non_finite)
    fail(fn, ": CompileOptions::clip_grad_norm and skip_non_finite apply to training steps (compile)");
  if (o.zero_stage) fail(fn, ": CompileOptions::zero_stage shards an optimizer's state; this step has no optimizer");
  if (o.accumulate != 1)
    fail(fn, ": CompileOptions::accumulate spreads one update over several runs; this step has no update");
  if (o.communicator)
    fail(fn, ": CompileOptions::communicator averages a training step's gradients over ranks; this step has no "
         "update to average for (each rank runs it on its own data)");
}
}  // namespace detail

// Loss and gradients for `wrt` (parameters the function reads), no update:
// for checking gradients and for custom training loops.
template <class Fn>
Step compile_gradients(Fn&& fn, std::vector<InputSpec> specs, std::vector<Tensor> wrt, Budget budget = {},
                       CompileOptions o = {}) {
  detail::refuse_training_options(o, "compile_gradients");
  auto backend = detail::backend_for(o);
  auto c = detail::capture(fn, specs, backend, o.training);
  return detail::finish(detail::prepare_gradients(std::move(backend), std::move(c), wrt, o), budget, o);
}

// What compile_inference() would plan, without allocating anything.
template <class Fn>
PlannedStep plan_inference(Fn&& fn, std::vector<InputSpec> specs, Budget budget = {}, CompileOptions o = {}) {
  auto backend = detail::backend_for(o);
  auto c = detail::capture(fn, specs, backend, o.training.value_or(false));
  return detail::planned(detail::prepare_inference(std::move(backend), std::move(c), o), specs, budget, o);
}

// Forward only: fn returns one Var or a std::vector<Var>; after run() they
// are in step.output(i). Modules run in eval mode (CompileOptions::training
// says otherwise); their train()/eval() flags are not changed.
template <class Fn>
Step compile_inference(Fn&& fn, std::vector<InputSpec> specs, Budget budget = {}, CompileOptions o = {}) {
  detail::refuse_training_options(o, "compile_inference");
  auto backend = detail::backend_for(o);
  auto c = detail::capture(fn, specs, backend, o.training.value_or(false));
  return detail::finish(detail::prepare_inference(std::move(backend), std::move(c), o), budget, o);
}

}  // namespace frugal
