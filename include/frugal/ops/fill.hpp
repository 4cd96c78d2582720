#pragma once
#include "cast.hpp"

namespace frugal::ops {

// A tensor of one constant value, shaped like its input (whose data it never
// reads). Autograd seeds the backward sweep with fill_like(loss, 1).
class FillLike final : public Op {
 public:
  ~FillLike() override;
  explicit FillLike(double value) : value_(value) {}
  double value() const { return value_; }
  std::string name() const override { return "fill_like"; }
  std::vector<TensorMeta> infer(std::span<const TensorMeta> in) const override {
    expect_arity(name(), in, 1);
    expect_float_storage(name(), in[0]);
    return {in[0]};
  }
  std::vector<std::optional<Var>> backward(const BackwardArgs&) const override { return {std::nullopt}; }

 private:
  double value_;
};

}  // namespace frugal::ops

namespace frugal {
inline Var fill_like(Var x, double value) { return apply1<ops::FillLike>({x}, value); }
}  // namespace frugal
