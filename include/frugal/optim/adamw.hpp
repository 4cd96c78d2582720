#pragma once
// AdamW (decoupled weight decay), as torch.optim.AdamW. Under dynamic loss
// scaling (optim/loss_scaler.hpp) its updates are guarded: a skipped step
// changes no parameter, no moment and not the count of steps taken that the
// bias corrections use.
#include "../graph/capture.hpp"
#include "../ops/optimizer_updates.hpp"
#include "../runtime/loss_scaling.hpp"
#include "../runtime/optimizer.hpp"
#include "hyperparameters.hpp"

namespace frugal::optim {

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
};

class AdamW final : public Optimizer, public SkippableOptimizer {
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
  }
  const std::vector<Tensor>& params() const override { return params_; }
  void append_update(Var p, Var g, std::size_t i) override {
    auto [m, v] = moments(p, i);
    frugal::apply(std::make_shared<ops::AdamWUpdate>(h_), {p, g, m, v});
  }
  void append_guarded_update(Var p, Var g, std::size_t i, const ops::UpdateGuard& guard) override {
    auto [m, v] = moments(p, i);
    frugal::apply(std::make_shared<ops::AdamWUpdate>(h_, true), {p, g, m, v, guard.found_inf, guard.scale, taken_var()});
  }
  void append_guarded_step_end(const ops::UpdateGuard& guard) override {
    frugal::apply(std::make_shared<ops::AdvanceStepCount>(), {taken_var(), guard.found_inf});
  }
  void begin_step() override { ++h_->step; }

  void set_lr(double lr) {
    hyper::require_at_least("optim::AdamW::set_lr", "lr", lr, 0);
    h_->lr = lr;
  }
  double lr() const { return h_->lr; }
  // Steps run (the host's count, advanced before each step).
  std::int64_t steps() const override { return h_->step; }
  void set_steps(std::int64_t n) override {
    if (n < 0) fail("optim::AdamW: the step count cannot be negative (got ", n, ")");
    h_->step = n;
  }
  std::string kind() const override { return "adamw"; }
  // Per parameter "exp_avg" and "exp_avg_sq"; "steps_taken" under loss scaling.
  std::vector<StateTensor> state() const override {
    std::vector<StateTensor> out;
    for (std::size_t i = 0; i < params_.size(); ++i)
      if (m_[i].defined()) {
        out.push_back({i, "exp_avg", m_[i]});
        out.push_back({i, "exp_avg_sq", v_[i]});
      }
    if (taken_.defined()) out.push_back({kNoParam, "steps_taken", taken_});
    return out;
  }
  // Steps whose update was applied: steps() unless loss scaling skipped some.
  std::int64_t steps_taken() const { return taken_.defined() ? taken_.data<std::int64_t>()[0] : h_->step; }
  const Tensor& exp_avg(std::size_t i) const { return m_.at(i); }
  const Tensor& exp_avg_sq(std::size_t i) const { return v_.at(i); }

 private:
  std::pair<Var, Var> moments(Var p, std::size_t i) {
    if (!m_[i].defined()) {
      m_[i] = Tensor(params_[i].shape(), params_[i].dtype());
      v_[i] = Tensor(params_[i].shape(), params_[i].dtype());
    }
    const std::string name = p.graph->value(p.id).name;  // a copy: the graph grows below
    return {persistent_var(m_[i], ValueKind::state, name + ".exp_avg"),
            persistent_var(v_[i], ValueKind::state, name + ".exp_avg_sq")};
  }
  // The device-side count of steps taken, for guarded updates.
  Var taken_var() {
    if (!taken_.defined()) taken_ = Tensor(Shape{}, DType::i64);
    return persistent_var(taken_, ValueKind::state, "adamw.steps_taken");
  }

  std::vector<Tensor> params_;
  std::shared_ptr<ops::AdamWHyper> h_;
  std::vector<Tensor> m_, v_;
  Tensor taken_;
};

}  // namespace frugal::optim
