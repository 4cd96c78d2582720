#pragma once
// AdamW with f32 master weights for a 16-bit parameter (DeepSpeed's and
// Megatron's mixed precision; the ZeRO paper's 2 + 2 + 12 bytes per
// parameter): the optimizer keeps an f32 copy of the bf16/f16 parameter and
// f32 moments, steps the copy with the f32 AdamW arithmetic, and writes the
// parameter as the copy rounded to nearest even. Small steps then
// accumulate in the copy instead of being rounded away in 8 or 11 bits.
#include "optimizer_updates.hpp"

namespace frugal::ops {

// S: the parameter's storage (BFloat16, Half). g is its gradient widened
// to f32 (exactly), times 1/scale under loss scaling. The master, m and v
// step exactly as an f32 parameter's AdamW would.
template <class S>
struct AdamWMasterMath {
  AdamWMath<float> adamw;
  FRUGAL_HD void operator()(S& p, float g, float& master, float& m, float& v) const {
    adamw(master, g, m, v);
    p = S(master);
  }
};

// Inputs (param, grad, master, m, v [, found_inf, scale, steps_taken]):
// param and grad bf16 or f16, of one dtype and shape; master, m and v f32
// of that shape. Writes param, master, m and v. Guarded as AdamWUpdate is
// (optimizer_updates.hpp): a skipped step writes nothing.
class AdamWMasterUpdate final : public Op {
 public:
  ~AdamWMasterUpdate() override;
  explicit AdamWMasterUpdate(std::shared_ptr<const AdamWHyper> h, bool guarded = false)
      : h_(std::move(h)), guarded_(guarded) {}
  bool guarded() const { return guarded_; }
  // `step`: this step's number, 1 on the first (the host's count unless guarded).
  template <class S>
  AdamWMasterMath<S> math(std::int64_t step) const {
    return {adamw_math<float>(*h_, step)};
  }
  template <class S>
  AdamWMasterMath<S> math() const {
    return math<S>(h_->step);
  }
  std::string name() const override { return guarded_ ? "adamw_master_update_guarded" : "adamw_master_update"; }
  std::vector<TensorMeta> infer(std::span<const TensorMeta> in) const override {
    if (guarded_) expect_guard(name(), in, 5);
    else expect_arity(name(), in, 5);
    const TensorMeta& p = in[0];
    if (p.dtype != DType::bf16 && p.dtype != DType::f16)
      fail<ShapeError>(name(), ": the parameter ", p.str(), " is not bf16 or f16; an f32 or f64 parameter needs no "
                       "master copy (adamw_update steps it in place)");
    if (in[1].dtype != p.dtype || in[1].shape != p.shape)
      fail<ShapeError>(name(), ": parameter ", p.str(), " and its gradient ", in[1].str(), " differ");
    for (std::size_t i = 2; i < 5; ++i)
      if (in[i].dtype != DType::f32 || in[i].shape != p.shape)
        fail<ShapeError>(name(), ": its ", i == 2 ? "master copy " : "moment ", in[i].str(), " is not f32",
                         p.shape.str(), ", the parameter's shape in f32");
    return {};
  }
  std::vector<int> mutated_inputs() const override { return {0, 2, 3, 4}; }

 private:
  std::shared_ptr<const AdamWHyper> h_;
  bool guarded_;
};

}  // namespace frugal::ops
