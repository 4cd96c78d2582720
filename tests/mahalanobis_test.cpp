// Issue 22: the Mahalanobis distance and loss (ops/mahalanobis.hpp), their
// kernels against the float64 reference (reference_mahalanobis.hpp) in f32
// and f64 and their gradients against finite differences (op_harness.hpp),
// on the embeddings, the centres and the Cholesky parameter; the
// covariance's gradient against its closed form; positive definiteness kept
// over training; the head and the attention pooling layer; errors.
#include <cmath>

#include "op_harness.hpp"
#include "reference_mahalanobis.hpp"

using namespace optest;
using frugal::DType;
using frugal::Tensor;
using frugal::Var;
using V = Vars;
using A = Arrays;

namespace {

Case distance_case(std::int64_t n, std::int64_t k, std::int64_t d) {
  return {"mahalanobis_distance N" + std::to_string(n) + " K" + std::to_string(k) + " D" + std::to_string(d),
          {x({n, d}), x({k, d}), x({d, d})},
          [](const V& v) { return frugal::mahalanobis_distance(v[0], v[1], v[2]); },
          [](const A& a) { return ref::mahalanobis_distance(a[0], a[1], a[2]); }};
}

Case loss_case(std::int64_t n, std::int64_t k, std::int64_t d, double lambda, double alpha,
               DType label_dtype = DType::i32) {
  std::ostringstream name;
  name << "mahalanobis_loss N" << n << " K" << k << " D" << d << " lambda " << lambda << " margin " << alpha << " "
       << frugal::dtype_name(label_dtype);
  return {name.str(),
          {x({n, d}), labels({n}, k, label_dtype), x({k, d}), x({d, d})},
          [=](const V& v) { return frugal::mahalanobis_loss(v[0], v[1], v[2], v[3], {lambda, alpha}); },
          [=](const A& a) { return ref::mahalanobis_loss(a[0], a[1], a[2], a[3], lambda, alpha); }};
}

// Cholesky of a symmetric matrix in double; false when it is not positive
// definite (a pivot <= 0 or not finite).
bool is_positive_definite(const std::vector<double>& m, std::size_t d) {
  std::vector<double> c(d * d, 0.0);
  for (std::size_t j = 0; j < d; ++j) {
    double s = m[j * d + j];
    for (std::size_t r = 0; r < j; ++r) s -= c[j * d + r] * c[j * d + r];
    if (!(s > 0) || !std::isfinite(s)) return false;
    c[j * d + j] = std::sqrt(s);
    for (std::size_t i = j + 1; i < d; ++i) {
      double t = m[i * d + j];
      for (std::size_t r = 0; r < j; ++r) t -= c[i * d + r] * c[j * d + r];
      c[i * d + j] = t / c[j * d + j];
    }
  }
  return true;
}

}  // namespace

TEST_CASE("mahalanobis_distance forward and backward on z, the centres and the Cholesky parameter", "[mahalanobis]") {
  check_op(distance_case(5, 3, 4));
  check_op(distance_case(1, 1, 1));
  check_op(distance_case(7, 4, 2));
}

TEST_CASE("mahalanobis_loss forward and backward on z, the centres and the Cholesky parameter", "[mahalanobis]") {
  check_op(loss_case(6, 3, 4, 0.1, 0));
  check_op(loss_case(5, 4, 3, 0, 0));                 // the discriminant's cross-entropy alone
  check_op(loss_case(4, 2, 5, 1.0, 0.5, DType::i64));  // a margin, the likelihood at full weight
  check_op(loss_case(3, 3, 1, 0.3, 1.0));             // D = 1: L is exp(p)
}

TEST_CASE("mahalanobis kernels match the reference on sizes that run in parallel", "[mahalanobis]") {
  // N * D * D and N * K * D above the kernels' parallel grain (2^15).
  check_forward_large(distance_case(300, 10, 24));
  check_forward_large(loss_case(400, 8, 24, 0.2, 0.3));
}

// The likelihood term λ mean_n (½ d²_{n,y} + ½ log det Σ) has, with S the
// scatter of the embeddings about their centres, the classical gradient
// ∂/∂Λ = λ/2 (S − Σ) in the precision Λ = L Lᵀ, so ∂/∂L = λ (S − Σ) L, and
// ∂/∂μ_k = −λ/N Σ_{n: y=k} Λ (z_n − μ_k). The loss is linear in λ, so the
// step's gradients at λ = 1 less those at λ = 0 are exactly that term's:
// this checks the covariance (log-determinant) part in the covariance's own
// form, with Σ inverted independently here.
TEST_CASE("mahalanobis_loss: the covariance's gradient equals (S - Sigma) L", "[mahalanobis]") {
  const std::int64_t N = 9, K = 3, D = 4;
  frugal::Rng rng(2201);
  auto fill = [&](Tensor& t, double scale) {
    for (std::int64_t i = 0; i < t.numel(); ++i) t.data<double>()[i] = scale * rng.normal();
  };
  Tensor z({N, D}, DType::f64), mu({K, D}, DType::f64), P({D, D}, DType::f64), y({N}, DType::i32);
  fill(z, 1), fill(mu, 1), fill(P, 0.4);
  for (std::int64_t n = 0; n < N; ++n) y.data<std::int32_t>()[n] = std::int32_t(n % K);
  auto gradients = [&](double lambda) {
    frugal::Step step = frugal::compile_gradients(
        [&] {
          return frugal::mahalanobis_loss(frugal::persistent_var(z, frugal::ValueKind::parameter, "z"),
                                          frugal::persistent_var(y, frugal::ValueKind::state, "y"),
                                          frugal::persistent_var(mu, frugal::ValueKind::parameter, "mu"),
                                          frugal::persistent_var(P, frugal::ValueKind::parameter, "P"),
                                          {lambda, 0.25});
        },
        {}, {z, mu, P});
    step.run();
    return std::vector<std::vector<double>>{step.grad(z).to_vector<double>(), step.grad(mu).to_vector<double>(),
                                            step.grad(P).to_vector<double>()};
  };
  const auto g1 = gradients(1.0), g0 = gradients(0.0);

  // The closed forms, in double.
  ref::Array pa{{D, D}, P.to_vector<double>()};
  const std::vector<double> L = ref::cholesky_from_param(pa), lam = ref::precision_from_param(pa);
  // Σ = Λ⁻¹ by Gauss-Jordan elimination with partial pivoting.
  std::vector<double> a = lam, sigma(std::size_t(D * D), 0.0);
  for (std::int64_t i = 0; i < D; ++i) sigma[std::size_t(i * D + i)] = 1;
  for (std::int64_t c = 0; c < D; ++c) {
    std::int64_t p = c;
    for (std::int64_t r = c + 1; r < D; ++r)
      if (std::abs(a[std::size_t(r * D + c)]) > std::abs(a[std::size_t(p * D + c)])) p = r;
    for (std::int64_t j = 0; j < D; ++j) {
      std::swap(a[std::size_t(c * D + j)], a[std::size_t(p * D + j)]);
      std::swap(sigma[std::size_t(c * D + j)], sigma[std::size_t(p * D + j)]);
    }
    const double piv = a[std::size_t(c * D + c)];
    for (std::int64_t j = 0; j < D; ++j) a[std::size_t(c * D + j)] /= piv, sigma[std::size_t(c * D + j)] /= piv;
    for (std::int64_t r = 0; r < D; ++r) {
      if (r == c) continue;
      const double f = a[std::size_t(r * D + c)];
      for (std::int64_t j = 0; j < D; ++j)
        a[std::size_t(r * D + j)] -= f * a[std::size_t(c * D + j)], sigma[std::size_t(r * D + j)] -= f * sigma[std::size_t(c * D + j)];
    }
  }
  std::vector<double> S(std::size_t(D * D), 0.0), dz(std::size_t(N * D), 0.0), dmu(std::size_t(K * D), 0.0);
  const double* zv = z.data<double>();
  const double* mv = mu.data<double>();
  for (std::int64_t n = 0; n < N; ++n) {
    const std::int64_t k = y.data<std::int32_t>()[n];
    for (std::int64_t i = 0; i < D; ++i) {
      for (std::int64_t j = 0; j < D; ++j)
        S[std::size_t(i * D + j)] += (zv[n * D + i] - mv[k * D + i]) * (zv[n * D + j] - mv[k * D + j]) / double(N);
      double lz = 0;  // (Λ (z_n − μ_k))_i
      for (std::int64_t j = 0; j < D; ++j) lz += lam[std::size_t(i * D + j)] * (zv[n * D + j] - mv[k * D + j]);
      dz[std::size_t(n * D + i)] = lz / double(N);
      dmu[std::size_t(k * D + i)] -= lz / double(N);
    }
  }
  std::vector<double> dP(std::size_t(D * D), 0.0);
  for (std::int64_t i = 0; i < D; ++i)
    for (std::int64_t j = 0; j <= i; ++j) {
      double dl = 0;  // ((S − Σ) L)_ij
      for (std::int64_t r = 0; r < D; ++r)
        dl += (S[std::size_t(i * D + r)] - sigma[std::size_t(i * D + r)]) * L[std::size_t(r * D + j)];
      dP[std::size_t(i * D + j)] = i == j ? dl * L[std::size_t(i * D + i)] : dl;  // through exp on the diagonal
    }
  // Differences of f64 gradients of size ~1-10: a few hundred ulp at most.
  auto diff = [](const std::vector<double>& a1, const std::vector<double>& a0) {
    std::vector<double> d(a1.size());
    for (std::size_t i = 0; i < d.size(); ++i) d[i] = a1[i] - a0[i];
    return d;
  };
  expect_close("likelihood term d/dz", diff(g1[0], g0[0]), dz, {N, D}, 1e-10);
  expect_close("likelihood term d/dcentres", diff(g1[1], g0[1]), dmu, {K, D}, 1e-10);
  expect_close("likelihood term d/dP (covariance form)", diff(g1[2], g0[2]), dP, {D, D}, 1e-10);
}

// Three anisotropic Gaussian classes in 3-D, the embeddings fixed, the head
// (centres and Cholesky parameter) trained by AdamW at a deliberately large
// learning rate. The covariance must stay positive definite at every step,
// the loss must fall, and the metric must find the data's shape: the data's
// within-class spread is 20 times larger along one direction than the
// others, and the learned covariance's largest-variance direction must
// point along it.
TEST_CASE("mahalanobis head: the covariance stays positive definite over training and fits the spread",
          "[mahalanobis]") {
  const std::int64_t N = 96, K = 3, D = 3;
  frugal::Rng rng(22);
  const double axis[3] = {0.48, 0.6, 0.64};  // a unit vector: the long axis of every class
  const double mean[3][3] = {{3, 0, 0}, {0, 3, 0}, {0, 0, 3}};
  Tensor z({N, D}), y({N}, DType::i32);
  for (std::int64_t n = 0; n < N; ++n) {
    const int c = int(n % K);
    y.data<std::int32_t>()[n] = c;
    const double along = 2.0 * rng.normal();  // standard deviation 2 along the axis, 0.1 across
    for (int i = 0; i < 3; ++i) z.data<float>()[n * D + i] = float(mean[c][i] + along * axis[i] + 0.1 * rng.normal());
  }
  frugal::nn::manual_seed(7);
  frugal::nn::MahalanobisHead head(K, D, {.loss = {.likelihood_weight = 1.0, .margin = 0.2}});
  frugal::optim::AdamW opt(head.parameters(), {.lr = 0.05, .weight_decay = 0});
  frugal::Step step = frugal::compile(
      [&](Var zv, Var yv) { return head.loss(zv, yv); }, {frugal::input<float>({N, D}), frugal::input<std::int32_t>({N})},
      opt);
  float first = 0, last = 0;
  for (int s = 0; s < 400; ++s) {
    last = step.run(z, y);
    if (s == 0) first = last;
    REQUIRE(std::isfinite(last));
    const std::vector<double> L = head.cholesky();
    for (int i = 0; i < D; ++i) REQUIRE(L[std::size_t(i * D + i)] > 0);
    INFO("step " << s);
    REQUIRE(is_positive_definite(head.covariance(), D));
  }
  INFO("loss " << first << " -> " << last);
  CHECK(last < first);
  // The leading eigenvector of Σ by power iteration: along the data's axis.
  const std::vector<double> sigma = head.covariance();
  double v[3] = {1, 0, 0};
  for (int it = 0; it < 200; ++it) {
    double w[3] = {0, 0, 0}, norm = 0;
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < 3; ++j) w[i] += sigma[std::size_t(i * 3 + j)] * v[j];
    for (double e : w) norm += e * e;
    for (int i = 0; i < 3; ++i) v[i] = w[i] / std::sqrt(norm);
  }
  // cos 25° = 0.906: a metric that did not learn the shape (L = I, or one
  // stretched along a coordinate axis) has |cos| <= 0.64 with this axis.
  const double cosine = std::abs(v[0] * axis[0] + v[1] * axis[1] + v[2] * axis[2]);
  INFO("|cos| between Sigma's leading direction and the data's: " << cosine);
  CHECK(cosine > 0.9);
  // Nearest-centre predictions on the training data: the classes are 3 apart
  // against a spread of 0.1 across the long axis, so all but a few are right.
  frugal::Step dist = frugal::compile_inference([&](Var zv) { return head.distances(zv); },
                                                {frugal::input<float>({N, D})});
  dist.run(z);
  const float* d2 = dist.output().data<float>();
  std::int64_t correct = 0;
  for (std::int64_t n = 0; n < N; ++n)
    correct += std::min_element(d2 + n * K, d2 + n * K + K) - (d2 + n * K) == y.data<std::int32_t>()[n];
  CHECK(correct >= N - 3);
}

TEST_CASE("spatial attention pooling: weights that sum to 1 and the weighted mean of the features",
          "[mahalanobis]") {
  frugal::nn::manual_seed(3);
  frugal::nn::SpatialAttentionPool pool(2, DType::f64);
  const std::int64_t N = 2, C = 2, H = 3, W = 4;
  Tensor x({N, C, H, W}, DType::f64);
  frugal::Rng rng(5);
  for (std::int64_t i = 0; i < x.numel(); ++i) x.data<double>()[i] = rng.normal();
  frugal::Step step = frugal::compile_inference(
      [&](Var xv) {
        auto [pooled, weights] = pool.pool(xv);
        return std::vector<Var>{pooled, weights};
      },
      {frugal::input<double>({N, C, H, W})});
  step.run(x);
  const double* pooled = step.output(0).data<double>();
  const double* wts = step.output(1).data<double>();
  REQUIRE(step.output(1).shape() == frugal::Shape{N, 1, H, W});
  const double* sw = pool.parameters().at(0).data<double>();  // score weight [1, C, 1, 1]
  for (std::int64_t n = 0; n < N; ++n) {
    std::vector<double> score(std::size_t(H * W));
    double mx = -1e300, total = 0;
    for (std::int64_t p = 0; p < H * W; ++p) {
      for (std::int64_t c = 0; c < C; ++c) score[std::size_t(p)] += sw[c] * x.data<double>()[(n * C + c) * H * W + p];
      mx = std::max(mx, score[std::size_t(p)]);
    }
    for (double& s : score) total += (s = std::exp(s - mx));
    double wsum = 0;
    for (std::int64_t p = 0; p < H * W; ++p) {
      CHECK(wts[n * H * W + p] == Approx(score[std::size_t(p)] / total).epsilon(1e-12));
      wsum += wts[n * H * W + p];
    }
    CHECK(wsum == Approx(1).epsilon(1e-12));
    for (std::int64_t c = 0; c < C; ++c) {
      double want = 0;
      for (std::int64_t p = 0; p < H * W; ++p)
        want += x.data<double>()[(n * C + c) * H * W + p] * score[std::size_t(p)] / total;
      CHECK(pooled[n * C + c] == Approx(want).epsilon(1e-12));
    }
  }
}

TEST_CASE("mahalanobis ops name what is wrong with bad input", "[mahalanobis]") {
  auto build = [](std::vector<std::int64_t> z, std::vector<std::int64_t> mu, std::vector<std::int64_t> p) {
    Tensor zt{frugal::Shape(z)}, mt{frugal::Shape(mu)}, pt{frugal::Shape(p)};
    frugal::compile_inference(
        [&] {
          return frugal::mahalanobis_distance(frugal::persistent_var(zt, frugal::ValueKind::state, "z"),
                                              frugal::persistent_var(mt, frugal::ValueKind::state, "mu"),
                                              frugal::persistent_var(pt, frugal::ValueKind::state, "P"));
        },
        {});
  };
  CHECK_THAT(error_message<frugal::ShapeError>([&] { build({4, 3}, {2, 2}, {3, 3}); }),
             Catch::Contains("mahalanobis_distance") && Catch::Contains("[2, 2]") && Catch::Contains("dimension D"));
  CHECK_THAT(error_message<frugal::ShapeError>([&] { build({4, 3}, {2, 3}, {3, 2}); }), Catch::Contains("[3, 2]"));
  CHECK_THAT(error_message<frugal::ShapeError>([&] { build({4, 3, 1}, {2, 3}, {3, 3}); }),
             Catch::Contains("[N, D]"));
  CHECK_THAT(error_message<frugal::ShapeError>([] { frugal::ops::MahalanobisLoss({.likelihood_weight = -1}); }),
             Catch::Contains("likelihood_weight"));
  // A label outside [0, K) when the step runs.
  Tensor z({2, 2}), mu({3, 2}), P({2, 2}), y = Tensor::from(std::vector<std::int32_t>{1, 3}, {2});
  frugal::Step step = frugal::compile_inference(
      [&] {
        return frugal::mahalanobis_loss(frugal::persistent_var(z, frugal::ValueKind::state, "z"),
                                        frugal::persistent_var(y, frugal::ValueKind::state, "y"),
                                        frugal::persistent_var(mu, frugal::ValueKind::state, "mu"),
                                        frugal::persistent_var(P, frugal::ValueKind::state, "P"));
      },
      {});
  CHECK_THAT(error_message<frugal::DataError>([&] { step.run(); }),
             Catch::Contains("mahalanobis_loss") && Catch::Contains("label 3 at position 1") &&
                 Catch::Contains("[0, 3)"));
}
