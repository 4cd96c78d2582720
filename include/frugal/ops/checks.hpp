#pragma once
#include <span>

#include "../graph/var.hpp"

namespace frugal::ops {

inline void expect_arity(const std::string& op, std::span<const TensorMeta> in, std::size_t n) {
  if (in.size() != n) fail<ShapeError>(op, ": expects ", n, " inputs, got ", in.size());
}

inline void expect_floating(const std::string& op, const TensorMeta& m) {
  if (m.dtype != DType::f32 && m.dtype != DType::f64)
    fail<ShapeError>(op, ": expects an f32 or f64 tensor, got ", m.str());
}

inline void expect_same_dtype(const std::string& op, const TensorMeta& a, const TensorMeta& b) {
  if (a.dtype != b.dtype) fail<ShapeError>(op, ": dtypes differ: ", a.str(), " and ", b.str());
}

}  // namespace frugal::ops
