#pragma once
// Sum over axes and broadcasting to a larger shape: each is the other's
// backward, so they share a header.
#include <algorithm>

#include "cast.hpp"
#include "shape_ops.hpp"

namespace frugal::ops {

class Sum final : public Op {
 public:
  ~Sum() override;
  // `axes` may be negative; empty means all axes.
  Sum(std::vector<int> axes, bool keepdim) : axes_(std::move(axes)), keepdim_(keepdim) {}
  std::string name() const override { return "sum"; }
  bool keepdim() const { return keepdim_; }
  // The reduced axes, normalized and sorted, for an input of this shape.
  std::vector<int> axes_for(const Shape& s) const {
    std::vector<int> out;
    if (axes_.empty()) {
      for (int i = 0; i < s.rank(); ++i) out.push_back(i);
      return out;
    }
    for (int a : axes_) out.push_back(s.normalize_axis(a));
    std::sort(out.begin(), out.end());
    if (std::adjacent_find(out.begin(), out.end()) != out.end())
      fail<ShapeError>("sum: an axis is repeated for shape ", s.str());
    return out;
  }
  // The same axes as a bit mask, computed without allocating (for kernels).
  std::uint32_t axes_mask(const Shape& s) const {
    if (axes_.empty()) return s.rank() >= 32 ? ~0u : (1u << s.rank()) - 1;
    std::uint32_t m = 0;
    for (int a : axes_) m |= 1u << s.normalize_axis(a);
    return m;
  }
  std::vector<TensorMeta> infer(std::span<const TensorMeta> in) const override {
    expect_arity(name(), in, 1);
    expect_float_storage(name(), in[0]);
    return {{in[0].dtype, reduced_shape(in[0].shape, axes_for(in[0].shape), keepdim_)}};
  }
  inline std::vector<std::optional<Var>> backward(const BackwardArgs& a) const override;

  static Shape reduced_shape(const Shape& s, const std::vector<int>& axes, bool keepdim) {
    std::vector<std::int64_t> d;
    for (int i = 0; i < s.rank(); ++i) {
      bool reduced = std::find(axes.begin(), axes.end(), i) != axes.end();
      if (!reduced)
        d.push_back(s[i]);
      else if (keepdim)
        d.push_back(1);
    }
    return Shape(d);
  }

 private:
  std::vector<int> axes_;
  bool keepdim_;
};

// Stretches size-1 (or missing leading) dimensions to `shape`, numpy-style.
class BroadcastTo final : public Op {
 public:
  ~BroadcastTo() override;
  explicit BroadcastTo(Shape shape) : shape_(std::move(shape)) {}
  std::string name() const override { return "broadcast_to"; }
  std::vector<TensorMeta> infer(std::span<const TensorMeta> in) const override {
    expect_arity(name(), in, 1);
    auto b = broadcast_shapes(in[0].shape, shape_);
    if (!b || *b != shape_)
      fail<ShapeError>("broadcast_to: cannot broadcast ", in[0].shape.str(), " to ", shape_.str());
    return {{in[0].dtype, shape_}};
  }
  inline std::vector<std::optional<Var>> backward(const BackwardArgs& a) const override;

 private:
  Shape shape_;
};

inline Var sum(Var x, std::vector<int> axes = {}, bool keepdim = false) {
  return apply1<Sum>({x}, std::move(axes), keepdim);
}

inline Var broadcast_to(Var x, const Shape& shape) {
  if (x.shape() == shape) return x;
  return apply1<BroadcastTo>({x}, shape);
}

// Sums a broadcast result back down to `target`: the backward of broadcasting.
inline Var sum_to(Var x, const Shape& target) {
  if (x.shape() == target) return x;
  const Shape& s = x.shape();
  int lead = s.rank() - target.rank();
  if (lead < 0) fail<ShapeError>("sum_to: cannot reduce ", s.str(), " to the larger ", target.str());
  std::vector<int> axes;
  for (int i = 0; i < s.rank(); ++i)
    if (i < lead || (target[i - lead] == 1 && s[i] != 1)) axes.push_back(i);
  Var r = axes.empty() ? x : sum(x, axes, true);
  return reshape(r, target.dims());
}

inline std::vector<std::optional<Var>> Sum::backward(const BackwardArgs& a) const {
  const Shape& in = a.inputs[0].shape();
  Var g = *a.grad_outputs[0];
  g = reshape(g, reduced_shape(in, axes_for(in), true).dims());
  return {broadcast_to(g, in)};
}

inline std::vector<std::optional<Var>> BroadcastTo::backward(const BackwardArgs& a) const {
  return {sum_to(*a.grad_outputs[0], a.inputs[0].shape())};
}

}  // namespace frugal::ops

#include "unary.hpp"

namespace frugal {

using ops::broadcast_to;
using ops::sum;
using ops::sum_to;

// Mean over `axes` (all when empty).
inline Var mean(Var x, std::vector<int> axes = {}, bool keepdim = false) {
  ops::Sum s(axes, keepdim);
  std::int64_t n = 1;
  for (int a : s.axes_for(x.shape())) n *= x.shape()[a];
  return sum(x, std::move(axes), keepdim) * (1.0 / double(n));
}

}  // namespace frugal
