#pragma once
#include "../ops/upsample.hpp"
#include "module.hpp"

namespace frugal::nn {

// torch.nn.Upsample(size=..., scale_factor=..., mode=..., align_corners=...)
// for NCHW input, mode nearest or bilinear (exactly one of size and
// scale_factor; align_corners for bilinear only). No parameters.
class Upsample : public Layer {
 public:
  ~Upsample() override;
  explicit Upsample(Upsample2dOptions o, UpsampleMode mode = UpsampleMode::nearest) : o_(o), mode_(mode) {
    if (bool(o.size) == bool(o.scale_factor))
      fail<ShapeError>("nn::Upsample: give exactly one of size and scale_factor");
    if (mode == UpsampleMode::nearest && o.align_corners)
      fail<ShapeError>("nn::Upsample: align_corners only applies to mode bilinear, not nearest");
  }
  Var forward(Var x) override {
    return mode_ == UpsampleMode::nearest ? upsample_nearest2d(x, o_) : upsample_bilinear2d(x, o_);
  }
  UpsampleMode mode() const { return mode_; }
  const Upsample2dOptions& options() const { return o_; }

 private:
  Upsample2dOptions o_;
  UpsampleMode mode_;
};

}  // namespace frugal::nn
