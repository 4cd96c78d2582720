#pragma once
// SGD with momentum, weight decay, dampening and Nesterov, as torch.optim.SGD.
// Under dynamic loss scaling its updates are guarded: a skipped step changes
// no parameter or buffer, and the first step taken seeds the momentum.
#include "../graph/capture.hpp"
#include "../ops/optimizer_updates.hpp"
#include "../runtime/loss_scaling.hpp"
#include "../runtime/optimizer.hpp"
#include "hyperparameters.hpp"

namespace frugal::optim {

struct SGDOptions {
  double lr = 0.01;
  double momentum = 0;
  double dampening = 0;
  double weight_decay = 0;
  bool nesterov = false;
};

class SGD final : public Optimizer, public SkippableOptimizer {
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
  const std::vector<Tensor>& params() const override { return params_; }
  void append_update(Var p, Var g, std::size_t i) override {
    frugal::apply(std::make_shared<ops::SgdUpdate>(h_), {p, g, buffer(p, i)});
  }
  void append_guarded_update(Var p, Var g, std::size_t i, const ops::UpdateGuard& guard) override {
    Var buf = buffer(p, i);
    if (!taken_.defined()) taken_ = Tensor(Shape{}, DType::i64);
    Var taken = persistent_var(taken_, ValueKind::state, "sgd.steps_taken");
    frugal::apply(std::make_shared<ops::SgdUpdate>(h_, true), {p, g, buf, guard.found_inf, guard.scale, taken});
  }
  void append_guarded_step_end(const ops::UpdateGuard& guard) override {
    if (!taken_.defined()) taken_ = Tensor(Shape{}, DType::i64);
    frugal::apply(std::make_shared<ops::AdvanceStepCount>(),
                  {persistent_var(taken_, ValueKind::state, "sgd.steps_taken"), guard.found_inf});
  }
  void begin_step() override { ++h_->step; }

  void set_lr(double lr) {
    hyper::require_at_least("optim::SGD::set_lr", "lr", lr, 0);
    h_->lr = lr;
  }
  double lr() const { return h_->lr; }
  // Steps run (the host's count, advanced before each step).
  std::int64_t steps() const override { return h_->step; }
  void set_steps(std::int64_t n) override {
    if (n < 0) fail("optim::SGD: the step count cannot be negative (got ", n, ")");
    h_->step = n;
  }
  std::string kind() const override { return "sgd"; }
  // Per parameter "momentum_buffer"; "steps_taken" under loss scaling.
  std::vector<StateTensor> state() const override {
    std::vector<StateTensor> out;
    for (std::size_t i = 0; i < params_.size(); ++i)
      if (momentum_[i].defined()) out.push_back({i, "momentum_buffer", momentum_[i]});
    if (taken_.defined()) out.push_back({kNoParam, "steps_taken", taken_});
    return out;
  }
  // Steps whose update was applied: steps() unless loss scaling skipped some.
  std::int64_t steps_taken() const { return taken_.defined() ? taken_.data<std::int64_t>()[0] : h_->step; }
  // Momentum buffers, by parameter index (undefined until compiled).
  const Tensor& momentum_buffer(std::size_t i) const { return momentum_.at(i); }

 private:
  // Without momentum the buffer is never read back; it still gives the
  // kernel one shape of call.
  Var buffer(Var p, std::size_t i) {
    if (!momentum_[i].defined()) momentum_[i] = Tensor(params_[i].shape(), params_[i].dtype());
    return persistent_var(momentum_[i], ValueKind::state, p.graph->value(p.id).name + ".momentum");
  }

  std::vector<Tensor> params_;
  std::shared_ptr<ops::SgdHyper> h_;
  std::vector<Tensor> momentum_;
  Tensor taken_;
};

}  // namespace frugal::optim
