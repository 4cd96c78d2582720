#pragma once
// Dynamic loss scaling for f16 training, as torch.cuda.amp.GradScaler, but
// inside the compiled step: the scale, the count of good steps and the skip
// statistics are persistent state the step's own ops read and write, so a
// step never waits on the host to decide whether to skip.
//
//   optim::LossScaler scaler;                          // GradScaler's defaults
//   optim::AdamW opt(model.parameters(), {.lr = 1e-3});
//   Step step = compile(loss_fn, specs, opt, {}, {.loss_scaler = &scaler});
//   for (...) {
//     float loss = step.run(x, y);                     // the unscaled loss
//     if (scaler.last_step_skipped()) ...              // gradients overflowed
//   }
//
// Each step: gradients are taken of loss * scale; if any gradient divided by
// the scale is infinite or NaN, the optimizer writes nothing (parameters,
// moments and its step count stay bitwise as they were) and the scale is
// multiplied by backoff_factor; otherwise the updates use gradient / scale,
// and after growth_interval such steps in a row the scale is multiplied by
// growth_factor. The optimizer must be a SkippableOptimizer (AdamW, SGD).
// Gradients kept with CompileOptions::keep_grads are the scaled ones (as
// PyTorch's .grad before unscale_).
#include <cmath>
#include <limits>

#include "../graph/capture.hpp"
#include "../ops/binary.hpp"
#include "../runtime/loss_scaling.hpp"

namespace frugal::optim {

struct LossScalerOptions {
  double init_scale = 65536.0;  // 2^16
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  std::int64_t growth_interval = 2000;
};

class LossScaler final : public LossScalerBase {
 public:
  ~LossScaler() override;
  explicit LossScaler(LossScalerOptions o = {})
      : h_(std::make_shared<ops::LossScaleHyper>()),
        scale_(Shape{}, DType::f32),
        good_steps_(Shape{}, DType::i32),
        stats_(Shape{2}, DType::i64) {
    if (!(o.init_scale > 0) || !std::isfinite(float(o.init_scale)))
      fail("optim::LossScaler: init_scale must be positive and finite in f32, got ", o.init_scale);
    if (!(o.growth_factor > 1)) fail("optim::LossScaler: growth_factor must be > 1, got ", o.growth_factor);
    if (!(o.backoff_factor > 0 && o.backoff_factor < 1))
      fail("optim::LossScaler: backoff_factor must lie in (0, 1), got ", o.backoff_factor);
    if (o.growth_interval < 1 || o.growth_interval > std::numeric_limits<std::int32_t>::max())
      fail("optim::LossScaler: growth_interval must be a positive int32, got ", o.growth_interval);
    *h_ = {o.growth_factor, o.backoff_factor, o.growth_interval};
    scale_.data<float>()[0] = float(o.init_scale);
  }

  Var scale_loss(Var loss) override {
    if (!is_floating(loss.dtype())) fail("optim::LossScaler: the loss has integer dtype ", dtype_name(loss.dtype()));
    return loss * cast(scale_var(), loss.dtype());
  }
  ops::UpdateGuard check_gradients(std::span<const Var> grads) override {
    std::vector<Var> in{scale_var()};
    in.insert(in.end(), grads.begin(), grads.end());
    Var found = apply1<ops::NonFiniteCheck>(std::move(in));
    return {found, scale_var()};
  }
  void append_scale_update(const ops::UpdateGuard& guard) override {
    frugal::apply(std::make_shared<ops::UpdateLossScale>(h_),
                  {scale_var(), persistent_var(good_steps_, ValueKind::state, "loss_scaler.growth_tracker"),
                   persistent_var(stats_, ValueKind::state, "loss_scaler.skip_stats"), guard.found_inf});
  }

  // The current scale (what the next step multiplies its loss by).
  float scale() const { return scale_.data<float>()[0]; }
  // Overflow-free steps since the scale last changed or overflowed.
  std::int32_t growth_tracker() const { return good_steps_.data<std::int32_t>()[0]; }
  // Steps whose update was skipped for an overflow, in all.
  std::int64_t skipped_steps() const { return stats_.data<std::int64_t>()[0]; }
  bool last_step_skipped() const { return stats_.data<std::int64_t>()[1] != 0; }
  // For resuming a run (as GradScaler.load_state_dict).
  void set_state(float scale, std::int32_t growth_tracker) {
    if (!(scale > 0) || !std::isfinite(scale)) fail("optim::LossScaler: scale must be positive and finite, got ", scale);
    scale_.data<float>()[0] = scale;
    good_steps_.data<std::int32_t>()[0] = growth_tracker;
  }
  // The state tensors, e.g. for checkpoints: f32[] scale, i32[] growth
  // tracker, i64[2] {skipped steps, last step skipped}.
  const Tensor& scale_tensor() const { return scale_; }
  const Tensor& growth_tracker_tensor() const { return good_steps_; }
  const Tensor& skip_stats_tensor() const { return stats_; }

 private:
  Var scale_var() const { return persistent_var(scale_, ValueKind::state, "loss_scaler.scale"); }

  std::shared_ptr<ops::LossScaleHyper> h_;
  Tensor scale_, good_steps_, stats_;
};

}  // namespace frugal::optim
