#pragma once
// AdamW (decoupled weight decay), as torch.optim.AdamW. Under dynamic loss
// scaling (optim/loss_scaler.hpp) its updates are guarded: a skipped step
// changes no parameter, no moment and not the count of steps taken that the
// bias corrections use.
//
// A bf16/f16 parameter is stepped in f32 and rounded back, its moments kept
// in its own dtype, as torch.optim.AdamW does; with master_weights it gets
// an f32 master copy and f32 moments instead (ops/adamw_master.hpp).
#include <algorithm>
#include <cmath>
#include <optional>

#include "../graph/capture.hpp"
#include "../ops/adamw_master.hpp"
#include "../ops/optimizer_updates.hpp"
#include "../runtime/loss_scaling.hpp"
#include "../runtime/optimizer.hpp"
#include "param_groups.hpp"
#include "hyperparameters.hpp"

namespace frugal::optim {

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
  // DeepSpeed-style mixed precision: each bf16/f16 parameter gets an f32
  // master copy (state "master", made from the parameter's values when a
  // step is compiled and has none that rounds to them) and f32 moments; the
  // update steps the master in f32 and writes the parameter as the master
  // rounded to nearest even. 12 bytes of optimizer state per such parameter
  // instead of 4. f32 and f64 parameters are unaffected. A program that
  // writes such parameters itself after compiling (io::load_weights) calls
  // master_from_params().
  bool master_weights = false;
};

// One parameter group's hyperparameters; unset ones are the optimizer's defaults.
struct AdamWGroupOptions {
  std::optional<double> lr, beta1, beta2, eps, weight_decay;
  std::optional<bool> master_weights;
};
using AdamWParamGroup = ParamGroup<AdamWGroupOptions>;

class AdamW final : public Optimizer, public SkippableOptimizer, public ScheduledOptimizer {
 public:
  ~AdamW() override;
  AdamW(std::vector<Tensor> params, AdamWOptions o)
      : params_(std::move(params)), h_(std::make_shared<ops::AdamWHyper>()) {
    hyper::require_at_least("optim::AdamW", "lr", o.lr, 0);
    hyper::require_beta("optim::AdamW", "beta1", o.beta1);
    hyper::require_beta("optim::AdamW", "beta2", o.beta2);
    hyper::require_at_least("optim::AdamW", "eps", o.eps, 0);
    hyper::require_at_least("optim::AdamW", "weight_decay", o.weight_decay, 0);
    *h_ = {o.lr, o.beta1, o.beta2, o.eps, o.weight_decay, 0};
    m_.resize(params_.size());
    v_.resize(params_.size());
    master_.resize(params_.size());
    wants_master_.assign(params_.size(), o.master_weights);
  }
  // Parameter groups (optim/param_groups.hpp), each checked as the
  // constructor above checks its options.
  AdamW(const std::vector<AdamWParamGroup>& groups, AdamWOptions defaults)
      : AdamW(flatten_groups(groups, "optim::AdamW"), defaults) {
    for (const auto& g : groups) {
      const AdamWGroupOptions& o = g.options;
      AdamWOptions merged{o.lr.value_or(defaults.lr), o.beta1.value_or(defaults.beta1),
                          o.beta2.value_or(defaults.beta2), o.eps.value_or(defaults.eps),
                          o.weight_decay.value_or(defaults.weight_decay),
                          o.master_weights.value_or(defaults.master_weights)};
      AdamW check(std::vector<Tensor>{}, merged);
      auto h = groups_.empty() ? h_ : std::make_shared<ops::AdamWHyper>();
      *h = *check.h_;
      groups_.push_back(h);
      const std::size_t first = group_of_.size();
      group_of_.insert(group_of_.end(), g.params.size(), groups_.size() - 1);
      std::fill(wants_master_.begin() + std::ptrdiff_t(first), wants_master_.begin() + std::ptrdiff_t(group_of_.size()),
                merged.master_weights);
    }
  }
  const std::vector<Tensor>& params() const override { return params_; }
  void append_update(Var p, Var g, std::size_t i) override {
    auto [m, v] = moments(p, i);
    if (has_master(i)) apply_update(std::make_shared<ops::AdamWMasterUpdate>(hyper_of(i)), {p, g, master_var(p, i), m, v});
    else apply_update(std::make_shared<ops::AdamWUpdate>(hyper_of(i)), {p, g, m, v});
  }
  void append_guarded_update(Var p, Var g, std::size_t i, const ops::UpdateGuard& guard) override {
    auto [m, v] = moments(p, i);
    if (has_master(i))
      apply_update(std::make_shared<ops::AdamWMasterUpdate>(hyper_of(i), true),
                   {p, g, master_var(p, i), m, v, guard.found_inf, guard.scale, taken_var()});
    else
      apply_update(std::make_shared<ops::AdamWUpdate>(hyper_of(i), true),
                   {p, g, m, v, guard.found_inf, guard.scale, taken_var()});
  }
  void append_guarded_step_end(const ops::UpdateGuard& guard) override {
    frugal::apply(std::make_shared<ops::AdvanceStepCount>(), {taken_var(), guard.found_inf});
  }
  void begin_step() override {
    ++h_->step;
    for (auto& h : groups_) h->step = h_->step;
  }

  void set_lr(double lr) {
    hyper::require_at_least("optim::AdamW::set_lr", "lr", lr, 0);
    h_->lr = lr;
    for (auto& h : groups_) h->lr = lr;  // every group, as PyTorch's schedulers set each
  }
  double lr() const { return h_->lr; }
  // Per parameter group, in the order given (an optimizer made without
  // groups has one, group 0).
  void set_lr(std::size_t group, double lr) {
    if (!(lr >= 0) || !std::isfinite(lr)) fail("optim::AdamW: learning rate ", lr, " of group ", group, " is not finite and >= 0");
    hyper(group).lr = lr;
  }
  double lr(std::size_t group) const { return hyper(group).lr; }
  std::size_t num_groups() const override { return std::max<std::size_t>(1, groups_.size()); }
  double group_lr(std::size_t group) const override { return lr(group); }
  void set_group_lr(std::size_t group, double lr) override { set_lr(group, lr); }
  double group_momentum(std::size_t group) const override { return hyper(group).beta1; }
  void set_group_momentum(std::size_t group, double beta1) override {
    if (!(beta1 >= 0 && beta1 < 1)) fail("optim::AdamW: beta1 must lie in [0, 1), got ", beta1);
    hyper(group).beta1 = beta1;
  }
  // A group's weight decay, e.g. to check what a group was given.
  double weight_decay(std::size_t group = 0) const { return hyper(group).weight_decay; }

  // Steps run (the host's count, advanced before each step).
  std::int64_t steps() const override { return h_->step; }
  void set_steps(std::int64_t n) override {
    if (n < 0) fail("optim::AdamW: the step count cannot be negative (got ", n, ")");
    h_->step = n;
    for (auto& h : groups_) h->step = n;
  }
  std::string kind() const override { return "adamw"; }
  // Per parameter "exp_avg" and "exp_avg_sq", and "master" where it has
  // master weights; "steps_taken" under loss scaling. Those of the step
  // that trains (Optimizer::trains), not of a layout planned since.
  std::vector<StateTensor> state() const override {
    std::vector<StateTensor> out;
    for (std::size_t i = 0; i < params_.size(); ++i)
      if (const Tensor m = exp_avg(i); m.defined()) {
        out.push_back({i, "exp_avg", m});
        out.push_back({i, "exp_avg_sq", exp_avg_sq(i)});
        if (const Tensor w = master(i); w.defined()) out.push_back({i, "master", w});
      }
    for (const StateTensor& s : out)  // from NVMe, where a step keeps them (nn::Module::named_parameters)
      NvmeHomes::registry().bring_back(s.tensor.raw());
    if (taken_.defined()) out.push_back({kNoParam, "steps_taken", taken_});
    return out;
  }
  // Steps whose update was applied: steps() unless loss scaling skipped some.
  std::int64_t steps_taken() const { return taken_.defined() ? taken_.data<std::int64_t>()[0] : h_->step; }
  // The moments of params()[i] (its ZeRO shard's elements under ZeRO) that
  // the step that trains uses (Optimizer::trains: the step made or run
  // last; before any, the step planned last).
  Tensor exp_avg(std::size_t i) const { return trained_state("exp_avg", i, m_.at(i)); }
  Tensor exp_avg_sq(std::size_t i) const { return trained_state("exp_avg_sq", i, v_.at(i)); }
  // The f32 master copy of params()[i] that that step uses, as exp_avg(i)
  // is; undefined where it has none (master_weights off, an f32/f64
  // parameter, or no step compiled yet).
  Tensor master(std::size_t i) const { return trained_state("master", i, master_.at(i)); }
  // Copies the parameters' values into their master copies, for a program
  // that wrote bf16/f16 parameters itself after compiling (io::load_weights,
  // its own initialisation): otherwise the next step would start from the
  // master's older values and overwrite them. Not after io::load_checkpoint,
  // which restores the masters themselves (and more precisely). Under ZeRO
  // stage 3 the steps train the rank's parameter shards, not the module's
  // tensors: there, write the parameters before compiling instead.
  void master_from_params() {
    for (std::size_t i = 0; i < params_.size(); ++i) {
      Tensor w = master(i);
      if (!w.defined()) continue;
      if (w.numel() != params_[i].numel())
        fail("optim::AdamW::master_from_params: parameter ", i, "'s master copy holds a ZeRO shard (", w.numel(), " of ",
             params_[i].numel(), " elements); compile the step after writing the parameters instead, which makes the "
             "master copies from them");
      NvmeHomes::registry().bring_back(w.raw());  // written here, so the step's next run takes these bytes
      NvmeHomes::registry().bring_back(params_[i].raw());
      widen_into(w, params_[i]);
    }
  }

 private:
  // Master weights for params()[i]: asked for, and a 16-bit parameter.
  bool has_master(std::size_t i) const {
    const DType dt = params_[i].dtype();
    return wants_master_[i] && (dt == DType::bf16 || dt == DType::f16);
  }
  // The master of params()[i]'s update, one per layout as the moments
  // (state_tensor): a step planned at another ZeRO layout (a stage search's
  // trial, dist::PlanOnly) must not cost the trained layout its f32 bits,
  // which the bf16/f16 parameter no longer holds. A kept master still
  // counts only while it rounds to the elements the update trains: if not,
  // they were written since (trained at another layout, loaded,
  // overwritten) and the master is made from them again, exactly (every
  // bf16/f16 value is an f32 value), as a new layout's zeros are.
  Var master_var(Var p, std::size_t i) {
    Tensor& w = master_[i];
    w = state_tensor("master", w, i, DType::f32);
    if (!params_[i].is_meta()) {  // a meta parameter's master is planned, never filled
      const Tensor trained = trained_elements(i);
      NvmeHomes::registry().bring_back(w.raw());  // read and maybe written here, as master_from_params does
      if (!rounds_to(w, trained)) widen_into(w, trained);
    }
    return persistent_var(w, ValueKind::state, p.graph->value(p.id).name + ".master");
  }
  // Whether every element of `master` rounds to nearest even to `param`'s bits.
  static bool rounds_to(const Tensor& master, const Tensor& param) {
    const float* w = master.data<float>();
    const auto* bits = static_cast<const std::uint16_t*>(param.raw());
    for (std::int64_t k = 0; k < param.numel(); ++k)
      if ((param.dtype() == DType::bf16 ? BFloat16(w[k]).bits : Half(w[k]).bits) != bits[k]) return false;
    return true;
  }
  static void widen_into(Tensor& to, const Tensor& from) {
    float* out = to.data<float>();
    if (from.dtype() == DType::bf16)
      for (std::int64_t k = 0; k < from.numel(); ++k) out[k] = float(from.data<BFloat16>()[k]);
    else if (from.dtype() == DType::f16)
      for (std::int64_t k = 0; k < from.numel(); ++k) out[k] = float(from.data<Half>()[k]);
    else
      fail("internal error: optim::AdamW: a master copy of a ", dtype_name(from.dtype()), " parameter");
  }
  std::pair<Var, Var> moments(Var p, std::size_t i) {
    const std::optional<DType> dt = has_master(i) ? std::optional(DType::f32) : std::nullopt;
    m_[i] = state_tensor("exp_avg", m_[i], i, dt);  // the parameter's shape, or its ZeRO shard's
    v_[i] = state_tensor("exp_avg_sq", v_[i], i, dt);
    const std::string name = p.graph->value(p.id).name;  // a copy: the graph grows below
    return {persistent_var(m_[i], ValueKind::state, name + ".exp_avg"),
            persistent_var(v_[i], ValueKind::state, name + ".exp_avg_sq")};
  }
  // The device-side count of steps taken, for guarded updates.
  Var taken_var() {
    if (!taken_.defined()) taken_ = Tensor(Shape{}, DType::i64);
    return persistent_var(taken_, ValueKind::state, "adamw.steps_taken");
  }

  // The hyperparameters params()[i]'s update reads: its group's.
  std::shared_ptr<ops::AdamWHyper> hyper_of(std::size_t i) const { return groups_.empty() ? h_ : groups_[group_of_.at(i)]; }
  // A group's hyperparameters (the pointees stay writable: the update ops share them).
  ops::AdamWHyper& hyper(std::size_t group) const {
    if (group >= num_groups()) fail("optim::AdamW: parameter group ", group, " does not exist (", num_groups(), " groups)");
    return group == 0 ? *h_ : *groups_[group];
  }

  std::vector<Tensor> params_;
  std::shared_ptr<ops::AdamWHyper> h_;
  // Parameter groups (empty without): groups_[0] is h_; group_of_[i] is params()[i]'s.
  std::vector<std::shared_ptr<ops::AdamWHyper>> groups_;
  std::vector<std::size_t> group_of_;
  // What state_tensor gave each slot last (the step prepared last): see
  // exp_avg(i) and master(i) for the state of the step that trains.
  std::vector<Tensor> m_, v_;
  std::vector<Tensor> master_;     // f32 master copies, by parameter (undefined without)
  std::vector<char> wants_master_;  // master_weights of each parameter's group
  Tensor taken_;
};

}  // namespace frugal::optim
