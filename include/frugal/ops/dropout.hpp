#pragma once
// Inverted dropout: y = x * keep / (1 - p), keep ~ Bernoulli(1 - p), with
// the mask drawn from counter-based Philox keyed by (op key, step, element).
//
// The op carries a 64-bit key fixed at capture; the step counter comes from
// the executor (KernelArgs::step). So the same op in the same step always
// draws the same mask: a recomputed dropout reproduces it, and the backward
// regenerates it instead of storing it.
//
// Trade-off of regenerating: storing the mask would keep N bytes (or N/8 as
// bits) alive from the forward to the backward, per dropout, at the memory
// peak; regenerating costs one Philox block per 4 elements again in the
// backward (a few ns per element), and no memory. Under a memory budget the
// memory is what is scarce, and the recomputation is what makes activation
// recomputation of a dropout exact, so frugal regenerates.
#include "../core/rng.hpp"
#include "checks.hpp"

namespace frugal::ops {

// Which elements a dropout keeps. Element i of a step draws 32 bits, word
// i % 4 of the Philox block at counter (hi = step, lo = i / 4) under the op's
// key; it is kept when the bits are >= floor(p * 2^32), so it is dropped with
// probability floor(p * 2^32) / 2^32 (p to within 2.4e-10).
struct DropoutMask {
  Philox philox;
  std::uint32_t threshold;
  FRUGAL_HD DropoutMask(std::uint64_t key, double p)
      : philox(key), threshold(p <= 0 ? 0u : std::uint32_t(p * 4294967296.0)) {}
  // The four keep flags of elements 4*group .. 4*group+3 of step `step`.
  FRUGAL_HD Philox::Block bits(std::uint64_t step, std::uint64_t group) const { return philox(step, group); }
  FRUGAL_HD bool keep(std::uint32_t bits) const { return bits >= threshold; }
};

inline void check_dropout_p(double p) {
  if (!(p >= 0 && p <= 1)) fail("dropout: the drop probability must be in [0, 1], got ", p);
}

// The op and its backward are the same map (y = x * mask / (1 - p)), so one
// class serves both; `grad` only changes its name.
class DropoutOp : public Op {
 public:
  ~DropoutOp() override;
  DropoutOp(double p, std::uint64_t key) : p_(p), key_(key) { check_dropout_p(p); }
  double p() const { return p_; }
  std::uint64_t key() const { return key_; }
  std::vector<TensorMeta> infer(std::span<const TensorMeta> in) const override {
    expect_arity(name(), in, 1);
    expect_any_floating(name(), in[0]);  // bf16/f16: scaled in f32, rounded once
    return {in[0]};
  }
  Cost cost(std::span<const TensorMeta> in, std::span<const TensorMeta> out) const override {
    return {20.0 * double(in[0].shape.numel()), double(in[0].nbytes() + out[0].nbytes())};
  }
  std::vector<int> inplace_inputs() const override { return {0}; }

 private:
  double p_;
  std::uint64_t key_;
};

// Inputs (dy) -> dx = dy * mask / (1 - p), the forward's mask regenerated.
class DropoutGrad final : public DropoutOp {
 public:
  ~DropoutGrad() override;
  using DropoutOp::DropoutOp;
  std::string name() const override { return "dropout_grad"; }
  std::vector<std::optional<Var>> backward(const BackwardArgs& a) const override {
    return {apply1<DropoutGrad>({*a.grad_outputs[0]}, p(), key())};
  }
};

class Dropout final : public DropoutOp {
 public:
  ~Dropout() override;
  using DropoutOp::DropoutOp;
  std::string name() const override { return "dropout"; }
  std::vector<std::optional<Var>> backward(const BackwardArgs& a) const override {
    return {apply1<DropoutGrad>({*a.grad_outputs[0]}, p(), key())};
  }
};

}  // namespace frugal::ops

namespace frugal {
// Dropout with an explicit key: two calls with the same key draw the same
// mask in a step. nn/dropout.hpp's dropout(x, p, training) chooses keys from
// the global seed; this is for code that manages its own.
inline Var dropout_with_key(Var x, double p, std::uint64_t key) {
  ops::check_dropout_p(p);
  if (p == 0) return x;
  return apply1<ops::Dropout>({x}, p, key);
}
}  // namespace frugal
