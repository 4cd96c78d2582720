#pragma once
// Conversions between the floating dtypes, and the dtype rules of mixed
// precision.
//
// f32 and f64 are compute types. bf16 and f16 are storage types: a tensor
// holds them, a kernel reads them into f32, computes in f32 and rounds the
// result on store (round to nearest even, core/half.hpp). The ops that
// accept them: cast, the elementwise unary and binary ops, sum/mean and
// broadcast_to, matmul and linear (f32 accumulation), softmax and
// log_softmax (computed in f32), and cross_entropy, whose loss is f32 for
// bf16/f16 logits (as under PyTorch's autocast, which runs softmax and
// cross-entropy in f32): a loss in 16 bits would round away the small
// changes training looks for.
//
// The training pattern: parameters and optimizer state in f32 (the master
// weights), `cast(w, DType::bf16)` inside the forward, activations in bf16.
// The cast's backward casts the gradient back, so the optimizer sees f32
// gradients for its f32 parameters. frugal::linear does this cast by itself
// when its input is bf16/f16 and its weight f32 (ops/matmul.hpp).
#include <cmath>

#include "../core/half.hpp"
#include "checks.hpp"

namespace frugal {

namespace math {

// A double rounded to float with round-to-odd: truncated toward zero, and
// the last bit set when anything was cut off. Rounding that float once more
// to a type at least two bits narrower (bf16: 8 bits, f16: 11, float: 24)
// gives the correctly rounded result of the double, so f64 -> bf16/f16 rounds
// once, as PyTorch's direct conversion does, not twice.
FRUGAL_HD float round_to_odd_float(double d) {
  float f = float(d);
  std::uint32_t u = detail::float_bits(f);
  if (::fabs(double(f)) > ::fabs(d)) u -= 1;  // rounded away from zero: step back (inf -> FLT_MAX)
  f = detail::bits_float(u);
  if (double(f) != d) u |= 1u;  // inexact (or NaN, which stays NaN)
  return detail::bits_float(u);
}

// convert<To>(x): the value x in type To, rounded to nearest even once.
template <class To, class From>
FRUGAL_HD To convert(From x) {
  if constexpr (std::is_same_v<To, From>) {
    return x;
  } else if constexpr (std::is_same_v<From, double> && (std::is_same_v<To, BFloat16> || std::is_same_v<To, Half>)) {
    return To(round_to_odd_float(x));
  } else if constexpr (std::is_same_v<From, BFloat16> || std::is_same_v<From, Half>) {
    return convert<To>(static_cast<float>(x));  // exact: float holds every bf16 and f16 value
  } else {
    return static_cast<To>(x);  // float <-> double, float -> bf16/f16 (core/half.hpp rounds)
  }
}

// The elementwise functor of the cast op, for any backend.
template <class To>
struct ConvertTo {
  template <class From>
  FRUGAL_HD To operator()(From x) const {
    return convert<To>(x);
  }
};

}  // namespace math

namespace ops {

// f32, f64, bf16 or f16: checks.hpp's expect_any_floating, under the name
// the elementwise ops have always used.
inline void expect_float_storage(const std::string& op, const TensorMeta& m) { expect_any_floating(op, m); }

// y = x converted to dtype `to`; the backward converts the gradient back to
// x's dtype.
class Cast final : public Op {
 public:
  ~Cast() override;
  explicit Cast(DType to) : to_(to) {}
  DType to() const { return to_; }
  std::string name() const override { return "cast"; }
  std::vector<TensorMeta> infer(std::span<const TensorMeta> in) const override {
    expect_arity(name(), in, 1);
    expect_float_storage(name(), in[0]);
    if (!is_floating(to_))
      fail<ShapeError>("cast: cannot cast ", in[0].str(), " to ", dtype_name(to_),
                       " (cast converts between f32, f64, bf16 and f16)");
    return {{to_, in[0].shape}};
  }
  inline std::vector<std::optional<Var>> backward(const BackwardArgs& a) const override;
  Cost cost(std::span<const TensorMeta> in, std::span<const TensorMeta> out) const override {
    return {double(in[0].shape.numel()), double(in[0].nbytes() + out[0].nbytes())};
  }

 private:
  DType to_;
};

}  // namespace ops

// x as dtype `to`; x itself when it already has that dtype.
inline Var cast(Var x, DType to) {
  if (x.dtype() == to) return x;
  return apply1<ops::Cast>({x}, to);
}

inline std::vector<std::optional<Var>> ops::Cast::backward(const BackwardArgs& a) const {
  return {cast(*a.grad_outputs[0], a.inputs[0].dtype())};
}

}  // namespace frugal
