#pragma once
// Compiled once per program, with the kernels (frugal_add_kernels, or
// <frugal/kernels.hpp>): planning a prepared step and building its Step.
// This code is the same for every model, and compiling it in every file
// that calls compile() would cost each of them seconds.
#include <exception>
#include <map>
#include <mutex>
#include <omp.h>
#include <thread>

#include "../../ops/all.hpp"
#include "../../ops/fusion.hpp"
#include "../../plan/budget_solve.hpp"
#include "../../plan/verify.hpp"
#include "../calibrate.hpp"
#include "../nvme_homes.hpp"
#include "../compile.hpp"
#include "../non_finite_guard.hpp"
#include "../../ops/zero.hpp"

namespace frugal::detail {

// The threads a step will run with: the option, or the process's OpenMP setting.
static int step_threads(const CompileOptions& o) { return o.threads > 0 ? o.threads : std::max(1, omp_get_max_threads()); }

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

std::shared_ptr<Backend> backend_for(const CompileOptions& o) {
  if (o.use_backend) return o.use_backend;
  return std::shared_ptr<Backend>(make_backend(o.backend, o.backend_options));
}

Captured start_capture(const std::vector<InputSpec>& specs, const std::shared_ptr<const Backend>& backend,
                       std::vector<Var>& vars) {
  Captured c{std::make_shared<Graph>(kernel_queries(backend)), {}, {}};
  for (std::size_t i = 0; i < specs.size(); ++i) {
    std::string name = specs[i].name.empty() ? cat("input", i) : specs[i].name;
    ValueId id = c.graph->add_input(specs[i].meta, name);
    c.inputs.push_back(id);
    vars.push_back({c.graph.get(), id});
  }
  return c;
}

void end_capture(Captured& c) {
  for (auto& v : c.results)
    if (v.graph != c.graph.get()) fail("compile: the step function returned a Var from another capture");
}

static Var single_loss(const Captured& c) {
  if (c.results.size() != 1) fail("compile: the step function must return exactly one loss Var");
  return c.results[0];
}

// A training step's loss is its function's first result; the rest are
// extra outputs, kept to the end of the step.
static Var training_loss(const Captured& c) {
  if (c.results.empty()) fail("compile: the step function must return the loss (then any extra outputs)");
  const Graph& g = *c.graph;
  for (std::size_t i = 1; i < c.results.size(); ++i) {
    const Value& v = g.value(c.results[i].id);
    if (v.kind == ValueKind::parameter || v.kind == ValueKind::state || v.kind == ValueKind::buffer)
      fail("compile: extra output ", i - 1, " is the ", value_kind_name(v.kind), " '", v.name,
           "', which the step updates in place; read that tensor after run instead");
  }
  return c.results[0];
}

// Multiplies each gradient by the clip coefficient of their global norm
// (ops/grad_clipping.hpp); returns the norm.
static Var clip_gradients(std::vector<std::optional<Var>>& grads, const std::vector<Var>& present, double max_norm) {
  auto outs = frugal::apply(std::make_shared<ops::ClipGradNormCoef>(max_norm), present);
  for (auto& gr : grads)
    if (gr) *gr = *gr * (gr->dtype() == DType::f32 ? outs[1] : cast(outs[1], gr->dtype()));
  return outs[0];
}

// Why stage 2 cannot run with these options ("" when it can): they need
// every whole gradient on every rank.
static std::string stage2_refusal(const CompileOptions& o) {
  if (o.clip_grad_norm != 0) return "clip_grad_norm (the global norm needs whole gradients)";
  if (o.loss_scaler) return "a loss_scaler (its overflow check reads whole gradients)";
  if (o.skip_non_finite) return "skip_non_finite (its check reads whole gradients)";
  if (o.keep_grads) return "keep_grads (stage 2 keeps only this rank's shard of each gradient)";
  return "";
}

// The ZeRO stage a training step is prepared at, checked against the options.
static int zero_stage_of(const CompileOptions& o) {
  if (!o.communicator) {
    if (o.zero_stage)
      fail("compile: CompileOptions::zero_stage ", *o.zero_stage, " shards over the ranks of a communicator, and "
           "CompileOptions::communicator is not set (dist::Mpi::world() under mpirun, dist::local() on one rank)");
    return 0;
  }
  const int stage = o.zero_stage.value_or(0);
  if (stage < 0 || stage > 3) fail("compile: CompileOptions::zero_stage must be 0, 1, 2 or 3, got ", stage);
  if (stage >= 2)
    if (std::string why = stage2_refusal(o); !why.empty())
      fail("compile: ZeRO stage ", stage, " with ", why, "; use zero_stage 1, which shards the optimizer state alone");
  return stage;
}

static std::pair<bool, std::string> overlap_choice(const CompileOptions& o, const std::string& backend);

void gather_parameters_from_shards(Captured& c, Optimizer& opt, const CompileOptions& o, const std::string& backend) {
  opt.begin_layout();  // the state and shards this step trains, from here on
  if (!o.communicator || o.zero_stage.value_or(0) != 3) return;
  auto gathered = std::make_shared<std::vector<GatheredParameter>>();
  c.gathered = gathered;
  std::map<const void*, std::size_t> index_of;
  for (std::size_t i = 0; i < opt.params().size(); ++i) index_of.emplace(opt.params()[i].raw(), i);
  std::shared_ptr<Communicator> comm = o.communicator;
  Optimizer* trains = &opt;
  // Beside compute, each gather is prefetched: it starts once the gathers
  // of the parameters read before it are done, so it runs while the
  // compute reading those does. Parameters one op reads together (a layer
  // norm's weight and bias) are gathered together, after the same ones.
  const bool beside = overlap_choice(o, backend).first;
  struct Prefetch {
    NodeId after = -1;           // the done the current group's gathers start after
    NodeId last_done = -1;       // the latest gather's done
    std::size_t nodes_then = 0;  // the graph's node count just after it
  };
  auto prefetch = std::make_shared<Prefetch>();
  c.graph->set_parameter_source([=](Graph& g, const Tensor& t, const std::string& name) -> ValueId {
    auto it = index_of.find(t.raw());
    if (it == index_of.end()) return kNoValue;  // frozen: read whole, from its tensor
    const ZeroShard s = ZeroShard::of(t.numel(), comm->rank(), comm->size());
    if (!s.every_rank_has_elements()) return kNoValue;  // too small to shard: whole on every rank
    Var shard = persistent_var(trains->parameter_shard(it->second, s), ValueKind::parameter, name + ".shard");
    auto op = std::make_shared<ops::AllGatherParameter>(comm, s, t.shape(),
                                                       cat("parameter '", name, "' (", s.str(), " on rank ", s.rank, ")"));
    Var whole;
    if (beside) {
      Prefetch& f = *prefetch;
      bool computed = false;  // since the latest gather: a new group
      for (std::size_t n = f.nodes_then; n < g.num_nodes() && !computed; ++n) {
        const Op& since = *g.node(NodeId(n)).op;
        computed = !since.is_view() && !since.is_collective();
      }
      if (computed) f.after = f.last_done;
      std::vector<NodeId> after;
      if (f.after >= 0) after.push_back(f.after);
      whole = start_collective(std::move(op), collective_inputs({shard}, comm), after)[0];
      f.last_done = g.value(whole.id).producer;
      f.nodes_then = g.num_nodes();
    } else {
      whole = frugal::apply(std::move(op), collective_inputs({shard}, comm))[0];
    }
    gathered->push_back({it->second, shard.id, whole.id, s});
    return whole.id;
  });
}

// Step::gather_parameters of a stage-3 step: every rank's shard of each
// gathered parameter into the module's tensor, outside the step.
static std::function<void()> shards_into_parameters(const std::vector<GatheredParameter>& gathered, Optimizer& opt,
                                                    std::shared_ptr<Communicator> comm) {
  struct Target {
    Tensor shard, whole;
    ZeroShard s;
  };
  std::vector<Target> targets;
  for (const auto& gp : gathered) targets.push_back({opt.parameter_shard(gp.index, gp.s), opt.params()[gp.index], gp.s});
  return [targets, comm] {
    for (const Target& t : targets) NvmeHomes::registry().bring_back(t.shard.raw());  // a shard living on NVMe
    for (const Target& t : targets)
      gather_shards(*comm, t.s, t.shard.raw(), t.whole.raw(), t.whole.dtype(),
                    cat("Step::gather_parameters: a parameter of ", t.s.numel, " elements"));
  };
}

// Gradient accumulation over `micro_steps` runs (CompileOptions::accumulate):
// each gradient, in `order`, into its accumulator; on the k-th run the mean
// over the micro-batches goes on to the collectives and the update. Returns
// the flag that the other runs skip them by (none when micro_steps is 1).
static std::optional<Var> accumulate_gradients(Graph& g, Var loss, const std::vector<Var>& wrt,
                                               std::vector<std::optional<Var>>& grads,
                                               const std::vector<std::size_t>& order, int micro_steps) {
  if (micro_steps == 1) return std::nullopt;
  Var skip = apply1<ops::MicroStepSkip>({loss}, micro_steps);
  for (std::size_t k : order) {
    const TensorMeta& m = g.value(grads[k]->id).meta;
    MetaScope meta(g.value(wrt[k].id).external.is_meta());  // a planned-only step's accumulator has no memory
    Var acc = persistent_var(Tensor(m.shape, m.dtype), ValueKind::buffer, g.value(wrt[k].id).name + ".grad_accumulator");
    grads[k] = apply1<ops::AccumulateGradient>({*grads[k], acc, skip}, micro_steps);
  }
  return skip;
}

// Whether the gradients' collectives run beside compute
// (CompileOptions::overlap_collectives), and why, for Plan::collectives.
static std::pair<bool, std::string> overlap_choice(const CompileOptions& o, const std::string& backend) {
  Communicator& c = *o.communicator;
  if (c.size() == 1) return {false, ""};
  if (o.overlap_collectives == false) return {false, "in place, on the step's thread (CompileOptions::overlap_collectives = false)"};
  if (!c.serialized_threads())
    return {false, "in place, on the step's thread: the communicator must be called from one thread only "
                   "(MPI initialised below MPI_THREAD_SERIALIZED)"};
  if (o.overlap_collectives == true) return {true, "pinned by CompileOptions::overlap_collectives"};
  if (backend != "cpu") return {true, "the communication leaves the device's compute alone"};
  // On the CPU the communication is CPU work. A process bound to fewer
  // cores than the machine has is taken to have them to itself; else the
  // machine's cores are shared by every rank on it.
  const int procs = omp_get_num_procs(), threads = o.threads > 0 ? o.threads : omp_get_max_threads();
  const bool bound = procs < int(std::thread::hardware_concurrency());
  const int sharing = bound ? 1 : c.ranks_on_this_machine();
  const int busy = sharing * threads;
  const std::string use = cat(sharing, " rank", sharing == 1 ? "" : "s", " x ", threads, " compute thread",
                              threads == 1 ? "" : "s", " on the ", procs, " core", procs == 1 ? "" : "s",
                              bound ? " this process is bound to" : " of this machine");
  if (procs > busy) return {true, cat(use, ": a core is free to communicate")};
  return {false, cat("in place, on the step's thread: ", use,
                     ", no core is free, and a communication thread would slow the backward down "
                     "(CompileOptions::overlap_collectives = true runs them beside compute anyway)")};
}

Prepared prepare_training(std::shared_ptr<Backend> backend, Captured c, Optimizer& opt, const CompileOptions& o) {
  Var loss = training_loss(c);
  Graph& g = *c.graph;
  g.set_parameter_source({});
  CaptureScope scope(g);
  // Parameters the optimizer owns and the loss reads; the rest stay frozen.
  // Under stage 3 a sharded one is read gathered: the gradient is taken of
  // that value, and the update trains its shard.
  std::vector<Var> wrt;
  std::vector<std::size_t> index;
  std::vector<const GatheredParameter*> gathered_of;
  for (std::size_t i = 0; i < opt.params().size(); ++i) {
    const Tensor& p = opt.params()[i];
    for (ValueId v : g.values_of_kind(ValueKind::parameter))
      if (g.value(v).external.raw() == p.raw()) {
        wrt.push_back({&g, v});
        index.push_back(i);
        gathered_of.push_back(nullptr);
      }
    if (c.gathered)
      for (const GatheredParameter& gp : *c.gathered)
        if (gp.index == i) {
          wrt.push_back({&g, gp.whole});
          index.push_back(i);
          gathered_of.push_back(&gp);
        }
  }
  // Under loss scaling, gradients are taken of loss * scale and every
  // update is guarded by one overflow check over all of them.
  SkippableOptimizer* skippable = nullptr;
  // skip_non_finite is a loss scaler whose scale stays 1 (runtime/non_finite_guard.hpp).
  std::shared_ptr<NonFiniteGuard> non_finite;
  if (o.skip_non_finite) {
    if (o.loss_scaler)
      fail("compile: CompileOptions::skip_non_finite with a loss_scaler: the loss scaler already skips "
           "steps whose gradients are not finite; use one of them");
    non_finite = std::make_shared<NonFiniteGuard>();
  }
  LossScalerBase* const scaler = non_finite ? non_finite.get() : o.loss_scaler;
  if (o.clip_grad_norm != 0 && o.loss_scaler)
    fail("compile: CompileOptions::clip_grad_norm with a loss_scaler is not supported: the gradients are "
         "scaled, and clipping must see them unscaled");
  if (scaler) {
    skippable = dynamic_cast<SkippableOptimizer*>(&opt);
    if (!skippable)
      fail("compile: CompileOptions::", non_finite ? "skip_non_finite" : "loss_scaler",
           " needs an optimizer whose updates can be skipped "
           "(a SkippableOptimizer: optim::AdamW, optim::SGD)");
  }
  const int micro_steps = o.accumulate;
  if (micro_steps < 1) fail("compile: CompileOptions::accumulate is ", micro_steps, " micro-steps per update; give 1 or more");
  if (micro_steps > 1) {
    if (scaler)
      fail("compile: CompileOptions::accumulate with ", non_finite ? "skip_non_finite" : "a loss_scaler",
           " is not supported yet (both decide through the same guard whether an update runs); use one of them");
    skippable = dynamic_cast<SkippableOptimizer*>(&opt);
    if (!skippable)
      fail("compile: CompileOptions::accumulate skips the update on all but every ", micro_steps,
           "th run, and needs an optimizer whose updates can be skipped (a SkippableOptimizer: optim::AdamW, optim::SGD)");
  }
  const int stage = zero_stage_of(o);
  // Under ZeRO 1 to 3, the shard of each parameter this rank updates (none
  // for one too small to give every rank an element; at stage 3, the shard
  // it read the parameter gathered from).
  std::vector<std::optional<ZeroShard>> shard_of(wrt.size());
  if (stage == 3)
    for (std::size_t k = 0; k < wrt.size(); ++k) {
      if (gathered_of[k]) shard_of[k] = gathered_of[k]->s;
    }
  else if (stage > 0)
    for (std::size_t k = 0; k < wrt.size(); ++k)
      if (auto s = ZeroShard::of(g.value(wrt[k].id).meta.shape.numel(), o.communicator->rank(), o.communicator->size());
          s.every_rank_has_elements())
        shard_of[k] = s;
  auto grads = grad(scaler ? scaler->scale_loss(loss) : loss, wrt);
  // The gradients in the order the backward completes them (their
  // producers' capture order), not the parameters' order: the collectives
  // run in the order they are captured, and the first parameter's gradient
  // is the backward's last.
  std::vector<std::size_t> order;
  for (std::size_t k = 0; k < wrt.size(); ++k)
    if (grads[k]) order.push_back(k);
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return g.value(grads[a]->id).producer < g.value(grads[b]->id).producer;
  });
  const std::optional<Var> micro_skip = accumulate_gradients(g, loss, wrt, grads, order, micro_steps);
  // Collectives beside compute (ops::CollectiveStart), or in place.
  const bool overlap = o.communicator && overlap_choice(o, backend->name()).first;
  if (o.communicator) {
    const Phase before = g.set_phase(Phase::backward);  // the backward's last work on each gradient
    auto name_of = [&](std::size_t k) { return g.value(wrt[k].id).name; };
    // Beside compute, whole gradients are all-reduced in buckets of at
    // least CompileOptions::bucket_bytes, in the order the backward
    // completes them: fewer, larger messages. In place, one by one: a
    // bucket would hold its gradients until its last is complete.
    // At stages 2 and 3 a sharded gradient is reduce-scattered, in buckets
    // of its own kind the same way.
    struct Bucket {
      bool scatter = false;  // reduce-scatter to the shards, or all-reduce whole
      std::vector<std::size_t> grads;
      std::size_t bytes = 0;
    };
    Bucket whole, sharded{.scatter = true};
    auto reduce_bucket = [&](Bucket& b) {
      if (b.grads.empty()) return;
      std::vector<Var> in;
      for (std::size_t k : b.grads) in.push_back(*grads[k]);
      std::string what = b.grads.size() == 1 ? cat("gradient of '", name_of(b.grads[0]), "'")
                                             : cat("bucket of ", b.grads.size(), " gradients, '", name_of(b.grads.front()),
                                                   "' to '", name_of(b.grads.back()), "'");
      std::vector<Var> out;
      if (b.scatter) {
        std::vector<ZeroShard> shards;
        for (std::size_t k : b.grads) shards.push_back(*shard_of[k]);
        out = reduce_scatter_mean(in, o.communicator, std::move(shards), std::move(what), micro_skip, overlap);
      } else {
        out = all_reduce_mean(in, o.communicator, std::move(what), micro_skip, overlap);
      }
      for (std::size_t i = 0; i < b.grads.size(); ++i) grads[b.grads[i]] = out[i];
      b.grads.clear();
      b.bytes = 0;
    };
    for (std::size_t k : order) {
      Bucket& b = stage >= 2 && shard_of[k] ? sharded : whole;
      const TensorMeta& m = g.value(grads[k]->id).meta;
      if (!b.grads.empty() && m.dtype != g.value(grads[b.grads[0]]->id).meta.dtype) reduce_bucket(b);
      b.grads.push_back(k);
      b.bytes += m.nbytes();
      if (!overlap || b.bytes >= o.bucket_bytes) reduce_bucket(b);
    }
    reduce_bucket(whole);
    reduce_bucket(sharded);
    g.set_phase(before);
  }
  std::vector<char> gather_later(wrt.size(), 0);
  Prepared p{std::move(backend), std::move(c), {loss.id}, &opt, loss.id, {}, {}, {}};
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
  if (scaler && !present.empty()) guard = scaler->check_gradients(present);
  if (micro_skip) {
    Tensor one(Shape{}, DType::f32);
    one.data<float>()[0] = 1.0f;
    guard = ops::UpdateGuard{*micro_skip, constant(one, "accumulation.unit_scale")};
  }
  if (o.clip_grad_norm != 0 && !present.empty()) {
    Var norm = clip_gradients(grads, present, o.clip_grad_norm);
    p.grad_norm = norm.id;
    p.roots.push_back(norm.id);
  }
  for (std::size_t k = 0; k < wrt.size(); ++k) {
    if (!grads[k]) continue;
    auto append = [&](Var param, Var gk) {
      if (guard) skippable->append_guarded_update(param, gk, index[k], *guard);
      else opt.append_update(param, gk, index[k]);
    };
    if (!shard_of[k]) {
      append(wrt[k], *grads[k]);
      continue;
    }
    // This rank's shard: its gradient (stages 2 and 3 reduced only that),
    // its update on the optimizer's shard-sized state. At stage 3 the shard
    // is the parameter, gathered where the next step reads it; at 1 and 2
    // every rank's updated shard is gathered into the parameter now.
    const ZeroShard& s = *shard_of[k];
    {
      Optimizer::ShardScope scope(opt, s, stage != 3);
      append(stage == 3 ? Var{&g, gathered_of[k]->shard} : wrt[k], stage == 1 ? shard_slice(*grads[k], s) : *grads[k]);
      if (scope.applies() == 0)
        fail("compile: ZeRO stage ", stage, " updates each rank's shard of a parameter, but the '", opt.kind(),
             "' optimizer's append_update did not apply its update op through Optimizer::apply_update (which runs it "
             "on the shard); apply it that way, or pin CompileOptions::zero_stage = 0");
    }
    if (stage != 3 && overlap) gather_later[k] = 1;
    else if (stage != 3)
      all_gather_shards(wrt[k], o.communicator, s,
                        cat("parameter '", g.value(wrt[k].id).name, "' (", s.str(), " on rank ", s.rank, ")"), micro_skip);
  }
  // Beside compute, each gather of updated shards starts as soon as its
  // update has run, which the schedule puts right after the gradient's
  // reduction: captured in the order the backward completes the gradients,
  // in a sequence of their own, they run while the backward goes on. Each
  // done is a result, so the step ends only once every parameter is whole.
  for (std::size_t k : order)
    if (gather_later[k]) {
      const ZeroShard& s = *shard_of[k];
      p.roots.push_back(start_all_gather_shards(wrt[k], o.communicator, s,
                                                cat("parameter '", g.value(wrt[k].id).name, "' (", s.str(), " on rank ",
                                                    s.rank, ")"),
                                                micro_skip)
                            .id);
    }
  if (guard) {
    skippable->append_guarded_step_end(*guard);
    if (scaler) scaler->append_scale_update(*guard);  // last: after every reader of the scale
  }
  if (non_finite) p.skip_stats = non_finite->skip_stats();
  if (p.c.gathered && !p.c.gathered->empty())
    p.gather_parameters = shards_into_parameters(*p.c.gathered, opt, o.communicator);
  for (std::size_t i = 1; i < p.c.results.size(); ++i) {  // extra outputs
    p.outputs.push_back(p.c.results[i].id);
    p.roots.push_back(p.c.results[i].id);
  }
  g.set_phase(previous);
  p.optimizer_layout = opt.prepared_layout();
  return p;
}

Prepared prepare_gradients(std::shared_ptr<Backend> backend, Captured c, const std::vector<Tensor>& wrt,
                           const CompileOptions&) {
  Var loss = single_loss(c);
  Graph& g = *c.graph;
  CaptureScope scope(g);
  std::vector<Var> vars;
  for (auto& t : wrt) {
    ValueId found = kNoValue;
    for (const ValueKind k : {ValueKind::parameter, ValueKind::state, ValueKind::buffer, ValueKind::constant})
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
  return {std::move(backend), std::move(c), std::move(roots), nullptr, loss.id, {}, std::move(grad_of), {}};
}

Prepared prepare_inference(std::shared_ptr<Backend> backend, Captured c, const CompileOptions&) {
  std::vector<ValueId> outs;
  for (auto& v : c.results) outs.push_back(v.id);
  return {std::move(backend), std::move(c), outs, nullptr, kNoValue, outs, {}, {}};
}

// Fuses the prepared graph (PlanOptions::fuse) before anything plans it,
// so re-plans start from the fused graph too: BatchNorm + ReLU first (a
// ReLU it takes cannot also start a chain), then elementwise chains.
static ops::FusionReport fuse_prepared(Prepared& p, const CompileOptions& o) {
  if (!o.plan.fuse) return {};
  ops::FusionReport bn;
  ops::fuse_batch_norm_relu(*p.c.graph, p.roots, bn);
  ops::FusionReport r = ops::fuse_elementwise(*p.c.graph, p.roots);
  r.chains += bn.chains;
  r.nodes_fused += bn.nodes_fused;
  r.values_removed += bn.values_removed;
  r.bytes_removed += bn.bytes_removed;
  return r;
}
// Optimizer offload (CompileOptions::offload_optimizer): the planner's
// options for it on this backend, and, pinned, the state moved to the host
// before anything plans the step (so re-plans start from it too).
static PlanOptions plan_options(const CompileOptions& o, const Backend& backend) {
  PlanOptions po = o.plan;
  po.offload_optimizer = o.offload_optimizer;
  if (!backend.host_addressable()) {
    if (o.offload_optimizer == true)
      fail("compile: CompileOptions::offload_optimizer on the ", backend.name(),
           " backend: its kernels cannot read host memory, and running the update on the host is not built there "
           "yet; leave it unset, or use the cpu backend");
    po.offload_optimizer = false;
    if (po.nvme_offload.pinned())
      fail("compile: PlanOptions::nvme_offload on the ", backend.name(),
           " backend: its NVMe tier is not built yet (file I/O would be handed device memory); "
           "leave it unset, or use the cpu backend");
    po.nvme_offload.automatic = false;
  }
  if (o.offload_optimizer == true && po.nvme_offload.optimizer_state)
    fail("compile: CompileOptions::offload_optimizer pins the optimizer state to the host and "
         "PlanOptions::nvme_offload.optimizer_state pins it to NVMe; set one of the two");
  return po;
}
static void offload_pinned(Prepared& p, const CompileOptions& o) {
  if (o.offload_optimizer == true && p.opt) plan::offload_optimizer_state(*p.c.graph);
}
// Plan::optimizer_offload: how much state lives on the host or on NVMe, and why.
static std::string offload_note(const Plan& plan, const CompileOptions& o) {
  auto bytes_of = [](const std::map<std::string, std::size_t>& m, const char* kind) {
    auto it = m.find(kind);
    return it == m.end() ? std::size_t(0) : it->second;
  };
  std::string nvme;
  if (plan.nvme_home_bytes) {
    nvme = cat(format_bytes(bytes_of(plan.nvme_home_by_kind, "optimizer state")), " of optimizer state and ",
               format_bytes(bytes_of(plan.nvme_home_by_kind, "parameters")), " of parameters (",
               plan.count(plan::Choice::nvme_home), " tensors) live on NVMe between steps, read before their first "
               "use and written back after their update",
               plan.nvme_home_slots == 1 ? " in place (one slot each: a step that fails part way leaves them part "
                                           "updated)"
                                         : " (two slots each: a step that fails part way leaves the state it started from)",
               ": ",
               o.plan.nvme_offload.pinned() ? "pinned by PlanOptions::nvme_offload" : "chosen by the budget solve");
  }
  const std::size_t bytes = bytes_of(plan.offloaded_by_kind, "optimizer state");
  std::string host;
  if (o.offload_optimizer == true)
    host = cat(format_bytes(bytes), " of optimizer state on the host, updated there in place "
               "(pinned by CompileOptions::offload_optimizer)");
  else if (const std::size_t chosen = plan.count(plan::Choice::host_update))
    host = cat(format_bytes(bytes), " of optimizer state (", chosen, " tensor", chosen == 1 ? "" : "s",
               ") on the host, updated there in place: chosen by the budget solve, at no copy");
  return host.empty() ? nvme : nvme.empty() ? host : host + "; " + nvme;
}
static void note_fusion(Plan& plan, const ops::FusionReport& r) {
  plan.fused_chains = r.chains;
  plan.fused_away_bytes = r.bytes_removed;
}

// A prepared step fused and planned, with what building its Step (and
// re-planning it) needs: the graph as captured, before the budget's rewrite.
struct PlannedPrepared {
  Prepared p;
  Plan plan;
  std::shared_ptr<Graph> captured;
  ops::FusionReport fused;
};
static Plan plan_prepared_from(Prepared& p, const Budget& budget, const CompileOptions& o, plan::Unconstrained start);

// Collectives run beside compute (ops::CollectiveStart), and of them, how
// many gather a parameter for the forward (ZeRO stage 3) and how many
// gather updated shards into their parameters (stages 1 and 2).
struct StartedCollectives {
  int all = 0, gathers = 0, updated = 0;
  // Plan::collectives: what runs beside compute, and why.
  std::string str(int in_flight, const std::string& why) const {
    if (all == 0) return why;
    std::vector<std::string> parts;
    if (gathers)
      parts.push_back(cat(gathers, " parameter gather", gathers == 1 ? "" : "s", ", each started once the one before it is done"));
    if (const int grads = all - gathers - updated) parts.push_back(cat(grads, " gradient collective", grads == 1 ? "" : "s"));
    if (updated) parts.push_back(cat(updated, " gather", updated == 1 ? "" : "s", " of updated shards"));
    std::string list;
    for (std::size_t i = 0; i < parts.size(); ++i) list += (i == 0 ? "" : i + 1 == parts.size() ? " and " : ", ") + parts[i];
    return cat(list, " beside compute, on a thread of their own, at most ", in_flight, " in flight (", why, ")");
  }
};
static StartedCollectives started_collectives(const Graph& g) {
  StartedCollectives n;
  for (const Node& node : g.nodes())
    if (auto* s = dynamic_cast<const ops::CollectiveStart*>(node.op.get())) {
      ++n.all;
      n.gathers += dynamic_cast<const ops::AllGatherParameter*>(&s->inner()) != nullptr;
      n.updated += dynamic_cast<const ops::AllGatherShards*>(&s->inner()) != nullptr;
    }
  return n;
}

// `prepare`, for a training step over ranks: run the collectives beside
// compute only where the budget does not bind. A collective in flight holds
// its gradient and scratch until its done, which would raise the least the
// step can run in; under a budget that binds, memory comes first.
static PlannedPrepared plan_fused(Prepared p, const Budget& budget, const CompileOptions& o,
                                  const PrepareTraining* prepare = nullptr) {
  const ops::FusionReport fused = fuse_prepared(p, o);
  offload_pinned(p, o);
  const StartedCollectives started = started_collectives(*p.c.graph);
  plan::Unconstrained start = plan::plan_unconstrained(*p.c.graph, p.roots, plan_options(o, *p.backend));
  if (prepare && started.all > 0 && budget.device > 0 && start.plan.total_bytes() > budget.device) {
    CompileOptions in_place = o;
    in_place.overlap_collectives = false;
    PlannedPrepared pp = plan_fused((*prepare)(in_place), budget, in_place);
    pp.plan.collectives = cat("in place, on the step's thread: the device budget binds, and collectives beside "
                              "compute would hold their gradients and scratch longer");
    return pp;
  }
  std::shared_ptr<Graph> captured = p.c.graph;
  Plan plan = plan_prepared_from(p, budget, o, std::move(start));
  note_fusion(plan, fused);
  if (o.communicator && o.communicator->size() > 1) {
    plan.collectives = started.str(o.plan.collectives_in_flight, overlap_choice(o, p.backend->name()).second);
  }
  return {std::move(p), std::move(plan), std::move(captured), fused};
}

static PlannedStep planned_step(PlannedPrepared pp, const std::vector<InputSpec>& specs) {
  std::size_t in = 0;
  for (auto& s : specs) in += s.meta.nbytes();
  const bool copies = !pp.p.backend->host_addressable();
  return {std::move(pp.p.c.graph), std::move(pp.plan), std::move(pp.p.roots), in, copies, std::move(pp.p.c.inputs),
          pp.p.loss, std::move(pp.p.outputs), std::move(pp.p.optimizer_layout)};
}

PlannedStep planned(Prepared p, const std::vector<InputSpec>& specs, const Budget& budget, const CompileOptions& o) {
  return planned_step(plan_fused(std::move(p), budget, o), specs);
}

// What a rank's step asks of the other ranks, in the order it asks: each
// collective's op and the elements it moves (whole tensors, so the same on
// every rank whatever its shard), hashed. Ranks whose sequences differ
// would each wait in a collective the others never start, until the
// communicator's timeout.
struct CollectiveSequence {
  std::int64_t count = 0, hash = 0;
};
static CollectiveSequence collective_sequence(const Graph& g, const Plan& p) {
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a
  auto mix = [&](std::uint64_t x) {
    for (int k = 0; k < 8; ++k) h = (h ^ ((x >> (8 * k)) & 0xff)) * 1099511628211ull;
  };
  CollectiveSequence seq;
  for (NodeId n : p.schedule) {
    const Node& node = g.node(n);
    if (!node.op->is_collective()) continue;
    ++seq.count;
    for (char c : node.op->name()) mix(std::uint8_t(c));
    // The scalars (the collective count, the skip flag) aside; a shard in
    // (an all-gather) or out (a reduce-scatter) is smaller than the whole.
    auto elements = [&](std::span<const ValueId> vs) {
      std::int64_t e = 0;
      for (ValueId v : vs)
        if (g.value(v).meta.shape.rank() > 0 && !g.value(v).is_workspace) e += g.value(v).meta.shape.numel();
      return e;
    };
    mix(std::uint64_t(std::max(elements(node.inputs), elements(node.outputs))));
  }
  seq.hash = std::int64_t(h);
  return seq;
}

// Every rank must run its step at the same stage, with the same
// collectives in the same order. Returns "" when they do, else what
// differs (every rank gets the same answer: it is read from all of them).
// A rank whose planning failed says so with this stage, so that the others
// learn it at once instead of waiting for it in the next collective.
inline constexpr int kPlanFailed = -2;
static std::string ranks_disagree(Communicator& comm, int stage, const CollectiveSequence& seq) {
  const std::size_t n = std::size_t(comm.size());
  std::vector<std::int64_t> all(3 * n);
  const std::int64_t mine[3] = {stage, seq.count, seq.hash};
  comm.all_gather(mine, all.data(), 3, DType::i64, "the ZeRO stage and collectives each rank compiled its step with");
  for (std::size_t r = 0; r < n; ++r)
    if (all[3 * r] == kPlanFailed) {
      return cat("rank ", r, " could not plan its step (its own error says why)");
    }
  for (std::size_t r = 1; r < n; ++r) {
    if (all[3 * r] != all[0])
      return cat("rank ", r, " planned its step at ZeRO stage ", all[3 * r], " and rank 0 at stage ", all[0]);
    if (all[3 * r + 1] != all[1] || all[3 * r + 2] != all[2])
      return cat("rank ", r, " planned ", all[3 * r + 1], " collectives and rank 0 ", all[1],
                 all[3 * r + 1] == all[1] ? ", in another order or of other sizes" : "");
  }
  return "";
}

// The step each rank compiled, checked against the others. Where their
// collectives differ (one rank's budget binds and another's does not, or
// their cores differ, so one runs them beside compute in buckets and
// another in place; or their budget solves gather a parameter again in
// different places), and no rank pinned them beside compute, every rank
// plans them in place again, gathering nothing twice: then each gradient
// has its own collective, in capture order, the same on every rank.
// `pp` is this rank's plan, or `failed` why it has none: the others learn
// that before it is rethrown here.
static PlannedPrepared agree_with_ranks(std::optional<PlannedPrepared> pp, std::exception_ptr failed,
                                        const PrepareTraining& prepare, const Budget& budget, const CompileOptions& o) {
  Communicator& comm = *o.communicator;
  auto sequence = [](const std::optional<PlannedPrepared>& x) {
    return x ? collective_sequence(*x->p.c.graph, x->plan) : CollectiveSequence{};
  };
  const int stage = pp ? pp->plan.zero_stage : kPlanFailed;
  std::string why = ranks_disagree(comm, stage, sequence(pp));
  if (failed) std::rethrow_exception(failed);
  if (why.empty()) return std::move(*pp);
  auto refuse = [&](const std::string& what, const std::string& advice) {
    fail("compile: the ranks' steps would not communicate: ", what, " (this is rank ", comm.rank(), "). ", advice);
  };
  if (why.find("could not plan") != std::string::npos)
    refuse(why, "Give every rank a budget its step fits in (the last rank's shards may be smaller than the others')");
  if (why.find("ZeRO stage") != std::string::npos)
    refuse(why, "Give every rank the same device budget and options, or pin CompileOptions::zero_stage");
  // Whether any rank pinned its collectives beside compute: then in place
  // is not every rank's to choose.
  std::vector<std::int32_t> pinned(std::size_t(comm.size()));
  const std::int32_t mine = o.overlap_collectives == true;
  comm.all_gather(&mine, pinned.data(), 1, DType::i32, "whether each rank pinned overlap_collectives");
  if (std::find(pinned.begin(), pinned.end(), 1) != pinned.end())
    refuse(why, "CompileOptions::overlap_collectives is pinned on some rank: give every rank the same options "
                "(overlap_collectives, bucket_bytes) and budget, or leave overlap_collectives unset");
  CompileOptions in_place = o;
  in_place.overlap_collectives = false;
  in_place.plan.recompute_collectives = false;  // a re-gather is each rank's budget's choice
  in_place.zero_stage = stage;
  std::optional<PlannedPrepared> again;
  try {
    again.emplace(plan_fused(prepare(in_place), budget, in_place));
    again->plan.zero_stage = stage;
    again->plan.zero_reason = pp->plan.zero_reason;
    again->plan.collectives = cat("in place, on the step's thread: the ranks planned different collectives (", why,
                                  "), so every rank runs them in place and gathers no parameter twice");
  } catch (...) {
    failed = std::current_exception();
  }
  why = ranks_disagree(comm, again ? stage : kPlanFailed, sequence(again));
  if (failed) std::rethrow_exception(failed);
  if (!why.empty()) refuse(why, "Give every rank the same options and budget");
  return std::move(*again);
}

// The training step at the ZeRO stage the optimizer's earlier steps train
// (Optimizer::zero_stage), whatever its own budget would pick: a stage lays
// the optimizer's state out its own way, and a step at another would train
// state of its own. Refused, naming the stage, where it does not fit.
static PlannedPrepared plan_at_trained_stage(const PrepareTraining& prepare, const Budget& budget,
                                             const CompileOptions& o, int stage) {
  const std::string why = cat("the optimizer's earlier steps train at ZeRO stage ", stage, ", and every step on it must");
  if (stage >= 2)
    if (std::string no_stage2 = stage2_refusal(o); !no_stage2.empty())
      fail("compile: ", why, ", but stage ", stage, " does not combine with ", no_stage2,
           ". Compile this step with the options of the earlier ones, or train it with an optimizer of its own");
  CompileOptions os = o;
  os.zero_stage = stage;
  try {
    PlannedPrepared pp = plan_fused(prepare(os), budget, os, &prepare);
    pp.plan.zero_stage = stage;
    pp.plan.zero_reason = cat("the stage the optimizer's earlier steps train, ", stage, ", over ",
                              o.communicator->size(), " ranks");
    return pp;
  } catch (const BudgetError& e) {
    const std::size_t need = e.smallest_feasible_bytes;
    throw BudgetError(cat("compile: ", why, "; at stage ", stage, " this step needs ",
                          need ? cat("at least ", format_bytes(need), " (", need, " bytes) of device memory, and its "
                                     "budget gives ", budget.device, " bytes")
                               : std::string("more memory than its budget gives"),
                          ". Raise the budget, or train this step with an optimizer of its own. The planner at stage ",
                          stage, ": ", e.what()),
                      need, e.unconstrained_bytes);
  }
}

// The training step planned at the pinned ZeRO stage, else at the one the
// optimizer's earlier steps train (`trained_stage`), else at the one the
// planner picks (CompileOptions::zero_stage), by this rank alone.
static PlannedPrepared plan_training_alone(const PrepareTraining& prepare, const Budget& budget,
                                           const CompileOptions& o, std::optional<int> trained_stage) {
  if (!o.communicator) return plan_fused(prepare(o), budget, o);
  Communicator& comm = *o.communicator;
  if (o.zero_stage) {
    PlannedPrepared pp = plan_fused(prepare(o), budget, o, &prepare);
    pp.plan.zero_stage = *o.zero_stage;
    pp.plan.zero_reason = cat("pinned by CompileOptions::zero_stage, over ", comm.size(), " ranks");
    return pp;
  }
  if (trained_stage) return plan_at_trained_stage(prepare, budget, o, *trained_stage);
  const std::string no_stage2 = stage2_refusal(o);
  const int last = comm.size() == 1 ? 0 : no_stage2.empty() ? 3 : 1;
  // Stage 0 fitting without evicting anything is the cheapest there is:
  // the higher stages only add communication. Otherwise every stage that
  // fits is priced (its evictions and its collectives, by the cost model
  // that prices the budget's choices), and the fastest is taken, a higher
  // stage only when predicted at least 5% faster than the lower one.
  constexpr double kClearlyFaster = 0.95;
  std::optional<PlannedPrepared> best;
  std::vector<std::pair<int, std::string>> tried;  // by stage: what it needs or how it fits
  auto tried_list = [&] {
    std::sort(tried.begin(), tried.end());
    std::string out;
    for (auto& [_, what] : tried) out += (out.empty() ? "" : "; ") + what;
    return out;
  };
  // Where the search would stop: stage 0 with nothing evicted. A refusal
  // carries it as the step's unconstrained bytes, so a broker's probe
  // (MemoryBroker) can give the step up to that, not only its least.
  std::size_t stage0_unconstrained = 0;
  // Each stage is first refused at once where its device, host and NVMe
  // together cannot hold it (PlanOptions::refuse_overflow): such a stage
  // cannot fit, and its least is searched only if its lower bound is below
  // every other stage's least when none fits (then the refusal names the
  // least device budget of some stage, exactly, as before).
  struct Refusal {
    int stage;
    BudgetError error;
  };
  std::vector<Refusal> refused;
  auto plan_stage = [&](int stage, bool refuse_overflow) {
    CompileOptions os = o;
    os.zero_stage = stage;
    os.plan.refuse_overflow = refuse_overflow || o.plan.refuse_overflow;
    PlannedPrepared pp = plan_fused(prepare(os), budget, os, &prepare);
    pp.plan.zero_stage = stage;
    return pp;
  };
  // Whether it fits at all (PlanOptions::fit_only) is asked highest stage
  // first: the stage that holds the least per rank, so a step that fits
  // is mostly answered by one search.
  for (int k = 0; k <= last; ++k) {
    const int stage = o.plan.fit_only ? last - k : k;
    try {
      PlannedPrepared pp = plan_stage(stage, true);
      char ms[32];
      std::snprintf(ms, sizeof ms, "%.2f", pp.plan.predicted_step_ms);
      if (stage == 0 && pp.plan.decisions.empty()) {
        pp.plan.zero_reason = budget.device ? cat("fits the budget over ", comm.size(), " ranks with nothing evicted")
                                            : std::string("no device budget, so nothing to shard for");
        best = std::move(pp);
        break;
      }
      tried.push_back({stage, cat("stage ", stage, " fits in ", format_bytes(pp.plan.total_bytes()), ", predicted ",
                                  ms, " ms")});
      // A higher stage communicates more than the cost model can see on a
      // shared-memory machine's numbers; it must be predicted clearly faster.
      if (!best || pp.plan.predicted_step_ms < kClearlyFaster * best->plan.predicted_step_ms) best = std::move(pp);
      if (o.plan.fit_only) break;  // whether it fits was the question, and it does
    } catch (const BudgetError& e) {
      refused.push_back({stage, e});
      if (stage == 0) stage0_unconstrained = e.unconstrained_bytes;
    }
  }
  // The refused stage needing least.
  auto least = [&] {
    return std::min_element(refused.begin(), refused.end(), [](const Refusal& a, const Refusal& b) {
      return a.error.smallest_feasible_bytes < b.error.smallest_feasible_bytes;
    });
  };
  if (!best) {
    // Its least searched where only bounded (a bound below every other
    // stage's least could be the answer).
    const bool exact_wanted = !o.plan.fit_only && !o.plan.refuse_overflow;
    for (auto r = least(); exact_wanted && r->error.smallest_is_lower_bound; r = least()) {
      try {
        plan_stage(r->stage, false);
        fail("internal error: ZeRO stage ", r->stage, " was refused as overflowing its tiers, yet fits");
      } catch (const BudgetError& e) {
        r->error = e;
      }
    }
  }
  for (const Refusal& r : refused)
    tried.push_back({r.stage, cat("stage ", r.stage, " needs at least ", format_bytes(r.error.smallest_feasible_bytes),
                                  r.error.smallest_is_lower_bound ? " (its device, host and NVMe together cannot hold it)"
                                                                  : "")});
  if (!best) {
    const Refusal& r = *least();
    BudgetError e(cat("no ZeRO stage fits the device budget over ", comm.size(), " rank", comm.size() == 1 ? "" : "s",
                      " (", tried_list(),
                      comm.size() == 1  ? "; one rank has nothing to shard over"
                      : last < 2 ? cat("; stages 2 and 3 were not tried, for ", no_stage2)
                                 : std::string(),
                      "). At stage ", r.stage, ", which needs least: ", r.error.what()),
                  r.error.smallest_feasible_bytes, stage0_unconstrained);
    e.smallest_is_lower_bound = r.error.smallest_is_lower_bound;
    throw e;
  }
  // Each stage tried prepared the optimizer's state in its own layout
  // (Optimizer::state_tensor), kept with its values, and the chosen step
  // carries its own (Prepared::optimizer_layout), which the Step made from
  // it trains (Optimizer::trains): its state, its checkpoints and what a
  // re-plan finds are that layout's, however many stages were tried after
  // it, so nothing is prepared again. An optimizer that only plans reports
  // the layout prepared last: the chosen one's, again.
  best->p.opt->prepared_again(best->p.optimizer_layout);
  if (best->plan.zero_reason.empty())
    best->plan.zero_reason = cat("the fastest that fits (a higher stage only if 5% faster), chosen by the planner over ",
                                 comm.size(), " ranks (", tried_list(), ")");
  return std::move(*best);
}

// plan_training_alone, and with `agree` (compile; plan_training only plans,
// and may plan one rank alone, with dist::PlanOnly) checked with the other
// ranks, a failure included.
static PlannedPrepared plan_training_at_stage(const PrepareTraining& prepare, const Budget& budget,
                                              const CompileOptions& o, std::optional<int> trained_stage, bool agree) {
  if (!agree || !o.communicator) return plan_training_alone(prepare, budget, o, trained_stage);
  std::optional<PlannedPrepared> pp;
  std::exception_ptr failed;
  try {
    pp.emplace(plan_training_alone(prepare, budget, o, trained_stage));
  } catch (...) {
    failed = std::current_exception();
  }
  return agree_with_ranks(std::move(pp), failed, prepare, budget, o);
}

// Planning alone (plan_training; dist::PlanOnly and frugal-plan --ranks,
// which plan other ranks, even other rank counts, on one optimizer) answers
// what a step would be, and trains nothing. Unpinned, it plans at the stage
// the optimizer's steps train, as compile would (a MemoryBroker sizes a
// step's share from its planner, and must plan what its compiler makes);
// a pinned stage it plans as asked, a what-if whose state is a layout of
// its own (Optimizer::state_tensor), where compile would refuse the pin.
// It fixes no stage: a program that plans before it compiles (the samples'
// unconstrained plan, a broker's probes, a stage search) must leave the
// compile its own pick.
PlannedStep planned_training(const PrepareTraining& prepare, const Optimizer& opt, const std::vector<InputSpec>& specs,
                             const Budget& budget, const CompileOptions& o) {
  return planned_step(plan_training_at_stage(prepare, budget, o, opt.zero_stage(), false), specs);
}

Plan plan_prepared(Prepared& p, const Budget& budget, const CompileOptions& o) {
  offload_pinned(p, o);
  return plan_prepared_from(p, budget, o, plan::plan_unconstrained(*p.c.graph, p.roots, plan_options(o, *p.backend)));
}

// plan_prepared from the step already planned unconstrained.
static Plan plan_prepared_from(Prepared& p, const Budget& budget, const CompileOptions& o, plan::Unconstrained start) {
  // least_saved_activations makes choices under any device budget, binding
  // or not; pinned NVMe homes are a choice with no device budget too.
  const bool binding =
      (budget.device > 0 && (start.plan.total_bytes() > budget.device || o.plan.least_saved_activations)) ||
      o.plan.nvme_offload.pinned();
  // An unconstrained plan makes no choice, so it measures nothing: its
  // predicted time is priced with the profile given (CompileOptions::profile,
  // FRUGAL_PROFILE), else at the built-in rates. A given profile prices
  // every plan, so ZeRO stages that bind and stages that do not are
  // compared at the same rates.
  const char* forced = std::getenv("FRUGAL_PROFILE");
  const bool measures = o.calibrate && !o.profile && !(forced && *forced);
  Pricing pricing = binding || !measures ? pricing_for(*p.backend, budget, o) : builtin_pricing(*p.backend, o);
  auto solved = plan::solve_budget(p.c.graph, p.roots, budget, plan::prices_from(pricing.model),
                                   plan_options(o, *p.backend), std::move(start));
  p.c.graph = std::move(solved.graph);
  if (binding) p.prices = pricing.model;
  solved.plan.priced_with = pricing.source;
  solved.plan.optimizer_offload = offload_note(solved.plan, o);
  if (o.verify) {
    auto report = plan::verify(*p.c.graph, solved.plan, p.roots);
    if (!report.ok()) fail("internal error: the planner produced a plan its verifier rejects:\n", report.str());
  }
  return std::move(solved.plan);
}

static Step build_step(PlannedPrepared pp, const Budget& budget, const CompileOptions& o) {
  Prepared& p = pp.p;
  for (const Value& v : p.c.graph->values())
    if (v.external.is_meta())
      fail("compile: ", v.name, " is a meta tensor (", dtype_name(v.meta.dtype), v.meta.shape.str(),
           ", made inside a frugal::MetaScope): a step over meta tensors can be planned (plan_training, "
           "plan_inference, frugal-plan) but not compiled to run; build the model and optimizer outside the "
           "MetaScope to train it");
  const std::shared_ptr<Graph>& captured = pp.captured;
  const ops::FusionReport fused = pp.fused;
  Step::Parts parts;
  parts.graph = std::move(p.c.graph);
  parts.plan = std::move(pp.plan);
  parts.backend = p.backend;
  parts.optimizer = p.opt;
  parts.optimizer_layout = p.optimizer_layout;
  parts.modes = std::move(p.c.modes);
  parts.inputs = std::move(p.c.inputs);
  parts.loss = p.loss;
  parts.outputs = std::move(p.outputs);
  parts.grad_of = std::move(p.grad_of);
  parts.threads = o.threads;
  parts.roots = std::move(p.roots);
  parts.nvme_dir = budget.nvme_dir;
  parts.grad_norm = p.grad_norm;
  parts.skip_stats = p.skip_stats;
  parts.gather_parameters = std::move(p.gather_parameters);
  if (o.replan && !parts.plan.decisions.empty()) {
    // What re-planning needs: the graph before the rewrite, the budget, and
    // a cost model that measured op times can refine.
    auto cm = p.prices;  // the model that priced the plan, refined by measured times
    auto roots = parts.roots;
    auto plan_opts = plan_options(o, *p.backend);
    bool verify = o.verify;
    // Each rank re-plans on its own measured times. A re-plan that would run
    // other collectives than the plan every rank agreed on at compile (a
    // stage-3 re-gather moved or dropped) is not taken: the ranks' sequences
    // would part.
    const CollectiveSequence agreed = collective_sequence(*parts.graph, parts.plan);
    parts.replanner = [captured, budget, cm, roots, plan_opts, verify, fused, o,
                       agreed](const plan::OpTimeRecorder& times) -> std::pair<std::shared_ptr<Graph>, Plan> {
      cm->set_measured(times);
      auto solved = plan::solve_budget(captured, roots, budget, plan::prices_from(cm), plan_opts);
      const CollectiveSequence seq = collective_sequence(*solved.graph, solved.plan);
      if (seq.count != agreed.count || seq.hash != agreed.hash) return {nullptr, Plan{}};
      solved.plan.optimizer_offload = offload_note(solved.plan, o);
      if (verify) {
        auto report = plan::verify(*solved.graph, solved.plan, roots);
        if (!report.ok()) fail("internal error: a re-plan was rejected by the verifier:\n", report.str());
      }
      note_fusion(solved.plan, fused);
      return std::pair{std::move(solved.graph), std::move(solved.plan)};
    };
  }
  return Step(std::move(parts));
}

Step finish(Prepared p, const Budget& budget, const CompileOptions& o) {
  return build_step(plan_fused(std::move(p), budget, o), budget, o);
}

// A step sharded otherwise than `opt`'s steps train (a pin of another ZeRO
// stage, or another rank count at a sharded stage), refused before
// anything is prepared.
static void refuse_other_sharding(const Optimizer& opt, const CompileOptions& o) {
  const std::optional<int> trained = opt.zero_stage();
  // At a sharded stage the state is this rank's shard for that rank count:
  // a step over no communicator, or another count, would find none of it
  // and train fresh state from zero.
  const int ranks = o.communicator ? o.communicator->size() : 1;
  if (trained && *trained >= 1 && ranks != opt.zero_ranks())
    fail("compile: the optimizer's earlier steps train at ZeRO stage ", *trained, " over ", opt.zero_ranks(),
         " ranks, each rank holding its shard of the optimizer state, and this step is ",
         o.communicator ? cat("over ", ranks, ranks == 1 ? " rank" : " ranks") : std::string("over no communicator"),
         ": it would find none of that state and train its own from zero. Compile it over the same ",
         opt.zero_ranks(), " ranks; to change the rank count, save the training with io::save_gathered_checkpoint, "
         "compile the step on a new optimizer and load it there with io::load_gathered_checkpoint (which reshards)");
  if (!o.communicator || !o.zero_stage || !trained || *o.zero_stage == *trained) return;
  fail("compile: CompileOptions::zero_stage pins ZeRO stage ", *o.zero_stage, ", and the optimizer's earlier steps "
       "train at stage ", *trained, ": each stage lays the optimizer's state out its own way, so steps of both would "
       "train different state. Pin stage ", *trained, " or leave zero_stage unset to take it; to move the training to "
       "stage ", *o.zero_stage, ", save it with io::save_gathered_checkpoint, compile the step at stage ",
       *o.zero_stage, " on a new optimizer, and load it there with io::load_gathered_checkpoint");
}

// The first training step compiled on an optimizer over a communicator
// fixes the optimizer's stage (Optimizer::zero_stage) once it is made: a
// compile that fails fixes nothing.
Step finish_training(const PrepareTraining& prepare, Optimizer& opt, const Budget& budget, const CompileOptions& o) {
  refuse_other_sharding(opt, o);
  Step step = build_step(plan_training_at_stage(prepare, budget, o, opt.zero_stage(), true), budget, o);
  if (o.communicator && !opt.zero_stage()) opt.fix_zero_stage(step.plan().zero_stage, o.communicator->size());
  return step;
}

}  // namespace frugal::detail
