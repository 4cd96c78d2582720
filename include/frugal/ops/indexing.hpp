#pragma once
// Indexing ops, with PyTorch's semantics. They come in adjoint pairs, each
// the other's backward:
//   concat(xs, axis)               <-> split(x, sizes, axis)
//   slice(x, axis, start, end, step) <-> slice_grad (embed into zeros)
//   index_select(x, axis, ids)     <-> index_add(base, axis, ids, src)
//   gather(x, axis, ids)           <-> scatter_add(base, axis, ids, src)
// Ids are i32 or i64. An id out of range stops the step with a DataError
// naming the op, the id, its position and the valid range (checked by the
// kernel before anything is read or written).
#include <numeric>

#include "embedding.hpp"

namespace frugal::ops {

inline Shape with_dim(const Shape& s, int axis, std::int64_t n) {
  std::vector<std::int64_t> d = s.dims();
  d[std::size_t(axis)] = n;
  return Shape(d);
}

inline int expect_axis(const std::string& op, const Shape& s, int axis) {
  if (s.rank() == 0) fail<ShapeError>(op, ": needs at least one dimension, got a scalar");
  if (axis < -s.rank() || axis >= s.rank())
    fail<ShapeError>(op, ": axis ", axis, " is out of range for shape ", s.str());
  return axis < 0 ? axis + s.rank() : axis;
}

// ---- concat / split ---------------------------------------------------------

// Pieces joined along an axis. Each entry of `pieces` is kInput (the next
// input) or the size of a block of zeros: split's backward passes zeros for
// the pieces no gradient reached, without materialising them.
class Concat final : public Op {
 public:
  ~Concat() override;
  static constexpr std::int64_t kInput = -1;
  Concat(int axis, std::vector<std::int64_t> pieces) : axis_(axis), pieces_(std::move(pieces)) {}
  int axis() const { return axis_; }
  const std::vector<std::int64_t>& pieces() const { return pieces_; }
  std::string name() const override { return "concat"; }
  std::vector<TensorMeta> infer(std::span<const TensorMeta> in) const override {
    const std::size_t inputs = std::size_t(std::count(pieces_.begin(), pieces_.end(), kInput));
    expect_arity(name(), in, inputs);
    const int axis = expect_axis(name(), in[0].shape, axis_);
    std::int64_t total = 0;
    std::size_t next = 0;
    for (std::int64_t p : pieces_) {
      if (p != kInput) {
        total += p;
        continue;
      }
      const TensorMeta& m = in[next++];
      bool ok = m.dtype == in[0].dtype && m.shape.rank() == in[0].shape.rank();
      for (int d = 0; ok && d < m.shape.rank(); ++d) ok = d == axis || m.shape[d] == in[0].shape[d];
      if (!ok)
        fail<ShapeError>(name(), ": input ", next - 1, " ", m.str(), " does not match input 0 ", in[0].str(),
                         " (all dimensions but axis ", axis_, " must agree, and the dtypes)");
      total += m.shape[axis];
    }
    return {{in[0].dtype, with_dim(in[0].shape, axis, total)}};
  }
  inline std::vector<std::optional<Var>> backward(const BackwardArgs& a) const override;

 private:
  int axis_;
  std::vector<std::int64_t> pieces_;
};

class Split final : public Op {
 public:
  ~Split() override;
  Split(int axis, std::vector<std::int64_t> sizes) : axis_(axis), sizes_(std::move(sizes)) {}
  int axis() const { return axis_; }
  const std::vector<std::int64_t>& sizes() const { return sizes_; }
  std::string name() const override { return "split"; }
  std::vector<TensorMeta> infer(std::span<const TensorMeta> in) const override {
    expect_arity(name(), in, 1);
    const int axis = expect_axis(name(), in[0].shape, axis_);
    std::string list;
    std::int64_t total = 0;
    for (std::int64_t s : sizes_) {
      list += (list.empty() ? "" : ", ") + std::to_string(s);
      if (s < 0) fail<ShapeError>(name(), ": a negative size in (", list, ") for ", in[0].str());
      total += s;
    }
    if (sizes_.empty() || total != in[0].shape[axis])
      fail<ShapeError>(name(), ": sizes (", list, ") sum to ", total, ", but axis ", axis_, " of ", in[0].str(),
                       " has ", in[0].shape[axis]);
    std::vector<TensorMeta> out;
    for (std::int64_t s : sizes_) out.push_back({in[0].dtype, with_dim(in[0].shape, axis, s)});
    return out;
  }
  std::vector<std::optional<Var>> backward(const BackwardArgs& a) const override {
    std::vector<Var> present;
    std::vector<std::int64_t> pieces;
    for (std::size_t k = 0; k < sizes_.size(); ++k) {
      if (a.grad_outputs[k]) present.push_back(*a.grad_outputs[k]);
      pieces.push_back(a.grad_outputs[k] ? Concat::kInput : sizes_[k]);
    }
    if (present.empty()) return {std::nullopt};
    return {frugal::apply(std::make_shared<Concat>(axis_, pieces), present).at(0)};
  }

 private:
  int axis_;
  std::vector<std::int64_t> sizes_;
};

inline std::vector<std::optional<Var>> Concat::backward(const BackwardArgs& a) const {
  const int axis = a.outputs[0].shape().normalize_axis(axis_);
  std::vector<std::int64_t> sizes;
  std::size_t next = 0;
  for (std::int64_t p : pieces_) sizes.push_back(p == kInput ? a.inputs[next++].dim(axis) : p);
  std::vector<Var> parts = frugal::apply(std::make_shared<Split>(axis_, sizes), {*a.grad_outputs[0]});
  std::vector<std::optional<Var>> out;
  for (std::size_t k = 0; k < pieces_.size(); ++k)
    if (pieces_[k] == kInput) out.push_back(parts[k]);
  return out;
}

// ---- slice ------------------------------------------------------------------

// Python's slice rules: negative start/end count from the end, both clamp to
// [0, n], step >= 1.
struct SliceRange {
  std::int64_t start = 0, count = 0, step = 1;
};

class SliceBase : public Op {
 public:
  ~SliceBase() override;
  SliceBase(int axis, std::int64_t start, std::int64_t end, std::int64_t step)
      : axis_(axis), start_(start), end_(end), step_(step) {}
  int axis() const { return axis_; }
  // The range on an axis of length n (no allocation: kernels call it).
  SliceRange range(std::int64_t n) const {
    auto norm = [n](std::int64_t i) { return std::clamp<std::int64_t>(i < 0 ? i + n : i, 0, n); };
    const std::int64_t b = norm(start_), e = norm(end_);
    return {b, e > b ? (e - b + step_ - 1) / step_ : 0, step_};
  }
  std::string slice_str() const { return cat(start_, ":", end_, ":", step_); }

 protected:
  void check(const std::string& op) const {
    if (step_ < 1) fail<ShapeError>(op, ": step must be >= 1, got ", step_);
  }
  int axis_;
  std::int64_t start_, end_, step_;
};

// Inputs (dy) -> dx of the sliced tensor's shape (axis length `n`): zeros,
// with dy at the sliced positions.
class SliceGrad final : public SliceBase {
 public:
  ~SliceGrad() override;
  SliceGrad(int axis, std::int64_t start, std::int64_t end, std::int64_t step, std::int64_t n)
      : SliceBase(axis, start, end, step), n_(n) {}
  std::int64_t n() const { return n_; }
  std::string name() const override { return "slice_grad"; }
  std::vector<TensorMeta> infer(std::span<const TensorMeta> in) const override {
    expect_arity(name(), in, 1);
    check(name());
    const int axis = expect_axis(name(), in[0].shape, axis_);
    if (range(n_).count != in[0].shape[axis])
      fail<ShapeError>(name(), ": gradient ", in[0].str(), " does not match the slice ", slice_str(), " of length ",
                       range(n_).count, " from an axis of ", n_);
    return {{in[0].dtype, with_dim(in[0].shape, axis, n_)}};
  }
  inline std::vector<std::optional<Var>> backward(const BackwardArgs& a) const override;
  Cost cost(std::span<const TensorMeta> in, std::span<const TensorMeta> out) const override {
    return {0, double(in[0].nbytes() + out[0].nbytes())};
  }

 private:
  std::int64_t n_;
};

class Slice final : public SliceBase {
 public:
  ~Slice() override;
  using SliceBase::SliceBase;
  std::string name() const override { return "slice"; }
  std::vector<TensorMeta> infer(std::span<const TensorMeta> in) const override {
    expect_arity(name(), in, 1);
    check(name());
    const int axis = expect_axis(name(), in[0].shape, axis_);
    return {{in[0].dtype, with_dim(in[0].shape, axis, range(in[0].shape[axis]).count)}};
  }
  std::vector<std::optional<Var>> backward(const BackwardArgs& a) const override {
    const Var x = a.inputs[0];
    return {
        apply1<SliceGrad>({*a.grad_outputs[0]}, axis_, start_, end_, step_, x.dim(x.shape().normalize_axis(axis_)))};
  }
  Cost cost(std::span<const TensorMeta> in, std::span<const TensorMeta> out) const override {
    (void)in;
    return {0, 2.0 * double(out[0].nbytes())};
  }
};

inline std::vector<std::optional<Var>> SliceGrad::backward(const BackwardArgs& a) const {
  return {apply1<Slice>({*a.grad_outputs[0]}, axis_, start_, end_, step_)};
}

// ---- index_select / index_add -------------------------------------------------

inline void expect_index_vector(const std::string& op, const TensorMeta& ids) {
  expect_ids(op, ids);
  if (ids.shape.rank() > 1) fail<ShapeError>(op, ": ids must be a vector (or a scalar), got ", ids.str());
}

// Inputs ([base], ids [m], src) -> out, where out = base (or zeros of
// src's shape with `n` along the axis) and out[..., ids[k], ...] +=
// src[..., k, ...], summed in k order.
class IndexAdd final : public Op {
 public:
  ~IndexAdd() override;
  IndexAdd(int axis, bool has_base, std::int64_t n = 0) : axis_(axis), has_base_(has_base), n_(n) {}
  int axis() const { return axis_; }
  bool has_base() const { return has_base_; }
  std::string name() const override { return "index_add"; }
  std::vector<TensorMeta> infer(std::span<const TensorMeta> in) const override {
    expect_arity(name(), in, has_base_ ? 3 : 2);
    const TensorMeta &ids = in[has_base_ ? 1 : 0], &src = in[has_base_ ? 2 : 1];
    expect_index_vector(name(), ids);
    expect_floating(name(), src);
    const int axis = expect_axis(name(), src.shape, axis_);
    if (src.shape[axis] != ids.shape.numel())
      fail<ShapeError>(name(), ": source ", src.str(), " has ", src.shape[axis], " entries along axis ", axis_,
                       " but ids ", ids.str(), " has ", ids.shape.numel());
    if (!has_base_) return {{src.dtype, with_dim(src.shape, axis, n_)}};
    const TensorMeta& base = in[0];
    expect_same_dtype(name(), base, src);
    if (base.shape.rank() != src.shape.rank() || with_dim(base.shape, axis, src.shape[axis]) != src.shape)
      fail<ShapeError>(name(), ": source ", src.str(), " does not fit base ", base.str(), " (all dimensions but axis ",
                       axis_, " must agree)");
    return {base};
  }
  inline std::vector<std::optional<Var>> backward(const BackwardArgs& a) const override;

 private:
  int axis_;
  bool has_base_;
  std::int64_t n_;
};

// Inputs (x, ids [m]) -> x with axis `axis` replaced by the rows ids picks.
class IndexSelect final : public Op {
 public:
  ~IndexSelect() override;
  explicit IndexSelect(int axis) : axis_(axis) {}
  int axis() const { return axis_; }
  std::string name() const override { return "index_select"; }
  std::vector<TensorMeta> infer(std::span<const TensorMeta> in) const override {
    expect_arity(name(), in, 2);
    expect_index_vector(name(), in[1]);
    const int axis = expect_axis(name(), in[0].shape, axis_);
    return {{in[0].dtype, with_dim(in[0].shape, axis, in[1].shape.numel())}};
  }
  std::vector<std::optional<Var>> backward(const BackwardArgs& a) const override {
    const Var x = a.inputs[0];
    return {apply1<IndexAdd>({a.inputs[1], *a.grad_outputs[0]}, axis_, false, x.dim(x.shape().normalize_axis(axis_))),
            std::nullopt};
  }

 private:
  int axis_;
};

inline std::vector<std::optional<Var>> IndexAdd::backward(const BackwardArgs& a) const {
  const Var ids = a.inputs[has_base_ ? 1 : 0], g = *a.grad_outputs[0];
  std::vector<std::optional<Var>> out;
  if (has_base_) out.push_back(g);
  out.push_back(std::nullopt);
  out.push_back(apply1<IndexSelect>({g, ids}, axis_));
  return out;
}

// ---- gather / scatter_add ---------------------------------------------------

// torch.gather's shape rule: ids has x's rank, and no more than x's extent
// on every axis but `axis`.
inline void expect_gather_ids(const std::string& op, const TensorMeta& x, const TensorMeta& ids, int axis_arg,
                              int axis) {
  expect_ids(op, ids);
  bool ok = ids.shape.rank() == x.shape.rank();
  for (int d = 0; ok && d < x.shape.rank(); ++d) ok = d == axis || ids.shape[d] <= x.shape[d];
  if (!ok)
    fail<ShapeError>(op, ": ids ", ids.str(), " do not fit ", x.str(), " along axis ", axis_arg,
                     " (ids need the same rank, and no larger a size on every other axis)");
}

// Inputs ([base], ids, src) -> out = base (or zeros of `shape`) with
// out[i][ids[i][j][k]][k] += src[i][j][k] (axis 1; likewise for any axis).
// src must have ids' shape.
class ScatterAdd final : public Op {
 public:
  ~ScatterAdd() override;
  ScatterAdd(int axis, bool has_base, Shape shape = {}) : axis_(axis), has_base_(has_base), shape_(std::move(shape)) {}
  int axis() const { return axis_; }
  bool has_base() const { return has_base_; }
  std::string name() const override { return "scatter_add"; }
  std::vector<TensorMeta> infer(std::span<const TensorMeta> in) const override {
    expect_arity(name(), in, has_base_ ? 3 : 2);
    const TensorMeta &ids = in[has_base_ ? 1 : 0], &src = in[has_base_ ? 2 : 1];
    const TensorMeta out = has_base_ ? in[0] : TensorMeta{src.dtype, shape_};
    expect_floating(name(), src);
    expect_same_dtype(name(), out, src);
    const int axis = expect_axis(name(), out.shape, axis_);
    expect_gather_ids(name(), out, ids, axis_, axis);
    if (src.shape != ids.shape)
      fail<ShapeError>(name(), ": source ", src.str(), " must have the shape of ids ", ids.str());
    return {out};
  }
  inline std::vector<std::optional<Var>> backward(const BackwardArgs& a) const override;

 private:
  int axis_;
  bool has_base_;
  Shape shape_;
};

// Inputs (x, ids) -> out of ids' shape, out[i][j][k] = x[i][ids[i][j][k]][k]
// (axis 1; likewise for any axis).
class Gather final : public Op {
 public:
  ~Gather() override;
  explicit Gather(int axis) : axis_(axis) {}
  int axis() const { return axis_; }
  std::string name() const override { return "gather"; }
  std::vector<TensorMeta> infer(std::span<const TensorMeta> in) const override {
    expect_arity(name(), in, 2);
    const int axis = expect_axis(name(), in[0].shape, axis_);
    expect_gather_ids(name(), in[0], in[1], axis_, axis);
    return {{in[0].dtype, in[1].shape}};
  }
  std::vector<std::optional<Var>> backward(const BackwardArgs& a) const override {
    return {apply1<ScatterAdd>({a.inputs[1], *a.grad_outputs[0]}, axis_, false, a.inputs[0].shape()), std::nullopt};
  }

 private:
  int axis_;
};

inline std::vector<std::optional<Var>> ScatterAdd::backward(const BackwardArgs& a) const {
  const Var ids = a.inputs[has_base_ ? 1 : 0], g = *a.grad_outputs[0];
  std::vector<std::optional<Var>> out;
  if (has_base_) out.push_back(g);
  out.push_back(std::nullopt);
  out.push_back(apply1<Gather>({g, ids}, axis_));
  return out;
}

}  // namespace frugal::ops

namespace frugal {

// Joins tensors along `axis`; all other dimensions agree.
inline Var concat(const std::vector<Var>& xs, int axis = 0) {
  if (xs.empty()) fail<ShapeError>("concat: no tensors to join");
  if (xs.size() == 1) return xs[0];
  return frugal::apply(std::make_shared<ops::Concat>(axis, std::vector<std::int64_t>(xs.size(), ops::Concat::kInput)),
                       xs)
      .at(0);
}

// Splits `x` along `axis` into pieces of the given sizes (torch.split with a
// list of sizes); the sizes must add up to the axis.
inline std::vector<Var> split(Var x, std::vector<std::int64_t> sizes, int axis = 0) {
  return frugal::apply(std::make_shared<ops::Split>(axis, std::move(sizes)), {x});
}

// x[..., start:end:step, ...] on `axis`, with Python's rules for negative
// and out-of-range bounds; step >= 1.
inline Var slice(Var x, int axis, std::int64_t start, std::int64_t end, std::int64_t step = 1) {
  auto op = std::make_shared<ops::Slice>(axis, start, end, step);
  if (step == 1 && x.rank() > 0 && axis >= -x.rank() && axis < x.rank()) {
    const std::int64_t n = x.dim(axis);
    if (op->range(n).count == n) return x;  // the whole axis: nothing to copy
  }
  return frugal::apply(std::move(op), {x}).at(0);
}

// torch.index_select: the entries ids (a vector) picks along `axis`.
inline Var index_select(Var x, int axis, Var ids) { return apply1<ops::IndexSelect>({x, ids}, axis); }

// torch.index_add (out of place): base with src[..., k, ...] added at
// base[..., ids[k], ...]; repeated ids accumulate, in order.
inline Var index_add(Var base, int axis, Var ids, Var src) {
  return apply1<ops::IndexAdd>({base, ids, src}, axis, true);
}

// torch.gather along `axis`.
inline Var gather(Var x, int axis, Var ids) { return apply1<ops::Gather>({x, ids}, axis); }

// torch.scatter_add (out of place) along `axis`; src has ids' shape.
inline Var scatter_add(Var base, int axis, Var ids, Var src) {
  return apply1<ops::ScatterAdd>({base, ids, src}, axis, true);
}

}  // namespace frugal
