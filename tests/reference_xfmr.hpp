#pragma once
// Naive float64 references for the transformer ops and the indexing ops,
// written from their definitions (PyTorch's semantics) with plain loops.
// Nothing here calls frugal; see reference.hpp for the Array type.
#include <cstdint>
#include <limits>

#include "reference.hpp"

namespace ref {

// ---- layer norm ---------------------------------------------------------

// Over the last axis; the variance is the biased one (divide by D).
inline Array layer_norm(const Array& x, const Array* w, const Array* b, double eps = 1e-5) {
  require(!x.shape.empty(), "layer_norm needs a dimension");
  const std::int64_t d = x.shape.back(), rows = numel(x.shape) / d;
  Array y = zeros(x.shape);
  for (std::int64_t r = 0; r < rows; ++r) {
    double mean = 0, var = 0;
    for (std::int64_t j = 0; j < d; ++j) mean += x.v[std::size_t(r * d + j)];
    mean /= double(d);
    for (std::int64_t j = 0; j < d; ++j) {
      double c = x.v[std::size_t(r * d + j)] - mean;
      var += c * c;
    }
    var /= double(d);
    for (std::int64_t j = 0; j < d; ++j) {
      double v = (x.v[std::size_t(r * d + j)] - mean) / std::sqrt(var + eps);
      if (w) v *= w->v[std::size_t(j)];
      if (b) v += b->v[std::size_t(j)];
      y.v[std::size_t(r * d + j)] = v;
    }
  }
  return y;
}

// ---- embedding ----------------------------------------------------------

// out[i..., :] = table[ids[i...], :]
inline Array embedding(const Array& ids, const Array& table) {
  require(table.shape.size() == 2, "embedding table must be 2-D");
  const std::int64_t d = table.shape[1];
  Dims os = ids.shape;
  os.push_back(d);
  Array y = zeros(os);
  for (std::size_t i = 0; i < ids.v.size(); ++i) {
    auto row = std::int64_t(ids.v[i]);
    require(row >= 0 && row < table.shape[0], "embedding id out of range");
    for (std::int64_t j = 0; j < d; ++j) y.v[i * std::size_t(d) + std::size_t(j)] = table.v[std::size_t(row * d + j)];
  }
  return y;
}

}  // namespace ref
