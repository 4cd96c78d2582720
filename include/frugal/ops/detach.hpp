#pragma once
// detach(x): x itself, through which no gradient flows (torch.detach). A
// view: the output shares x's memory (Op::is_view), so it costs no bytes
// and no copy.
#include "cast.hpp"

namespace frugal::ops {

class Detach final : public Op {
 public:
  ~Detach() override;
  std::string name() const override { return "detach"; }
  std::vector<TensorMeta> infer(std::span<const TensorMeta> in) const override {
    expect_arity(name(), in, 1);
    return {in[0]};
  }
  std::vector<std::optional<Var>> backward(const BackwardArgs&) const override { return {std::nullopt}; }
  bool is_view() const override { return true; }  // and so costs nothing (Op::cost)
};

}  // namespace frugal::ops

namespace frugal {
inline Var detach(Var x) { return apply1<ops::Detach>({x}); }
}  // namespace frugal
