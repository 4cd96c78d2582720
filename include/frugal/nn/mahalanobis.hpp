#pragma once
// A classifier head of learned class centres and a learned shared
// covariance (ops/mahalanobis.hpp): trained with mahalanobis_loss, it
// predicts the nearest centre in the Mahalanobis metric.
#include <algorithm>
#include <cmath>
#include <vector>

#include "../ops/mahalanobis.hpp"
#include "init.hpp"
#include "module.hpp"

namespace frugal::nn {

struct MahalanobisHeadOptions {
  MahalanobisLossOptions loss{};
  double centre_init = 1;  // centres drawn from U(-centre_init, centre_init)
  DType dtype = DType::f32;
};

class MahalanobisHead : public Module {
 public:
  ~MahalanobisHead() override;
  // `classes` centres in a `dim`-dimensional embedding; the Cholesky
  // parameter starts at 0, so L = I and the metric is Euclidean at first.
  MahalanobisHead(std::int64_t classes, std::int64_t dim, MahalanobisHeadOptions o = {}) : k_(classes), d_(dim), o_(o) {
    if (classes <= 0 || dim <= 0)
      fail<ShapeError>("nn::MahalanobisHead: classes and dim must be positive, got ", classes, " and ", dim);
    if (!is_floating(o.dtype))
      fail<ShapeError>("nn::MahalanobisHead: dtype must be floating, got ", dtype_name(o.dtype));
    centres = register_parameter("centres", Tensor({classes, dim}, o.dtype));
    uniform_(centres, -o.centre_init, o.centre_init);
    chol = register_parameter("chol", Tensor({dim, dim}, o.dtype));  // zeros
  }
  // The mean loss of embeddings z [N, dim] with labels [N].
  Var loss(Var z, Var labels) { return mahalanobis_loss(z, labels, var(centres), var(chol), o_.loss); }
  // Squared distances [N, classes]; the prediction is their argmin.
  Var distances(Var z) { return mahalanobis_distance(z, var(centres), var(chol)); }

  std::int64_t classes() const { return k_; }
  std::int64_t dim() const { return d_; }

  // On the host, in double, from the parameter's current values: the
  // precision's Cholesky factor L [dim, dim] (row-major, lower) ...
  std::vector<double> cholesky() const {
    std::vector<double> L(std::size_t(d_ * d_), 0.0);
    for (std::int64_t i = 0; i < d_; ++i)
      for (std::int64_t j = 0; j <= i; ++j) {
        const double p = param(i * d_ + j);
        L[std::size_t(i * d_ + j)] = i == j ? std::exp(p) : p;
      }
    return L;
  }
  // ... and the covariance Σ = (L Lᵀ)⁻¹ = L⁻ᵀ L⁻¹ (forward substitution on L).
  std::vector<double> covariance() const {
    const std::vector<double> L = cholesky();
    const auto D = std::size_t(d_);
    std::vector<double> inv(D * D, 0.0);  // L⁻¹, lower triangular
    for (std::size_t c = 0; c < D; ++c)
      for (std::size_t i = c; i < D; ++i) {
        double s = i == c ? 1.0 : 0.0;
        for (std::size_t r = c; r < i; ++r) s -= L[i * D + r] * inv[r * D + c];
        inv[i * D + c] = s / L[i * D + i];
      }
    std::vector<double> sigma(D * D, 0.0);
    for (std::size_t i = 0; i < D; ++i)
      for (std::size_t j = 0; j < D; ++j)
        for (std::size_t r = std::max(i, j); r < D; ++r) sigma[i * D + j] += inv[r * D + i] * inv[r * D + j];
    return sigma;
  }

  Tensor centres, chol;

 private:
  double param(std::int64_t i) const {
    return chol.dtype() == DType::f64 ? chol.data<double>()[i] : double(chol.data<float>()[i]);
  }
  std::int64_t k_, d_;
  MahalanobisHeadOptions o_;
};

}  // namespace frugal::nn
