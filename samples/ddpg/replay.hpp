#pragma once
// The replay buffer, and the adversary that poisons what enters it.
//
// The buffer is a ring of transitions (s, a, r, s', not_done). Each slot
// also records whether the adversary poisoned it (ground truth, used only
// to report how well the defence detects) and whether the defence lets it
// be sampled: with the defence on, a transition waits until the defence has
// scored it (defence.hpp) before any update may draw it.
//
// The attack: each transition entering the buffer is poisoned with
// probability `fraction`, by one of
//   reward flipping   r ← r_min + r_max - r (mirrored in the environment's
//                     reward range: the best steps look worst and back);
//   state perturbation s, s' ← s, s' + σ · scale · N(0, 1) per observation
//                     (σ = 0.5 of the environment's typical magnitude).
// `kind` picks one ("flip", "perturb") or either at random ("both").
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <frugal/frugal.hpp>

#include "envs.hpp"

namespace ddpg {

class ReplayBuffer {
 public:
  ReplayBuffer(std::int64_t capacity, int obs, int act) : cap_(capacity), obs_(obs), act_(act) {
    s_.resize(std::size_t(cap_ * obs));
    s2_.resize(std::size_t(cap_ * obs));
    a_.resize(std::size_t(cap_ * act));
    r_.resize(std::size_t(cap_));
    nd_.resize(std::size_t(cap_));
    poisoned_.resize(std::size_t(cap_));
    usable_.resize(std::size_t(cap_));
  }
  std::int64_t size() const { return size_; }
  std::int64_t capacity() const { return cap_; }
  std::int64_t head() const { return head_; }
  int obs_dim() const { return obs_; }
  int act_dim() const { return act_; }

  // Appends a transition (overwriting the oldest when full); `usable`: may
  // be sampled at once (no defence), or only after scoring.
  std::int64_t add(const float* s, const float* a, float r, const float* s2, bool terminal, bool poisoned,
                   bool usable) {
    const std::int64_t i = head_;
    std::memcpy(&s_[std::size_t(i * obs_)], s, sizeof(float) * std::size_t(obs_));
    std::memcpy(&s2_[std::size_t(i * obs_)], s2, sizeof(float) * std::size_t(obs_));
    std::memcpy(&a_[std::size_t(i * act_)], a, sizeof(float) * std::size_t(act_));
    r_[std::size_t(i)] = r;
    nd_[std::size_t(i)] = terminal ? 0.f : 1.f;
    poisoned_[std::size_t(i)] = poisoned;
    usable_[std::size_t(i)] = usable;
    head_ = (head_ + 1) % cap_;
    size_ = std::min(size_ + 1, cap_);
    return i;
  }

  // Slots an update may draw from.
  std::int64_t usable_count() const {
    std::int64_t n = 0;
    for (std::int64_t i = 0; i < size_; ++i) n += usable_[std::size_t(i)];
    return n;
  }

  // Fills the batch tensors with n transitions drawn uniformly from the
  // usable slots, from the Philox stream of update `update`. Draws by
  // rejection (the usable share is large); false if none is usable.
  bool sample(std::uint64_t seed, std::uint64_t update, float* s, float* a, float* r, float* s2, float* nd,
              std::int64_t n) const {
    if (size_ == 0) return false;
    frugal::Rng rng(seed, kSample + update);
    for (std::int64_t k = 0; k < n; ++k) {
      std::int64_t i = -1;
      for (int tries = 0; tries < 10000 && i < 0; ++tries) {
        const auto j = std::int64_t(rng.below(std::uint64_t(size_)));
        if (usable_[std::size_t(j)]) i = j;
      }
      if (i < 0) return false;
      copy_out(i, s + k * obs_, a + k * act_, r + k, s2 + k * obs_, nd + k);
    }
    return true;
  }
  void copy_out(std::int64_t i, float* s, float* a, float* r, float* s2, float* nd) const {
    std::memcpy(s, &s_[std::size_t(i * obs_)], sizeof(float) * std::size_t(obs_));
    std::memcpy(a, &a_[std::size_t(i * act_)], sizeof(float) * std::size_t(act_));
    std::memcpy(s2, &s2_[std::size_t(i * obs_)], sizeof(float) * std::size_t(obs_));
    *r = r_[std::size_t(i)];
    *nd = nd_[std::size_t(i)];
  }

  const float* s(std::int64_t i) const { return &s_[std::size_t(i * obs_)]; }
  const float* a(std::int64_t i) const { return &a_[std::size_t(i * act_)]; }
  const float* s2(std::int64_t i) const { return &s2_[std::size_t(i * obs_)]; }
  float r(std::int64_t i) const { return r_[std::size_t(i)]; }
  bool poisoned(std::int64_t i) const { return poisoned_[std::size_t(i)]; }
  bool usable(std::int64_t i) const { return usable_[std::size_t(i)]; }
  void set_usable(std::int64_t i, bool u) { usable_[std::size_t(i)] = u; }

  // The whole buffer as tensors, for checkpoints, and back.
  frugal::io::NamedTensors tensors() const {
    frugal::io::NamedTensors out;
    auto f32 = [&](const char* name, const std::vector<float>& v) {
      frugal::Tensor t({std::int64_t(v.size())}, frugal::DType::f32);
      std::copy(v.begin(), v.end(), t.data<float>());
      out.emplace_back(name, t);
    };
    f32("replay.s", s_);
    f32("replay.a", a_);
    f32("replay.r", r_);
    f32("replay.s2", s2_);
    f32("replay.not_done", nd_);
    frugal::Tensor flags({cap_, 2}, frugal::DType::i32);
    for (std::int64_t i = 0; i < cap_; ++i) {
      flags.data<std::int32_t>()[2 * i] = poisoned_[std::size_t(i)];
      flags.data<std::int32_t>()[2 * i + 1] = usable_[std::size_t(i)];
    }
    out.emplace_back("replay.flags", flags);
    frugal::Tensor pos({2}, frugal::DType::i64);
    pos.data<std::int64_t>()[0] = size_;
    pos.data<std::int64_t>()[1] = head_;
    out.emplace_back("replay.position", pos);
    return out;
  }
  void load(const frugal::io::NamedTensors& extra, const std::string& file) {
    auto find = [&](const std::string& name, std::int64_t numel) -> const frugal::Tensor& {
      for (auto& [n, t] : extra)
        if (n == name) {
          if (t.numel() != numel)
            frugal::fail<frugal::DataError>(file, ": '", name, "' has ", t.numel(), " elements, this run's replay buffer ",
                                            numel);
          return t;
        }
      frugal::fail<frugal::DataError>(file, ": no '", name, "' in the checkpoint");
    };
    auto f32 = [&](const char* name, std::vector<float>& v) {
      const frugal::Tensor& t = find(name, std::int64_t(v.size()));
      std::copy(t.data<float>(), t.data<float>() + t.numel(), v.begin());
    };
    f32("replay.s", s_);
    f32("replay.a", a_);
    f32("replay.r", r_);
    f32("replay.s2", s2_);
    f32("replay.not_done", nd_);
    const frugal::Tensor& flags = find("replay.flags", cap_ * 2);
    for (std::int64_t i = 0; i < cap_; ++i) {
      poisoned_[std::size_t(i)] = flags.data<std::int32_t>()[2 * i];
      usable_[std::size_t(i)] = flags.data<std::int32_t>()[2 * i + 1];
    }
    const frugal::Tensor& pos = find("replay.position", 2);
    size_ = pos.data<std::int64_t>()[0];
    head_ = pos.data<std::int64_t>()[1];
    if (size_ < 0 || size_ > cap_ || head_ < 0 || head_ >= cap_)
      frugal::fail<frugal::DataError>(file, ": replay position ", size_, "/", head_, " out of range");
  }

 private:
  std::int64_t cap_, size_ = 0, head_ = 0;
  int obs_, act_;
  std::vector<float> s_, a_, r_, s2_, nd_;
  std::vector<std::uint8_t> poisoned_, usable_;
};

struct Attack {
  double fraction = 0;        // share of transitions poisoned
  std::string kind = "both";  // flip, perturb or both
  double sigma = 0.5;         // perturbation, in units of the observation's scale

  // Poisons (s, r, s') of the transition entering at environment step
  // `step`, or leaves it; returns whether it did. Deterministic per (seed, step).
  bool apply(std::uint64_t seed, std::uint64_t step, const Env& env, float* s, float& r, float* s2) const {
    if (fraction <= 0) return false;
    frugal::Rng rng(seed, kPoison + step);
    if (rng.uniform() >= fraction) return false;
    const bool flip = kind == "flip" || (kind == "both" && rng.uniform() < 0.5);
    if (flip) {
      r = float(env.reward_min() + env.reward_max() - double(r));
    } else {
      const std::vector<float> scale = env.obs_scale();
      for (int j = 0; j < env.obs_dim(); ++j) {
        s[j] += float(sigma * scale[std::size_t(j)] * rng.normal());
        s2[j] += float(sigma * scale[std::size_t(j)] * rng.normal());
      }
    }
    return true;
  }
};

}  // namespace ddpg
