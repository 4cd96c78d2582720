#pragma once
// Batch normalisation over NCHW tensors (per channel C, statistics over N,
// H, W), as PyTorch's BatchNorm2d.
//
// Training mode is two ops. BatchNorm2dTrain normalises with the batch
// statistics and outputs them; it has no side effects, so a planner may
// recompute it. BatchNormUpdateStats, a separate op, folds those statistics
// into the running mean and variance in place (PyTorch's rule: momentum
// 0.1, the running variance takes the UNBIASED batch variance), so
// recomputing the forward never updates the statistics twice.
// Eval mode normalises with the running statistics: a pure op.
//
// Dtypes: x, y, their gradients and the affine weight and bias (gamma,
// beta) share one dtype, f32, f64, bf16 or f16; the statistics (the batch
// mean and variance these ops output and read, and the running mean and
// variance) are in its compute dtype (compute_dtype: f32 for bf16/f16), as
// PyTorch and cuDNN keep them for half-precision batch norm. A 16-bit
// running variance would lose the momentum updates (0.1 of a change below
// half a bf16 ulp of the variance rounds away), and the f32 statistics are
// what the backward needs to reproduce the forward's normalisation. gamma
// and beta are parameters like every other of a 16-bit model: stored in 16
// bits, stepped in f32 by the optimizer (with f32 master copies under
// AdamWOptions::master_weights).
#include "checks.hpp"
#include "unary.hpp"

namespace frugal::ops {

// x is [N, C, H, W]; `params` (named) are [C] in x's dtype, `stats` (named
// after them) are [C] in x's compute dtype.
inline void check_batch_norm(const std::string& op, const TensorMeta& x, std::span<const TensorMeta> params,
                             std::span<const TensorMeta> stats, std::span<const char* const> names) {
  expect_any_floating(op, x);
  if (x.shape.rank() != 4)
    fail<ShapeError>(op, ": expects an input [N, C, H, W], got ", x.shape.str());
  const std::int64_t c = x.shape[1];
  auto check = [&](const TensorMeta& m, const char* what, DType want) {
    if (m.dtype != want)
      fail<ShapeError>(op, ": ", what, " ", m.str(), " must be ", dtype_name(want), " for an input ", x.str(),
                       want == x.dtype ? "" : " (batch norm keeps its statistics in f32 for a 16-bit input)");
    if (m.shape != Shape{c})
      fail<ShapeError>(op, ": ", what, " ", m.shape.str(), " does not match input ", x.shape.str(),
                       " (expected [", c, "], one per channel)");
  };
  for (std::size_t i = 0; i < params.size(); ++i) check(params[i], names[i], x.dtype);
  for (std::size_t i = 0; i < stats.size(); ++i) check(stats[i], names[params.size() + i], compute_dtype(x.dtype));
}

// The dtype and shape of a [N, C, H, W] input's per-channel statistics.
inline TensorMeta batch_norm_stats_meta(const TensorMeta& x) { return {compute_dtype(x.dtype), Shape{x.shape[1]}}; }

// Values per channel the statistics run over: N * H * W.
inline std::int64_t batch_norm_count(const Shape& x) { return x[0] * x[2] * x[3]; }

// Inputs (x, dy, gamma, mean, var) -> (dx, dgamma, dbeta): the backward of
// training mode (batch statistics depend on x) or, with `training` false, of
// eval mode (mean and var are constants).
class BatchNorm2dBackward final : public Op {
 public:
  ~BatchNorm2dBackward() override;
  BatchNorm2dBackward(double eps, bool training) : eps_(eps), training_(training) {}
  double eps() const { return eps_; }
  bool training() const { return training_; }
  std::string name() const override { return training_ ? "batch_norm2d_backward" : "batch_norm2d_eval_backward"; }
  std::vector<TensorMeta> infer(std::span<const TensorMeta> in) const override {
    expect_arity(name(), in, 5);
    static constexpr const char* names[] = {"weight", "mean", "var"};
    check_batch_norm(name(), in[0], in.subspan(2, 1), in.subspan(3, 2), names);
    if (in[1].shape != in[0].shape || in[1].dtype != in[0].dtype)
      fail<ShapeError>(name(), ": output gradient ", in[1].str(), " does not match input ", in[0].str());
    return {in[0], in[2], in[2]};
  }
  Cost cost(std::span<const TensorMeta> in, std::span<const TensorMeta> out) const override {
    return {10.0 * double(in[0].shape.numel()), double(2 * in[0].nbytes() + out[0].nbytes())};
  }

 private:
  double eps_;
  bool training_;
};

// The gradient through a ReLU epilogue, y = relu(v): relu_grad reads only
// y, so dv = relu_grad(y, dy) needs no v.
inline Var relu_epilogue_grad(Var y, Var dy) { return apply1<UnaryGrad<math::Relu>>({dy, y, dy}); }

// Inputs (x, gamma, beta) -> (y, mean, var), per channel, biased variance:
// y = (x - mean) / sqrt(var + eps) * gamma + beta.
// With `relu`, y = relu(that): the fusion pass (ops/fusion.hpp) merges a
// ReLU that alone reads the normalised values, so they are never stored
// (the same bits: the kernel applies math::Relu to what it would have
// stored).
class BatchNorm2dTrain final : public Op {
 public:
  ~BatchNorm2dTrain() override;
  explicit BatchNorm2dTrain(double eps, bool relu = false) : eps_(eps), relu_(relu) {}
  double eps() const { return eps_; }
  bool relu() const { return relu_; }
  std::string name() const override { return relu_ ? "batch_norm2d_relu" : "batch_norm2d"; }
  std::vector<TensorMeta> infer(std::span<const TensorMeta> in) const override {
    expect_arity(name(), in, 3);
    static constexpr const char* names[] = {"weight", "bias"};
    check_batch_norm(name(), in[0], in.subspan(1, 2), {}, names);
    if (batch_norm_count(in[0].shape) <= 1)
      fail<ShapeError>(name(), ": expected more than 1 value per channel when training, got input ", in[0].shape.str());
    return {in[0], batch_norm_stats_meta(in[0]), batch_norm_stats_meta(in[0])};
  }
  std::vector<std::optional<Var>> backward(const BackwardArgs& a) const override {
    if (a.grad_outputs[1] || a.grad_outputs[2])
      fail("batch_norm2d: the batch mean and variance it outputs are statistics, not differentiable outputs; "
           "the loss must not depend on them");
    if (!a.grad_outputs[0]) return {std::nullopt, std::nullopt, std::nullopt};
    Var dy = relu_ ? relu_epilogue_grad(a.outputs[0], *a.grad_outputs[0]) : *a.grad_outputs[0];
    auto g = frugal::apply(std::make_shared<BatchNorm2dBackward>(eps_, true),
                           {a.inputs[0], dy, a.inputs[1], a.outputs[1], a.outputs[2]});
    return {g[0], g[1], g[2]};
  }
  Cost cost(std::span<const TensorMeta> in, std::span<const TensorMeta> out) const override {
    return {8.0 * double(in[0].shape.numel()), double(2 * in[0].nbytes() + out[0].nbytes())};
  }

 private:
  double eps_;
  bool relu_;
};

// Inputs (x, gamma, beta, running_mean, running_var) -> y, normalised with
// the running statistics (a per-channel affine map). With `relu`, y is
// relu(that), as in BatchNorm2dTrain.
class BatchNorm2dEval final : public Op {
 public:
  ~BatchNorm2dEval() override;
  explicit BatchNorm2dEval(double eps, bool relu = false) : eps_(eps), relu_(relu) {}
  double eps() const { return eps_; }
  bool relu() const { return relu_; }
  std::string name() const override { return relu_ ? "batch_norm2d_eval_relu" : "batch_norm2d_eval"; }
  std::vector<TensorMeta> infer(std::span<const TensorMeta> in) const override {
    expect_arity(name(), in, 5);
    static constexpr const char* names[] = {"weight", "bias", "running_mean", "running_var"};
    check_batch_norm(name(), in[0], in.subspan(1, 2), in.subspan(3, 2), names);
    return {in[0]};
  }
  std::vector<std::optional<Var>> backward(const BackwardArgs& a) const override {
    if (!a.grad_outputs[0]) return {std::nullopt, std::nullopt, std::nullopt, std::nullopt, std::nullopt};
    Var dy = relu_ ? relu_epilogue_grad(a.outputs[0], *a.grad_outputs[0]) : *a.grad_outputs[0];
    auto g = frugal::apply(std::make_shared<BatchNorm2dBackward>(eps_, false),
                           {a.inputs[0], dy, a.inputs[1], a.inputs[3], a.inputs[4]});
    // The running statistics are buffers, not trained: no gradient.
    return {g[0], g[1], g[2], std::nullopt, std::nullopt};
  }
  Cost cost(std::span<const TensorMeta> in, std::span<const TensorMeta> out) const override {
    return {2.0 * double(in[0].shape.numel()), double(in[0].nbytes() + out[0].nbytes())};
  }

 private:
  double eps_;
  bool relu_;
};

// Inputs (running_mean, running_var, batch_mean, batch_var[, num_batches_tracked]);
// writes the first two (and the i64 counter) in place:
//   running_mean = (1 - momentum) running_mean + momentum batch_mean
//   running_var  = (1 - momentum) running_var  + momentum batch_var * n / (n - 1)
// with n the values per channel, and num_batches_tracked += 1.
class BatchNormUpdateStats final : public Op {
 public:
  ~BatchNormUpdateStats() override;
  BatchNormUpdateStats(double momentum, std::int64_t count, bool with_counter)
      : momentum_(momentum), count_(count), counter_(with_counter) {}
  double momentum() const { return momentum_; }
  std::int64_t count() const { return count_; }
  bool with_counter() const { return counter_; }
  std::string name() const override { return "batch_norm_update_stats"; }
  std::vector<TensorMeta> infer(std::span<const TensorMeta> in) const override {
    expect_arity(name(), in, counter_ ? 5 : 4);
    for (int i = 0; i < 4; ++i) {
      expect_floating(name(), in[std::size_t(i)]);
      if (in[std::size_t(i)].shape.rank() != 1 || in[std::size_t(i)].shape != in[0].shape ||
          in[std::size_t(i)].dtype != in[0].dtype)
        fail<ShapeError>(name(), ": running statistics ", in[0].str(), " and ", in[1].str(), " and batch statistics ",
                         in[2].str(), " and ", in[3].str(), " must be equal vectors");
    }
    if (counter_ && (in[4].dtype != DType::i64 || in[4].shape.numel() != 1))
      fail<ShapeError>(name(), ": num_batches_tracked must be a single i64, got ", in[4].str());
    if (count_ <= 1) fail<ShapeError>(name(), ": needs more than 1 value per channel, got ", count_);
    return {};
  }
  std::vector<int> mutated_inputs() const override {
    if (counter_) return {0, 1, 4};
    return {0, 1};
  }

 private:
  double momentum_;
  std::int64_t count_;
  bool counter_;
};

}  // namespace frugal::ops

namespace frugal {

struct BatchNormOutputs {
  Var y, mean, var;  // var is the biased batch variance
};

// Training-mode normalisation with batch statistics; no side effects.
inline BatchNormOutputs batch_norm2d_train(Var x, Var weight, Var bias, double eps = 1e-5) {
  auto o = frugal::apply(std::make_shared<ops::BatchNorm2dTrain>(eps), {x, weight, bias});
  return {o[0], o[1], o[2]};
}

// Eval-mode normalisation with the running statistics.
inline Var batch_norm2d_eval(Var x, Var weight, Var bias, Var running_mean, Var running_var, double eps = 1e-5) {
  return apply1<ops::BatchNorm2dEval>({x, weight, bias, running_mean, running_var}, eps);
}

// Folds one batch's statistics into the running ones, in place (state Vars).
// `count` is the values per channel the batch statistics were taken over.
inline void batch_norm_update_stats(Var running_mean, Var running_var, const BatchNormOutputs& batch,
                                    std::int64_t count, double momentum = 0.1,
                                    std::optional<Var> num_batches_tracked = std::nullopt) {
  std::vector<Var> in{running_mean, running_var, batch.mean, batch.var};
  if (num_batches_tracked) in.push_back(*num_batches_tracked);
  frugal::apply(std::make_shared<ops::BatchNormUpdateStats>(momentum, count, bool(num_batches_tracked)), in);
}

// PyTorch's F.batch_norm for NCHW input. Training: normalise with the batch
// statistics and, when running statistics are given, update them. Eval:
// normalise with the running statistics.
inline Var batch_norm2d(Var x, std::optional<Var> running_mean, std::optional<Var> running_var, Var weight, Var bias,
                        bool training, double momentum = 0.1, double eps = 1e-5) {
  if (bool(running_mean) != bool(running_var))
    fail<ShapeError>("batch_norm2d: give both running_mean and running_var, or neither");
  if (!training) {
    if (!running_mean) fail<ShapeError>("batch_norm2d: eval mode needs the running statistics");
    return batch_norm2d_eval(x, weight, bias, *running_mean, *running_var, eps);
  }
  BatchNormOutputs o = batch_norm2d_train(x, weight, bias, eps);
  if (running_mean)
    batch_norm_update_stats(*running_mean, *running_var, o, ops::batch_norm_count(x.shape()), momentum);
  return o.y;
}

}  // namespace frugal
