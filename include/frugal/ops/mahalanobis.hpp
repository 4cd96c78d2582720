#pragma once
// Mahalanobis distances to learned class centres under a learned shared
// covariance, and the Gaussian-discriminant loss built on them.
//
// The metric is parameterised by a free matrix P [D, D] through the lower
// Cholesky factor of the precision (inverse covariance) Λ = Σ⁻¹ = L Lᵀ:
//
//   L = tril(P, -1) + diag(exp(diag(P)))
//
// (torch.distributions.transforms.LowerCholeskyTransform's map). Every P
// gives a lower-triangular L with a positive diagonal, so Λ and Σ are
// positive definite by construction, whatever an optimizer does to P; P's
// upper triangle is unused (its gradient is 0). Then
//
//   d²(z, μ_k) = (z − μ_k)ᵀ Λ (z − μ_k) = ||Lᵀ (z − μ_k)||²
//   log det Σ = −2 Σ_i log L_ii = −2 Σ_i P_ii
//
// mahalanobis_distance(z [N, D], centres [K, D], P [D, D]) -> d² [N, K];
// prediction is the nearest centre, argmin over k.
//
// mahalanobis_loss(z, labels [N], centres, P, {likelihood_weight λ, margin α})
// -> one number, the mean over the N rows of
//
//   ℓ_n = −log softmax_k(−½ s_k d²_nk)[y_n] + λ (½ d²_{n,y_n} − Σ_i P_ii),
//   s_k = 1 + α [k = y_n].
//
// Why this loss (Wan et al., "Rethinking feature distribution for loss
// functions in image classification", CVPR 2018, the "Gaussian mixture
// loss"): with one covariance shared by equally likely classes, −½ d²_k is
// the log posterior of class k up to a constant, so the first term is the
// Gaussian discriminant's cross-entropy. It pushes an embedding away from
// the other centres, but only relative to its own: it is unchanged when
// all d² shift together and falls without bound as L grows, so alone it
// inflates the metric. The second term is the embedding's negative log
// likelihood under its class's Gaussian, ½ d² + ½ log det Σ (the constant
// D/2 log 2π dropped): it pulls each embedding to its centre in this metric,
// and its log-determinant stops the precision from growing for free: along
// L → sL the term alone is least where the mean d² to the own centre is D,
// that is where Σ matches the classes' spread. α > 0 widens the margin: the own class's
// distance counts (1 + α) times in the softmax during training. The
// log-determinant cancels in the softmax (it is the same for every class),
// so only the likelihood term carries it.
//
// The learned embedding can still trade its own scale against L's (shrink
// z − μ by t, grow L by 1/t: d² is unchanged and log det Σ falls), so feed
// the loss a normalised embedding (layer_norm without affine, as the medical
// sample does) or decay the weights.
#include <cmath>
#include <string>

#include "checks.hpp"

namespace frugal::ops {

// z [N, D], centres [K, D], P [D, D], all one floating dtype, N, K, D > 0.
inline void check_mahalanobis(const std::string& op, const TensorMeta& z, const TensorMeta& centres,
                              const TensorMeta& chol) {
  expect_floating(op, z);
  expect_same_dtype(op, z, centres);
  expect_same_dtype(op, z, chol);
  if (z.shape.rank() != 2 || centres.shape.rank() != 2 || chol.shape.rank() != 2)
    fail<ShapeError>(op, ": expects embeddings [N, D], centres [K, D] and a Cholesky parameter [D, D], got ",
                     z.shape.str(), ", ", centres.shape.str(), " and ", chol.shape.str());
  const std::int64_t d = z.shape[1];
  if (centres.shape[1] != d || chol.shape[0] != d || chol.shape[1] != d)
    fail<ShapeError>(op, ": embeddings ", z.shape.str(), ", centres ", centres.shape.str(), " and Cholesky parameter ",
                     chol.shape.str(), " do not agree on the dimension D (want [N, D], [K, D], [D, D])");
  if (z.shape[0] <= 0 || centres.shape[0] <= 0 || d <= 0)
    fail<ShapeError>(op, ": N, K and D must be positive, got embeddings ", z.shape.str(), " and centres ",
                     centres.shape.str());
}

inline void check_mahalanobis_labels(const std::string& op, const TensorMeta& z, const TensorMeta& labels) {
  if (!is_integer(labels.dtype)) fail<ShapeError>(op, ": labels must be i32 or i64 class indices, got ", labels.str());
  if (labels.shape != Shape{z.shape[0]})
    fail<ShapeError>(op, ": labels ", labels.shape.str(), " do not match embeddings ", z.shape.str(),
                     " (want one label per row, [", z.shape[0], "])");
}

// (N, K, D) of checked metas z, centres.
struct MahalanobisDims {
  std::int64_t n = 0, k = 0, d = 0;
};
inline MahalanobisDims mahalanobis_dims(const TensorMeta& z, const TensorMeta& centres) {
  return {z.shape[0], centres.shape[0], z.shape[1]};
}

// Flops of the forward: the projections Lᵀz and Lᵀμ, then the distances.
inline double mahalanobis_flops(const MahalanobisDims& m) {
  return double(m.n + m.k) * double(m.d * (m.d + 1)) + 3.0 * double(m.n * m.k * m.d);
}

struct MahalanobisLossOptions {
  double likelihood_weight = 0.1;  // λ: the weight of the Gaussian log-likelihood (pull) term
  double margin = 0;               // α: the own class's distance counts (1 + α) times in the softmax
};

// Inputs (z, centres, P, dd² [N, K]) -> (dz, dcentres, dP).
class MahalanobisDistanceGrad final : public Op {
 public:
  ~MahalanobisDistanceGrad() override;
  std::string name() const override { return "mahalanobis_distance_grad"; }
  std::vector<TensorMeta> infer(std::span<const TensorMeta> in) const override {
    expect_arity(name(), in, 4);
    check_mahalanobis(name(), in[0], in[1], in[2]);
    const TensorMeta want{in[0].dtype, Shape{in[0].shape[0], in[1].shape[0]}};
    if (in[3].dtype != want.dtype || in[3].shape != want.shape) fail<ShapeError>(name(), ": the distances' gradient ", in[3].str(), " should be ", want.str());
    return {in[0], in[1], in[2]};
  }
  Cost cost(std::span<const TensorMeta> in, std::span<const TensorMeta> out) const override {
    return {3.0 * mahalanobis_flops(mahalanobis_dims(in[0], in[1])), Op::cost(in, out).bytes};
  }
};

// Inputs (z, centres, P) -> d² [N, K].
class MahalanobisDistance final : public Op {
 public:
  ~MahalanobisDistance() override;
  std::string name() const override { return "mahalanobis_distance"; }
  std::vector<TensorMeta> infer(std::span<const TensorMeta> in) const override {
    expect_arity(name(), in, 3);
    check_mahalanobis(name(), in[0], in[1], in[2]);
    return {{in[0].dtype, Shape{in[0].shape[0], in[1].shape[0]}}};
  }
  std::vector<std::optional<Var>> backward(const BackwardArgs& a) const override {
    if (!a.grad_outputs[0]) return std::vector<std::optional<Var>>(3);
    std::vector<Var> g = frugal::apply(std::make_shared<MahalanobisDistanceGrad>(),
                                       {a.inputs[0], a.inputs[1], a.inputs[2], *a.grad_outputs[0]});
    return {g[0], g[1], g[2]};
  }
  Cost cost(std::span<const TensorMeta> in, std::span<const TensorMeta> out) const override {
    return {mahalanobis_flops(mahalanobis_dims(in[0], in[1])), Op::cost(in, out).bytes};
  }
};

class MahalanobisLossBase : public Op {
 public:
  ~MahalanobisLossBase() override;
  explicit MahalanobisLossBase(MahalanobisLossOptions o) : o_(o) {
    if (!std::isfinite(o.likelihood_weight) || o.likelihood_weight < 0)
      fail<ShapeError>("mahalanobis_loss: likelihood_weight must be finite and >= 0, got ", o.likelihood_weight);
    if (!std::isfinite(o.margin) || o.margin < 0)
      fail<ShapeError>("mahalanobis_loss: margin must be finite and >= 0, got ", o.margin);
  }
  const MahalanobisLossOptions& options() const { return o_; }

 protected:
  MahalanobisLossOptions o_;
};

// Inputs (z, labels, centres, P, dloss) -> (dz, dcentres, dP).
class MahalanobisLossGrad final : public MahalanobisLossBase {
 public:
  ~MahalanobisLossGrad() override;
  using MahalanobisLossBase::MahalanobisLossBase;
  std::string name() const override { return "mahalanobis_loss_grad"; }
  std::vector<TensorMeta> infer(std::span<const TensorMeta> in) const override {
    expect_arity(name(), in, 5);
    check_mahalanobis(name(), in[0], in[2], in[3]);
    check_mahalanobis_labels(name(), in[0], in[1]);
    if (in[4].dtype != in[0].dtype || in[4].shape.numel() != 1)
      fail<ShapeError>(name(), ": the loss gradient ", in[4].str(), " must be one ", dtype_name(in[0].dtype),
                       " number");
    return {in[0], in[2], in[3]};
  }
  Cost cost(std::span<const TensorMeta> in, std::span<const TensorMeta> out) const override {
    return {3.0 * mahalanobis_flops(mahalanobis_dims(in[0], in[2])), Op::cost(in, out).bytes};
  }
};

// Inputs (z, labels, centres, P) -> the mean loss (one number of z's dtype).
// A label outside [0, K) stops the step with a DataError naming it.
class MahalanobisLoss final : public MahalanobisLossBase {
 public:
  ~MahalanobisLoss() override;
  using MahalanobisLossBase::MahalanobisLossBase;
  std::string name() const override { return "mahalanobis_loss"; }
  std::vector<TensorMeta> infer(std::span<const TensorMeta> in) const override {
    expect_arity(name(), in, 4);
    check_mahalanobis(name(), in[0], in[2], in[3]);
    check_mahalanobis_labels(name(), in[0], in[1]);
    return {{in[0].dtype, Shape{}}};
  }
  std::vector<std::optional<Var>> backward(const BackwardArgs& a) const override {
    if (!a.grad_outputs[0]) return std::vector<std::optional<Var>>(4);
    std::vector<Var> g = frugal::apply(std::make_shared<MahalanobisLossGrad>(o_),
                                       {a.inputs[0], a.inputs[1], a.inputs[2], a.inputs[3], *a.grad_outputs[0]});
    return {g[0], std::nullopt, g[1], g[2]};
  }
  Cost cost(std::span<const TensorMeta> in, std::span<const TensorMeta> out) const override {
    return {mahalanobis_flops(mahalanobis_dims(in[0], in[2])), Op::cost(in, out).bytes};
  }
};

}  // namespace frugal::ops

namespace frugal {

using ops::MahalanobisLossOptions;

// Squared Mahalanobis distances [N, K] of embeddings z [N, D] to centres
// [K, D] under the precision L Lᵀ, L = tril(P, -1) + diag(exp(diag(P))).
inline Var mahalanobis_distance(Var z, Var centres, Var chol_param) {
  return apply1<ops::MahalanobisDistance>({z, centres, chol_param});
}

// The Gaussian-discriminant loss above (ops/mahalanobis.hpp), averaged over rows.
inline Var mahalanobis_loss(Var z, Var labels, Var centres, Var chol_param, MahalanobisLossOptions o = {}) {
  return apply1<ops::MahalanobisLoss>({z, labels, centres, chol_param}, o);
}

}  // namespace frugal
