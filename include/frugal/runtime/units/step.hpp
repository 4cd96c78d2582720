#pragma once
// Compiled once per program (frugal_add_kernels, or <frugal/kernels.hpp>):
// the Step's members, the same code for every model.
#include <algorithm>
#include <chrono>
#include <cmath>

#include "../../plan/cost_model.hpp"
#include "../../plan/report.hpp"
#include "../../plan/verify.hpp"
#include "../executor.hpp"
#include "../step.hpp"
#include "../threads.hpp"

namespace frugal {

Step::Step(Parts p) : p_(std::move(p)) {
  if (p_.optimizer) {
    optimizer_alive_ = p_.optimizer->liveness();
    optimizer_kind_ = p_.optimizer->kind();
  }
  executor_ = std::make_unique<Executor>(p_.graph, p_.plan, *p_.backend, p_.nvme_dir);
  for (ValueId o : p_.outputs) outputs_.emplace_back(p_.graph->value(o).meta.shape, p_.graph->value(o).meta.dtype);
  // A step made trains: checkpoints describe its state until another is
  // made or runs (a checkpoint loaded now, resharding a run, loads into it).
  if (p_.optimizer && p_.optimizer_layout) p_.optimizer->trains(p_.optimizer_layout);
}
Step::Step(Step&&) noexcept = default;
Step& Step::operator=(Step&&) noexcept = default;
Step::~Step() = default;

// Before anything of a run happens: the optimizer the step calls into must
// still exist, and the modules' train/eval flags must be the ones captured.
void Step::check_alive_and_modes() const {
  if (p_.optimizer && optimizer_alive_.expired())
    fail("step.run: the optimizer this training step was compiled with (", optimizer_kind_,
         ") has been destroyed; a Step does not own its optimizer, which keeps the step count and "
         "hyperparameters the update reads. Keep the optimizer alive as long as the step (for example as "
         "members of one struct, declared before the Step), or compile the step again with a live one");
  for (const ModeRead& r : p_.modes)
    if (*r.flag != r.training) fail("step.run: ", mode_change_message(r));
}

float Step::run_inputs(std::span<const Tensor* const> inputs) {
  check_alive_and_modes();
  replan_if_due();
  stage(inputs);
  return execute();
}

Step::Audit Step::audit_inputs(std::span<const Tensor* const> list) {
  Audit a{0, p_.plan.peak_bytes, true};
  check_alive_and_modes();
  replan_if_due();
  a.predicted = p_.plan.peak_bytes;
  for (unsigned char pattern : {0xA5, 0x5A}) {
    executor_->fill(pattern);
    stage(list);
    execute();
    a.high_water = std::max(a.high_water, executor_->touched_up_to(pattern));
  }
  a.canary_intact = a.high_water <= p_.plan.peak_bytes;
  return a;
}

void Step::stage(std::span<const Tensor* const> inputs) {
  if (inputs.size() != p_.inputs.size())
    fail("step.run: expected ", p_.inputs.size(), " inputs, got ", inputs.size());
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const Value& v = p_.graph->value(p_.inputs[i]);
    const Tensor& t = *inputs[i];
    if (t.dtype() != v.meta.dtype || t.shape() != v.meta.shape)
      fail<ShapeError>("step.run: input ", i, " ('", v.name, "') is ", dtype_name(t.dtype()), t.shape().str(),
                       " but the step was compiled for ", v.meta.str());
    p_.backend->copy_to_device(executor_->address(p_.inputs[i]), t.raw(), t.nbytes());
  }
}

float Step::execute() {
  ScopedThreads threads(p_.threads);  // this thread's OpenMP (and so BLAS) count, for this run only
  Optimizer::RunStart before;
  if (p_.optimizer) before = p_.optimizer->start_run(p_.optimizer_layout);
  const bool timed = p_.replanner && !replanned_ && !replan_due_ && timed_steps_ >= 0 && steps_ > 0;
  if (timed && !recorder_) recorder_ = std::make_unique<plan::OpTimeRecorder>(p_.graph->num_nodes());
  auto t0 = std::chrono::steady_clock::now();
  try {
    executor_->run(std::uint64_t(steps_), timed ? recorder_.get() : nullptr);
  } catch (...) {
    // A step that fails counts for nothing: the optimizer's count goes back
    // (the step's own is advanced only after a run that finished), so the
    // next step's bias correction and random streams are the ones it would
    // have had without the failure.
    if (p_.optimizer) p_.optimizer->undo_run(before);
    throw;
  }
  if (timed) {
    step_ms_[std::size_t(timed_steps_)] =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    recorder_->finish_step();
    if (++timed_steps_ == kTimedSteps) maybe_replan();
  }
  ++steps_;
  for (std::size_t i = 0; i < outputs_.size(); ++i)
    p_.backend->copy_to_host(outputs_[i].raw(), executor_->address(p_.outputs[i]), outputs_[i].nbytes());
  return p_.loss == kNoValue ? std::nanf("") : float(last_loss_f64());
}

double Step::last_loss_f64() const {
  const Value& lv = p_.graph->value(p_.loss);
  if (lv.meta.dtype == DType::f64) {
    double d = 0;
    p_.backend->copy_to_host(&d, executor_->address(p_.loss), sizeof d);
    return d;
  }
  float f = 0;
  p_.backend->copy_to_host(&f, executor_->address(p_.loss), sizeof f);
  return f;
}

double Step::grad_norm() const {
  if (p_.grad_norm == kNoValue) fail("step.grad_norm: the step was not compiled with CompileOptions::clip_grad_norm");
  float f = 0;
  p_.backend->copy_to_host(&f, executor_->address(p_.grad_norm), sizeof f);
  return f;
}
std::int64_t Step::skipped_steps() const {
  if (!p_.skip_stats.defined())
    fail("step.skipped_steps: the step was not compiled with CompileOptions::skip_non_finite");
  return p_.skip_stats.data<std::int64_t>()[0];
}
bool Step::last_step_skipped() const {
  if (!p_.skip_stats.defined())
    fail("step.last_step_skipped: the step was not compiled with CompileOptions::skip_non_finite");
  return p_.skip_stats.data<std::int64_t>()[1] != 0;
}

Tensor Step::grad(const Tensor& param) const {
  auto it = p_.grad_of.find(param.raw());
  if (it == p_.grad_of.end())
    fail("step.grad: no gradient kept for this tensor; compile with compile_gradients(...) or "
         "CompileOptions::keep_grads, and make sure the loss depends on it");
  const Value& v = p_.graph->value(it->second);
  Tensor out(v.meta.shape, v.meta.dtype);
  p_.backend->copy_to_host(out.raw(), executor_->address(it->second), out.nbytes());
  return out;
}

void Step::set_steps_run(std::int64_t n) {
  if (n < 0) fail("step.set_steps_run: the step counter cannot be negative (got ", n, ")");
  steps_ = n;
  executor_->storage_changed();
}

void Step::maybe_replan() {
  std::array<double, kTimedSteps> ms = step_ms_;
  std::sort(ms.begin(), ms.end());
  measured_ms_ = ms[kTimedSteps / 2];
  timed_steps_ = -1;  // timing is over either way
  replan_due_ = plan::prediction_is_off(p_.plan.predicted_step_ms, measured_ms_);
}

void Step::replan_if_due() {
  if (!replan_due_) return;
  replan_due_ = false;
  std::pair<std::shared_ptr<Graph>, Plan> next;
  try {
    next = p_.replanner(*recorder_);
  } catch (const BudgetError&) {
    // The measured prices lead the solver to a plan that does not fit
    // (its least-memory search depends on the prices): keep this one.
    replanned_ = true;
    return;
  }
  // The arena (and the host pool and NVMe file) is reserved once: a re-plan
  // runs in it, and one that needs more than was reserved is not taken;
  // nor one the replanner declined (no graph: its collectives differ from
  // those the ranks agreed on).
  if (!next.first || !executor_->fits(next.second)) {
    replanned_ = true;
    return;
  }
  if (replan_check_) {
    replan_declined_ = replan_check_(*next.first, next.second);
    if (!replan_declined_.empty()) {
      replanned_ = true;
      return;
    }
  }
  // What the plan says of the step's distribution was decided at compile
  // and holds for every re-plan of it.
  next.second.zero_stage = p_.plan.zero_stage;
  next.second.zero_reason = p_.plan.zero_reason;
  next.second.collectives = p_.plan.collectives;
  // Before the arena is refilled, and with the plan it ran.
  earlier_device_bytes_ = std::max(earlier_device_bytes_, executor_->high_water() + p_.plan.persistent_bytes);
  earlier_arena_bytes_ = std::max(earlier_arena_bytes_, executor_->high_water());
  auto moved = std::make_unique<Executor>(next.first, next.second, *executor_);
  executor_ = std::move(moved);
  p_.graph = std::move(next.first);
  p_.plan = std::move(next.second);
  replanned_ = true;
  ++replans_;
}

std::string Step::summary() const { return plan::summary(*p_.graph, p_.plan); }
plan::VerifyReport Step::verify() const { return plan::verify(*p_.graph, p_.plan, p_.roots); }
std::size_t Step::measured_device_bytes() const {
  return std::max(earlier_device_bytes_, executor_->high_water() + p_.plan.persistent_bytes);
}
std::size_t Step::measured_arena_bytes() const { return std::max(earlier_arena_bytes_, executor_->high_water()); }
void Step::parameters_changed() { executor_->storage_changed(); }
void Step::sync_to_host() { executor_->sync_to_host(); }
std::uint64_t Step::fetches_performed() const { return executor_->fetches(); }
std::size_t Step::undo_journal_bytes() const { return executor_->journal_bytes(); }
Step::CommunicationTime Step::communication_time() const {
  const auto [busy, waited] = executor_->communication_seconds();
  return {busy, waited};
}

}  // namespace frugal
