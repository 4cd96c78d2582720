#pragma once
// AdamW (decoupled weight decay), as torch.optim.AdamW.
#include "../ops/optimizer_updates.hpp"
#include "../runtime/optimizer.hpp"

namespace frugal::optim {

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
};

class AdamW final : public Optimizer {
 public:
  AdamW(std::vector<Tensor> params, AdamWOptions o)
      : params_(std::move(params)), h_(std::make_shared<ops::AdamWHyper>()) {
    if (o.lr < 0) fail("optim::AdamW: learning rate ", o.lr, " is negative");
    if (o.beta1 < 0 || o.beta1 >= 1 || o.beta2 < 0 || o.beta2 >= 1)
      fail("optim::AdamW: betas must lie in [0, 1), got ", o.beta1, " and ", o.beta2);
    *h_ = {o.lr, o.beta1, o.beta2, o.eps, o.weight_decay, 0};
    m_.resize(params_.size());
    v_.resize(params_.size());
  }
  const std::vector<Tensor>& params() const override { return params_; }
  void append_update(Var p, Var g, std::size_t i) override {
    if (!m_[i].defined()) {
      m_[i] = Tensor(params_[i].shape(), params_[i].dtype());
      v_[i] = Tensor(params_[i].shape(), params_[i].dtype());
    }
    const std::string name = p.graph->value(p.id).name;  // a copy: the graph grows below
    Var m = persistent_var(m_[i], ValueKind::state, name + ".exp_avg");
    Var v = persistent_var(v_[i], ValueKind::state, name + ".exp_avg_sq");
    frugal::apply(std::make_shared<ops::AdamWUpdate>(h_), {p, g, m, v});
  }
  void begin_step() override { ++h_->step; }

  void set_lr(double lr) { h_->lr = lr; }
  double lr() const { return h_->lr; }
  std::int64_t steps() const { return h_->step; }
  const Tensor& exp_avg(std::size_t i) const { return m_.at(i); }
  const Tensor& exp_avg_sq(std::size_t i) const { return v_.at(i); }

 private:
  std::vector<Tensor> params_;
  std::shared_ptr<ops::AdamWHyper> h_;
  std::vector<Tensor> m_, v_;
};

}  // namespace frugal::optim
