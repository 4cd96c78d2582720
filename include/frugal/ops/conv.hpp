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

// ---- scratch space -----------------------------------------------------------
// The CPU kernels lower a convolution to matrix products over a chunk of
// images at a time: the chunk's im2col columns [k, images * Ho*Wo] (as a
// matrix for BLAS, or as 32-column panels for the AVX-512 engine), one
// product per group, then scatter (forward) or col2im (data gradient). A
// chunk has enough images that the product has about kConvTargetColumns
// columns (late ResNet layers have 4x4 outputs: one image would give 16
// columns, too few to split over threads or to run BLAS near its peak),
// capped so the column buffer stays small. The layout depends only on the
// shapes, never on the thread count or the engine, so a plan is the same on
// every machine. bf16/f16 operands are widened to f32 into this space too.
inline constexpr std::int64_t kConvTargetColumns = 512;
inline constexpr std::int64_t kConvMaxColumnBytes = std::int64_t(16) << 20;
// The CPU's AVX-512 engine packs columns in panels of 32; the regions it
// packs into are rounded up to whole panels.
inline constexpr std::int64_t kConvPanel = 32;

enum class ConvPass { forward, backward_data, backward_weight };

// With stride 1 (and padding no wider than the dilated kernel) the data
// gradient is itself a convolution: dx = conv(dy, w flipped in space with
// in/out channels swapped, padding (k - 1) * d - p), mapping the Ho x Wo
// planes of dy back to H x W. The CPU's AVX-512 engine runs it so, with no
// column gradient and no col2im.
inline bool conv_data_grad_is_conv(const ConvGeometry& g) {
  return g.sh == 1 && g.sw == 1 && g.ph <= (g.kh - 1) * g.dh && g.pw <= (g.kw - 1) * g.dw;
}
inline ConvGeometry conv_data_grad_geometry(const ConvGeometry& g) {
  ConvGeometry f = g;
  f.cin = g.cout, f.h = g.ho, f.w = g.wo, f.cout = g.cin;
  f.ph = (g.kh - 1) * g.dh - g.ph, f.pw = (g.kw - 1) * g.dw - g.pw;
  f.ho = g.h, f.wo = g.w;
  return f;
}

struct ConvScratch {
  std::int64_t images = 1;      // per chunk
  bool one = false;             // one image per chunk in f32/f64: BLAS reads and writes the tensors in place
  std::size_t elem = 4;         // bytes of the compute type (f32, or f64 for f64)
  // Region sizes in compute-type elements; 0 where the kernel works in place.
  std::size_t col = 0;          // [k, P] im2col columns (forward, weight) or their gradient (data)
  std::size_t weight = 0;       // [Cout, k] the weight widened to f32 (bf16/f16)
  std::size_t rows = 0;         // [Cout/groups, P] GEMM output (forward) or gathered dy (backward)
  std::size_t acc = 0;          // f32 accumulator for bf16/f16: dx of a chunk, or dw
  static constexpr std::size_t kAlign = 256;
  static std::size_t round(std::size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }
  std::size_t col_offset() const { return 0; }
  std::size_t weight_offset() const { return col_offset() + round(col * elem); }
  std::size_t rows_offset() const { return weight_offset() + round(weight * elem); }
  std::size_t acc_offset() const { return rows_offset() + round(rows * elem); }
  // Ends exactly at the last region's last byte, which the kernel writes, so
  // an audit of a step whose peak is this scratch sees every planned byte.
  std::size_t bytes() const {
    if (acc) return acc_offset() + acc * elem;
    if (rows) return rows_offset() + rows * elem;
    if (weight) return weight_offset() + weight * elem;
    return col * elem;
  }
};

inline bool is_half_storage(DType t) { return t == DType::bf16 || t == DType::f16; }

inline std::int64_t conv_chunk_images(const ConvGeometry& g, std::size_t elem,
                                      std::int64_t target_columns = kConvTargetColumns) {
  std::int64_t hw = std::max<std::int64_t>(g.hw_out(), 1);
  std::int64_t b = std::clamp<std::int64_t>((target_columns + hw - 1) / hw, 1, std::max<std::int64_t>(g.n, 1));
  std::int64_t col_bytes_per_image = g.k() * hw * std::int64_t(elem);
  while (b > 1 && b * col_bytes_per_image > kConvMaxColumnBytes) --b;
  return b;
}

// `images` overrides the chunk size (for benchmarks); 0 keeps the policy above.
inline ConvScratch conv_scratch(const ConvGeometry& g, DType dt, ConvPass pass, std::int64_t images = 0) {
  ConvScratch s;
  s.elem = dt == DType::f64 ? 8 : 4;
  // The weight gradient sums over the chunk's columns: longer chunks mean
  // fewer synchronised steps and deeper sums per output.
  const std::int64_t target = pass == ConvPass::backward_weight ? 4 * kConvTargetColumns : kConvTargetColumns;
  s.images = images > 0 ? std::min(images, std::max<std::int64_t>(g.n, 1)) : conv_chunk_images(g, s.elem, target);
  const bool half = is_half_storage(dt);
  const bool one = s.one = s.images == 1 && !half;
  const std::size_t p = std::size_t(s.images * g.hw_out()), k = std::size_t(g.k());
  const std::size_t cout_g = std::size_t(g.cout_g());
  auto panels = [](std::size_t n) { return (n + kConvPanel - 1) / kConvPanel * kConvPanel; };
  if (half) s.weight = std::size_t(g.cout) * k;
  // Each region serves both CPU engines (BLAS: row-major matrices; AVX-512:
  // 32-column panels), so a plan does not depend on which one runs.
  switch (pass) {
    case ConvPass::forward:
      s.col = k * panels(p);            // im2col columns / their panels
      s.rows = one ? 0 : cout_g * p;    // BLAS: the product before its scatter into y
      break;
    case ConvPass::backward_data:
      s.col = one && g.pointwise() ? 0 : k * p;  // the columns' gradient, for col2im
      s.rows = cout_g * panels(p);               // dy gathered / packed in panels
      if (half) s.acc = std::size_t(s.images * g.cin_g() * g.hw());
      if (conv_data_grad_is_conv(g)) {
        // As a convolution: dy's im2col panels, and the flipped weight in f32.
        const ConvGeometry f = conv_data_grad_geometry(g);
        s.col = std::max(s.col, std::size_t(f.k()) * panels(std::size_t(s.images * f.hw_out())));
        s.weight = std::size_t(g.cout) * k;
      }
      break;
    case ConvPass::backward_weight:
      s.col = one && g.pointwise() ? 0 : k * p;  // im2col columns
      s.rows = panels(cout_g) * p;               // dy gathered / packed transposed in panels
      if (half) s.acc = std::size_t(g.cout) * k;
      break;
  }
  return s;
}

// ---- ops ----------------------------------------------------------------------

class Conv2dBackwardData;
class Conv2dBackwardWeight;

// Inputs (x, w[, b]) -> y [N, Cout, Ho, Wo].
class Conv2d final : public Op {
 public:
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
  std::vector<std::optional<Var>> backward(const BackwardArgs& args) const override;
  Cost cost(std::span<const TensorMeta> in, std::span<const TensorMeta> out) const override {
    double bytes = 0;
    for (auto& m : in) bytes += double(m.nbytes());
    return {geometry(in).flops(), bytes + double(out[0].nbytes())};
  }
  std::size_t workspace_bytes(std::span<const TensorMeta> in, std::span<const TensorMeta>) const override {
    return conv_scratch(geometry(in), in[0].dtype, ConvPass::forward).bytes();
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
  std::size_t workspace_bytes(std::span<const TensorMeta> in, std::span<const TensorMeta>) const override {
    return conv_scratch(geometry(in), in[0].dtype, ConvPass::backward_data).bytes();
  }

 private:
  Conv2dOptions o_;
  Shape x_;
};

// Inputs (x, dy) -> dw [, db]: the gradient of conv2d with respect to its
// weight (GEMM dy·colᵀ, summed over the batch in image order) and bias.
class Conv2dBackwardWeight final : public Op {
 public:
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
  std::size_t workspace_bytes(std::span<const TensorMeta> in, std::span<const TensorMeta>) const override {
    return conv_scratch(geometry(in), in[0].dtype, ConvPass::backward_weight).bytes();
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
