#pragma once
// Parameter groups, as PyTorch's optimizer param_groups: each group of
// parameters has its own hyperparameters (no weight decay on norms and
// biases, a smaller learning rate for a pretrained trunk). A group names
// only what differs from the optimizer's defaults:
//
//   optim::AdamW opt({{decay, {.weight_decay = 0.1}}, {no_decay, {.weight_decay = 0}}}, {.lr = 1e-3});
//   opt.set_lr(2e-3);      // every group, as a scheduler would
//   opt.set_lr(1, 5e-4);   // group 1 only
//
// And what a learning-rate scheduler (optim/lr_scheduler.hpp) drives: each
// group's learning rate and momentum (SGD's momentum, AdamW's beta1), read
// by the update ops when they run, so changing them needs no recompilation.
#include <cstddef>
#include <vector>

#include "../core/tensor.hpp"

namespace frugal::optim {

// `Overrides` holds std::optional fields: an unset one takes the default.
template <class Overrides>
struct ParamGroup {
  std::vector<Tensor> params;
  Overrides options{};
};

// Fails unless every tensor appears in one group at most (PyTorch's rule).
template <class Group>
std::vector<Tensor> flatten_groups(const std::vector<Group>& groups, const char* who) {
  std::vector<Tensor> all;
  for (std::size_t g = 0; g < groups.size(); ++g)
    for (const Tensor& t : groups[g].params) {
      for (const Tensor& seen : all)
        if (seen.raw() == t.raw()) fail(who, ": a parameter appears in more than one parameter group (again in group ", g, ")");
      all.push_back(t);
    }
  return all;
}

class ScheduledOptimizer {
 public:
  virtual ~ScheduledOptimizer() = default;
  virtual std::size_t num_groups() const = 0;
  virtual double group_lr(std::size_t group) const = 0;
  virtual void set_group_lr(std::size_t group, double lr) = 0;
  // SGD's momentum, AdamW's beta1 (what OneCycleLR cycles).
  virtual double group_momentum(std::size_t group) const = 0;
  virtual void set_group_momentum(std::size_t group, double momentum) = 0;
};

}  // namespace frugal::optim
