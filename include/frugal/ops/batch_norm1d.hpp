#pragma once
// 1-D batch normalisation, as PyTorch's BatchNorm1d: x [N, C] or [N, C, L],
// statistics per channel over N (and L). It is batch_norm2d on x viewed as
// [N, C, L, 1] ([N, C, 1, 1] for [N, C]): the same memory in the same order,
// so the 2-D ops compute exactly the 1-D statistics (count N * L), and the
// views cost nothing (reshape is a view). Training mode keeps its running
// statistics update a separate op, so a recomputed forward never updates
// them twice.
#include "batch_norm.hpp"
#include "shape_ops.hpp"

namespace frugal {

namespace ops {

// The 4-D view batch_norm2d normalises: [N, C] -> [N, C, 1, 1], [N, C, L] -> [N, C, L, 1].
inline std::vector<std::int64_t> batch_norm1d_view(const Shape& x) {
  if (x.rank() != 2 && x.rank() != 3)
    fail<ShapeError>("batch_norm1d: expects an input [N, C] or [N, C, L], got ", x.str());
  return {x[0], x[1], x.rank() == 3 ? x[2] : 1, 1};
}

}  // namespace ops

// Values per channel the statistics of x [N, C] or [N, C, L] run over.
inline std::int64_t batch_norm1d_count(const Shape& x) {
  return ops::batch_norm_count(Shape(ops::batch_norm1d_view(x)));
}

// Training-mode normalisation with batch statistics; no side effects. The
// statistics are [C].
inline BatchNormOutputs batch_norm1d_train(Var x, Var weight, Var bias, double eps = 1e-5) {
  const Shape shape = x.shape();
  if (batch_norm1d_count(shape) <= 1)
    fail<ShapeError>("batch_norm1d: expected more than 1 value per channel when training, got input ", shape.str());
  BatchNormOutputs o = batch_norm2d_train(ops::reshape(x, ops::batch_norm1d_view(shape)), weight, bias, eps);
  o.y = ops::reshape(o.y, shape.dims());
  return o;
}

// Eval-mode normalisation with the running statistics.
inline Var batch_norm1d_eval(Var x, Var weight, Var bias, Var running_mean, Var running_var, double eps = 1e-5) {
  const Shape shape = x.shape();
  Var y = batch_norm2d_eval(ops::reshape(x, ops::batch_norm1d_view(shape)), weight, bias, running_mean, running_var,
                            eps);
  return ops::reshape(y, shape.dims());
}


// PyTorch's F.batch_norm for [N, C] or [N, C, L] input (see batch_norm2d).
inline Var batch_norm1d(Var x, std::optional<Var> running_mean, std::optional<Var> running_var, Var weight, Var bias,
                        bool training, double momentum = 0.1, double eps = 1e-5) {
  if (bool(running_mean) != bool(running_var))
    fail<ShapeError>("batch_norm1d: give both running_mean and running_var, or neither");
  if (!training) {
    if (!running_mean) fail<ShapeError>("batch_norm1d: eval mode needs the running statistics");
    return batch_norm1d_eval(x, weight, bias, *running_mean, *running_var, eps);
  }
  BatchNormOutputs o = batch_norm1d_train(x, weight, bias, eps);
  if (running_mean) batch_norm_update_stats(*running_mean, *running_var, o, batch_norm1d_count(x.shape()), momentum);
  return o.y;
}

}  // namespace frugal
