#pragma once
// The ddpg sample's environments, in plain C++: deterministic per seed (every
// random draw comes from a Philox stream keyed by the seed and the episode),
// with the whole state a vector of doubles, so a checkpoint resumes them
// exactly.
//
//   Pendulum  Gymnasium's Pendulum-v1: swing a pole up and keep it there.
//   Reacher   a planar 2-link arm (point masses at the link ends, no
//             gravity, viscous joint damping) whose fingertip must reach a
//             random target: 10 observations, 2 torques.
//
// Actions are in [-1, 1] per dimension (the actor's tanh); each environment
// scales them to its own torques.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <frugal/core/rng.hpp>

namespace ddpg {

constexpr double kPi = 3.14159265358979323846;

// The Philox streams the sample draws from: one per purpose, offset by a
// counter (episode, step, update), so nothing random carries state.
enum Stream : std::uint64_t {
  kEnvReset = 1ull << 40,
  kExplore = 2ull << 40,
  kWarmupAction = 3ull << 40,
  kSample = 4ull << 40,
  kPoison = 5ull << 40,
  kKmeans = 6ull << 40,
  kEvalReset = 7ull << 40,
  kRandomPolicy = 8ull << 40,
};

struct StepResult {
  double reward = 0;
  bool terminal = false;   // the state is absorbing: no bootstrapping past it
  bool truncated = false;  // the episode ends on its time limit (bootstrapping goes on)
};

class Env {
 public:
  virtual ~Env() = default;
  virtual std::string name() const = 0;
  virtual int obs_dim() const = 0;
  virtual int act_dim() const = 0;
  virtual int episode_steps() const = 0;
  // Starts episode `episode` of the run seeded `seed`: the same pair always
  // gives the same start.
  virtual void reset(std::uint64_t seed, std::uint64_t episode) = 0;
  // One step with actions in [-1, 1] (clipped).
  virtual StepResult step(const float* action) = 0;
  virtual void observe(float* obs) const = 0;
  // The least and largest reward a step can give (reward flipping mirrors in it).
  virtual double reward_min() const = 0;
  virtual double reward_max() const = 0;
  // A typical magnitude per observation (state perturbation scales by it).
  virtual std::vector<float> obs_scale() const = 0;
  // The whole state, for checkpoints.
  virtual std::vector<double> state() const = 0;
  virtual void set_state(const std::vector<double>& s) = 0;
  int t() const { return t_; }

 protected:
  int t_ = 0;  // steps into the episode
};

inline double clip(double x, double lo, double hi) { return std::min(std::max(x, lo), hi); }
inline double angle_normalize(double x) { return std::fmod(std::fmod(x + kPi, 2 * kPi) + 2 * kPi, 2 * kPi) - kPi; }

// Gymnasium's Pendulum-v1, step for step: g = 10, m = l = 1, dt = 0.05,
// torque in [-2, 2], speed in [-8, 8], reward -(θ² + 0.1 θ̇² + 0.001 u²)
// with θ normalised to [-π, π), 200-step episodes from θ ~ U[-π, π],
// θ̇ ~ U[-1, 1]; observation (cos θ, sin θ, θ̇). Never terminal.
class Pendulum final : public Env {
 public:
  static constexpr double g = 10, m = 1, l = 1, dt = 0.05, max_torque = 2, max_speed = 8;
  std::string name() const override { return "pendulum"; }
  int obs_dim() const override { return 3; }
  int act_dim() const override { return 1; }
  int episode_steps() const override { return 200; }
  void reset(std::uint64_t seed, std::uint64_t episode) override {
    frugal::Rng rng(seed, kEnvReset + episode);
    th = rng.uniform(-kPi, kPi);
    thdot = rng.uniform(-1, 1);
    t_ = 0;
  }
  StepResult step(const float* action) override {
    const double u = clip(double(action[0]), -1, 1) * max_torque;
    const double th_n = angle_normalize(th);
    const double cost = th_n * th_n + 0.1 * thdot * thdot + 0.001 * u * u;
    double newthdot = thdot + (3 * g / (2 * l) * std::sin(th) + 3.0 / (m * l * l) * u) * dt;
    newthdot = clip(newthdot, -max_speed, max_speed);
    th = th + newthdot * dt;
    thdot = newthdot;
    ++t_;
    return {-cost, false, t_ >= episode_steps()};
  }
  void observe(float* obs) const override {
    obs[0] = float(std::cos(th));
    obs[1] = float(std::sin(th));
    obs[2] = float(thdot);
  }
  double reward_min() const override {
    return -(kPi * kPi + 0.1 * max_speed * max_speed + 0.001 * max_torque * max_torque);
  }
  double reward_max() const override { return 0; }
  std::vector<float> obs_scale() const override { return {1, 1, float(max_speed)}; }
  std::vector<double> state() const override { return {th, thdot, double(t_)}; }
  void set_state(const std::vector<double>& s) override {
    if (s.size() != 3) throw std::invalid_argument("pendulum: a state has 3 numbers");
    th = s[0], thdot = s[1], t_ = int(s[2]);
  }

  double th = 0, thdot = 0;
};

// A planar 2-link arm in the horizontal plane (no gravity): point masses m1,
// m2 at the ends of links l1, l2, joint torques τ = max_torque · a, viscous
// damping b at each joint. With q = (q1, q2), c2 = cos q2, s2 = sin q2:
//   M(q) = [[(m1+m2) l1² + m2 l2² + 2 m2 l1 l2 c2,  m2 l2² + m2 l1 l2 c2],
//           [m2 l2² + m2 l1 l2 c2,                  m2 l2²             ]]
//   M q̈ = τ - b q̇ - h,  h = m2 l1 l2 s2 · (-(2 q̇1 q̇2 + q̇2²), q̇1²)
// integrated by semi-implicit Euler (q̇ first, speeds clipped to
// ±max_speed, then q with the new q̇), dt = 0.02, 100-step episodes. The
// target is uniform in the disc of radius l1 + l2; the arm starts at
// q ~ U[-0.1, 0.1]², q̇ ~ U[-0.005, 0.005]² (as Gymnasium's Reacher).
// Reward: -(distance from fingertip to target)/(l1 + l2) - 0.01 |a|².
// Observation: cos q1, cos q2, sin q1, sin q2, target (x, y), q̇ / 10,
// fingertip - target (x, y), positions in units of l1 + l2.
class Reacher final : public Env {
 public:
  static constexpr double m1 = 1, m2 = 1, l1 = 0.1, l2 = 0.1, b = 0.01, max_torque = 0.1, max_speed = 10,
                          dt = 0.02;
  std::string name() const override { return "reacher"; }
  int obs_dim() const override { return 10; }
  int act_dim() const override { return 2; }
  int episode_steps() const override { return 100; }
  void reset(std::uint64_t seed, std::uint64_t episode) override {
    frugal::Rng rng(seed, kEnvReset + episode);
    q1 = rng.uniform(-0.1, 0.1);
    q2 = rng.uniform(-0.1, 0.1);
    w1 = rng.uniform(-0.005, 0.005);
    w2 = rng.uniform(-0.005, 0.005);
    const double r = (l1 + l2) * std::sqrt(rng.uniform()), phi = rng.uniform(-kPi, kPi);
    tx = r * std::cos(phi);
    ty = r * std::sin(phi);
    t_ = 0;
  }
  // Joint accelerations at (q2, q̇1, q̇2) under torques (u1, u2).
  static void accelerations(double q2, double w1, double w2, double u1, double u2, double& a1, double& a2) {
    const double c2 = std::cos(q2), s2 = std::sin(q2);
    const double M11 = (m1 + m2) * l1 * l1 + m2 * l2 * l2 + 2 * m2 * l1 * l2 * c2;
    const double M12 = m2 * l2 * l2 + m2 * l1 * l2 * c2, M22 = m2 * l2 * l2;
    const double h = m2 * l1 * l2 * s2;
    const double f1 = u1 - b * w1 + h * (2 * w1 * w2 + w2 * w2);
    const double f2 = u2 - b * w2 - h * w1 * w1;
    const double det = M11 * M22 - M12 * M12;
    a1 = (M22 * f1 - M12 * f2) / det;
    a2 = (M11 * f2 - M12 * f1) / det;
  }
  StepResult step(const float* action) override {
    const double a0 = clip(double(action[0]), -1, 1), a1c = clip(double(action[1]), -1, 1);
    double acc1, acc2;
    accelerations(q2, w1, w2, max_torque * a0, max_torque * a1c, acc1, acc2);
    w1 = clip(w1 + dt * acc1, -max_speed, max_speed);
    w2 = clip(w2 + dt * acc2, -max_speed, max_speed);
    q1 += dt * w1;
    q2 += dt * w2;
    ++t_;
    const double reward = -distance() / (l1 + l2) - 0.01 * (a0 * a0 + a1c * a1c);
    return {reward, false, t_ >= episode_steps()};
  }
  double tip_x() const { return l1 * std::cos(q1) + l2 * std::cos(q1 + q2); }
  double tip_y() const { return l1 * std::sin(q1) + l2 * std::sin(q1 + q2); }
  double distance() const { return std::hypot(tip_x() - tx, tip_y() - ty); }
  void observe(float* obs) const override {
    const double L = l1 + l2;
    obs[0] = float(std::cos(q1));
    obs[1] = float(std::cos(q2));
    obs[2] = float(std::sin(q1));
    obs[3] = float(std::sin(q2));
    obs[4] = float(tx / L);
    obs[5] = float(ty / L);
    obs[6] = float(w1 / 10);
    obs[7] = float(w2 / 10);
    obs[8] = float((tip_x() - tx) / L);
    obs[9] = float((tip_y() - ty) / L);
  }
  double reward_min() const override { return -2.0 - 0.02; }  // the far side of the reach, full torques
  double reward_max() const override { return 0; }
  std::vector<float> obs_scale() const override { return {1, 1, 1, 1, 0.5f, 0.5f, 0.5f, 0.5f, 1, 1}; }
  // Kinetic energy ½ q̇ᵀ M q̇ (conserved without torque and damping).
  double kinetic_energy() const {
    const double c2 = std::cos(q2);
    const double M11 = (m1 + m2) * l1 * l1 + m2 * l2 * l2 + 2 * m2 * l1 * l2 * c2;
    const double M12 = m2 * l2 * l2 + m2 * l1 * l2 * c2, M22 = m2 * l2 * l2;
    return 0.5 * (M11 * w1 * w1 + 2 * M12 * w1 * w2 + M22 * w2 * w2);
  }
  std::vector<double> state() const override { return {q1, q2, w1, w2, tx, ty, double(t_)}; }
  void set_state(const std::vector<double>& s) override {
    if (s.size() != 7) throw std::invalid_argument("reacher: a state has 7 numbers");
    q1 = s[0], q2 = s[1], w1 = s[2], w2 = s[3], tx = s[4], ty = s[5], t_ = int(s[6]);
  }

  double q1 = 0, q2 = 0, w1 = 0, w2 = 0, tx = 0.1, ty = 0;
};

inline std::unique_ptr<Env> make_env(const std::string& name) {
  if (name == "pendulum") return std::make_unique<Pendulum>();
  if (name == "reacher") return std::make_unique<Reacher>();
  return nullptr;
}

}  // namespace ddpg
