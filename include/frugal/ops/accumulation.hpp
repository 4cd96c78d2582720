#pragma once
// Gradient accumulation (CompileOptions::accumulate = k): each run of the
// step is one micro-batch; its gradients are added into accumulators that
// live across runs, and every k-th run averages them over the k micro-batches
// and applies the update. The runs in between skip the update, its
// collectives and its count of steps taken, through the same guard a loss
// scaler's overflow uses.
#include <memory>
#include <string>

#include "../graph/capture.hpp"
#include "checks.hpp"
#include "loss_scaling.hpp"

namespace frugal::ops {

// (anchor) -> f32 scalar: 1 on runs that only accumulate, 0 on every k-th
// (KernelArgs::step, the runs before this one, is k - 1 modulo k). The
// anchor (the loss) is read only for its place in the graph.
class MicroStepSkip final : public Op {
 public:
  ~MicroStepSkip() override;
  explicit MicroStepSkip(int k) : k_(k) {
    if (k < 1) fail("micro_step_skip: ", k, " micro-steps per update; give 1 or more");
  }
  int micro_steps() const { return k_; }
  std::string name() const override { return "micro_step_skip"; }
  std::vector<TensorMeta> infer(std::span<const TensorMeta> in) const override {
    expect_arity(name(), in, 1);
    return {{DType::f32, Shape{}}};
  }

 private:
  int k_;
};

// (g, accumulator, skip) -> total. Where skip is set: accumulator += g, and
// total is zero (the update and collectives that read it skip too). Else
// total = (accumulator + g) / k, the mean over the k micro-batches, and the
// accumulator is zeroed for the next update. Writes the accumulator.
class AccumulateGradient final : public Op {
 public:
  ~AccumulateGradient() override;
  explicit AccumulateGradient(int k) : k_(k) {
    if (k < 2) fail("accumulate_gradient: ", k, " micro-steps per update; accumulating needs 2 or more");
  }
  int micro_steps() const { return k_; }
  std::string name() const override { return "accumulate_gradient"; }
  std::vector<TensorMeta> infer(std::span<const TensorMeta> in) const override {
    expect_arity(name(), in, 3);
    expect_floating(name(), in[0]);
    if (in[1].dtype != in[0].dtype || in[1].shape != in[0].shape)
      fail<ShapeError>(name(), ": the gradient ", in[0].str(), " and its accumulator ", in[1].str(), " differ");
    expect_scalar(name(), "the skip flag", in[2], DType::f32);
    return {in[0]};
  }
  std::vector<int> mutated_inputs() const override { return {1}; }

 private:
  int k_;
};

}  // namespace frugal::ops
