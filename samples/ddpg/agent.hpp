#pragma once
// DDPG (Lillicrap et al., 2016) on frugal steps: an actor μ(s), a critic
// Q(s, a), and target copies μ', Q' of both. Each update is two compiled
// training steps, built once and run every iteration:
//
//   critic step  y = r + γ (1 - done) Q'(s', μ'(s'))         (no gradient)
//                loss = mean (Q(s, a) - y)²   trains Q (critic_opt)
//   actor step   loss = -mean Q(s, μ(s))      trains μ (actor_opt)
//
// A training step trains only the parameters its optimizer owns; the others
// it reads (the targets in the critic step, the critic in the actor step)
// are frozen inputs read from their tensors as they are when the step runs,
// so the actor step sees the critic the critic step just updated (the
// steps share tensors, and the executor tracks writes between steps). The
// gradient of the actor's loss flows through Q into the action and on into
// μ's weights, never into Q's. The targets follow by Polyak averaging,
// θ' ← (1 - τ) θ' + τ θ, written into their tensors between steps; the
// steps reading them are told (parameters_changed), so a budget that keeps
// them off the device fetches them again.
//
// Two inference steps read the same tensors: the policy on one observation
// (acting), and the TD error |Q(s, a) - y| of a chunk of transitions (the
// defence's score, defence.hpp).
#include <array>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include <frugal/frugal.hpp>

namespace ddpg {

using frugal::Var;
namespace nn = frugal::nn;

// DDPG's initialisation of the last layer: small, so the first actions and
// values are near zero.
inline void small_last_layer(nn::Linear& fc) {
  nn::uniform_(fc.weight, -3e-3, 3e-3);
  nn::uniform_(fc.bias, -3e-3, 3e-3);
}

struct Actor : nn::Module {
  nn::Linear fc1, fc2, fc3;
  Actor(int obs, int act, int hidden) : fc1(obs, hidden), fc2(hidden, hidden), fc3(hidden, act) {
    register_module("fc1", fc1);
    register_module("fc2", fc2);
    register_module("fc3", fc3);
    small_last_layer(fc3);
  }
  Var forward(Var s) { return frugal::tanh(fc3(frugal::relu(fc2(frugal::relu(fc1(s)))))); }
};

struct Critic : nn::Module {
  nn::Linear fc1, fc2, fc3;
  Critic(int obs, int act, int hidden) : fc1(obs + act, hidden), fc2(hidden, hidden), fc3(hidden, 1) {
    register_module("fc1", fc1);
    register_module("fc2", fc2);
    register_module("fc3", fc3);
    small_last_layer(fc3);
  }
  Var forward(Var s, Var a) {
    return fc3(frugal::relu(fc2(frugal::relu(fc1(frugal::concat({s, a}, 1))))));
  }
};

// θ_dst ← (1 - τ) θ_dst + τ θ_src over two modules of the same structure
// (τ = 1 copies).
inline void soft_update(nn::Module& dst, const nn::Module& src, double tau) {
  auto d = dst.named_parameters();
  auto s = src.named_parameters();
  if (d.size() != s.size()) frugal::fail("soft_update: the modules differ");
  for (std::size_t i = 0; i < d.size(); ++i) {
    if (d[i].first != s[i].first || d[i].second.numel() != s[i].second.numel())
      frugal::fail("soft_update: parameter '", d[i].first, "' differs from '", s[i].first, "'");
    float* t = d[i].second.data<float>();
    const float* o = s[i].second.data<float>();
    for (std::int64_t k = 0; k < d[i].second.numel(); ++k)
      t[k] = tau == 1 ? o[k] : float((1 - tau) * double(t[k]) + tau * double(o[k]));
  }
}

// All four networks, under one module: the checkpoint's model.
struct Agent : nn::Module {
  Actor actor, actor_target;
  Critic critic, critic_target;
  Agent(int obs, int act, int hidden)
      : actor(obs, act, hidden), actor_target(obs, act, hidden), critic(obs, act, hidden),
        critic_target(obs, act, hidden) {
    register_module("actor", actor);
    register_module("critic", critic);
    register_module("actor_target", actor_target);
    register_module("critic_target", critic_target);
    soft_update(actor_target, actor, 1);
    soft_update(critic_target, critic, 1);
  }
};

struct Hyper {
  int obs = 3, act = 1, hidden = 256;
  std::int64_t batch = 128;
  std::int64_t score_chunk = 256;  // transitions per run of the TD-error step
  double gamma = 0.99, tau = 0.005, actor_lr = 1e-3, critic_lr = 1e-3;
};

// The unconstrained device bytes of each step, planned without memory.
struct StepSizes {
  std::size_t critic = 0, actor = 0, act = 0, score = 0;
  std::size_t total() const { return critic + actor + act + score; }
};

class Learner {
 public:
  Learner(Agent& ag, const Hyper& h, frugal::CompileOptions copts)
      : ag_(ag), h_(h), copts_(std::move(copts)),
        critic_opt_(ag.critic.parameters(), {.lr = h.critic_lr, .weight_decay = 0}),
        actor_opt_(ag.actor.parameters(), {.lr = h.actor_lr, .weight_decay = 0}) {}

  // The step functions: the graphs the steps capture.
  Var td_target(Var r, Var s2, Var not_done) {
    return frugal::detach(r + (not_done * ag_.critic_target.forward(s2, ag_.actor_target.forward(s2))) * h_.gamma);
  }
  std::vector<Var> critic_fn(Var s, Var a, Var r, Var s2, Var nd) {
    Var y = td_target(r, s2, nd);
    Var q = ag_.critic.forward(s, a);
    return {frugal::mse_loss(q, y), y, q};
  }
  Var actor_fn(Var s) { return -frugal::mean(ag_.critic.forward(s, ag_.actor.forward(s))); }
  Var act_fn(Var s) { return ag_.actor.forward(s); }
  Var score_fn(Var s, Var a, Var r, Var s2, Var nd) {
    return frugal::abs(ag_.critic.forward(s, a) - td_target(r, s2, nd));
  }

  std::vector<frugal::InputSpec> transition_specs(std::int64_t n) const {
    using frugal::input;
    return {input<float>({n, h_.obs}, "s"), input<float>({n, h_.act}, "a"), input<float>({n, 1}, "r"),
            input<float>({n, h_.obs}, "s2"), input<float>({n, 1}, "not_done")};
  }

  StepSizes plan_sizes() {
    StepSizes z;
    auto cf = [this](Var s, Var a, Var r, Var s2, Var nd) { return critic_fn(s, a, r, s2, nd); };
    auto af = [this](Var s) { return actor_fn(s); };
    auto pf = [this](Var s) { return act_fn(s); };
    auto sf = [this](Var s, Var a, Var r, Var s2, Var nd) { return score_fn(s, a, r, s2, nd); };
    critic_plan_ = frugal::plan_training(cf, transition_specs(h_.batch), critic_opt_, {}, copts_).plan;
    z.critic = critic_plan_.total_bytes();
    z.actor = frugal::plan_training(af, {frugal::input<float>({h_.batch, h_.obs}, "s")}, actor_opt_, {}, copts_)
                  .plan.total_bytes();
    z.act = frugal::plan_inference(pf, {frugal::input<float>({1, h_.obs}, "s")}, {}, copts_).plan.total_bytes();
    z.score = frugal::plan_inference(sf, transition_specs(h_.score_chunk), {}, copts_).plan.total_bytes();
    return z;
  }

  // Compiles the four steps. With no device bytes in `whole`, each alone
  // with nothing evicted; else through one memory broker within
  // whole.device (frugal::MemoryBroker): each step gets a share between its
  // least and its unconstrained bytes, and the weights several steps keep
  // on the device (the critic's, which the actor and scoring steps read;
  // the actor's, which the acting step reads) count once. The steps must
  // then be compiled without re-planning on measured times (copts.replan
  // false). A budget too small for all four is a BudgetError naming the
  // bytes they need.
  void compile(const frugal::Budget& whole) {
    using frugal::Budget;
    using frugal::Var;
    auto cf = [this](Var s, Var a, Var r, Var s2, Var nd) { return critic_fn(s, a, r, s2, nd); };
    auto af = [this](Var s) { return actor_fn(s); };
    auto pf = [this](Var s) { return act_fn(s); };
    auto sf = [this](Var s, Var a, Var r, Var s2, Var nd) { return score_fn(s, a, r, s2, nd); };
    const std::vector<frugal::InputSpec> critic_in = transition_specs(h_.batch),
                                         actor_in{frugal::input<float>({h_.batch, h_.obs}, "s")},
                                         act_in{frugal::input<float>({1, h_.obs}, "s")},
                                         score_in = transition_specs(h_.score_chunk);
    auto critic = [=, this](const Budget& b) { return frugal::compile(cf, critic_in, critic_opt_, b, copts_); };
    auto actor = [=, this](const Budget& b) { return frugal::compile(af, actor_in, actor_opt_, b, copts_); };
    auto act = [=, this](const Budget& b) { return frugal::compile_inference(pf, act_in, b, copts_); };
    auto score = [=, this](const Budget& b) { return frugal::compile_inference(sf, score_in, b, copts_); };
    if (whole.device == 0) {
      own_.clear();
      own_.reserve(4);  // the steps stay where they are
      own_.push_back(critic(whole));
      own_.push_back(actor(whole));
      own_.push_back(act(whole));
      own_.push_back(score(whole));
      steps_ = {&own_[0], &own_[1], &own_[2], &own_[3]};
    } else {
      broker_ = std::make_unique<frugal::MemoryBroker>(whole);
      auto join = [&](const char* name, auto compile_fn, auto plan_fn) {
        return &broker_->step(broker_->join(name, std::move(compile_fn), std::move(plan_fn)));
      };
      // The training steps first: the weights count for the step that
      // trains them.
      steps_[0] = join("critic", critic,
                       [=, this](const Budget& b) { return frugal::plan_training(cf, critic_in, critic_opt_, b, copts_); });
      steps_[1] = join("actor", actor,
                       [=, this](const Budget& b) { return frugal::plan_training(af, actor_in, actor_opt_, b, copts_); });
      steps_[2] = join("acting", act, [=, this](const Budget& b) { return frugal::plan_inference(pf, act_in, b, copts_); });
      steps_[3] = join("scoring", score,
                       [=, this](const Budget& b) { return frugal::plan_inference(sf, score_in, b, copts_); });
    }
    s_ = frugal::Tensor({h_.batch, h_.obs});
    a_ = frugal::Tensor({h_.batch, h_.act});
    r_ = frugal::Tensor({h_.batch, 1});
    s2_ = frugal::Tensor({h_.batch, h_.obs});
    nd_ = frugal::Tensor({h_.batch, 1});
    obs1_ = frugal::Tensor({1, h_.obs});
  }
  // The device bytes the four steps hold, measured: under the broker, the
  // weights they share once.
  std::size_t measured_device_bytes() const {
    if (broker_) return broker_->measured_device_bytes();
    std::size_t sum = 0;
    for (const frugal::Step* st : steps_) sum += st->measured_device_bytes();
    return sum;
  }
  const frugal::MemoryBroker* broker() const { return broker_.get(); }

  // The batch the next update trains on (filled by the caller).
  frugal::Tensor& s() { return s_; }
  frugal::Tensor& a() { return a_; }
  frugal::Tensor& r() { return r_; }
  frugal::Tensor& s2() { return s2_; }
  frugal::Tensor& not_done() { return nd_; }

  // One DDPG update on the batch: the critic, then the actor (reading the
  // updated critic), then the targets. Returns the critic's loss.
  float update() {
    const float critic_loss = critic_step().run(s_, a_, r_, s2_, nd_);
    actor_loss_ = actor_step().run(s_);
    soft_update(ag_.critic_target, ag_.critic, h_.tau);
    soft_update(ag_.actor_target, ag_.actor, h_.tau);
    targets_changed();
    return critic_loss;
  }
  float last_actor_loss() const { return actor_loss_; }
  // The critic step's unconstrained plan (after plan_sizes).
  const frugal::Plan& unconstrained_critic_plan() const { return critic_plan_; }

  // μ(obs) for one observation.
  void act(const float* obs, float* action) {
    std::memcpy(obs1_.raw(), obs, sizeof(float) * std::size_t(h_.obs));
    act_step().run(obs1_);
    std::memcpy(action, act_step().output().data<float>(), sizeof(float) * std::size_t(h_.act));
  }

  // After the tensors the steps read were written outside them (targets,
  // a loaded checkpoint).
  void targets_changed() {
    critic_step().parameters_changed();
    score_step().parameters_changed();
  }
  void all_changed() {
    for (frugal::Step* st : steps()) st->parameters_changed();
  }

  std::vector<frugal::Step*> steps() { return {steps_.begin(), steps_.end()}; }
  frugal::Step& critic_step() { return *steps_[0]; }
  frugal::Step& actor_step() { return *steps_[1]; }
  frugal::Step& act_step() { return *steps_[2]; }
  frugal::Step& score_step() { return *steps_[3]; }
  frugal::optim::AdamW& critic_opt() { return critic_opt_; }
  frugal::optim::AdamW& actor_opt() { return actor_opt_; }
  const Hyper& hyper() const { return h_; }

 private:
  Agent& ag_;
  Hyper h_;
  frugal::CompileOptions copts_;
  frugal::optim::AdamW critic_opt_, actor_opt_;
  std::unique_ptr<frugal::MemoryBroker> broker_;  // under a budget: it owns the steps
  std::vector<frugal::Step> own_;                  // without
  std::array<frugal::Step*, 4> steps_{};           // critic, actor, acting, scoring
  frugal::Tensor s_, a_, r_, s2_, nd_, obs1_;
  float actor_loss_ = 0;
  frugal::Plan critic_plan_;
};

}  // namespace ddpg
