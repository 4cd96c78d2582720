#pragma once
// A chain of elementwise ops merged into one node (ops/fusion.hpp makes
// them): a small program of functor applications over register slots. Slots
// 0..inputs-1 hold the node's inputs (broadcast to the output's shape); step
// s writes slot inputs+s from earlier slots; `outputs` names the slots the
// node stores. Only those exist in memory: every other slot lives in
// registers (a block of them on the CPU), so the chain's intermediate
// activations never take arena bytes.
//
// The per-element math is the functors of elementwise_math.hpp and gelu.hpp
// (FRUGAL_HD), applied in the order the unfused ops applied them. A backend
// that rounds every step's result to the storage type, as the unfused
// kernels round each op's output, computes the unfused bits exactly.
#include <array>
#include <variant>

#include "binary.hpp"
#include "gelu.hpp"
#include "unary.hpp"

namespace frugal::ops {

// A unary functor's gradient as a three-operand function: (x, y, dy) -> dx,
// as UnaryGrad<F> computes it.
template <class F>
struct GradOf {
  F f;
  template <class T>
  FRUGAL_HD T operator()(T x, T y, T dy) const {
    return f.grad(x, y, dy);
  }
};

using FusedFn = std::variant<math::Relu, math::GeluTanh, math::GeluErf, math::GeluErfPoly, math::Tanh, math::Sigmoid,
                             math::Exp, math::Log, math::Rsqrt, math::Affine, GradOf<math::Relu>,
                             GradOf<math::GeluTanh>, GradOf<math::GeluErf>, GradOf<math::GeluErfPoly>,
                             GradOf<math::Tanh>, GradOf<math::Sigmoid>, GradOf<math::Exp>, GradOf<math::Log>,
                             GradOf<math::Rsqrt>, GradOf<math::Affine>, math::Add, math::Sub, math::Mul, math::Div>;

template <class F>
inline constexpr int fused_arity = requires(const F& f, float x) { f(x, x, x); } ? 3
                                   : requires(const F& f, float x) { f(x, x); } ? 2
                                                                               : 1;

inline int arity_of(const FusedFn& fn) {
  return std::visit([](const auto& f) { return fused_arity<std::decay_t<decltype(f)>>; }, fn);
}

// A step's exp, log, tanh... evaluations per element (Cost::transcendentals).
template <class F>
constexpr double fused_transcendentals(const F&) {
  return math::transcendentals_of<F>();
}
template <class F>
constexpr double fused_transcendentals(const GradOf<F>&) {
  return math::grad_transcendentals_of<F>();
}

struct FusedStep {
  FusedFn fn;
  std::array<int, 3> args{-1, -1, -1};  // operand slots; the first arity_of(fn) are used
};

struct FusedProgram {
  // Limits that keep a CPU block of slots on the stack (kernels must not
  // allocate while a step runs).
  static constexpr int kMaxInputs = 8, kMaxSteps = 16, kMaxOutputs = 8;
  int inputs = 0;
  std::vector<FusedStep> steps;
  std::vector<int> outputs;  // slots stored, one per node output
  int slots() const { return inputs + int(steps.size()); }
};

// The unfused op that computes one step (for the backward, and for names).
std::shared_ptr<const Op> unfused_op(const FusedFn& fn);

class FusedElementwise final : public Op {
 public:
  explicit FusedElementwise(FusedProgram p);
  ~FusedElementwise() override;
  const FusedProgram& program() const { return p_; }
  std::string name() const override { return name_; }
  std::vector<TensorMeta> infer(std::span<const TensorMeta> in) const override;
  // The chain's own backward, op by op: the steps whose slot is not an
  // output are recomputed from the inputs (so a fused-away activation is
  // never kept for the backward), then each step's unfused op differentiates
  // itself and contributions are summed, as autograd would.
  std::vector<std::optional<Var>> backward(const BackwardArgs& a) const override;
  Cost cost(std::span<const TensorMeta> in, std::span<const TensorMeta> out) const override {
    double bytes = 0;
    for (auto& m : in) bytes += double(m.nbytes());
    for (auto& m : out) bytes += double(m.nbytes());
    double per_element = 0;
    for (const FusedStep& st : p_.steps)
      per_element += std::visit([](const auto& f) { return fused_transcendentals(f); }, st.fn);
    const double n = double(out[0].shape.numel());
    return {double(p_.steps.size()) * n, bytes, per_element * n};
  }
  // A CPU block reads every input before it stores any output, so any
  // input of the output's shape (the planner checks) may be overwritten.
  std::vector<int> inplace_inputs() const override {
    std::vector<int> all(std::size_t(p_.inputs));
    std::iota(all.begin(), all.end(), 0);
    return all;
  }

 private:
  FusedProgram p_;
  std::string name_;
};

}  // namespace frugal::ops
