#pragma once
#include "../ops/batch_norm1d.hpp"
#include "batch_norm.hpp"

namespace frugal::nn {

// torch.nn.BatchNorm1d over [N, C] or [N, C, L] input: weight = 1, bias = 0,
// buffers running_mean = 0, running_var = 1, num_batches_tracked = 0, the
// same options and rules as BatchNorm2d (statistics per channel over N and
// L; the running statistics are updated by one separate in-place op).
class BatchNorm1d : public Layer {
 public:
  ~BatchNorm1d() override;
  explicit BatchNorm1d(std::int64_t num_features, BatchNormOptions o = {}) : c_(num_features), o_(o) {
    detail::check_batch_norm_options("nn::BatchNorm1d", num_features, o);
    weight = register_parameter("weight", detail::filled_per_channel(c_, o.dtype, 1.0));
    bias = register_parameter("bias", detail::filled_per_channel(c_, o.dtype, 0.0));
    if (o.track_running_stats) {
      running_mean = register_buffer("running_mean", detail::filled_per_channel(c_, compute_dtype(o.dtype), 0.0));
      running_var = register_buffer("running_var", detail::filled_per_channel(c_, compute_dtype(o.dtype), 1.0));
      num_batches_tracked = register_buffer("num_batches_tracked", Tensor(Shape{}, DType::i64));
    }
  }
  Var forward(Var x) override {
    if ((x.rank() != 2 && x.rank() != 3) || x.dim(1) != c_)
      fail<ShapeError>("nn::BatchNorm1d '", qualified_name(), "': expects [N, ", c_, "] or [N, ", c_, ", L], got ",
                       x.shape().str());
    if (is_training() || !o_.track_running_stats) {
      BatchNormOutputs out = batch_norm1d_train(x, var(weight), var(bias), o_.eps);
      if (o_.track_running_stats && is_training())
        batch_norm_update_stats(buffer_var(running_mean), buffer_var(running_var), out,
                                batch_norm1d_count(x.shape()), o_.momentum, buffer_var(num_batches_tracked));
      return out.y;
    }
    return batch_norm1d_eval(x, var(weight), var(bias), buffer_var(running_mean), buffer_var(running_var), o_.eps);
  }
  std::int64_t num_features() const { return c_; }
  const BatchNormOptions& options() const { return o_; }

  Tensor weight, bias, running_mean, running_var, num_batches_tracked;

 private:
  std::int64_t c_;
  BatchNormOptions o_;
};

}  // namespace frugal::nn
