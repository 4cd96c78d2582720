#pragma once
// The compiled step the user holds: run(batch) executes one whole training
// step (forward, backward, optimizer update) as planned.
#include <cmath>
#include <cstring>
#include <map>

#include <algorithm>
#include <array>
#include <chrono>
#include <functional>

#include "../plan/cost_model.hpp"
#include "../plan/report.hpp"
#include "../plan/verify.hpp"
#include "executor.hpp"
#include "optimizer.hpp"
#include "threads.hpp"

namespace frugal {

class Step {
 public:
  struct Parts {
    std::shared_ptr<Graph> graph;
    Plan plan;
    std::shared_ptr<Backend> backend;
    Optimizer* optimizer = nullptr;
    std::vector<ValueId> inputs;
    ValueId loss = kNoValue;
    std::vector<ValueId> outputs;
    std::map<const void*, ValueId> grad_of;  // parameter storage -> kept gradient
    int threads = 0;
    std::vector<ValueId> roots;  // values that must survive to the end of the step
    std::string nvme_dir;        // where the NVMe tier's file goes, if the plan spills
    // Re-solves the budget with measured op times (set when the plan made
    // budget decisions and re-planning is on).
    std::function<std::pair<std::shared_ptr<Graph>, Plan>(const plan::OpTimeRecorder&)> replanner;
  };

  explicit Step(Parts p) : p_(std::move(p)) {
    executor_ = std::make_unique<Executor>(p_.graph, p_.plan, *p_.backend, p_.nvme_dir);
    for (ValueId o : p_.outputs) outputs_.emplace_back(p_.graph->value(o).meta.shape, p_.graph->value(o).meta.dtype);
  }

  // Runs one step on these inputs (in the order compile() declared them) and
  // returns the loss; an inference step returns NaN and fills outputs().
  template <class... Ts>
  float run(const Ts&... inputs) {
    const std::array<const Tensor*, sizeof...(Ts)> list{&inputs...};  // a plain array could not be empty
    return run_inputs(list);
  }

  float run_inputs(std::span<const Tensor* const> inputs) {
    replan_if_due();
    stage(inputs);
    return execute();
  }

  // What an audited step actually touched. The arena and the canary beyond
  // it are filled with a byte pattern, the step runs, and the highest byte
  // that changed is found; done twice with two patterns, so a value that
  // happens to end in one pattern's byte cannot hide. Runs the step twice.
  struct Audit {
    std::size_t high_water = 0;     // one past the highest byte written
    std::size_t predicted = 0;      // the plan's peak_bytes
    bool canary_intact = false;     // nothing written beyond the predicted peak
  };
  template <class... Ts>
  Audit audit(const Ts&... inputs) {
    const std::array<const Tensor*, sizeof...(Ts)> list{&inputs...};
    Audit a{0, p_.plan.peak_bytes, true};
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

 private:
  void stage(std::span<const Tensor* const> inputs) {
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

  // Steps 1..kTimedSteps of a budget plan are timed op by op (step 0 warms
  // up); then, if the measured step is off the prediction by more than 20%,
  // the budget is solved again with the measured times, once.
  static constexpr int kTimedSteps = 3;

  float execute() {
    ScopedThreads threads(p_.threads);  // this thread's OpenMP (and so BLAS) count, for this run only
    if (p_.optimizer) p_.optimizer->begin_step();
    const bool timed = p_.replanner && !replanned_ && !replan_due_ && timed_steps_ >= 0 && steps_ > 0;
    if (timed && !recorder_) recorder_ = std::make_unique<plan::OpTimeRecorder>(p_.graph->num_nodes());
    auto t0 = std::chrono::steady_clock::now();
    executor_->run(std::uint64_t(steps_), timed ? recorder_.get() : nullptr);
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

 public:
  // The last loss in full precision (f64 steps would lose digits as float).
  double last_loss_f64() const {
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

  // The outputs of an inference step (or extra outputs), after run().
  const Tensor& output(std::size_t i = 0) const { return outputs_.at(i); }

  // The gradient of the loss for `param` from the last run; the step must
  // have been compiled to keep it (compile_gradients, or keep_grads).
  Tensor grad(const Tensor& param) const {
    auto it = p_.grad_of.find(param.raw());
    if (it == p_.grad_of.end())
      fail("step.grad: no gradient kept for this tensor; compile with compile_gradients(...) or "
           "CompileOptions::keep_grads, and make sure the loss depends on it");
    const Value& v = p_.graph->value(it->second);
    Tensor out(v.meta.shape, v.meta.dtype);
    p_.backend->copy_to_host(out.raw(), executor_->address(it->second), out.nbytes());
    return out;
  }

  // How many times the step re-planned with measured op times (0 or 1), and
  // the measured median step time that decided it (0 before it is known).
  int replans() const { return replans_; }
  double measured_step_ms() const { return measured_ms_; }

  const Plan& plan() const { return p_.plan; }
  // The plan explained: peak, lower bound, categories, what is live at the peak.
  std::string summary() const { return plan::summary(*p_.graph, p_.plan); }
  // The independent plan verifier's verdict on this step's plan.
  plan::VerifyReport verify() const { return plan::verify(*p_.graph, p_.plan, p_.roots); }
  const Graph& graph() const { return *p_.graph; }
  std::size_t arena_bytes() const { return p_.plan.arena_bytes; }
  // Device bytes in use, measured: the highest arena byte the steps so far
  // have written (the arena is filled with a marker byte when allocated and
  // scanned from the top), plus the parameters and optimizer state the plan
  // keeps on the device. Never more than plan().total_bytes(); equal to it
  // once a step has run, since the prediction is exact.
  std::size_t measured_device_bytes() const {
    return std::max(earlier_high_water_, executor_->high_water()) + p_.plan.persistent_bytes;
  }
  std::int64_t steps_run() const { return steps_; }
  // Sets the step counter, as a resumed run does: random ops (dropout) key
  // their streams by it, so step n draws the same numbers either way.
  void set_steps_run(std::int64_t n) {
    if (n < 0) fail("step.set_steps_run: the step counter cannot be negative (got ", n, ")");
    steps_ = n;
    executor_->storage_changed();
  }

  // Under a budget that keeps parameters or optimizer state on the host, the
  // end of each step already fetches what the next step reads first. Call
  // this after writing those tensors between steps (loading a checkpoint,
  // editing weights), so the next step fetches them again (and so does any
  // other step that fetched them early).
  void parameters_changed() { executor_->storage_changed(); }
  // Fetches into the arena this step's executor has performed: an early
  // fetch still valid at the next step saves one.
  std::uint64_t fetches_performed() const { return executor_->fetches(); }

 private:
  void maybe_replan() {
    std::array<double, kTimedSteps> ms = step_ms_;
    std::sort(ms.begin(), ms.end());
    measured_ms_ = ms[kTimedSteps / 2];
    timed_steps_ = -1;  // timing is over either way
    replan_due_ = plan::prediction_is_off(p_.plan.predicted_step_ms, measured_ms_);
  }

  // Before the next step's inputs are staged (so the last step's loss,
  // outputs and gradients stay readable until then).
  void replan_if_due() {
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
    // runs in it, and one that needs more than was reserved is not taken.
    if (!executor_->fits(next.second)) {
      replanned_ = true;
      return;
    }
    earlier_high_water_ = std::max(earlier_high_water_, executor_->high_water());  // before the arena is refilled
    auto moved = std::make_unique<Executor>(next.first, next.second, *executor_);
    executor_ = std::move(moved);
    p_.graph = std::move(next.first);
    p_.plan = std::move(next.second);
    replanned_ = true;
    ++replans_;
  }

  Parts p_;
  std::unique_ptr<Executor> executor_;
  std::unique_ptr<plan::OpTimeRecorder> recorder_;
  std::array<double, kTimedSteps> step_ms_{};
  int timed_steps_ = 0;
  bool replanned_ = false, replan_due_ = false;  // re-planning was tried; it is due before the next step
  int replans_ = 0;
  double measured_ms_ = 0;
  std::size_t earlier_high_water_ = 0;  // of the executors a re-plan replaced
  std::vector<Tensor> outputs_;
  std::int64_t steps_ = 0;
};

}  // namespace frugal
