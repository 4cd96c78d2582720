#pragma once
// The non-finite guard's bookkeeping (CompileOptions::skip_non_finite): the
// guard reuses dynamic loss scaling's overflow check and guarded updates
// (ops/loss_scaling.hpp) with a scale fixed at 1, and counts the steps it
// skipped with this op instead of updating a scale.
#include "checks.hpp"
#include "loss_scaling.hpp"

namespace frugal::ops {

// Inputs (stats i64[2], found_inf f32[]); writes stats = {steps skipped so
// far, whether this step was skipped}.
class CountSkippedStep final : public Op {
 public:
  ~CountSkippedStep() override;
  std::string name() const override { return "count_skipped_step"; }
  std::vector<TensorMeta> infer(std::span<const TensorMeta> in) const override {
    expect_arity(name(), in, 2);
    if (in[0].dtype != DType::i64 || in[0].shape.numel() != 2)
      fail<ShapeError>(name(), ": the skip statistics must be i64[2], got ", in[0].str());
    expect_scalar(name(), "found_inf", in[1], DType::f32);
    return {};
  }
  std::vector<int> mutated_inputs() const override { return {0}; }
};

}  // namespace frugal::ops
