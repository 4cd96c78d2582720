#pragma once
// What compile() needs from an optimizer: the parameters it trains, a way to
// append each parameter's update to the captured graph, and a tick per step.
#include <vector>

#include "../graph/var.hpp"

namespace frugal {

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  virtual const std::vector<Tensor>& params() const = 0;
  // Appends the update of params()[index] given its gradient.
  virtual void append_update(Var param, Var grad, std::size_t index) = 0;
  // Called once before each step runs (advances step counters).
  virtual void begin_step() = 0;
};

}  // namespace frugal
