#pragma once
// 2-D pooling over NCHW tensors with PyTorch's semantics (floor mode):
// max_pool2d (padding is -inf; the first maximum in window order wins
// ties), avg_pool2d (count_include_pad as PyTorch), and global average
// pooling to [N, C] (adaptive_avg_pool2d(x, 1) then flatten).
//
// max_pool2d's backward recomputes each window's argmax from x instead of
// saving an index tensor: an index tensor would be a second planned value
// of the output's size in i64 (twice the output's bytes), while x is
// usually kept alive anyway (the ReLU before the pool keeps its output for
// its own backward), and finding a window's maximum again costs a few
// comparisons per output in a memory-bound kernel. Recomputing also makes
// the backward a pure function of (x, dy), like every other op here.
#include <optional>

#include "conv.hpp"

namespace frugal {

struct Pool2dOptions {
  Size2 kernel = 1;
  std::optional<Size2> stride;  // default: the kernel size, as PyTorch
  Size2 padding = 0;
};

}  // namespace frugal

namespace frugal::ops {

struct PoolGeometry {
  std::int64_t n, c, h, w, kh, kw, sh, sw, ph, pw, ho, wo;
  std::int64_t planes() const { return n * c; }
  std::int64_t hw() const { return h * w; }
  std::int64_t hw_out() const { return ho * wo; }
};

// Allocates nothing unless the shapes are bad, so kernels may call it.
inline PoolGeometry pool_geometry(const char* op, const Shape& x, const Pool2dOptions& o) {
  const Size2 s = o.stride.value_or(o.kernel);
  auto bad = [&](const std::string& why) {
    fail<ShapeError>(op, ": input ", x.str(), " (kernel ", o.kernel.str(), ", stride ", s.str(), ", padding ",
                     o.padding.str(), "): ", why);
  };
  if (x.rank() != 4) bad("the input must be [N, C, H, W]");
  if (o.kernel.h < 1 || o.kernel.w < 1) bad("kernel size must be at least 1");
  if (s.h < 1 || s.w < 1) bad("stride must be at least 1");
  if (o.padding.h < 0 || o.padding.w < 0) bad("padding must not be negative");
  if (2 * o.padding.h > o.kernel.h || 2 * o.padding.w > o.kernel.w)
    bad("padding must be at most half of the kernel size");
  PoolGeometry g{x[0], x[1], x[2], x[3], o.kernel.h, o.kernel.w, s.h, s.w, o.padding.h, o.padding.w, 0, 0};
  if (g.h + 2 * g.ph < g.kh || g.w + 2 * g.pw < g.kw)
    bad(cat("the padded input (", g.h + 2 * g.ph, " x ", g.w + 2 * g.pw, ") is smaller than the kernel"));
  g.ho = (g.h + 2 * g.ph - g.kh) / g.sh + 1;
  g.wo = (g.w + 2 * g.pw - g.kw) / g.sw + 1;
  return g;
}

class PoolOp : public Op {
 public:
  ~PoolOp() override;
  explicit PoolOp(Pool2dOptions o) : o_(o) {}
  const Pool2dOptions& options() const { return o_; }

 protected:
  Pool2dOptions o_;
};

// Inputs (x, dy) -> dx: dy routed to each window's (recomputed) argmax.
class MaxPool2dBackward final : public PoolOp {
 public:
  ~MaxPool2dBackward() override;
  using PoolOp::PoolOp;
  std::string name() const override { return "max_pool2d_backward"; }
  PoolGeometry geometry(const Shape& x) const { return pool_geometry("max_pool2d_backward", x, o_); }
  std::vector<TensorMeta> infer(std::span<const TensorMeta> in) const override {
    expect_arity(name(), in, 2);
    expect_floating(name(), in[0]);
    expect_same_dtype(name(), in[0], in[1]);
    PoolGeometry g = geometry(in[0].shape);
    if (in[1].shape != Shape{g.n, g.c, g.ho, g.wo})
      fail<ShapeError>(name(), ": output gradient ", in[1].shape.str(), " does not match pooling ", in[0].shape.str(),
                       " (expected [", g.n, ", ", g.c, ", ", g.ho, ", ", g.wo, "])");
    return {in[0]};
  }
};

// Input x -> y, the maximum of each window.
class MaxPool2d final : public PoolOp {
 public:
  ~MaxPool2d() override;
  using PoolOp::PoolOp;
  std::string name() const override { return "max_pool2d"; }
  PoolGeometry geometry(const Shape& x) const { return pool_geometry("max_pool2d", x, o_); }
  std::vector<TensorMeta> infer(std::span<const TensorMeta> in) const override {
    expect_arity(name(), in, 1);
    expect_floating(name(), in[0]);
    PoolGeometry g = geometry(in[0].shape);
    return {{in[0].dtype, Shape{g.n, g.c, g.ho, g.wo}}};
  }
  std::vector<std::optional<Var>> backward(const BackwardArgs& a) const override {
    return {apply1<MaxPool2dBackward>({a.inputs[0], *a.grad_outputs[0]}, o_)};
  }
};

// Input dy -> dx: each window's gradient spread evenly over it.
class AvgPool2dBackward final : public PoolOp {
 public:
  ~AvgPool2dBackward() override;
  AvgPool2dBackward(Pool2dOptions o, bool count_include_pad, Shape x_shape)
      : PoolOp(o), include_pad_(count_include_pad), x_(std::move(x_shape)) {}
  bool count_include_pad() const { return include_pad_; }
  std::string name() const override { return "avg_pool2d_backward"; }
  PoolGeometry geometry() const { return pool_geometry("avg_pool2d_backward", x_, o_); }
  std::vector<TensorMeta> infer(std::span<const TensorMeta> in) const override {
    expect_arity(name(), in, 1);
    expect_floating(name(), in[0]);
    PoolGeometry g = geometry();
    if (in[0].shape != Shape{g.n, g.c, g.ho, g.wo})
      fail<ShapeError>(name(), ": output gradient ", in[0].shape.str(), " does not match pooling ", x_.str(),
                       " (expected [", g.n, ", ", g.c, ", ", g.ho, ", ", g.wo, "])");
    return {{in[0].dtype, x_}};
  }

 private:
  bool include_pad_;
  Shape x_;
};

// Input x -> y, the mean of each window; with count_include_pad the divisor
// is the whole window, padding included, else only the input positions.
class AvgPool2d final : public PoolOp {
 public:
  ~AvgPool2d() override;
  AvgPool2d(Pool2dOptions o, bool count_include_pad) : PoolOp(o), include_pad_(count_include_pad) {}
  bool count_include_pad() const { return include_pad_; }
  std::string name() const override { return "avg_pool2d"; }
  PoolGeometry geometry(const Shape& x) const { return pool_geometry("avg_pool2d", x, o_); }
  std::vector<TensorMeta> infer(std::span<const TensorMeta> in) const override {
    expect_arity(name(), in, 1);
    expect_floating(name(), in[0]);
    PoolGeometry g = geometry(in[0].shape);
    return {{in[0].dtype, Shape{g.n, g.c, g.ho, g.wo}}};
  }
  std::vector<std::optional<Var>> backward(const BackwardArgs& a) const override {
    return {apply1<AvgPool2dBackward>({*a.grad_outputs[0]}, o_, include_pad_, a.inputs[0].shape())};
  }

 private:
  bool include_pad_;
};

// Input dy [N, C] -> dx [N, C, H, W] = dy / (H W) everywhere. (Both global
// average pool ops also take bf16/f16: summed in double, rounded once.)
class GlobalAvgPool2dBackward final : public Op {
 public:
  ~GlobalAvgPool2dBackward() override;
  explicit GlobalAvgPool2dBackward(Shape x_shape) : x_(std::move(x_shape)) {}
  std::string name() const override { return "global_avg_pool2d_backward"; }
  std::vector<TensorMeta> infer(std::span<const TensorMeta> in) const override {
    expect_arity(name(), in, 1);
    expect_any_floating(name(), in[0]);
    if (in[0].shape != Shape{x_[0], x_[1]})
      fail<ShapeError>(name(), ": output gradient ", in[0].shape.str(), " does not match input ", x_.str());
    return {{in[0].dtype, x_}};
  }

 private:
  Shape x_;
};

// Input x [N, C, H, W] -> [N, C], the mean over H and W.
class GlobalAvgPool2d final : public Op {
 public:
  ~GlobalAvgPool2d() override;
  std::string name() const override { return "global_avg_pool2d"; }
  std::vector<TensorMeta> infer(std::span<const TensorMeta> in) const override {
    expect_arity(name(), in, 1);
    expect_any_floating(name(), in[0]);
    const Shape& x = in[0].shape;
    if (x.rank() != 4) fail<ShapeError>(name(), ": expects an input [N, C, H, W], got ", x.str());
    if (x[2] == 0 || x[3] == 0) fail<ShapeError>(name(), ": input ", x.str(), " has an empty plane");
    return {{in[0].dtype, Shape{x[0], x[1]}}};
  }
  std::vector<std::optional<Var>> backward(const BackwardArgs& a) const override {
    return {apply1<GlobalAvgPool2dBackward>({*a.grad_outputs[0]}, a.inputs[0].shape())};
  }
};

}  // namespace frugal::ops

namespace frugal {

inline Var max_pool2d(Var x, Size2 kernel, std::optional<Size2> stride = std::nullopt, Size2 padding = 0) {
  return apply1<ops::MaxPool2d>({x}, Pool2dOptions{kernel, stride, padding});
}

inline Var avg_pool2d(Var x, Size2 kernel, std::optional<Size2> stride = std::nullopt, Size2 padding = 0,
                      bool count_include_pad = true) {
  return apply1<ops::AvgPool2d>({x}, Pool2dOptions{kernel, stride, padding}, count_include_pad);
}

// adaptive_avg_pool2d(x, 1).flatten(1): [N, C, H, W] -> [N, C].
inline Var global_avg_pool2d(Var x) { return apply1<ops::GlobalAvgPool2d>({x}); }

}  // namespace frugal
