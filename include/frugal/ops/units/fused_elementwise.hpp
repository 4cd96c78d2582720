#pragma once
// Compiled once per program (frugal_add_kernels, or <frugal/kernels.hpp>):
// the fused elementwise op's members.
#include "../all.hpp"
#include "../fused_elementwise.hpp"

namespace frugal::ops {

std::shared_ptr<const Op> unfused_op(const FusedFn& fn) {
  return std::visit(
      [](const auto& f) -> std::shared_ptr<const Op> {
        using F = std::decay_t<decltype(f)>;
        if constexpr (fused_arity<F> == 1) return std::make_shared<Unary<F>>(f);
        else if constexpr (fused_arity<F> == 2) return std::make_shared<Binary<F>>();
        else return std::make_shared<UnaryGrad<decltype(f.f)>>(f.f);
      },
      fn);
}

FusedElementwise::FusedElementwise(FusedProgram p) : p_(std::move(p)) {
  if (p_.inputs < 1 || p_.inputs > FusedProgram::kMaxInputs)
    fail("fused_elementwise: ", p_.inputs, " inputs (1 to ", FusedProgram::kMaxInputs, " are supported)");
  if (p_.steps.empty() || int(p_.steps.size()) > FusedProgram::kMaxSteps)
    fail("fused_elementwise: ", p_.steps.size(), " steps (1 to ", FusedProgram::kMaxSteps, " are supported)");
  if (p_.outputs.empty() || int(p_.outputs.size()) > FusedProgram::kMaxOutputs)
    fail("fused_elementwise: ", p_.outputs.size(), " outputs (1 to ", FusedProgram::kMaxOutputs, " are supported)");
  name_ = "fused(";
  for (std::size_t s = 0; s < p_.steps.size(); ++s) {
    const FusedStep& st = p_.steps[s];
    for (int k = 0; k < arity_of(st.fn); ++k)
      if (st.args[std::size_t(k)] < 0 || st.args[std::size_t(k)] >= p_.inputs + int(s))
        fail("fused_elementwise: step ", s, " reads slot ", st.args[std::size_t(k)], ", which is not computed before it");
    name_ += cat(s ? "+" : "", unfused_op(st.fn)->name());
  }
  name_ += ")";
  for (int o : p_.outputs)
    if (o < p_.inputs || o >= p_.slots())
      fail("fused_elementwise: output slot ", o, " is not a step's result (steps write slots ", p_.inputs, " to ",
           p_.slots() - 1, ")");
}

FusedElementwise::~FusedElementwise() = default;

std::vector<TensorMeta> FusedElementwise::infer(std::span<const TensorMeta> in) const {
  expect_arity(name(), in, std::size_t(p_.inputs));
  expect_float_storage(name(), in[0]);
  Shape out = in[0].shape;
  for (std::size_t i = 1; i < in.size(); ++i) {
    expect_same_dtype(name(), in[0], in[i]);
    auto b = broadcast_shapes(out, in[i].shape);
    if (!b)
      fail<ShapeError>(name(), ": input ", i, " of shape ", in[i].shape.str(), " does not broadcast to ", out.str());
    out = *b;
  }
  return std::vector<TensorMeta>(p_.outputs.size(), TensorMeta{in[0].dtype, out});
}

std::vector<std::optional<Var>> FusedElementwise::backward(const BackwardArgs& a) const {
  const int n = p_.slots();
  std::vector<std::optional<Var>> slot(static_cast<std::size_t>(n)), dslot(static_cast<std::size_t>(n));
  for (int i = 0; i < p_.inputs; ++i) slot[std::size_t(i)] = a.inputs[std::size_t(i)];
  for (std::size_t o = 0; o < p_.outputs.size(); ++o) {
    slot[std::size_t(p_.outputs[o])] = a.outputs[o];
    dslot[std::size_t(p_.outputs[o])] = a.grad_outputs[o];
  }
  std::vector<std::shared_ptr<const Op>> ops;
  for (std::size_t s = 0; s < p_.steps.size(); ++s) {
    const FusedStep& st = p_.steps[s];
    ops.push_back(unfused_op(st.fn));
    auto& v = slot[std::size_t(p_.inputs) + s];
    if (v) continue;  // an output: the node stored it
    std::vector<Var> args;
    for (int k = 0; k < arity_of(st.fn); ++k) args.push_back(*slot[std::size_t(st.args[std::size_t(k)])]);
    v = frugal::apply(ops.back(), std::move(args)).at(0);
  }
  for (int s = int(p_.steps.size()) - 1; s >= 0; --s) {
    const FusedStep& st = p_.steps[std::size_t(s)];
    auto& g = dslot[std::size_t(p_.inputs + s)];
    if (!g) continue;
    std::vector<Var> args;
    for (int k = 0; k < arity_of(st.fn); ++k) args.push_back(*slot[std::size_t(st.args[std::size_t(k)])]);
    std::vector<Var> outs{*slot[std::size_t(p_.inputs + s)]};
    std::vector<std::optional<Var>> gouts{g};
    auto gin = ops[std::size_t(s)]->backward({args, outs, gouts});
    for (int k = 0; k < arity_of(st.fn); ++k) {
      if (!gin[std::size_t(k)]) continue;
      auto& acc = dslot[std::size_t(st.args[std::size_t(k)])];
      acc = acc ? *acc + *gin[std::size_t(k)] : *gin[std::size_t(k)];
    }
  }
  return {dslot.begin(), dslot.begin() + p_.inputs};
}

}  // namespace frugal::ops
