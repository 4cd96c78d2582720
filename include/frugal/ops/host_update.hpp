#pragma once
// Optimizer offload (ZeRO-Offload): an optimizer update that the host runs
// against optimizer state living in host memory. The state never enters
// the device budget, and the update reads it where it lives instead of
// having it staged into the device arena and written back.
//
// The planner decides which state lives there (plan/offload.hpp): pinned
// by CompileOptions::offload_optimizer, or chosen by the budget solve where
// the budget binds. The arithmetic is the wrapped update's own, so the bits
// are the same wherever the state lives.
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "../graph/op.hpp"
#include "checks.hpp"

namespace frugal::ops {

// Runs `inner` (AdamWUpdate, SgdUpdate, a ShardedUpdate of one, a
// program's own update) on the host; its inputs at `host_inputs` live in
// host memory and are read and written there.
class HostUpdate final : public Op {
 public:
  ~HostUpdate() override;
  HostUpdate(std::shared_ptr<const Op> inner, std::vector<int> host_inputs)
      : inner_(std::move(inner)), host_inputs_(std::move(host_inputs)) {
    if (!inner_) fail("host update: no update op");
    std::sort(host_inputs_.begin(), host_inputs_.end());
    const auto mutated = inner_->mutated_inputs();
    for (int i : host_inputs_)
      if (std::find(mutated.begin(), mutated.end(), i) == mutated.end())
        fail("host update: ", inner_->name(), " does not update its input ", i,
             ", so it is no optimizer state the update could keep on the host");
  }
  const Op& inner() const { return *inner_; }
  std::shared_ptr<const Op> inner_ptr() const { return inner_; }
  const std::vector<int>& host_inputs() const { return host_inputs_; }
  bool reads_on_host(std::size_t input) const {
    return std::binary_search(host_inputs_.begin(), host_inputs_.end(), int(input));
  }
  std::string name() const override { return inner_->name() + "_on_host"; }
  std::vector<TensorMeta> infer(std::span<const TensorMeta> in) const override { return inner_->infer(in); }
  std::vector<int> mutated_inputs() const override { return inner_->mutated_inputs(); }
  Cost cost(std::span<const TensorMeta> in, std::span<const TensorMeta> out) const override {
    return inner_->cost(in, out);
  }

 private:
  std::shared_ptr<const Op> inner_;
  std::vector<int> host_inputs_;
};

}  // namespace frugal::ops
