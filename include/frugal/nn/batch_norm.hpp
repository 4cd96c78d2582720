#pragma once
#include "../ops/batch_norm.hpp"
#include "module.hpp"

namespace frugal::nn {

struct BatchNormOptions {
  double eps = 1e-5;
  double momentum = 0.1;
  bool track_running_stats = true;
  DType dtype = DType::f32;
};

// torch.nn.BatchNorm2d over NCHW input: weight = 1, bias = 0, and buffers
// running_mean = 0, running_var = 1, num_batches_tracked = 0. In training
// mode it normalises with the batch statistics and updates the buffers (one
// separate in-place op, so recomputing the forward never updates them
// twice); in eval mode it normalises with the buffers.
class BatchNorm2d : public Layer {
 public:
  ~BatchNorm2d() override;
  explicit BatchNorm2d(std::int64_t num_features, BatchNormOptions o = {}) : c_(num_features), o_(o) {
    if (num_features <= 0) fail<ShapeError>("nn::BatchNorm2d: num_features must be positive, got ", num_features);
    if (o.dtype != DType::f32 && o.dtype != DType::f64)
      fail<ShapeError>("nn::BatchNorm2d: dtype must be f32 or f64, got ", dtype_name(o.dtype));
    weight = register_parameter("weight", filled(1.0));
    bias = register_parameter("bias", filled(0.0));
    if (o.track_running_stats) {
      running_mean = register_buffer("running_mean", filled(0.0));
      running_var = register_buffer("running_var", filled(1.0));
      num_batches_tracked = register_buffer("num_batches_tracked", Tensor(Shape{}, DType::i64));
    }
  }
  Var forward(Var x) override {
    if (x.rank() != 4 || x.dim(1) != c_)
      fail<ShapeError>("nn::BatchNorm2d '", qualified_name(), "': expects [N, ", c_, ", H, W], got ", x.shape().str());
    if (is_training() || !o_.track_running_stats) {
      BatchNormOutputs out = batch_norm2d_train(x, var(weight), var(bias), o_.eps);
      if (o_.track_running_stats && is_training())
        batch_norm_update_stats(buffer_var(running_mean), buffer_var(running_var), out,
                                ops::batch_norm_count(x.shape()), o_.momentum, buffer_var(num_batches_tracked));
      return out.y;
    }
    return batch_norm2d_eval(x, var(weight), var(bias), buffer_var(running_mean), buffer_var(running_var), o_.eps);
  }
  std::int64_t num_features() const { return c_; }
  const BatchNormOptions& options() const { return o_; }

  Tensor weight, bias, running_mean, running_var, num_batches_tracked;

 private:
  Tensor filled(double v) const {
    Tensor t({c_}, o_.dtype);
    if (t.is_meta()) return t;
    for (std::int64_t i = 0; i < c_; ++i) {
      if (o_.dtype == DType::f64) t.data<double>()[i] = v;
      else t.data<float>()[i] = float(v);
    }
    return t;
  }
  std::int64_t c_;
  BatchNormOptions o_;
};

}  // namespace frugal::nn
