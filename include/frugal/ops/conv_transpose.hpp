#pragma once
// 2-D transposed convolution over NCHW tensors with PyTorch's layout and
// semantics (F.conv_transpose2d): x [N, Cin, H, W], weight
// [Cin, Cout/groups, kH, kW], optional bias [Cout], output
//   Ho = (H - 1) sH - 2 pH + dH (kH - 1) + output_padding_h + 1   (and W alike).
//
// A transposed convolution is the adjoint of a convolution: it is conv2d's
// data gradient, for the convolution that maps the output [N, Cout, Ho, Wo]
// back to x by the same weight (conv2d's out_channels = Cin). So every op
// here describes itself by that convolution's ConvGeometry (input = this
// op's output, output = this op's input) and the CPU runs conv2d's kernels:
//   forward          = conv2d backward-data,
//   data gradient    = conv2d forward (of dy by the same weight),
//   weight gradient  = conv2d weight gradient with x and dy in swapped roles.
// The geometry's output size is x's H x W, which the convolution's own
// formula gives whenever output_padding < stride; with stride <=
// output_padding < dilation (which PyTorch also allows) the formula gives
// more rows than x has, and the kernels, which bound-check every tap, simply
// compute the first H (except for a 1x1, stride-1, unpadded kernel, whose
// kernels assume the planes line up: that one case is refused).
//
// The backward is two ops, as conv2d's, so the planner can free what each
// does not read: the data gradient reads (dy, w), the weight gradient (x, dy).
#include "conv.hpp"

namespace frugal {

struct ConvTranspose2dOptions {
  Size2 stride = 1;
  Size2 padding = 0;
  Size2 output_padding = 0;
  std::int64_t groups = 1;
  Size2 dilation = 1;  // PyTorch's argument order: dilation comes after groups
};

}  // namespace frugal

namespace frugal::ops {

inline Conv2dOptions as_conv_options(const ConvTranspose2dOptions& o) {
  return {o.stride, o.padding, o.dilation, o.groups};
}

// The convolution whose data gradient is the transposed convolution of x by
// wt. Allocates nothing unless the shapes are bad, so kernels may call it.
inline ConvGeometry conv_transpose_geometry(const char* op, const Shape& x, const Shape& wt,
                                            const ConvTranspose2dOptions& o) {
  auto bad = [&](const std::string& why) {
    fail<ShapeError>(op, ": input ", x.str(), " and weight ", wt.str(), " (stride ", o.stride.str(), ", padding ",
                     o.padding.str(), ", output_padding ", o.output_padding.str(), ", groups ", o.groups,
                     ", dilation ", o.dilation.str(), "): ", why);
  };
  if (x.rank() != 4) bad("the input must be [N, C, H, W]");
  if (wt.rank() != 4) bad("the weight must be [in_channels, out_channels/groups, kH, kW]");
  if (o.stride.h < 1 || o.stride.w < 1) bad("stride must be at least 1");
  if (o.dilation.h < 1 || o.dilation.w < 1) bad("dilation must be at least 1");
  if (o.padding.h < 0 || o.padding.w < 0) bad("padding must not be negative");
  if (o.groups < 1) bad("groups must be at least 1");
  if (o.output_padding.h < 0 || o.output_padding.w < 0) bad("output_padding must not be negative");
  if ((o.output_padding.h >= o.stride.h && o.output_padding.h >= o.dilation.h) ||
      (o.output_padding.w >= o.stride.w && o.output_padding.w >= o.dilation.w))
    bad("output_padding must be smaller than either stride or dilation");
  const std::int64_t n = x[0], cin = x[1], h = x[2], w = x[3];
  if (cin == 0 || wt[1] == 0 || wt[2] == 0 || wt[3] == 0) bad("channels and kernel sizes must be positive");
  if (h == 0 || w == 0) bad("the input has an empty plane");
  if (wt[0] != cin) bad(cat("the weight's first dimension must be in_channels = ", cin, ", got ", wt[0]));
  if (cin % o.groups != 0) bad(cat("in_channels ", cin, " is not divisible by groups ", o.groups));
  const std::int64_t cout = wt[1] * o.groups;
  const std::int64_t ho = (h - 1) * o.stride.h - 2 * o.padding.h + o.dilation.h * (wt[2] - 1) + o.output_padding.h + 1;
  const std::int64_t wo = (w - 1) * o.stride.w - 2 * o.padding.w + o.dilation.w * (wt[3] - 1) + o.output_padding.w + 1;
  if (ho <= 0 || wo <= 0) bad(cat("the output would be ", ho, " x ", wo, ": the padding is too large"));
  ConvGeometry g = conv_geometry(op, Shape{n, cout, ho, wo}, wt, as_conv_options(o));
  // The convolution of the output gives back at least H x W (see above); x is its first H x W.
  if ((g.ho != h || g.wo != w) && g.pointwise())
    bad("output_padding at or above the stride with a 1x1 kernel, stride 1 and no padding is not supported "
        "(those output rows would be bias only; pad the result instead)");
  g.ho = h;
  g.wo = w;
  return g;
}

// The output shape [N, Cout, Ho, Wo] from the geometry (the convolution's input).
inline Shape conv_transpose_output_shape(const ConvGeometry& g) { return Shape{g.n, g.cin, g.h, g.w}; }

inline void expect_conv_transpose_dtype(const std::string& op, const TensorMeta& m) {
  if (m.dtype != DType::f32 && m.dtype != DType::f64)
    fail<ShapeError>(op, ": expects an f32 or f64 tensor (bf16/f16 are not supported yet), got ", m.str());
}

class ConvTranspose2dBackwardData;
class ConvTranspose2dBackwardWeight;

// Inputs (x, w[, b]) -> y [N, Cout, Ho, Wo].
class ConvTranspose2d final : public Op {
 public:
  ~ConvTranspose2d() override;
  ConvTranspose2d(ConvTranspose2dOptions o, bool has_bias) : o_(o), has_bias_(has_bias) {}
  const ConvTranspose2dOptions& options() const { return o_; }
  bool has_bias() const { return has_bias_; }
  std::string name() const override { return "conv_transpose2d"; }
  ConvGeometry geometry(const Shape& x, const Shape& w) const {
    return conv_transpose_geometry("conv_transpose2d", x, w, o_);
  }
  ConvGeometry geometry(std::span<const TensorMeta> in) const { return geometry(in[0].shape, in[1].shape); }
  std::vector<TensorMeta> infer(std::span<const TensorMeta> in) const override {
    expect_arity(name(), in, has_bias_ ? 3 : 2);
    expect_conv_transpose_dtype(name(), in[0]);
    expect_same_dtype(name(), in[0], in[1]);
    ConvGeometry g = geometry(in);
    if (has_bias_) {
      expect_same_dtype(name(), in[0], in[2]);
      if (in[2].shape != Shape{g.cin})
        fail<ShapeError>(name(), ": bias ", in[2].shape.str(), " does not match weight ", in[1].shape.str(),
                         " and groups ", o_.groups, " (expected [", g.cin, "], one per output channel)");
    }
    return {{in[0].dtype, conv_transpose_output_shape(g)}};
  }
  inline std::vector<std::optional<Var>> backward(const BackwardArgs& args) const override;
  Cost cost(std::span<const TensorMeta> in, std::span<const TensorMeta> out) const override {
    double bytes = 0;
    for (auto& m : in) bytes += double(m.nbytes());
    return {geometry(in).flops(), bytes + double(out[0].nbytes())};
  }

 private:
  ConvTranspose2dOptions o_;
  bool has_bias_;
};

// Inputs (dy, w) -> dx: a convolution of dy by w with the same stride,
// padding, dilation and groups. x's shape is kept, so the op checks dy
// against the forward it came from.
class ConvTranspose2dBackwardData final : public Op {
 public:
  ~ConvTranspose2dBackwardData() override;
  ConvTranspose2dBackwardData(ConvTranspose2dOptions o, Shape x_shape) : o_(o), x_(std::move(x_shape)) {}
  const ConvTranspose2dOptions& options() const { return o_; }
  std::string name() const override { return "conv_transpose2d_backward_data"; }
  ConvGeometry geometry(const Shape& w) const {
    return conv_transpose_geometry("conv_transpose2d_backward_data", x_, w, o_);
  }
  ConvGeometry geometry(std::span<const TensorMeta> in) const { return geometry(in[1].shape); }
  std::vector<TensorMeta> infer(std::span<const TensorMeta> in) const override {
    expect_arity(name(), in, 2);
    expect_conv_transpose_dtype(name(), in[0]);
    expect_same_dtype(name(), in[0], in[1]);
    ConvGeometry g = geometry(in);
    if (in[0].shape != conv_transpose_output_shape(g))
      fail<ShapeError>(name(), ": output gradient ", in[0].shape.str(), " does not match the transposed convolution of ",
                       x_.str(), " by ", in[1].shape.str(), " (expected ", conv_transpose_output_shape(g).str(), ")");
    return {{in[0].dtype, x_}};
  }
  Cost cost(std::span<const TensorMeta> in, std::span<const TensorMeta> out) const override {
    return {geometry(in).flops(), double(in[0].nbytes() + in[1].nbytes() + out[0].nbytes())};
  }

 private:
  ConvTranspose2dOptions o_;
  Shape x_;
};

// Inputs (x, dy) -> dw [, db]: conv2d's weight gradient with dy as the
// convolution's input and x as its output gradient; db sums dy per channel.
class ConvTranspose2dBackwardWeight final : public Op {
 public:
  ~ConvTranspose2dBackwardWeight() override;
  ConvTranspose2dBackwardWeight(ConvTranspose2dOptions o, Shape w_shape, bool with_bias)
      : o_(o), w_(std::move(w_shape)), with_bias_(with_bias) {}
  const ConvTranspose2dOptions& options() const { return o_; }
  bool with_bias() const { return with_bias_; }
  std::string name() const override { return "conv_transpose2d_backward_weight"; }
  ConvGeometry geometry(const Shape& x) const {
    return conv_transpose_geometry("conv_transpose2d_backward_weight", x, w_, o_);
  }
  ConvGeometry geometry(std::span<const TensorMeta> in) const { return geometry(in[0].shape); }
  std::vector<TensorMeta> infer(std::span<const TensorMeta> in) const override {
    expect_arity(name(), in, 2);
    expect_conv_transpose_dtype(name(), in[0]);
    expect_same_dtype(name(), in[0], in[1]);
    ConvGeometry g = geometry(in);
    if (in[1].shape != conv_transpose_output_shape(g))
      fail<ShapeError>(name(), ": output gradient ", in[1].shape.str(), " does not match the transposed convolution of ",
                       in[0].shape.str(), " by ", w_.str(), " (expected ", conv_transpose_output_shape(g).str(), ")");
    std::vector<TensorMeta> out{{in[0].dtype, w_}};
    if (with_bias_) out.push_back({in[0].dtype, Shape{g.cin}});
    return out;
  }
  Cost cost(std::span<const TensorMeta> in, std::span<const TensorMeta> out) const override {
    double bytes = double(in[0].nbytes() + in[1].nbytes());
    for (auto& m : out) bytes += double(m.nbytes());
    return {geometry(in).flops(), bytes};
  }

 private:
  ConvTranspose2dOptions o_;
  Shape w_;
  bool with_bias_;
};

}  // namespace frugal::ops

namespace frugal {

// PyTorch's F.conv_transpose2d: x [N, Cin, H, W], w [Cin, Cout/groups, kH, kW], b [Cout].
inline Var conv_transpose2d(Var x, Var w, std::optional<Var> b = std::nullopt, ConvTranspose2dOptions o = {}) {
  if (b) return apply1<ops::ConvTranspose2d>({x, w, *b}, o, true);
  return apply1<ops::ConvTranspose2d>({x, w}, o, false);
}

inline std::vector<std::optional<Var>> ops::ConvTranspose2d::backward(const BackwardArgs& args) const {
  Var x = args.inputs[0], w = args.inputs[1];
  if (!args.grad_outputs[0]) return std::vector<std::optional<Var>>(args.inputs.size());
  Var dy = *args.grad_outputs[0];
  Var dx = apply1<ConvTranspose2dBackwardData>({dy, w}, o_, x.shape());
  auto dwb = frugal::apply(std::make_shared<ConvTranspose2dBackwardWeight>(o_, w.shape(), has_bias_), {x, dy});
  std::vector<std::optional<Var>> grads{dx, dwb[0]};
  if (has_bias_) grads.push_back(dwb[1]);
  return grads;
}

}  // namespace frugal
