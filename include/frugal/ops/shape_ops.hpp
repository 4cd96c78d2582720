#pragma once
// Ops that move data without arithmetic: reshape and permute.
#include <algorithm>
#include <numeric>

#include "checks.hpp"

namespace frugal::ops {

// Reshape to `shape`; one dimension may be -1 and is inferred.
class Reshape final : public Op {
 public:
  ~Reshape() override;
  explicit Reshape(std::vector<std::int64_t> dims) : dims_(std::move(dims)) {}
  std::string name() const override { return "reshape"; }
  std::vector<TensorMeta> infer(std::span<const TensorMeta> in) const override {
    expect_arity(name(), in, 1);
    return {{in[0].dtype, resolve(in[0].shape)}};
  }
  inline std::vector<std::optional<Var>> backward(const BackwardArgs& a) const override;
  bool is_view() const override { return true; }
  Shape resolve(const Shape& from) const {
    std::vector<std::int64_t> d = dims_;
    int infer_at = -1;
    std::int64_t known = 1;
    for (int i = 0; i < int(d.size()); ++i) {
      if (d[std::size_t(i)] == -1) {
        if (infer_at >= 0) fail<ShapeError>("reshape: more than one -1 in the target shape");
        infer_at = i;
      } else {
        known *= d[std::size_t(i)];
      }
    }
    if (infer_at >= 0) {
      if (known == 0 || from.numel() % known != 0)
        fail<ShapeError>("reshape: cannot reshape ", from.str(), " to ", Shape(replace_neg(d)).str(),
                         " (-1 has no whole size)");
      d[std::size_t(infer_at)] = from.numel() / known;
    }
    Shape to(d);
    if (to.numel() != from.numel())
      fail<ShapeError>("reshape: cannot reshape ", from.str(), " (", from.numel(), " elements) to ", to.str(), " (",
                       to.numel(), " elements)");
    return to;
  }

 private:
  static std::vector<std::int64_t> replace_neg(std::vector<std::int64_t> d) {
    for (auto& x : d)
      if (x < 0) x = 0;
    return d;
  }
  std::vector<std::int64_t> dims_;
};

inline Var reshape(Var x, std::vector<std::int64_t> dims) {
  if (x.shape().dims() == dims) return x;
  return apply1<Reshape>({x}, std::move(dims));
}

// out.shape[i] = in.shape[perm[i]]
class Permute final : public Op {
 public:
  ~Permute() override;
  explicit Permute(std::vector<int> perm) : perm_(std::move(perm)) {}
  std::string name() const override { return "permute"; }
  const std::vector<int>& perm() const { return perm_; }
  std::vector<TensorMeta> infer(std::span<const TensorMeta> in) const override {
    expect_arity(name(), in, 1);
    const Shape& s = in[0].shape;
    std::vector<int> sorted = perm_;
    std::sort(sorted.begin(), sorted.end());
    std::vector<int> iota(std::size_t(s.rank()));
    std::iota(iota.begin(), iota.end(), 0);
    if (sorted != iota) {
      std::string p;
      for (int v : perm_) p += std::to_string(v) + " ";
      fail<ShapeError>("permute: (", p, ") is not a permutation of the axes of ", s.str());
    }
    std::vector<std::int64_t> d;
    for (int a : perm_) d.push_back(s[a]);
    return {{in[0].dtype, Shape(d)}};
  }
  std::vector<std::optional<Var>> backward(const BackwardArgs& a) const override {
    std::vector<int> inv(perm_.size());
    for (std::size_t i = 0; i < perm_.size(); ++i) inv[std::size_t(perm_[i])] = int(i);
    return {apply1<Permute>({*a.grad_outputs[0]}, inv)};
  }

 private:
  std::vector<int> perm_;
};

inline Var permute(Var x, std::vector<int> perm) { return apply1<Permute>({x}, std::move(perm)); }

inline Var transpose(Var x, int a, int b) {
  std::vector<int> perm(std::size_t(x.rank()));
  std::iota(perm.begin(), perm.end(), 0);
  std::swap(perm[std::size_t(x.shape().normalize_axis(a))], perm[std::size_t(x.shape().normalize_axis(b))]);
  return permute(x, perm);
}

inline std::vector<std::optional<Var>> Reshape::backward(const BackwardArgs& a) const {
  return {reshape(*a.grad_outputs[0], a.inputs[0].shape().dims())};
}

}  // namespace frugal::ops
