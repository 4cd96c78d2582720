#pragma once
// The compiled step the user holds: run(batch) executes one whole training
// step (forward, backward, optimizer update) as planned. Its members are
// compiled once per program (runtime/units/step.hpp); a file that holds a
// Step sees only this.
#include <array>
#include <functional>
#include <map>
#include <memory>
#include <span>

#include "../graph/modes.hpp"
#include "../plan/plan.hpp"
#include "backend.hpp"
#include "optimizer.hpp"

namespace frugal {

class Executor;
namespace plan {
class OpTimeRecorder;
struct VerifyReport;
}  // namespace plan

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
    // budget decisions and re-planning is on); a null graph: keep the plan.
    std::function<std::pair<std::shared_ptr<Graph>, Plan>(const plan::OpTimeRecorder&)> replanner;
    ValueId grad_norm = kNoValue;  // CompileOptions::clip_grad_norm's total norm (a root)
    Tensor skip_stats;             // CompileOptions::skip_non_finite's i64[2] {skipped, last skipped}
    std::function<void()> gather_parameters;  // ZeRO stage 3: the shards into the module's tensors
    std::vector<ModeRead> modes;  // train/eval flags the step was captured under, checked before each run
    // The optimizer's state and stage-3 shards this step trains (Optimizer::trains).
    std::shared_ptr<const Optimizer::Layout> optimizer_layout;
  };

  explicit Step(Parts p);
  Step(Step&&) noexcept;
  Step& operator=(Step&&) noexcept;
  ~Step();

  // Runs one step on these inputs (in the order compile() declared them) and
  // returns the loss; an inference step returns NaN and fills outputs().
  template <class... Ts>
  float run(const Ts&... inputs) {
    const std::array<const Tensor*, sizeof...(Ts)> list{&inputs...};  // a plain array could not be empty
    return run_inputs(list);
  }
  float run_inputs(std::span<const Tensor* const> inputs);

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
    return audit_inputs(list);
  }
  Audit audit_inputs(std::span<const Tensor* const> inputs);

  // The last loss in full precision (f64 steps would lose digits as float).
  double last_loss_f64() const;

  // The outputs of an inference step (or extra outputs), after run().
  const Tensor& output(std::size_t i = 0) const { return outputs_.at(i); }

  // The total gradient norm of the last run, before clipping (compiled with
  // CompileOptions::clip_grad_norm); inf or NaN if a gradient was.
  double grad_norm() const;
  // Steps whose update CompileOptions::skip_non_finite skipped, and whether
  // the last one was.
  std::int64_t skipped_steps() const;
  bool last_step_skipped() const;

  // The gradient of the loss for `param` from the last run; the step must
  // have been compiled to keep it (compile_gradients, or keep_grads).
  Tensor grad(const Tensor& param) const;

  // How many times the step re-planned with measured op times (0 or 1), and
  // the measured median step time that decided it (0 before it is known).
  int replans() const { return replans_; }
  // Whether a later run may still re-plan on measured times (the plan made
  // budget decisions and CompileOptions::replan was on).
  bool may_replan() const { return bool(p_.replanner) && !replanned_; }
  double measured_step_ms() const { return measured_ms_; }
  // A condition a re-plan must also meet to be taken, besides fitting the
  // memory reserved at compile: it returns "" to take the new plan, or why
  // not (then kept in replan_declined()). A MemoryBroker sets one on its
  // steps: a re-plan keeps the persistents the step holds on the device.
  using ReplanCheck = std::function<std::string(const Graph&, const Plan&)>;
  void set_replan_check(ReplanCheck check) { replan_check_ = std::move(check); }
  const std::string& replan_declined() const { return replan_declined_; }

  const Plan& plan() const { return p_.plan; }
  // The plan explained: peak, lower bound, categories, what is live at the peak.
  std::string summary() const;
  // The independent plan verifier's verdict on this step's plan
  // (plan/verify.hpp, which frugal.hpp includes, defines the report).
  plan::VerifyReport verify() const;
  const Graph& graph() const { return *p_.graph; }
  // Whether the persistents this step keeps on the device are copies of its
  // own (a backend that cannot address host memory, a GPU), which no other
  // step shares.
  bool device_copies() const { return !p_.backend->host_addressable(); }
  std::size_t arena_bytes() const { return p_.plan.arena_bytes; }
  // Device bytes in use, measured: the highest arena byte the steps so far
  // have written (the arena is filled with a marker byte when allocated and
  // scanned from the top), plus the parameters and optimizer state the plan
  // keeps on the device. Never more than plan().total_bytes(); once a step
  // has run, equal to it but for the topmost buffer's rounding to 256 bytes
  // (a buffer is not always written to its rounded end), since the
  // prediction is exact. After a re-plan, the
  // larger of what each plan held (each plan's arena mark with that plan's
  // persistents: the old plan's arena beside the new plan's persistents never
  // existed at once).
  std::size_t measured_device_bytes() const;
  // Of that, the arena alone: the highest byte any of its plans wrote in
  // the arena reserved at compile (a re-plan runs in the same arena).
  std::size_t measured_arena_bytes() const;
  std::int64_t steps_run() const { return steps_; }
  // Sets the step counter, as a resumed run does: random ops (dropout) key
  // their streams by it, so step n draws the same numbers either way.
  void set_steps_run(std::int64_t n);

  // Under a budget that keeps parameters or optimizer state on the host, the
  // end of each step already fetches what the next step reads first. Call
  // this after writing those tensors between steps (loading a checkpoint,
  // editing weights), so the next step fetches them again (and so does any
  // other step that fetched them early).
  void parameters_changed();
  // Under a plan whose parameters or optimizer state live on NVMe between
  // steps (PlanOptions::nvme_offload, Plan::nvme_home_bytes), their tensors
  // give their pages back after each run and read as zeros. This reads
  // them back from the file, for a program that reads or edits them itself;
  // checkpoints, weight files and other steps do it on their own. The next
  // run takes what they hold then.
  void sync_to_host();
  // ZeRO stage 3 (CompileOptions::zero_stage): the step trains this rank's
  // shard of each parameter, and the module's tensors keep what they held at
  // compile. This gathers every rank's shard into them (a collective: every
  // rank calls it, between steps): before reading or saving the weights
  // (io::save_weights), evaluating with another step, or ending. At other
  // stages the tensors are always current and this does nothing.
  void gather_parameters() {
    if (p_.gather_parameters) p_.gather_parameters();
  }
  // Fetches into the arena this step's executor has performed: an early
  // fetch still valid at the next step saves one.
  std::uint64_t fetches_performed() const;
  // Host bytes kept so that a step failing part way (an NVMe I/O error after
  // some updates ran) is undone: it leaves parameters, optimizer state and
  // counters as they were. Zero unless the plan touches NVMe after an update.
  std::size_t undo_journal_bytes() const;
  // Where the gradients' collectives run beside compute (Plan::collectives):
  // the seconds the communication thread spent in them, and the seconds the
  // step waited for them, over the runs since compile (or the last re-plan).
  // Their difference is communication hidden behind the backward.
  struct CommunicationTime {
    double communicating = 0;
    double waited = 0;
  };
  CommunicationTime communication_time() const;

 private:
  void check_alive_and_modes() const;
  void stage(std::span<const Tensor* const> inputs);
  float execute();
  void maybe_replan();
  void replan_if_due();

  // Steps 1..kTimedSteps of a budget plan are timed op by op (step 0 warms
  // up); then, if the measured step is off the prediction by more than 20%,
  // the budget is solved again with the measured times, once.
  static constexpr int kTimedSteps = 3;

  Parts p_;
  // The optimizer's liveness() and kind(), taken when the step is made:
  // checked before each run, named when it expired.
  std::weak_ptr<const void> optimizer_alive_;
  std::string optimizer_kind_;
  std::unique_ptr<Executor> executor_;
  std::unique_ptr<plan::OpTimeRecorder> recorder_;
  std::array<double, kTimedSteps> step_ms_{};
  int timed_steps_ = 0;
  bool replanned_ = false, replan_due_ = false;  // re-planning was tried; it is due before the next step
  int replans_ = 0;
  ReplanCheck replan_check_;
  std::string replan_declined_;
  double measured_ms_ = 0;
  // The most device bytes an executor a re-plan replaced held: its arena's
  // high-water mark plus its own plan's device-resident persistents.
  std::size_t earlier_device_bytes_ = 0;
  std::size_t earlier_arena_bytes_ = 0;  // its arena's high-water mark
  std::vector<Tensor> outputs_;
  std::int64_t steps_ = 0;
};

}  // namespace frugal
