#pragma once
// What every sample does around its own model and data: split the device
// budget between the training and the evaluation step, print the plan,
// resume from and save checkpoints, show progress, keep the loss history,
// and end with the JSON line and the plot.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <frugal/frugal.hpp>

#include "cli.hpp"
#include "json_line.hpp"
#include "metrics.hpp"
#include "plot.hpp"
#include "progress.hpp"
#include "ranks.hpp"

namespace samples {

// The optimizer state a plan keeps on the host, where its update runs.
inline std::size_t offloaded_state(const frugal::Plan& p) {
  auto it = p.offloaded_by_kind.find("optimizer state");
  return it == p.offloaded_by_kind.end() ? 0 : it->second;
}

// A sample's training and evaluation steps (Session::compile_steps).
struct SampleSteps {
  std::size_t budget_total = 0;  // --budget in bytes; 0: none
  std::unique_ptr<frugal::MemoryBroker> broker;  // under --budget: it owns the steps
  std::optional<frugal::Step> own_train, own_eval;  // without
  frugal::Step* train = nullptr;
  frugal::Step* eval = nullptr;
  // The process's device bytes in use, measured: under the broker, weights
  // both steps keep on the device once.
  std::size_t measured_device_bytes() const {
    return broker ? broker->measured_device_bytes() : train->measured_device_bytes() + eval->measured_device_bytes();
  }
};

class Session {
 public:
  Session(std::string sample, CommonArgs& args) : sample_(std::move(sample)), a_(args) {
    out_ = a_.json ? stderr : stdout;
  }

  // Under mpirun: rank 0 prints; the others are quiet.
  void set_ranks(const Ranks& r) {
    ranks_ = r;
    if (!r.leader()) {
      quiet_ = std::fopen("/dev/null", "w");
      if (quiet_) out_ = quiet_;
    }
  }
  ~Session() {
    if (quiet_) std::fclose(quiet_);
  }
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;
  const Ranks& ranks() const { return ranks_; }
  bool leader() const { return ranks_.leader(); }

  std::FILE* out() const { return out_; }
  const CommonArgs& args() const { return a_; }
  const std::string& name() const { return sample_; }

  // The training and evaluation steps: a training step of `train_fn` over
  // `opt` and an evaluation step of `eval_fn`, each with its options.
  // Under --budget, one memory broker (frugal::MemoryBroker) plans both
  // within it: --budget is the device memory of the whole process, and the
  // weights both steps keep on the device count once; each step gets a
  // share between its least and its unconstrained bytes. A budget too small
  // for both names the bytes needed. Without --budget each is planned
  // alone, with nothing evicted. The samples compile the broker's steps
  // with CompileOptions::replan = !brokered_steps(): the broker would take
  // a re-plan on measured times that keeps the shared weights where its
  // shares count them, but under --budget the plan a sample prints is the
  // one it runs.
  // `free_train` / `free_eval`: the unconstrained plans, the base of a
  // --budget percentage.
  bool brokered_steps() const { return !a_.budget.empty(); }
  template <class TrainFn, class EvalFn>
  void compile_steps(SampleSteps& out, const frugal::PlannedStep& free_train, const frugal::PlannedStep& free_eval,
                     TrainFn& train_fn, std::vector<frugal::InputSpec> train_in, frugal::Optimizer& opt,
                     frugal::CompileOptions train_opts, EvalFn& eval_fn, std::vector<frugal::InputSpec> eval_in,
                     frugal::CompileOptions eval_opts) const {
    using frugal::Budget;
    // Kept by the broker, which plans the steps again as shares change.
    auto train_compile = [&train_fn, train_in, &opt, train_opts](const Budget& b) {
      return frugal::compile(train_fn, train_in, opt, b, train_opts);
    };
    auto train_plan = [&train_fn, train_in, &opt, train_opts](const Budget& b) {
      return frugal::plan_training(train_fn, train_in, opt, b, train_opts);
    };
    auto eval_compile = [&eval_fn, eval_in, eval_opts](const Budget& b) {
      return frugal::compile_inference(eval_fn, eval_in, b, eval_opts);
    };
    auto eval_plan = [&eval_fn, eval_in, eval_opts](const Budget& b) {
      return frugal::plan_inference(eval_fn, eval_in, b, eval_opts);
    };
    Budget whole;
    whole.host = a_.host.empty() ? 0 : frugal::parse_bytes(a_.host);
    whole.nvme_dir = a_.nvme_dir;
    if (a_.budget.empty()) {
      out.own_train.emplace(train_compile(whole));
      out.own_eval.emplace(eval_compile(whole));
      out.train = &*out.own_train;
      out.eval = &*out.own_eval;
      return;
    }
    // A percentage is of both unconstrained steps together.
    out.budget_total = whole.device =
        frugal::parse_bytes(a_.budget, free_train.plan.total_bytes() + free_eval.plan.total_bytes());
    out.broker = std::make_unique<frugal::MemoryBroker>(whole);
    bool trained = false;
    try {
      const auto t = out.broker->join("training", train_compile, train_plan);
      trained = true;
      const auto e = out.broker->join("evaluation", eval_compile, eval_plan);
      out.train = &out.broker->step(t);
      out.eval = &out.broker->step(e);
    } catch (const frugal::BudgetError& ex) {
      std::size_t need = ex.smallest_feasible_bytes;
      if (!need) throw;
      // Training alone did not fit: both need at most the two leasts.
      if (!trained) need += least_of(eval_plan, whole);
      throw frugal::BudgetError(frugal::cat("--budget ", frugal::format_bytes(out.budget_total), " (",
                                            out.budget_total, " bytes) is too small for the training and evaluation "
                                            "steps; use --budget ", need, " (", frugal::format_bytes(need),
                                            ") or more.\nThe planner said: ", ex.what()),
                                need);
    }
  }

  // The least device bytes `plan` (a step's planner) can plan its step in.
  template <class PlanFn>
  static std::size_t least_of(PlanFn& plan, frugal::Budget b) {
    b.device = 1;
    try {
      plan(b);
    } catch (const frugal::BudgetError& e) {
      return e.smallest_feasible_bytes;
    }
    return 0;
  }

  // Prints what will happen: the plan of the training step under the budget.
  void print_plan(const frugal::Step& train, const frugal::Step& eval, std::size_t budget_total,
                  std::size_t unconstrained_train) const {
    std::fprintf(out_, "%s", train.summary().c_str());
    if (budget_total)
      std::fprintf(out_, "device budget %s: training step %s (unconstrained %s), evaluation step %s\n",
                   frugal::format_bytes(budget_total).c_str(), frugal::format_bytes(train.plan().total_bytes()).c_str(),
                   frugal::format_bytes(unconstrained_train).c_str(),
                   frugal::format_bytes(eval.plan().total_bytes()).c_str());
    std::fflush(out_);
  }

  // Loads --resume (after the steps are compiled: the optimizer's state
  // exists from then on) and returns the step to continue from. `config`
  // describes the model and data settings; a checkpoint of another
  // configuration is refused.
  std::int64_t resume(frugal::nn::Module& model, frugal::Optimizer& opt, std::vector<frugal::Step*> steps,
                      const std::string& config) {
    config_ = config;
    if (a_.resume.empty()) return 0;
    // Under mpirun the checkpoint holds whole tensors (save below), and each
    // rank takes its shards, at whatever rank count and ZeRO stage it saved.
    frugal::io::TrainingState st = ranks_.comm
                                       ? frugal::io::load_gathered_checkpoint(a_.resume, model, opt, *ranks_.comm)
                                       : frugal::io::load_checkpoint(a_.resume, model, opt);
    auto it = st.metadata.find("sample");
    if (it == st.metadata.end() || it->second != sample_)
      frugal::fail<frugal::DataError>(a_.resume, ": a checkpoint of '", it == st.metadata.end() ? "?" : it->second,
                                      "', not of ", sample_);
    it = st.metadata.find("config");
    if (it == st.metadata.end() || it->second != config)
      frugal::fail<frugal::DataError>(a_.resume, ": saved with the configuration\n  ",
                                      it == st.metadata.end() ? "(none)" : it->second, "\nbut this run has\n  ",
                                      config, "\nresume with the same options");
    for (auto& [name, t] : st.extra) {
      if (name == "train_loss") history_.train.assign(t.data<float>(), t.data<float>() + t.numel());
      if (name == "val_step")
        for (std::int64_t i = 0; i < t.numel(); ++i) val_steps_.push_back(t.data<std::int64_t>()[i]);
      if (name == "val_loss")
        for (std::int64_t i = 0; i < t.numel(); ++i) val_values_.push_back(t.data<double>()[i]);
    }
    if (std::int64_t(history_.train.size()) != st.step || val_steps_.size() != val_values_.size())
      frugal::fail<frugal::DataError>(a_.resume, ": its loss history (", history_.train.size(),
                                      " steps) does not match its step counter ", st.step);
    for (frugal::Step* s : steps) {
      s->set_steps_run(st.step);
      s->parameters_changed();
    }
    resumed_from_ = st.step;
    std::fprintf(out_, "resumed from %s at step %lld\n", a_.resume.c_str(), static_cast<long long>(st.step));
    return st.step;
  }

  void start(std::int64_t first, std::int64_t total, const std::string& unit, double per_step,
             std::size_t budget_bytes) {
    total_ = total;
    progress_.emplace(out_, first, total, unit, per_step, budget_bytes, a_.log_every);
  }

  // After each training step.
  void step_done(std::int64_t step, float loss, double ms, std::size_t device_bytes, frugal::nn::Module& model,
                 frugal::Optimizer& opt) {
    loss = float(ranks_.mean(loss));  // the global batch's: the same history on every rank
    if (!std::isfinite(loss))
      frugal::fail("the loss is ", loss, " at step ", step + 1,
                   ": training diverged (lower the learning rate, or check the data)");
    history_.train.push_back(loss);
    step_ms_.push_back(ms);
    last_loss_ = loss;
    peak_seen_ = std::max(peak_seen_, device_bytes);
    progress_->update(step, loss, device_bytes);
    if (a_.save_every > 0 && (step + 1) % a_.save_every == 0 && step + 1 < total_) save(model, opt, step + 1);
  }

  // A scheduled evaluation (part of the history a checkpoint carries).
  void validation(std::int64_t step, double value, const std::string& line) {
    val_steps_.push_back(step);
    val_values_.push_back(value);
    progress_->note(line);
  }
  void note(const std::string& line) {
    if (progress_) progress_->note(line);
    else std::fprintf(out_, "%s\n", line.c_str());
  }

  void save(frugal::nn::Module& model, frugal::Optimizer& opt, std::int64_t step) {
    if (a_.checkpoint.empty()) return;
    frugal::Tensor tl({std::int64_t(history_.train.size())}, frugal::DType::f32);
    std::copy(history_.train.begin(), history_.train.end(), tl.data<float>());
    frugal::Tensor vs({std::int64_t(val_steps_.size())}, frugal::DType::i64);
    frugal::Tensor vl({std::int64_t(val_values_.size())}, frugal::DType::f64);
    std::copy(val_steps_.begin(), val_steps_.end(), vs.data<std::int64_t>());
    std::copy(val_values_.begin(), val_values_.end(), vl.data<double>());
    const frugal::io::Metadata md{{"sample", sample_}, {"config", config_}};
    const frugal::io::NamedTensors extra{{"train_loss", tl}, {"val_step", vs}, {"val_loss", vl}};
    if (ranks_.comm) frugal::io::save_gathered_checkpoint(a_.checkpoint, model, opt, step, *ranks_.comm, md, extra);
    else frugal::io::save_checkpoint(a_.checkpoint, model, opt, step, md, extra);
  }

  double step_ms_median() const {
    if (step_ms_.empty()) return 0;
    std::vector<double> v = step_ms_;
    std::nth_element(v.begin(), v.begin() + std::ptrdiff_t(v.size() / 2), v.end());
    return v[v.size() / 2];
  }
  float last_loss() const { return last_loss_; }
  std::int64_t resumed_from() const { return resumed_from_; }

  // The fields every sample's JSON line has.
  JsonLine summary_json(std::int64_t steps, std::size_t peak_device, std::size_t budget_total,
                        const frugal::Step& train, std::size_t unconstrained_total) const {
    JsonLine j;
    j.add("sample", sample_)
        .add("steps", steps)
        .add("final_loss", double(last_loss_))
        .add("step_ms_median", step_ms_median())
        .add("peak_device_bytes", peak_device)
        .add("budget_bytes", budget_total)
        .add("unconstrained_bytes", unconstrained_total)
        .add("train_step_bytes", train.plan().total_bytes())
        .add("eval_step_bytes", peak_device - train.measured_device_bytes())
        .add("recomputed", std::int64_t(train.plan().count(frugal::plan::Choice::recompute)))
        .add("swapped_to_host", std::int64_t(train.plan().count(frugal::plan::Choice::host)))
        .add("resumed_from", resumed_from_)
        .add("seed", a_.seed)
        .add("threads", a_.threads)
        .add("ranks", ranks_.size)
        .add("zero_stage", train.plan().zero_stage)
        .add("collectives", train.plan().collectives)
        .add("optimizer_state_on_host_bytes", std::int64_t(offloaded_state(train.plan())))
        .add("on_nvme_bytes", std::int64_t(train.plan().nvme_home_bytes))
        .add("host_rss_bytes", std::int64_t(frugal::current_rss_bytes()))
        .add("peak_rss_bytes", std::int64_t(frugal::peak_rss_bytes()));
    return j;
  }

  // --plot: loss curves and device memory over one step.
  void write_plot(const std::string& title, const frugal::Plan& budgeted, const frugal::Plan& unconstrained,
                  std::size_t budget, std::size_t measured, const std::string& val_label,
                  std::optional<std::pair<std::int64_t, double>> final_val = std::nullopt) const {
    if (a_.plot.empty() || !leader()) return;
    LossPlot lp{history_.train, {}, val_label};
    for (std::size_t i = 0; i < val_steps_.size(); ++i) lp.val.push_back({val_steps_[i], val_values_[i]});
    if (final_val && (lp.val.empty() || lp.val.back().first != final_val->first)) lp.val.push_back(*final_val);
    MemoryPlot mp{device_bytes_per_position(budgeted), device_bytes_per_position(unconstrained), double(budget),
                  double(measured)};
    write_text_file(a_.plot, plot_svg(title, lp, mp));
  }

 private:
  std::string sample_;
  CommonArgs& a_;
  std::FILE* out_;
  std::string config_;
  LossPlot history_;
  std::vector<std::int64_t> val_steps_;
  std::vector<double> val_values_;
  std::vector<double> step_ms_;
  std::optional<Progress> progress_;
  std::int64_t total_ = 0, resumed_from_ = 0;
  float last_loss_ = std::nanf("");
  std::size_t peak_seen_ = 0;
  Ranks ranks_;
  std::FILE* quiet_ = nullptr;
};

}  // namespace samples
