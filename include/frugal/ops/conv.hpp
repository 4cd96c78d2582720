#pragma once
// 2-D convolution over NCHW tensors with PyTorch's layout and semantics:
// x [N, Cin, H, W], weight [Cout, Cin/groups, kH, kW], optional bias [Cout].
// The backward is two ops, so the planner can free what each does not read:
// the data gradient reads (dy, w), the weight gradient reads (x, dy).
#include <algorithm>
#include <type_traits>

#include "checks.hpp"

namespace frugal {

// A (height, width) pair; one number means the same for both.
struct Size2 {
  std::int64_t h = 0, w = 0;
  constexpr Size2(std::int64_t both) : h(both), w(both) {}  // NOLINT: implicit on purpose
  constexpr Size2(std::int64_t height, std::int64_t width) : h(height), w(width) {}
  bool operator==(const Size2&) const = default;
  std::string str() const { return cat("(", h, ", ", w, ")"); }
};

struct Conv2dOptions {
  Size2 stride = 1;
  Size2 padding = 0;
  Size2 dilation = 1;
  std::int64_t groups = 1;
};

}  // namespace frugal

namespace frugal::ops {

// Storage dtypes the convolution kernels take: f32 and f64 compute in their
// own precision; bf16 and f16 are storage only, widened to f32 for the GEMM.
inline void expect_conv_dtype(const std::string& op, const TensorMeta& m) {
  if (!is_floating(m.dtype)) fail<ShapeError>(op, ": expects an f32, f64, bf16 or f16 tensor, got ", m.str());
}

// Every size of one convolution, checked once.
struct ConvGeometry {
  std::int64_t n, cin, h, w, cout, kh, kw, sh, sw, ph, pw, dh, dw, groups, ho, wo;
  std::int64_t cin_g() const { return cin / groups; }
  std::int64_t cout_g() const { return cout / groups; }
  std::int64_t k() const { return cin_g() * kh * kw; }  // a group's GEMM inner size
  std::int64_t hw() const { return h * w; }
  std::int64_t hw_out() const { return ho * wo; }
  // 1x1, stride 1, no padding: the input planes are already the columns.
  bool pointwise() const { return kh == 1 && kw == 1 && sh == 1 && sw == 1 && ph == 0 && pw == 0; }
  double flops() const { return 2.0 * double(n) * double(cout) * double(hw_out()) * double(k()); }
};

// Allocates nothing unless the shapes are bad, so kernels may call it.
inline ConvGeometry conv_geometry(const char* op, const Shape& x, const Shape& wt, const Conv2dOptions& o) {
  auto bad = [&](const std::string& why) {
    fail<ShapeError>(op, ": input ", x.str(), " and weight ", wt.str(), " (stride ", o.stride.str(), ", padding ",
                     o.padding.str(), ", dilation ", o.dilation.str(), ", groups ", o.groups, "): ", why);
  };
  if (x.rank() != 4) bad("the input must be [N, C, H, W]");
  if (wt.rank() != 4) bad("the weight must be [out_channels, in_channels/groups, kH, kW]");
  if (o.stride.h < 1 || o.stride.w < 1) bad("stride must be at least 1");
  if (o.dilation.h < 1 || o.dilation.w < 1) bad("dilation must be at least 1");
  if (o.padding.h < 0 || o.padding.w < 0) bad("padding must not be negative");
  if (o.groups < 1) bad("groups must be at least 1");
  ConvGeometry g{};
  g.n = x[0], g.cin = x[1], g.h = x[2], g.w = x[3];
  g.cout = wt[0], g.kh = wt[2], g.kw = wt[3];
  g.sh = o.stride.h, g.sw = o.stride.w, g.ph = o.padding.h, g.pw = o.padding.w;
  g.dh = o.dilation.h, g.dw = o.dilation.w, g.groups = o.groups;
  if (g.cin == 0 || g.cout == 0 || g.kh == 0 || g.kw == 0) bad("channels and kernel sizes must be positive");
  if (g.cin % g.groups != 0) bad(cat("in_channels ", g.cin, " is not divisible by groups ", g.groups));
  if (g.cout % g.groups != 0) bad(cat("out_channels ", g.cout, " is not divisible by groups ", g.groups));
  if (wt[1] != g.cin / g.groups)
    bad(cat("the weight's second dimension must be in_channels/groups = ", g.cin / g.groups, ", got ", wt[1]));
  std::int64_t ekh = (g.kh - 1) * g.dh + 1, ekw = (g.kw - 1) * g.dw + 1;
  if (g.h + 2 * g.ph < ekh || g.w + 2 * g.pw < ekw)
    bad(cat("the padded input (", g.h + 2 * g.ph, " x ", g.w + 2 * g.pw, ") is smaller than the dilated kernel (",
            ekh, " x ", ekw, ")"));
  g.ho = (g.h + 2 * g.ph - ekh) / g.sh + 1;
  g.wo = (g.w + 2 * g.pw - ekw) / g.sw + 1;
  return g;
}

// ---- ops ----------------------------------------------------------------------

class Conv2dBackwardData;
class Conv2dBackwardWeight;

// Inputs (x, w[, b]) -> y [N, Cout, Ho, Wo].
class Conv2d final : public Op {
 public:
  ~Conv2d() override;
  Conv2d(Conv2dOptions o, bool has_bias) : o_(o), has_bias_(has_bias) {}
  const Conv2dOptions& options() const { return o_; }
  bool has_bias() const { return has_bias_; }
  std::string name() const override { return "conv2d"; }
  ConvGeometry geometry(const Shape& x, const Shape& w) const { return conv_geometry("conv2d", x, w, o_); }
  ConvGeometry geometry(std::span<const TensorMeta> in) const { return geometry(in[0].shape, in[1].shape); }
  std::vector<TensorMeta> infer(std::span<const TensorMeta> in) const override {
    expect_arity(name(), in, has_bias_ ? 3 : 2);
    expect_conv_dtype(name(), in[0]);
    expect_same_dtype(name(), in[0], in[1]);
    ConvGeometry g = geometry(in);
    if (has_bias_) {
      expect_same_dtype(name(), in[0], in[2]);
      if (in[2].shape != Shape{g.cout})
        fail<ShapeError>(name(), ": bias ", in[2].shape.str(), " does not match weight ", in[1].shape.str(),
                         " (expected [", g.cout, "])");
    }
    return {{in[0].dtype, Shape{g.n, g.cout, g.ho, g.wo}}};
  }
  inline std::vector<std::optional<Var>> backward(const BackwardArgs& args) const override;
  Cost cost(std::span<const TensorMeta> in, std::span<const TensorMeta> out) const override {
    double bytes = 0;
    for (auto& m : in) bytes += double(m.nbytes());
    return {geometry(in).flops(), bytes + double(out[0].nbytes())};
  }

 private:
  Conv2dOptions o_;
  bool has_bias_;
};

// Inputs (dy, w) -> dx, the gradient of conv2d with respect to its input
// (a transposed convolution: GEMM wᵀ·dy, then col2im). x's shape is kept,
// since several input sizes give the same output size.
class Conv2dBackwardData final : public Op {
 public:
  ~Conv2dBackwardData() override;
  Conv2dBackwardData(Conv2dOptions o, Shape x_shape) : o_(o), x_(std::move(x_shape)) {}
  const Conv2dOptions& options() const { return o_; }
  std::string name() const override { return "conv2d_backward_data"; }
  ConvGeometry geometry(const Shape& w) const { return conv_geometry("conv2d_backward_data", x_, w, o_); }
  ConvGeometry geometry(std::span<const TensorMeta> in) const { return geometry(in[1].shape); }
  std::vector<TensorMeta> infer(std::span<const TensorMeta> in) const override {
    expect_arity(name(), in, 2);
    expect_conv_dtype(name(), in[0]);
    expect_same_dtype(name(), in[0], in[1]);
    ConvGeometry g = geometry(in);
    if (in[0].shape != Shape{g.n, g.cout, g.ho, g.wo})
      fail<ShapeError>(name(), ": output gradient ", in[0].shape.str(), " does not match the convolution of ", x_.str(),
                       " by ", in[1].shape.str(), " (expected [", g.n, ", ", g.cout, ", ", g.ho, ", ", g.wo, "])");
    return {{in[0].dtype, x_}};
  }
  Cost cost(std::span<const TensorMeta> in, std::span<const TensorMeta> out) const override {
    return {geometry(in).flops(), double(in[0].nbytes() + in[1].nbytes() + out[0].nbytes())};
  }

 private:
  Conv2dOptions o_;
  Shape x_;
};

// Inputs (x, dy) -> dw [, db]: the gradient of conv2d with respect to its
// weight (GEMM dy·colᵀ, summed over the batch in image order) and bias.
class Conv2dBackwardWeight final : public Op {
 public:
  ~Conv2dBackwardWeight() override;
  Conv2dBackwardWeight(Conv2dOptions o, Shape w_shape, bool with_bias)
      : o_(o), w_(std::move(w_shape)), with_bias_(with_bias) {}
  const Conv2dOptions& options() const { return o_; }
  bool with_bias() const { return with_bias_; }
  std::string name() const override { return "conv2d_backward_weight"; }
  ConvGeometry geometry(const Shape& x) const { return conv_geometry("conv2d_backward_weight", x, w_, o_); }
  ConvGeometry geometry(std::span<const TensorMeta> in) const { return geometry(in[0].shape); }
  std::vector<TensorMeta> infer(std::span<const TensorMeta> in) const override {
    expect_arity(name(), in, 2);
    expect_conv_dtype(name(), in[0]);
    expect_same_dtype(name(), in[0], in[1]);
    ConvGeometry g = geometry(in);
    if (in[1].shape != Shape{g.n, g.cout, g.ho, g.wo})
      fail<ShapeError>(name(), ": output gradient ", in[1].shape.str(), " does not match the convolution of ",
                       in[0].shape.str(), " by ", w_.str(), " (expected [", g.n, ", ", g.cout, ", ", g.ho, ", ", g.wo,
                       "])");
    std::vector<TensorMeta> out{{in[0].dtype, w_}};
    if (with_bias_) out.push_back({in[0].dtype, Shape{g.cout}});
    return out;
  }
  Cost cost(std::span<const TensorMeta> in, std::span<const TensorMeta> out) const override {
    double bytes = double(in[0].nbytes() + in[1].nbytes());
    for (auto& m : out) bytes += double(m.nbytes());
    return {geometry(in).flops(), bytes};
  }

 private:
  Conv2dOptions o_;
  Shape w_;
  bool with_bias_;
};

}  // namespace frugal::ops

namespace frugal {

// PyTorch's F.conv2d: x [N, Cin, H, W], w [Cout, Cin/groups, kH, kW], b [Cout].
inline Var conv2d(Var x, Var w, std::optional<Var> b = std::nullopt, Conv2dOptions o = {}) {
  if (b) return apply1<ops::Conv2d>({x, w, *b}, o, true);
  return apply1<ops::Conv2d>({x, w}, o, false);
}

inline std::vector<std::optional<Var>> ops::Conv2d::backward(const BackwardArgs& args) const {
  Var x = args.inputs[0], w = args.inputs[1];
  if (!args.grad_outputs[0]) return std::vector<std::optional<Var>>(args.inputs.size());  // one nullopt per input
  Var dy = *args.grad_outputs[0];
  Var dx = apply1<Conv2dBackwardData>({dy, w}, o_, x.shape());
  auto dwb = frugal::apply(std::make_shared<Conv2dBackwardWeight>(o_, w.shape(), has_bias_), {x, dy});
  std::vector<std::optional<Var>> grads{dx, dwb[0]};
  if (has_bias_) grads.push_back(dwb[1]);
  return grads;
}

}  // namespace frugal
