#pragma once
// Float64 references for ops/mahalanobis.hpp, written from the definitions
// and independent of the kernels' factored form: the precision matrix
// Λ = L Lᵀ is built explicitly and each distance is (z − μ)ᵀ Λ (z − μ),
// with no projection, no centring and no shared intermediate.
#include <algorithm>
#include <cmath>

#include "reference.hpp"

namespace ref {

// L = tril(P, -1) + diag(exp(diag(P))), row-major [D, D].
inline std::vector<double> cholesky_from_param(const Array& P) {
  const std::int64_t D = P.shape.at(0);
  std::vector<double> L(std::size_t(D * D), 0.0);
  for (std::int64_t i = 0; i < D; ++i)
    for (std::int64_t j = 0; j <= i; ++j)
      L[std::size_t(i * D + j)] = i == j ? std::exp(P.v[std::size_t(i * D + i)]) : P.v[std::size_t(i * D + j)];
  return L;
}

// Λ = L Lᵀ.
inline std::vector<double> precision_from_param(const Array& P) {
  const std::int64_t D = P.shape.at(0);
  const std::vector<double> L = cholesky_from_param(P);
  std::vector<double> lam(std::size_t(D * D), 0.0);
  for (std::int64_t i = 0; i < D; ++i)
    for (std::int64_t j = 0; j < D; ++j)
      for (std::int64_t r = 0; r < D; ++r) lam[std::size_t(i * D + j)] += L[std::size_t(i * D + r)] * L[std::size_t(j * D + r)];
  return lam;
}

// d²[n, k] = (z_n − μ_k)ᵀ Λ (z_n − μ_k).
inline Array mahalanobis_distance(const Array& z, const Array& mu, const Array& P) {
  const std::int64_t N = z.shape.at(0), D = z.shape.at(1), K = mu.shape.at(0);
  require(mu.shape.at(1) == D && P.shape == Dims{D, D}, "mahalanobis_distance: shapes");
  const std::vector<double> lam = precision_from_param(P);
  Array out = zeros({N, K});
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t k = 0; k < K; ++k) {
      double s = 0;
      for (std::int64_t i = 0; i < D; ++i)
        for (std::int64_t j = 0; j < D; ++j)
          s += (z.v[std::size_t(n * D + i)] - mu.v[std::size_t(k * D + i)]) * lam[std::size_t(i * D + j)] *
               (z.v[std::size_t(n * D + j)] - mu.v[std::size_t(k * D + j)]);
      out.v[std::size_t(n * K + k)] = s;
    }
  return out;
}

// mean_n [ −log softmax_k(−½ s_k d²_nk)[y_n] + λ (½ d²_{n,y_n} + ½ log det Σ) ],
// s_k = 1 + α [k = y_n], with log det Σ = −log det Λ taken from L's diagonal.
inline Array mahalanobis_loss(const Array& z, const Array& labels, const Array& mu, const Array& P, double lambda,
                              double alpha) {
  const Array d2 = mahalanobis_distance(z, mu, P);
  const std::int64_t N = d2.shape[0], K = d2.shape[1], D = P.shape[0];
  double logdet_sigma = 0;
  const std::vector<double> L = cholesky_from_param(P);
  for (std::int64_t i = 0; i < D; ++i) logdet_sigma -= 2 * std::log(L[std::size_t(i * D + i)]);
  double total = 0;
  for (std::int64_t n = 0; n < N; ++n) {
    const auto y = std::int64_t(labels.v[std::size_t(n)]);
    std::vector<double> logit(static_cast<std::size_t>(K));
    for (std::int64_t k = 0; k < K; ++k) logit[std::size_t(k)] = -0.5 * (k == y ? 1 + alpha : 1) * d2.v[std::size_t(n * K + k)];
    const double mx = *std::max_element(logit.begin(), logit.end());
    double z_sum = 0;
    for (double l : logit) z_sum += std::exp(l - mx);
    total += mx + std::log(z_sum) - logit[std::size_t(y)] +
             lambda * (0.5 * d2.v[std::size_t(n * K + y)] + 0.5 * logdet_sigma);
  }
  Array out = zeros({});
  out.v[0] = total / double(N);
  return out;
}

}  // namespace ref
