#pragma once
// SGD with momentum, weight decay, dampening and Nesterov, as torch.optim.SGD.
// Under dynamic loss scaling its updates are guarded: a skipped step changes
// no parameter or buffer, and the first step taken seeds the momentum.
#include <algorithm>
#include <cmath>
#include <optional>

#include "../graph/capture.hpp"
#include "../ops/optimizer_updates.hpp"
#include "../runtime/loss_scaling.hpp"
#include "../runtime/optimizer.hpp"
#include "param_groups.hpp"
#include "hyperparameters.hpp"

namespace frugal::optim {

struct SGDOptions {
  double lr = 0.01;
  double momentum = 0;
  double dampening = 0;
  double weight_decay = 0;
  bool nesterov = false;
};

// One parameter group's hyperparameters; unset ones are the optimizer's defaults.
struct SGDGroupOptions {
  std::optional<double> lr, momentum, dampening, weight_decay;
  std::optional<bool> nesterov;
};
using SGDParamGroup = ParamGroup<SGDGroupOptions>;

class SGD final : public Optimizer, public SkippableOptimizer, public ScheduledOptimizer {
 public:
  ~SGD() override;
  SGD(std::vector<Tensor> params, SGDOptions o) : params_(std::move(params)), h_(std::make_shared<ops::SgdHyper>()) {
    hyper::require_at_least("optim::SGD", "lr", o.lr, 0);
    hyper::require_at_least("optim::SGD", "momentum", o.momentum, 0);
    hyper::require_finite("optim::SGD", "dampening", o.dampening);
    hyper::require_at_least("optim::SGD", "weight_decay", o.weight_decay, 0);
    if (o.nesterov && (o.momentum <= 0 || o.dampening != 0))
      fail("optim::SGD: Nesterov momentum needs momentum > 0 and dampening = 0");
    *h_ = {o.lr, o.momentum, o.dampening, o.weight_decay, o.nesterov, 0};
    momentum_.resize(params_.size());
  }
  // Parameter groups (optim/param_groups.hpp), each checked as the
  // constructor above checks its options.
  SGD(const std::vector<SGDParamGroup>& groups, SGDOptions defaults)
      : SGD(flatten_groups(groups, "optim::SGD"), defaults) {
    for (const auto& g : groups) {
      const SGDGroupOptions& o = g.options;
      SGDOptions merged{o.lr.value_or(defaults.lr), o.momentum.value_or(defaults.momentum),
                        o.dampening.value_or(defaults.dampening), o.weight_decay.value_or(defaults.weight_decay),
                        o.nesterov.value_or(defaults.nesterov)};
      SGD check(std::vector<Tensor>{}, merged);
      auto h = groups_.empty() ? h_ : std::make_shared<ops::SgdHyper>();
      *h = *check.h_;
      groups_.push_back(h);
      group_of_.insert(group_of_.end(), g.params.size(), groups_.size() - 1);
    }
  }
  const std::vector<Tensor>& params() const override { return params_; }
  void append_update(Var p, Var g, std::size_t i) override {
    apply_update(std::make_shared<ops::SgdUpdate>(hyper_of(i)), {p, g, buffer(p, i)});
  }
  void append_guarded_update(Var p, Var g, std::size_t i, const ops::UpdateGuard& guard) override {
    Var buf = buffer(p, i);
    if (!taken_.defined()) taken_ = Tensor(Shape{}, DType::i64);
    Var taken = persistent_var(taken_, ValueKind::state, "sgd.steps_taken");
    apply_update(std::make_shared<ops::SgdUpdate>(hyper_of(i), true), {p, g, buf, guard.found_inf, guard.scale, taken});
  }
  void append_guarded_step_end(const ops::UpdateGuard& guard) override {
    if (!taken_.defined()) taken_ = Tensor(Shape{}, DType::i64);
    frugal::apply(std::make_shared<ops::AdvanceStepCount>(),
                  {persistent_var(taken_, ValueKind::state, "sgd.steps_taken"), guard.found_inf});
  }
  void begin_step() override {
    ++h_->step;
    for (auto& h : groups_) h->step = h_->step;
  }

  void set_lr(double lr) {
    hyper::require_at_least("optim::SGD::set_lr", "lr", lr, 0);
    h_->lr = lr;
    for (auto& h : groups_) h->lr = lr;  // every group, as PyTorch's schedulers set each
  }
  double lr() const { return h_->lr; }
  // Per parameter group, in the order given (an optimizer made without
  // groups has one, group 0).
  void set_lr(std::size_t group, double lr) {
    if (!(lr >= 0) || !std::isfinite(lr)) fail("optim::SGD: learning rate ", lr, " of group ", group, " is not finite and >= 0");
    hyper(group).lr = lr;
  }
  double lr(std::size_t group) const { return hyper(group).lr; }
  std::size_t num_groups() const override { return std::max<std::size_t>(1, groups_.size()); }
  double group_lr(std::size_t group) const override { return lr(group); }
  void set_group_lr(std::size_t group, double lr) override { set_lr(group, lr); }
  double group_momentum(std::size_t group) const override { return hyper(group).momentum; }
  void set_group_momentum(std::size_t group, double momentum) override {
    if (!(momentum >= 0) || !std::isfinite(momentum)) fail("optim::SGD: momentum must be finite and >= 0, got ", momentum);
    hyper(group).momentum = momentum;
  }
  // A group's weight decay, e.g. to check what a group was given.
  double weight_decay(std::size_t group = 0) const { return hyper(group).weight_decay; }
  // Steps run (the host's count, advanced before each step).
  std::int64_t steps() const override { return h_->step; }
  void set_steps(std::int64_t n) override {
    if (n < 0) fail("optim::SGD: the step count cannot be negative (got ", n, ")");
    h_->step = n;
    for (auto& h : groups_) h->step = n;
  }
  std::string kind() const override { return "sgd"; }
  // Per parameter "momentum_buffer"; "steps_taken" under loss scaling.
  // Those of the step that trains (Optimizer::trains), not of a layout
  // planned since.
  std::vector<StateTensor> state() const override {
    std::vector<StateTensor> out;
    for (std::size_t i = 0; i < params_.size(); ++i)
      if (const Tensor m = momentum_buffer(i); m.defined()) {
        NvmeHomes::registry().bring_back(m.raw());  // from NVMe, where a step keeps them (nn::Module::named_parameters)
        out.push_back({i, "momentum_buffer", m});
      }
    if (taken_.defined()) out.push_back({kNoParam, "steps_taken", taken_});
    return out;
  }
  // Steps whose update was applied: steps() unless loss scaling skipped some.
  std::int64_t steps_taken() const { return taken_.defined() ? taken_.data<std::int64_t>()[0] : h_->step; }
  // Momentum buffers, by parameter index (undefined until compiled), of the
  // step that trains (Optimizer::trains).
  Tensor momentum_buffer(std::size_t i) const { return trained_state("momentum", i, momentum_.at(i)); }

 private:
  // Without momentum the buffer is never read back; it still gives the
  // kernel one shape of call.
  Var buffer(Var p, std::size_t i) {
    momentum_[i] = state_tensor("momentum", momentum_[i], i);  // the parameter's shape, or its ZeRO shard's
    return persistent_var(momentum_[i], ValueKind::state, p.graph->value(p.id).name + ".momentum");
  }

  // The hyperparameters params()[i]'s update reads: its group's.
  std::shared_ptr<ops::SgdHyper> hyper_of(std::size_t i) const { return groups_.empty() ? h_ : groups_[group_of_.at(i)]; }
  // A group's hyperparameters (the pointees stay writable: the update ops share them).
  ops::SgdHyper& hyper(std::size_t group) const {
    if (group >= num_groups()) fail("optim::SGD: parameter group ", group, " does not exist (", num_groups(), " groups)");
    return group == 0 ? *h_ : *groups_[group];
  }

  std::vector<Tensor> params_;
  std::shared_ptr<ops::SgdHyper> h_;
  // Parameter groups (empty without): groups_[0] is h_; group_of_[i] is params()[i]'s.
  std::vector<std::shared_ptr<ops::SgdHyper>> groups_;
  std::vector<std::size_t> group_of_;
  std::vector<Tensor> momentum_;  // what state_tensor gave each last (the step prepared last)
  Tensor taken_;
};

}  // namespace frugal::optim
