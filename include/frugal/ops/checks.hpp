#pragma once
#include <span>

#include "../graph/var.hpp"

namespace frugal::ops {

inline void expect_arity(const std::string& op, std::span<const TensorMeta> in, std::size_t n) {
  if (in.size() != n) fail<ShapeError>(op, ": expects ", n, " inputs, got ", in.size());
}

// For ops whose kernels compute in the tensor's own type only: bf16/f16 are
// refused here, at capture, rather than by a kernel in the middle of a step.
inline void expect_floating(const std::string& op, const TensorMeta& m) {
  if (m.dtype != DType::f32 && m.dtype != DType::f64)
    fail<ShapeError>(op, ": expects an f32 or f64 tensor, got ", m.str(),
                     " (this op has no bf16/f16 kernels: cast the input to f32 first)");
}

// For ops whose kernels also take bf16/f16 (read into f32, computed in f32,
// rounded once on store: core/precision.hpp) on every backend that has them.
inline void expect_any_floating(const std::string& op, const TensorMeta& m) {
  if (!is_floating(m.dtype)) fail<ShapeError>(op, ": expects a floating tensor (f32, f64, bf16 or f16), got ", m.str());
}

inline void expect_same_dtype(const std::string& op, const TensorMeta& a, const TensorMeta& b) {
  if (a.dtype != b.dtype) fail<ShapeError>(op, ": dtypes differ: ", a.str(), " and ", b.str());
}

}  // namespace frugal::ops
