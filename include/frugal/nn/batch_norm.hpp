#pragma once
#include <algorithm>
#include <type_traits>

#include "../ops/batch_norm.hpp"
#include "../ops/cast.hpp"
#include "module.hpp"

namespace frugal::nn {

struct BatchNormOptions {
  double eps = 1e-5;
  double momentum = 0.1;
  bool track_running_stats = true;
  // f32, f64, bf16 or f16: the dtype of the input, the output, and the
  // weight and bias. The running statistics are kept in its compute dtype
  // (f32 for bf16/f16; ops/batch_norm.hpp says why).
  DType dtype = DType::f32;
};

namespace detail {
// The checks and per-channel tensors BatchNorm2d and BatchNorm1d share.
inline void check_batch_norm_options(const char* layer, std::int64_t num_features, const BatchNormOptions& o) {
  if (num_features <= 0) fail<ShapeError>(layer, ": num_features must be positive, got ", num_features);
  if (!is_floating(o.dtype))
    fail<ShapeError>(layer, ": dtype must be f32, f64, bf16 or f16, got ", dtype_name(o.dtype));
}
// [c] of dtype dt, every element v (rounded once to dt).
inline Tensor filled_per_channel(std::int64_t c, DType dt, double v) {
  Tensor t({c}, dt);
  if (t.is_meta()) return t;
  auto fill = [&](auto* p) {
    using T = std::remove_pointer_t<decltype(p)>;
    std::fill(p, p + c, math::convert<T>(v));
  };
  switch (dt) {
    case DType::f64: fill(t.data<double>()); break;
    case DType::f32: fill(t.data<float>()); break;
    case DType::bf16: fill(t.data<BFloat16>()); break;
    case DType::f16: fill(t.data<Half>()); break;
    default: fail("internal error: a batch norm tensor of dtype ", dtype_name(dt));
  }
  return t;
}
}  // namespace detail

// torch.nn.BatchNorm2d over NCHW input: weight = 1, bias = 0, and buffers
// running_mean = 0, running_var = 1, num_batches_tracked = 0. In training
// mode it normalises with the batch statistics and updates the buffers (one
// separate in-place op, so recomputing the forward never updates them
// twice); in eval mode it normalises with the buffers. weight and bias are
// of options().dtype, the running statistics of its compute dtype.
class BatchNorm2d : public Layer {
 public:
  ~BatchNorm2d() override;
  explicit BatchNorm2d(std::int64_t num_features, BatchNormOptions o = {}) : c_(num_features), o_(o) {
    detail::check_batch_norm_options("nn::BatchNorm2d", num_features, o);
    weight = register_parameter("weight", detail::filled_per_channel(c_, o.dtype, 1.0));
    bias = register_parameter("bias", detail::filled_per_channel(c_, o.dtype, 0.0));
    if (o.track_running_stats) {
      running_mean = register_buffer("running_mean", detail::filled_per_channel(c_, compute_dtype(o.dtype), 0.0));
      running_var = register_buffer("running_var", detail::filled_per_channel(c_, compute_dtype(o.dtype), 1.0));
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
  std::int64_t c_;
  BatchNormOptions o_;
};

}  // namespace frugal::nn
