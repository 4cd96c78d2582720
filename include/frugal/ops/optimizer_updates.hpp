#pragma once
// Optimizer updates as graph ops: each writes its parameter and state in
// place. Hyperparameters are read when the op runs, so a learning-rate
// schedule changes them between steps without recompiling.
//
// Guarded updates (dynamic loss scaling, ops/loss_scaling.hpp) take three
// more inputs: found_inf (f32 scalar), the loss scale (f32 scalar) and the
// optimizer's device-side count of steps taken (i64 scalar). They divide the
// gradient by the scale, write nothing when found_inf is set, and take their
// step number from the count (steps taken before this one, + 1), not from
// the host's count of steps run, so a skipped step leaves no trace.
#include <algorithm>
#include <cmath>
#include <memory>

#include "checks.hpp"
#include "elementwise_math.hpp"
#include "loss_scaling.hpp"

namespace frugal::ops {

struct SgdHyper {
  double lr = 0.01, momentum = 0, dampening = 0, weight_decay = 0;
  bool nesterov = false;
  std::int64_t step = 0;  // steps taken, counting the one running (1 on the first)
};

struct AdamWHyper {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 1e-2;
  std::int64_t step = 0;
};

// PyTorch's SGD: the first step seeds the momentum buffer with the gradient.
template <class T>
struct SgdMomentumMath {
  T lr, momentum, dampening, weight_decay;
  bool nesterov, first;
  FRUGAL_HD void operator()(T& p, T g, T& buf) const {
    T d = g + weight_decay * p;
    buf = first ? d : momentum * buf + (T(1) - dampening) * d;
    T dir = nesterov ? d + momentum * buf : buf;
    p = p - lr * dir;
  }
};

// AdamW with decoupled weight decay (Loshchilov & Hutter), in PyTorch's order.
template <class T>
struct AdamWMath {
  T lr, beta1, beta2, eps, weight_decay, bias1, bias2_sqrt;
  FRUGAL_HD void operator()(T& p, T g, T& m, T& v) const {
    p = p * (T(1) - lr * weight_decay);
    m = beta1 * m + (T(1) - beta1) * g;
    v = beta2 * v + (T(1) - beta2) * g * g;
    T denom = math::sqrt_(v) / bias2_sqrt + eps;
    p = p - (lr / bias1) * m / denom;
  }
};

// AdamW on 16-bit storage S (BFloat16, Half) without an f32 master copy,
// as torch.optim.AdamW on bf16 parameters: parameter and moments are read
// into f32, stepped by AdamWMath<float> and each rounded to nearest even on
// store. The moments then carry S's 8 or 11 significant bits, which is what
// AdamWMasterMath (adamw_master.hpp) avoids.
template <class S>
struct AdamWStorageMath {
  AdamWMath<float> adamw;
  FRUGAL_HD void operator()(S& p, float g, S& m, S& v) const {
    float pf = float(p), mf = float(m), vf = float(v);
    adamw(pf, g, mf, vf);
    p = S(pf);
    m = S(mf);
    v = S(vf);
  }
};

// AdamWMath for `h` at step `step` (1 on the first): the bias corrections
// computed in double on the host and rounded once to T, so every backend
// and every update op steps with the same constants.
template <class T>
AdamWMath<T> adamw_math(const AdamWHyper& h, std::int64_t step) {
  double t = double(std::max<std::int64_t>(step, 1));
  return {T(h.lr),
          T(h.beta1),
          T(h.beta2),
          T(h.eps),
          T(h.weight_decay),
          T(1.0 - std::pow(h.beta1, t)),
          T(std::sqrt(1.0 - std::pow(h.beta2, t)))};
}

// A parameter, its gradient and its state share one dtype. bf16/f16 ones
// (a model built in 16 bits) are updated in f32, each element read into
// f32, stepped by the functors above and rounded once on store.
inline void expect_same_meta(const std::string& op, std::span<const TensorMeta> in) {
  for (auto& m : in) {
    expect_any_floating(op, m);
    if (m.shape != in[0].shape || m.dtype != in[0].dtype)
      fail<ShapeError>(op, ": parameter ", in[0].str(), " and its gradient/state ", m.str(), " differ");
  }
}

// The guard inputs (found_inf, scale, steps_taken) that follow a guarded
// update's `state` leading inputs.
inline void expect_guard(const std::string& op, std::span<const TensorMeta> in, std::size_t state) {
  expect_arity(op, in, state + 3);
  expect_scalar(op, "found_inf", in[state], DType::f32);
  expect_scalar(op, "the loss scale", in[state + 1], DType::f32);
  expect_scalar(op, "the step count", in[state + 2], DType::i64);
}

// Inputs (param, grad, momentum buffer [, found_inf, scale, steps_taken]);
// writes param and buffer.
class SgdUpdate final : public Op {
 public:
  ~SgdUpdate() override;
  explicit SgdUpdate(std::shared_ptr<const SgdHyper> h, bool guarded = false) : h_(std::move(h)), guarded_(guarded) {}
  const SgdHyper& hyper() const { return *h_; }
  bool guarded() const { return guarded_; }
  // `step`: this step's number, 1 on the first (the host's count unless guarded).
  template <class T>
  SgdMomentumMath<T> math(std::int64_t step) const {
    return {T(h_->lr), T(h_->momentum), T(h_->dampening), T(h_->weight_decay), h_->nesterov, step <= 1};
  }
  template <class T>
  SgdMomentumMath<T> math() const {
    return math<T>(h_->step);
  }
  std::string name() const override { return guarded_ ? "sgd_update_guarded" : "sgd_update"; }
  std::vector<TensorMeta> infer(std::span<const TensorMeta> in) const override {
    if (guarded_) expect_guard(name(), in, 3);
    else expect_arity(name(), in, 3);
    expect_same_meta(name(), in.first(3));
    return {};
  }
  std::vector<int> mutated_inputs() const override { return {0, 2}; }

 private:
  std::shared_ptr<const SgdHyper> h_;
  bool guarded_;
};

// Inputs (param, grad, m, v [, found_inf, scale, steps_taken]); writes
// param, m and v. All four of one dtype: f32 and f64 step in themselves,
// bf16 and f16 through AdamWStorageMath.
class AdamWUpdate final : public Op {
 public:
  ~AdamWUpdate() override;
  explicit AdamWUpdate(std::shared_ptr<const AdamWHyper> h, bool guarded = false)
      : h_(std::move(h)), guarded_(guarded) {}
  bool guarded() const { return guarded_; }
  template <class T>
  AdamWMath<T> math() const {
    return math<T>(h_->step);
  }
  // `step`: this step's number, 1 on the first; the bias corrections use it.
  template <class T>
  AdamWMath<T> math(std::int64_t step) const {
    return adamw_math<T>(*h_, step);
  }
  std::string name() const override { return guarded_ ? "adamw_update_guarded" : "adamw_update"; }
  std::vector<TensorMeta> infer(std::span<const TensorMeta> in) const override {
    if (guarded_) expect_guard(name(), in, 4);
    else expect_arity(name(), in, 4);
    expect_same_meta(name(), in.first(4));
    return {};
  }
  std::vector<int> mutated_inputs() const override { return {0, 2, 3}; }

 private:
  std::shared_ptr<const AdamWHyper> h_;
  bool guarded_;
};

}  // namespace frugal::ops
