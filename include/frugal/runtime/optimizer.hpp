#pragma once
// What compile() needs from an optimizer: the parameters it trains, a way to
// append each parameter's update to the captured graph, and a tick per step.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "../graph/var.hpp"

namespace frugal {

class Optimizer {
 public:
  Optimizer() = default;
  // A copy is another optimizer, with a life of its own: it gets its own
  // token, and assigning keeps the target's (steps compiled with either
  // still point at the object they were compiled with).
  Optimizer(const Optimizer&) : alive_(std::make_shared<char>()) {}
  Optimizer& operator=(const Optimizer&) { return *this; }
  virtual ~Optimizer() = default;

  // Expires when this optimizer is destroyed. A Step does not own its
  // optimizer (it calls begin_step() on it every run), so it holds this and
  // fails with an error naming the optimizer instead of calling into freed
  // memory when the optimizer went out of scope first.
  std::weak_ptr<const void> liveness() const { return alive_; }
  virtual const std::vector<Tensor>& params() const = 0;
  // Appends the update of params()[index] given its gradient.
  virtual void append_update(Var param, Var grad, std::size_t index) = 0;
  // Called once before each step runs (advances step counters).
  virtual void begin_step() = 0;

  // What the optimizer keeps between steps, for checkpoints. `param` indexes
  // params(), or is kNoParam for optimizer-wide state (the steps-taken
  // counter of guarded updates). The tensors share storage with the ones the
  // compiled steps read and write, so copying into them restores the state.
  static constexpr std::size_t kNoParam = std::size_t(-1);
  struct StateTensor {
    std::size_t param;
    std::string slot;
    Tensor tensor;
  };
  // Only tensors that exist: optimizers create their state when a step is compiled.
  virtual std::vector<StateTensor> state() const { return {}; }
  // "adamw", "sgd": a checkpoint of one kind does not load into another.
  virtual std::string kind() const = 0;
  // The host step count (bias corrections use it), and setting it as a
  // resumed run does.
  virtual std::int64_t steps() const = 0;
  virtual void set_steps(std::int64_t n) = 0;

 private:
  std::shared_ptr<char> alive_ = std::make_shared<char>();
};

}  // namespace frugal
