#pragma once
// Upsampling (interpolation) of NCHW tensors with PyTorch's index
// conventions exactly (aten/src/ATen/native/UpSample.h):
// - nearest (F.interpolate(mode="nearest")): output (oh, ow) reads input
//   (min(floor(oh * scale_h), H - 1), ...) with scale = 1/scale_factor when a
//   scale factor was given, else H / Ho, computed in float as PyTorch does
//   (an output as large as the input copies it; twice as large halves the
//   index exactly).
// - bilinear (mode="bilinear"): the source coordinate is scale * oh with
//   align_corners (scale = (H-1)/(Ho-1), 0 for Ho = 1), else
//   scale * (oh + 0.5) - 0.5 clamped at 0 (scale as for nearest); it mixes
//   the two neighbouring rows and columns by their distances, computed in the
//   tensor's own precision (float for f32), as PyTorch's CPU kernel does.
// The output size is given, or floor(H * scale_factor) as F.interpolate
// computes it (recompute_scale_factor=None: the given factor, not the
// rounded size, sets the scale).
//
// The backward adds each output's gradient into the inputs it read with the
// same weights: a pure function of dy, deterministic (planes over threads,
// each plane in output order).
#include <cmath>
#include <optional>

#include "conv.hpp"

namespace frugal {

// A (height, width) pair of scale factors; one number means both.
struct Scale2 {
  double h = 1, w = 1;
  constexpr Scale2(double both) : h(both), w(both) {}  // NOLINT: implicit on purpose
  constexpr Scale2(double height, double width) : h(height), w(width) {}
  bool operator==(const Scale2&) const = default;
  std::string str() const { return cat("(", h, ", ", w, ")"); }
};

// Exactly one of size and scale_factor, as F.interpolate.
struct Upsample2dOptions {
  std::optional<Size2> size;
  std::optional<Scale2> scale_factor;
  bool align_corners = false;  // bilinear only
};

enum class UpsampleMode { nearest, bilinear };

}  // namespace frugal

namespace frugal::ops {

// PyTorch's compute_scales_value / area_pixel_compute_scale, in type A.
template <class A>
inline A upsample_scale(std::int64_t in, std::int64_t out, bool align_corners, double scale_factor) {
  if (align_corners) return out > 1 ? A(in - 1) / A(out - 1) : A(0);
  return scale_factor > 0 ? A(1.0 / scale_factor) : A(in) / A(out);
}

// PyTorch's nearest_idx: the input index output index o reads.
inline std::int64_t nearest_source(std::int64_t o, std::int64_t in, std::int64_t out, double scale_factor) {
  if (out == in) return o;
  if (out == 2 * in) return o >> 1;
  const float scale = upsample_scale<float>(in, out, false, scale_factor);
  return std::min(std::int64_t(std::floor(float(o) * scale)), in - 1);
}

// One output coordinate's two input neighbours and their weights.
template <class A>
struct LinearTap {
  std::int64_t i0, i1;  // i1 = i0 + 1, or i0 at the last input
  A l0, l1;             // weights of i0 and i1
};

// PyTorch's area_pixel_compute_source_index and the neighbours of bilinear.
template <class A>
inline LinearTap<A> linear_source(std::int64_t o, std::int64_t in, A scale, bool align_corners) {
  A src = align_corners ? scale * A(o) : scale * (A(o) + A(0.5)) - A(0.5);
  if (!align_corners && src < A(0)) src = A(0);
  // guard_index_and_lambda: the index clamped to the input, its weight to [0, 1].
  const std::int64_t i0 = std::min(std::int64_t(std::floor(src)), in - 1);
  const std::int64_t step = i0 < in - 1 ? 1 : 0;
  const A l1 = std::clamp(src - A(i0), A(0), A(1));
  return {i0, i0 + step, A(1) - l1, l1};
}

// The resolved geometry: input and output sizes, and the scale factors the
// index maps use (0 where the size, not a factor, was given).
struct UpsampleGeometry {
  std::int64_t n, c, h, w, ho, wo;
  double scale_h = 0, scale_w = 0;
  std::int64_t planes() const { return n * c; }
  std::int64_t hw() const { return h * w; }
  std::int64_t hw_out() const { return ho * wo; }
};

inline const char* upsample_name(UpsampleMode m) {
  return m == UpsampleMode::nearest ? "upsample_nearest2d" : "upsample_bilinear2d";
}

inline UpsampleGeometry upsample_geometry(const std::string& op, const Shape& x, UpsampleMode mode,
                                          const Upsample2dOptions& o) {
  auto bad = [&](const std::string& why) { fail<ShapeError>(op, ": input ", x.str(), ": ", why); };
  if (x.rank() != 4) bad("the input must be [N, C, H, W]");
  if (x[2] == 0 || x[3] == 0) bad("the input has an empty plane");
  if (bool(o.size) == bool(o.scale_factor)) bad("give exactly one of size and scale_factor");
  if (mode == UpsampleMode::nearest && o.align_corners)
    bad("align_corners only applies to bilinear interpolation, not nearest");
  UpsampleGeometry g{x[0], x[1], x[2], x[3], 0, 0};
  if (o.size) {
    if (o.size->h < 1 || o.size->w < 1) bad(cat("the output size ", o.size->str(), " must be positive"));
    g.ho = o.size->h, g.wo = o.size->w;
  } else {
    const Scale2 s = *o.scale_factor;
    if (!(s.h > 0) || !(s.w > 0) || !std::isfinite(s.h) || !std::isfinite(s.w))
      bad(cat("scale_factor ", s.str(), " must be positive and finite"));
    g.ho = std::int64_t(std::floor(double(g.h) * s.h));
    g.wo = std::int64_t(std::floor(double(g.w) * s.w));
    if (g.ho < 1 || g.wo < 1)
      bad(cat("scale_factor ", s.str(), " gives an empty output (", g.ho, " x ", g.wo, ")"));
    g.scale_h = s.h, g.scale_w = s.w;
  }
  return g;
}

class Upsample2dBackward;

// Input x [N, C, H, W] -> y [N, C, Ho, Wo].
class Upsample2d final : public Op {
 public:
  ~Upsample2d() override;
  Upsample2d(UpsampleMode mode, Upsample2dOptions o) : mode_(mode), o_(o) {}
  UpsampleMode mode() const { return mode_; }
  bool align_corners() const { return o_.align_corners; }
  std::string name() const override { return upsample_name(mode_); }
  UpsampleGeometry geometry(const Shape& x) const { return upsample_geometry(name(), x, mode_, o_); }
  std::vector<TensorMeta> infer(std::span<const TensorMeta> in) const override {
    expect_arity(name(), in, 1);
    expect_floating(name(), in[0]);
    UpsampleGeometry g = geometry(in[0].shape);
    return {{in[0].dtype, Shape{g.n, g.c, g.ho, g.wo}}};
  }
  inline std::vector<std::optional<Var>> backward(const BackwardArgs& a) const override;
  Cost cost(std::span<const TensorMeta> in, std::span<const TensorMeta> out) const override {
    const double taps = mode_ == UpsampleMode::nearest ? 1 : 4;
    return {2 * taps * double(out[0].shape.numel()), double(in[0].nbytes() + out[0].nbytes())};
  }

 private:
  UpsampleMode mode_;
  Upsample2dOptions o_;
};

// Input dy [N, C, Ho, Wo] -> dx [N, C, H, W].
class Upsample2dBackward final : public Op {
 public:
  ~Upsample2dBackward() override;
  Upsample2dBackward(UpsampleMode mode, Upsample2dOptions o, Shape x_shape)
      : mode_(mode), o_(o), x_(std::move(x_shape)) {}
  UpsampleMode mode() const { return mode_; }
  bool align_corners() const { return o_.align_corners; }
  std::string name() const override { return std::string(upsample_name(mode_)) + "_backward"; }
  UpsampleGeometry geometry() const { return upsample_geometry(name(), x_, mode_, o_); }
  std::vector<TensorMeta> infer(std::span<const TensorMeta> in) const override {
    expect_arity(name(), in, 1);
    expect_floating(name(), in[0]);
    UpsampleGeometry g = geometry();
    if (in[0].shape != Shape{g.n, g.c, g.ho, g.wo})
      fail<ShapeError>(name(), ": output gradient ", in[0].shape.str(), " does not match upsampling ", x_.str(),
                       " (expected [", g.n, ", ", g.c, ", ", g.ho, ", ", g.wo, "])");
    return {{in[0].dtype, x_}};
  }
  Cost cost(std::span<const TensorMeta> in, std::span<const TensorMeta> out) const override {
    const double taps = mode_ == UpsampleMode::nearest ? 1 : 4;
    return {2 * taps * double(in[0].shape.numel()), double(in[0].nbytes() + out[0].nbytes())};
  }

 private:
  UpsampleMode mode_;
  Upsample2dOptions o_;
  Shape x_;
};

inline std::vector<std::optional<Var>> Upsample2d::backward(const BackwardArgs& a) const {
  if (!a.grad_outputs[0]) return {std::nullopt};
  return {apply1<Upsample2dBackward>({*a.grad_outputs[0]}, mode_, o_, a.inputs[0].shape())};
}

}  // namespace frugal::ops

namespace frugal {

// F.interpolate(x, size=..., mode="nearest") or (x, scale_factor=...).
inline Var upsample_nearest2d(Var x, Upsample2dOptions o) {
  return apply1<ops::Upsample2d>({x}, UpsampleMode::nearest, o);
}

// F.interpolate(x, size=... or scale_factor=..., mode="bilinear", align_corners=...).
inline Var upsample_bilinear2d(Var x, Upsample2dOptions o) {
  return apply1<ops::Upsample2d>({x}, UpsampleMode::bilinear, o);
}

}  // namespace frugal
