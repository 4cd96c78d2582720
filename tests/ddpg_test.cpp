// The ddpg sample (issue 22): its environments against closed-form steps,
// DDPG's TD target and actor gradient against a hand computation on a tiny
// network, the poisoning, and the defence on a pool with known poison.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <frugal/frugal.hpp>
#include <vector>

#include "../samples/ddpg/agent.hpp"
#include "../samples/ddpg/defence.hpp"
#include "../samples/ddpg/envs.hpp"
#include "../samples/ddpg/replay.hpp"

namespace {

// Pendulum-v1's step, as Gymnasium writes it.
TEST_CASE("ddpg: Pendulum's step is Gymnasium's closed form", "[ddpg]") {
  ddpg::Pendulum p;
  p.set_state({0.3, -0.5, 0});
  const float a = 0.25f;  // u = 0.5 N·m
  ddpg::StepResult r = p.step(&a);
  const double thdot = -0.5 + (3 * 10 / 2.0 * std::sin(0.3) + 3.0 * 0.5) * 0.05;
  CHECK(p.thdot == Approx(thdot).epsilon(1e-12));
  CHECK(p.th == Approx(0.3 + thdot * 0.05).epsilon(1e-12));
  CHECK(r.reward == Approx(-(0.09 + 0.1 * 0.25 + 0.001 * 0.25)).epsilon(1e-12));
  CHECK_FALSE(r.terminal);
  float obs[3];
  p.observe(obs);
  CHECK(obs[0] == float(std::cos(p.th)));
  CHECK(obs[2] == float(thdot));

  // Torque clipped to 2, the cost's angle normalised to [-π, π).
  p.set_state({3.5, 7.9, 0});
  const float big = 3;
  r = p.step(&big);
  const double th_n = 3.5 - 2 * ddpg::kPi;
  CHECK(r.reward == Approx(-(th_n * th_n + 0.1 * 7.9 * 7.9 + 0.001 * 4)).epsilon(1e-12));
  CHECK(p.thdot == Approx(7.9 + (15 * std::sin(3.5) + 3 * 2) * 0.05).epsilon(1e-12));
  // Speed clipped to 8 (7.9 + (15 sin 0.5 + 6) 0.05 would be 8.56).
  p.set_state({0.5, 7.9, 0});
  p.step(&big);
  CHECK(p.thdot == 8.0);
  CHECK(p.th == Approx(0.5 + 8 * 0.05).epsilon(1e-12));

  // 200 steps, then the episode is truncated (not terminal).
  p.reset(1, 0);
  const float zero = 0;
  for (int i = 0; i < 199; ++i) CHECK_FALSE(p.step(&zero).truncated);
  CHECK(p.step(&zero).truncated);
}

TEST_CASE("ddpg: the reacher's step matches the arm's equations worked by hand", "[ddpg]") {
  // At q = 0, q̇ = 0 (no Coriolis, no damping force): M = [[0.05, 0.02],
  // [0.02, 0.01]], det 1e-4; τ = (0.1, 0) gives q̈ = M⁻¹τ = (10, -20).
  ddpg::Reacher r;
  r.set_state({0, 0, 0, 0, 0.1, 0.1, 0});
  const float a[2] = {1, 0};
  ddpg::StepResult res = r.step(a);
  CHECK(r.w1 == Approx(10 * 0.02).epsilon(1e-12));
  CHECK(r.w2 == Approx(-20 * 0.02).epsilon(1e-12));
  CHECK(r.q1 == Approx(0.2 * 0.02).epsilon(1e-12));
  CHECK(r.q2 == Approx(-0.4 * 0.02).epsilon(1e-12));
  const double tx = 0.1 * std::cos(0.004) + 0.1 * std::cos(0.004 - 0.008);
  const double ty = 0.1 * std::sin(0.004) + 0.1 * std::sin(0.004 - 0.008);
  CHECK(res.reward == Approx(-std::hypot(tx - 0.1, ty - 0.1) / 0.2 - 0.01).epsilon(1e-12));

  // Away from rest the equations of motion must balance power: with T the
  // kinetic energy of the two point masses (from their velocities, not from
  // M), dT/dt = τ·q̇ - b|q̇|². Checked by a central difference along the
  // accelerations the environment uses, at states and torques drawn at random.
  auto kinetic = [](double q1, double q2, double w1, double w2) {
    const double v1x = -0.1 * std::sin(q1) * w1, v1y = 0.1 * std::cos(q1) * w1;
    const double v2x = v1x - 0.1 * std::sin(q1 + q2) * (w1 + w2), v2y = v1y + 0.1 * std::cos(q1 + q2) * (w1 + w2);
    return 0.5 * (v1x * v1x + v1y * v1y) + 0.5 * (v2x * v2x + v2y * v2y);
  };
  frugal::Rng rng(3, 0);
  for (int k = 0; k < 20; ++k) {
    const double q1 = rng.uniform(-3, 3), q2 = rng.uniform(-3, 3), w1 = rng.uniform(-4, 4), w2 = rng.uniform(-4, 4);
    const double u1 = rng.uniform(-0.1, 0.1), u2 = rng.uniform(-0.1, 0.1);
    double a1, a2;
    ddpg::Reacher::accelerations(q2, w1, w2, u1, u2, a1, a2);
    const double h = 1e-6;
    const double dT = (kinetic(q1 + h * w1, q2 + h * w2, w1 + h * a1, w2 + h * a2) -
                       kinetic(q1 - h * w1, q2 - h * w2, w1 - h * a1, w2 - h * a2)) / (2 * h);
    const double power = u1 * w1 + u2 * w2 - 0.01 * (w1 * w1 + w2 * w2);
    CHECK(dT == Approx(power).margin(1e-7));
    // ... and T agrees with ½ q̇ᵀ M q̇ as the environment computes it
    ddpg::Reacher s;
    s.set_state({q1, q2, w1, w2, 0, 0, 0});
    CHECK(s.kinetic_energy() == Approx(kinetic(q1, q2, w1, w2)).epsilon(1e-12));
  }
}

TEST_CASE("ddpg: environments are deterministic per seed and episode", "[ddpg]") {
  for (const char* name : {"pendulum", "reacher"}) {
    auto a = ddpg::make_env(name), b = ddpg::make_env(name);
    a->reset(7, 3);
    b->reset(7, 3);
    CHECK(a->state() == b->state());
    b->reset(7, 4);
    CHECK(a->state() != b->state());
    b->reset(8, 3);
    CHECK(a->state() != b->state());
    b->reset(7, 3);
    std::vector<float> act(std::size_t(a->act_dim()));
    for (int t = 0; t < 50; ++t) {
      for (std::size_t j = 0; j < act.size(); ++j) act[j] = float(std::sin(0.3 * t + double(j)));
      ddpg::StepResult ra = a->step(act.data()), rb = b->step(act.data());
      CHECK(ra.reward == rb.reward);
    }
    CHECK(a->state() == b->state());
    // A state restored from a checkpoint continues the same way.
    auto c = ddpg::make_env(name);
    c->set_state(a->state());
    a->step(act.data());
    c->step(act.data());
    CHECK(a->state() == c->state());
  }
}

// A tiny DDPG: obs 2, action 1, hidden 3, a batch of 2, with weights set by hand.
struct Tiny {
  static constexpr int O = 2, A = 1, H = 3;
  ddpg::Agent agent{O, A, H};
  ddpg::Hyper h;
  std::unique_ptr<ddpg::Learner> learner;
  Tiny() {
    // distinct weights everywhere; the targets differ from the online nets
    int k = 0;
    for (auto& [name, t] : agent.named_parameters()) {
      float* p = t.data<float>();
      for (std::int64_t i = 0; i < t.numel(); ++i, ++k) p[i] = float(0.37 * std::sin(1.3 * k + 0.4) + 0.05);
    }
    h.obs = O, h.act = A, h.hidden = H, h.batch = 2, h.score_chunk = 2, h.gamma = 0.9, h.tau = 0.25;
    learner = std::make_unique<ddpg::Learner>(agent, h, frugal::CompileOptions{.threads = 1});
    learner->compile({});
  }
};

// The networks in double, from the module's own tensors.
std::vector<double> lin(const frugal::nn::Linear& fc, const std::vector<double>& x) {
  std::vector<double> y(std::size_t(fc.out_features()));
  for (std::int64_t o = 0; o < fc.out_features(); ++o) {
    double s = fc.bias.data<float>()[o];
    for (std::int64_t i = 0; i < fc.in_features(); ++i) s += double(fc.weight.data<float>()[o * fc.in_features() + i]) * x[std::size_t(i)];
    y[std::size_t(o)] = s;
  }
  return y;
}
std::vector<double> relu(std::vector<double> v) {
  for (double& x : v) x = std::max(x, 0.0);
  return v;
}
double mu(const ddpg::Actor& n, const std::vector<double>& s) {
  return std::tanh(lin(n.fc3, relu(lin(n.fc2, relu(lin(n.fc1, s)))))[0]);
}
double Q(const ddpg::Critic& n, const std::vector<double>& s, double a) {
  std::vector<double> x = s;
  x.push_back(a);
  return lin(n.fc3, relu(lin(n.fc2, relu(lin(n.fc1, x)))))[0];
}

TEST_CASE("ddpg: the critic's TD target and loss equal a hand computation", "[ddpg]") {
  Tiny t;
  ddpg::Learner& L = *t.learner;
  const float s[4] = {0.5f, -0.2f, -0.7f, 0.9f}, a[2] = {0.3f, -0.8f}, r[2] = {-1.5f, 0.25f};
  const float s2[4] = {0.1f, 0.4f, -0.3f, -0.6f}, nd[2] = {1.f, 0.f};  // the second transition is terminal
  std::memcpy(L.s().raw(), s, sizeof s);
  std::memcpy(L.a().raw(), a, sizeof a);
  std::memcpy(L.r().raw(), r, sizeof r);
  std::memcpy(L.s2().raw(), s2, sizeof s2);
  std::memcpy(L.not_done().raw(), nd, sizeof nd);
  double y[2], loss = 0;
  for (int i = 0; i < 2; ++i) {
    const std::vector<double> sn{s2[2 * i], s2[2 * i + 1]};
    y[i] = r[i] + 0.9 * nd[i] * Q(t.agent.critic_target, sn, mu(t.agent.actor_target, sn));
    const double q = Q(t.agent.critic, {s[2 * i], s[2 * i + 1]}, a[i]);
    loss += (q - y[i]) * (q - y[i]) / 2;
  }
  CHECK(y[1] == r[1]);  // terminal: no bootstrap
  const float got = L.critic_step().run(L.s(), L.a(), L.r(), L.s2(), L.not_done());
  CHECK(got == Approx(loss).epsilon(1e-5));
  for (int i = 0; i < 2; ++i) CHECK(L.critic_step().output(0).data<float>()[i] == Approx(y[i]).epsilon(1e-5));

  // The score step's TD error is |Q(s, a) - y| on the same transitions.
  // (The critic has just been updated; recompute Q from its new weights.)
  L.score_step().run(L.s(), L.a(), L.r(), L.s2(), L.not_done());
  for (int i = 0; i < 2; ++i) {
    const double q = Q(t.agent.critic, {s[2 * i], s[2 * i + 1]}, a[i]);
    CHECK(L.score_step().output().data<float>()[i] == Approx(std::abs(q - y[i])).epsilon(1e-4));
  }
}

TEST_CASE("ddpg: the actor step follows dQ(s, mu(s))/dtheta_mu and leaves the critic alone", "[ddpg]") {
  Tiny t;
  ddpg::Learner& L = *t.learner;
  const float s[4] = {0.5f, -0.2f, -0.7f, 0.9f};
  std::memcpy(L.s().raw(), s, sizeof s);
  // The actor's loss -mean Q(s, μ(s)) in double, and its gradient for every
  // actor weight by central differences.
  auto loss = [&]() {
    double l = 0;
    for (int i = 0; i < 2; ++i) {
      const std::vector<double> si{s[2 * i], s[2 * i + 1]};
      l -= Q(t.agent.critic, si, mu(t.agent.actor, si)) / 2;
    }
    return l;
  };
  std::vector<std::vector<double>> grad;
  std::vector<std::vector<float>> before;
  for (auto& [name, p] : t.agent.actor.named_parameters()) {
    std::vector<double> g(std::size_t(p.numel()));
    float* v = p.data<float>();
    before.emplace_back(v, v + p.numel());
    for (std::int64_t i = 0; i < p.numel(); ++i) {
      const float keep = v[i];
      // a small step: a larger one may cross a ReLU's kink (the networks
      // run in double here, so the difference loses little)
      v[i] = keep + 1e-5f;
      const double up = loss();
      v[i] = keep - 1e-5f;
      const double down = loss();
      v[i] = keep;
      g[std::size_t(i)] = (up - down) / (double(keep + 1e-5f) - double(keep - 1e-5f));
    }
    grad.push_back(g);
  }
  std::vector<std::vector<float>> critic_before;
  for (auto& [name, p] : t.agent.critic.named_parameters())
    critic_before.emplace_back(p.data<float>(), p.data<float>() + p.numel());

  // The gradients frugal computes for the same loss.
  auto fn = [&](frugal::Var x) { return L.actor_fn(x); };
  frugal::Step grads = frugal::compile_gradients(fn, {frugal::input<float>({2, 2}, "s")}, t.agent.actor.parameters(), {},
                                                 frugal::CompileOptions{.threads = 1});
  const float l = grads.run(L.s());
  CHECK(l == Approx(loss()).epsilon(1e-5));
  std::size_t k = 0;
  for (auto& [name, p] : t.agent.actor.named_parameters()) {
    frugal::Tensor g = grads.grad(p);
    for (std::int64_t i = 0; i < p.numel(); ++i) {
      INFO(name << "[" << i << "]");
      CHECK(double(g.data<float>()[i]) == Approx(grad[k][std::size_t(i)]).margin(2e-4).epsilon(2e-3));
    }
    ++k;
  }

  // The actor step: Adam's first update moves each weight by about -lr
  // times the sign of its gradient; the critic's weights stay bit for bit.
  L.actor_step().run(L.s());
  k = 0;
  for (auto& [name, p] : t.agent.actor.named_parameters()) {
    for (std::int64_t i = 0; i < p.numel(); ++i) {
      const double g = grad[k][std::size_t(i)];
      if (std::abs(g) < 1e-4) continue;  // Adam's eps and rounding decide tiny ones
      INFO(name << "[" << i << "] gradient " << g);
      CHECK(double(p.data<float>()[i]) - double(before[k][std::size_t(i)]) ==
            Approx(g > 0 ? -t.h.actor_lr : t.h.actor_lr).epsilon(0.02));
    }
    ++k;
  }
  k = 0;
  for (auto& [name, p] : t.agent.critic.named_parameters()) {
    CHECK(std::memcmp(p.data<float>(), critic_before[k].data(), sizeof(float) * critic_before[k].size()) == 0);
    ++k;
  }
}

TEST_CASE("ddpg: targets follow by Polyak averaging, and the steps read them", "[ddpg]") {
  Tiny t;
  ddpg::Learner& L = *t.learner;
  std::vector<float> online, target;
  for (auto& [n, p] : t.agent.critic.named_parameters()) online.insert(online.end(), p.data<float>(), p.data<float>() + p.numel());
  for (auto& [n, p] : t.agent.critic_target.named_parameters())
    target.insert(target.end(), p.data<float>(), p.data<float>() + p.numel());
  ddpg::soft_update(t.agent.critic_target, t.agent.critic, 0.25);
  std::size_t k = 0;
  for (auto& [n, p] : t.agent.critic_target.named_parameters())
    for (std::int64_t i = 0; i < p.numel(); ++i, ++k)
      CHECK(p.data<float>()[i] == float(0.75 * double(target[k]) + 0.25 * double(online[k])));
  // The critic step's TD target now uses the averaged target critic.
  const float s[4] = {0.5f, -0.2f, -0.7f, 0.9f}, a[2] = {0.3f, -0.8f}, r[2] = {0, 0}, nd[2] = {1, 1};
  for (frugal::Tensor* x : {&L.s(), &L.s2()}) std::memcpy(x->raw(), s, sizeof s);
  std::memcpy(L.a().raw(), a, sizeof a);
  std::memcpy(L.r().raw(), r, sizeof r);
  std::memcpy(L.not_done().raw(), nd, sizeof nd);
  L.targets_changed();
  L.critic_step().run(L.s(), L.a(), L.r(), L.s2(), L.not_done());
  const std::vector<double> s0{s[0], s[1]};
  CHECK(L.critic_step().output(0).data<float>()[0] ==
        Approx(0.9 * Q(t.agent.critic_target, s0, mu(t.agent.actor_target, s0))).epsilon(1e-5));
}

TEST_CASE("ddpg: the adversary poisons the stated fraction, deterministically", "[ddpg]") {
  ddpg::Pendulum env;
  ddpg::Attack attack{0.2, "both", 0.5};
  int poisoned = 0, flipped = 0;
  const int n = 20000;
  for (int t = 0; t < n; ++t) {
    float s[3] = {1, 0, 0}, s2[3] = {1, 0, 0}, r = -1.0f;
    float s_b[3] = {1, 0, 0}, s2_b[3] = {1, 0, 0}, r_b = -1.0f;
    const bool p = attack.apply(5, std::uint64_t(t), env, s, r, s2);
    CHECK(p == attack.apply(5, std::uint64_t(t), env, s_b, r_b, s2_b));
    CHECK(r == r_b);
    poisoned += p;
    if (p && r != -1.0f) {
      ++flipped;
      CHECK(r == float(env.reward_min() + 1.0));  // mirrored in [r_min, 0]
    }
    if (!p) CHECK((r == -1.0f && s[0] == 1 && s2[2] == 0));
  }
  // Binomial(20000, 0.2): standard deviation 57; 5 of them either side.
  CHECK(std::abs(poisoned - 0.2 * n) < 5 * 57);
  CHECK(std::abs(flipped - 0.5 * poisoned) < 5 * std::sqrt(0.25 * poisoned));
}

TEST_CASE("ddpg: the defence filters most poisoned transitions and few clean ones", "[ddpg]") {
  // A pool of 4000 Pendulum transitions under random actions, 20% poisoned
  // (flips and perturbations); the defence scores it without a critic.
  ddpg::Pendulum env;
  ddpg::ReplayBuffer buf(4000, 3, 1);
  ddpg::Attack attack{0.2, "both", 0.5};
  env.reset(11, 0);
  std::int64_t episode = 0;
  for (int t = 0; t < 4000; ++t) {
    float s[3], s2[3], a;
    env.observe(s);
    frugal::Rng rng(11, std::uint64_t(t));
    a = float(rng.uniform(-1, 1));
    ddpg::StepResult res = env.step(&a);
    env.observe(s2);
    float r = float(res.reward);
    const bool p = attack.apply(11, std::uint64_t(t), env, s, r, s2);
    buf.add(s, &a, r, s2, false, p, false);
    if (res.truncated) env.reset(11, std::uint64_t(++episode));
  }
  CHECK(buf.usable_count() == 0);  // nothing is sampled before it is scored
  ddpg::Defence d({32, 4.0, 250});
  ddpg::DefenceReport rep = d.rescore(buf, nullptr, 11, 0);
  const double recall = double(rep.poisoned_filtered) / double(rep.poisoned);
  const double clean_dropped = double(rep.filtered - rep.poisoned_filtered) / double(rep.scored - rep.poisoned);
  INFO("recall " << recall << ", clean transitions dropped " << clean_dropped);
  // Stated bounds, wide of what this pool gives (recall 0.87, clean dropped
  // 0.006 here): at least 60% of the poison, at most 10% of the clean.
  CHECK(recall > 0.6);
  CHECK(clean_dropped < 0.1);
  CHECK(buf.usable_count() == rep.scored - rep.filtered);
  // Deterministic per seed.
  ddpg::DefenceReport again = d.rescore(buf, nullptr, 11, 0);
  CHECK(again.filtered == rep.filtered);
}

}  // namespace
