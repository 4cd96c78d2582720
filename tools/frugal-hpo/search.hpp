#pragma once
// Asynchronous Bayesian optimisation of hyperparameters (issue 21):
// a Gaussian-process surrogate with a Matern 5/2 kernel, expected
// improvement, and pending trials taken into account by the constant liar.
//
// Numerics, stated:
// - Inputs are mapped to the unit cube (log-uniform parameters through
//   their log; integers and choices by their position in their range, so
//   choices are ordered as given). Outputs are standardised (mean 0, sd 1)
//   before fitting; minimisation throughout (frugal-hpo negates a metric to
//   maximise).
// - MaternKernel hyperparameters (one length scale per input, signal variance,
//   noise variance) maximise the log marginal likelihood, by Nelder-Mead in
//   log space from a fixed set of starts (deterministic), clamped to
//   length scales [0.01, 20], signal [0.01, 20], noise [1e-6, 1].
// - K + noise * I is factored by Cholesky; if that fails, jitter starting
//   at 1e-10 of the mean diagonal grows tenfold up to 1e-2, then it fails.
// - Pending trials (running, no value yet) join the data with the best
//   value seen so far as their value (constant liar, CL-min; Ginsbourger,
//   Le Riche and Carraro 2010), for the acquisition only, not for the
//   hyperparameter fit: expected improvement then falls near points that
//   are already being evaluated, so W workers explore W places. The lie is
//   optimistic, which keeps the batch close to the incumbent; kriging
//   believer (the posterior mean as the lie) was the alternative, and needs
//   a refit per pending trial.
// - Expected improvement is maximised over 2,000 random points of the cube
//   and a local search from the best 8 of them.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include <frugal/core/error.hpp>
#include <frugal/core/rng.hpp>

namespace frugal::hpo {

// ---- A small dense Gaussian process ----------------------------------------

struct MaternKernel {
  std::vector<double> length;  // per input dimension
  double signal = 1, noise = 1e-4;
};

inline double matern52(const std::vector<double>& a, const std::vector<double>& b, const MaternKernel& k) {
  double r2 = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double d = (a[i] - b[i]) / k.length[i];
    r2 += d * d;
  }
  const double r = std::sqrt(5.0 * r2);
  return k.signal * (1 + r + r * r / 3) * std::exp(-r);
}

// Lower-triangular L with L L^T = A (n x n, row-major), adding jitter to the
// diagonal where A is not numerically positive definite; false if even the
// largest jitter fails.
inline bool cholesky(std::vector<double> a, std::size_t n, std::vector<double>& l) {
  double mean_diag = 0;
  for (std::size_t i = 0; i < n; ++i) mean_diag += a[i * n + i];
  mean_diag = n ? mean_diag / double(n) : 1;
  for (double jitter = 0; jitter <= 1e-2 * mean_diag; jitter = jitter == 0 ? 1e-10 * mean_diag : jitter * 10) {
    l.assign(n * n, 0);
    bool ok = true;
    for (std::size_t j = 0; j < n && ok; ++j) {
      double d = a[j * n + j] + jitter;
      for (std::size_t k = 0; k < j; ++k) d -= l[j * n + k] * l[j * n + k];
      if (!(d > 0)) {
        ok = false;
        break;
      }
      l[j * n + j] = std::sqrt(d);
      for (std::size_t i = j + 1; i < n; ++i) {
        double s = a[i * n + j];
        for (std::size_t k = 0; k < j; ++k) s -= l[i * n + k] * l[j * n + k];
        l[i * n + j] = s / l[j * n + j];
      }
    }
    if (ok) return true;
  }
  return false;
}

// Solves L x = b (forward) in place.
inline void forward(const std::vector<double>& l, std::size_t n, std::vector<double>& b) {
  for (std::size_t i = 0; i < n; ++i) {
    double s = b[i];
    for (std::size_t k = 0; k < i; ++k) s -= l[i * n + k] * b[k];
    b[i] = s / l[i * n + i];
  }
}
// Solves L^T x = b (backward) in place.
inline void backward(const std::vector<double>& l, std::size_t n, std::vector<double>& b) {
  for (std::size_t i = n; i-- > 0;) {
    double s = b[i];
    for (std::size_t k = i + 1; k < n; ++k) s -= l[k * n + i] * b[k];
    b[i] = s / l[i * n + i];
  }
}

class Gp {
 public:
  // Conditions on (x, y) with kernel k; false if K + noise I cannot be factored.
  bool fit(std::vector<std::vector<double>> x, std::vector<double> y, MaternKernel k) {
    x_ = std::move(x), k_ = std::move(k);
    const std::size_t n = x_.size();
    std::vector<double> a(n * n);
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t j = 0; j < n; ++j) a[i * n + j] = matern52(x_[i], x_[j], k_) + (i == j ? k_.noise : 0);
    if (!cholesky(std::move(a), n, l_)) return false;
    alpha_ = y;
    forward(l_, n, alpha_);
    double fit = 0;
    for (double v : alpha_) fit += v * v;
    double logdet = 0;
    for (std::size_t i = 0; i < n; ++i) logdet += 2 * std::log(l_[i * n + i]);
    lml_ = -0.5 * fit - 0.5 * logdet - 0.5 * double(n) * std::log(2 * M_PI);
    backward(l_, n, alpha_);
    return true;
  }
  double log_marginal_likelihood() const { return lml_; }
  // Posterior mean and variance (of the latent function) at p.
  std::pair<double, double> predict(const std::vector<double>& p) const {
    const std::size_t n = x_.size();
    std::vector<double> ks(n);
    for (std::size_t i = 0; i < n; ++i) ks[i] = matern52(x_[i], p, k_);
    double mean = 0;
    for (std::size_t i = 0; i < n; ++i) mean += ks[i] * alpha_[i];
    forward(l_, n, ks);
    double v = k_.signal;
    for (double w : ks) v -= w * w;
    return {mean, std::max(v, 0.0)};
  }

 private:
  std::vector<std::vector<double>> x_;
  MaternKernel k_;
  std::vector<double> l_, alpha_;
  double lml_ = 0;
};

// Minimises f over R^d from `start` by Nelder-Mead (steps of `step`),
// `iterations` at most.
template <class F>
std::vector<double> nelder_mead(F&& f, std::vector<double> start, double step, int iterations) {
  const std::size_t d = start.size();
  std::vector<std::vector<double>> s(d + 1, start);
  for (std::size_t i = 0; i < d; ++i) s[i + 1][i] += step;
  std::vector<double> v(d + 1);
  for (std::size_t i = 0; i <= d; ++i) v[i] = f(s[i]);
  for (int it = 0; it < iterations; ++it) {
    std::vector<std::size_t> o(d + 1);
    std::iota(o.begin(), o.end(), 0);
    std::sort(o.begin(), o.end(), [&](std::size_t a, std::size_t b) { return v[a] < v[b]; });
    const std::size_t best = o[0], worst = o[d], second = o[d - (d > 0 ? 1 : 0)];
    std::vector<double> c(d, 0);
    for (std::size_t i = 0; i <= d; ++i)
      if (i != worst)
        for (std::size_t j = 0; j < d; ++j) c[j] += s[i][j] / double(d);
    auto along = [&](double t) {
      std::vector<double> p(d);
      for (std::size_t j = 0; j < d; ++j) p[j] = c[j] + t * (s[worst][j] - c[j]);
      return p;
    };
    std::vector<double> r = along(-1);
    const double fr = f(r);
    if (fr < v[best]) {
      std::vector<double> e = along(-2);
      const double fe = f(e);
      if (fe < fr) s[worst] = e, v[worst] = fe;
      else s[worst] = r, v[worst] = fr;
    } else if (fr < v[second]) {
      s[worst] = r, v[worst] = fr;
    } else {
      std::vector<double> k = along(0.5);
      const double fk = f(k);
      if (fk < v[worst]) {
        s[worst] = k, v[worst] = fk;
      } else {
        for (std::size_t i = 0; i <= d; ++i)
          if (i != best) {
            for (std::size_t j = 0; j < d; ++j) s[i][j] = s[best][j] + 0.5 * (s[i][j] - s[best][j]);
            v[i] = f(s[i]);
          }
      }
    }
  }
  return s[std::size_t(std::min_element(v.begin(), v.end()) - v.begin())];
}

// The kernel that maximises the log marginal likelihood of (x, y).
inline MaternKernel fit_kernel(const std::vector<std::vector<double>>& x, const std::vector<double>& y) {
  const std::size_t d = x.empty() ? 0 : x[0].size();
  auto kernel_of = [&](const std::vector<double>& t) {
    MaternKernel k;
    for (std::size_t i = 0; i < d; ++i) k.length.push_back(std::exp(std::clamp(t[i], std::log(0.01), std::log(20.0))));
    k.signal = std::exp(std::clamp(t[d], std::log(0.01), std::log(20.0)));
    k.noise = std::exp(std::clamp(t[d + 1], std::log(1e-6), std::log(1.0)));
    return k;
  };
  auto cost = [&](const std::vector<double>& t) {
    Gp gp;
    if (!gp.fit(x, y, kernel_of(t))) return std::numeric_limits<double>::infinity();
    return -gp.log_marginal_likelihood();
  };
  std::vector<double> best;
  double best_cost = std::numeric_limits<double>::infinity();
  for (double length : {0.1, 0.3, 1.0}) {
    std::vector<double> t(d, std::log(length));
    t.push_back(0);               // signal 1: the outputs are standardised
    t.push_back(std::log(1e-3));  // little noise
    t = nelder_mead(cost, t, 0.5, 60 * int(d + 2));
    const double c = cost(t);
    if (c < best_cost) best_cost = c, best = t;
  }
  return kernel_of(best);
}

inline double normal_pdf(double z) { return std::exp(-0.5 * z * z) / std::sqrt(2 * M_PI); }
inline double normal_cdf(double z) { return 0.5 * std::erfc(-z / std::sqrt(2.0)); }

// Expected improvement below `best` of a posterior (mean, variance).
inline double expected_improvement(double mean, double variance, double best) {
  const double sd = std::sqrt(variance);
  if (sd < 1e-12) return std::max(best - mean, 0.0);
  const double z = (best - mean) / sd;
  return (best - mean) * normal_cdf(z) + sd * normal_pdf(z);
}

// The next point of the unit cube to evaluate, given the finished points
// (x, y; y to minimise) and the pending ones. `rng` draws the candidates.
inline std::vector<double> suggest(const std::vector<std::vector<double>>& x, const std::vector<double>& y,
                                   const std::vector<std::vector<double>>& pending, std::size_t dims, Rng& rng) {
  auto random_point = [&] {
    std::vector<double> p(dims);
    for (double& v : p) v = rng.uniform();
    return p;
  };
  if (x.size() < std::max<std::size_t>(4, dims + 1)) return random_point();  // the initial design
  // Standardised outputs.
  const double mean = std::accumulate(y.begin(), y.end(), 0.0) / double(y.size());
  double var = 0;
  for (double v : y) var += (v - mean) * (v - mean);
  const double sd = std::max(std::sqrt(var / double(y.size())), 1e-12);
  std::vector<double> ys;
  for (double v : y) ys.push_back((v - mean) / sd);
  const MaternKernel k = fit_kernel(x, ys);
  const double best = *std::min_element(ys.begin(), ys.end());
  std::vector<std::vector<double>> xs = x;
  for (const auto& p : pending) xs.push_back(p), ys.push_back(best);  // constant liar (CL-min)
  Gp gp;
  if (!gp.fit(xs, ys, k)) return random_point();
  auto ei = [&](const std::vector<double>& p) {
    auto [m, v] = gp.predict(p);
    return expected_improvement(m, v, best);
  };
  std::vector<std::pair<double, std::vector<double>>> cands;
  for (int i = 0; i < 2000; ++i) {
    auto p = random_point();
    cands.push_back({ei(p), p});
  }
  std::partial_sort(cands.begin(), cands.begin() + 8, cands.end(), [](auto& a, auto& b) { return a.first > b.first; });
  std::pair<double, std::vector<double>> top = cands[0];
  for (int c = 0; c < 8; ++c) {
    auto [value, p] = cands[std::size_t(c)];
    double step = 0.05;
    for (int it = 0; it < 60; ++it, step *= 0.95) {
      std::vector<double> q = p;
      for (double& v : q) v = std::clamp(v + step * (2 * rng.uniform() - 1), 0.0, 1.0);
      const double e = ei(q);
      if (e > value) value = e, p = q;
    }
    if (value > top.first) top = {value, p};
  }
  return top.second;
}

// ---- Test objectives (to minimise), on the unit cube ------------------------

// Branin on [-5, 10] x [0, 15]; least 0.397887.
inline double branin(const std::vector<double>& u) {
  const double x = -5 + 15 * u[0], y = 15 * u[1];
  const double b = 5.1 / (4 * M_PI * M_PI), c = 5 / M_PI, t = 1 / (8 * M_PI);
  return (y - b * x * x + c * x - 6) * (y - b * x * x + c * x - 6) + 10 * (1 - t) * std::cos(x) + 10;
}

// Hartmann-6 on [0, 1]^6; least -3.32237.
inline double hartmann6(const std::vector<double>& x) {
  static const double alpha[4] = {1.0, 1.2, 3.0, 3.2};
  static const double a[4][6] = {{10, 3, 17, 3.5, 1.7, 8}, {0.05, 10, 17, 0.1, 8, 14}, {3, 3.5, 1.7, 10, 17, 8},
                                 {17, 8, 0.05, 10, 0.1, 14}};
  static const double p[4][6] = {{0.1312, 0.1696, 0.5569, 0.0124, 0.8283, 0.5886},
                                 {0.2329, 0.4135, 0.8307, 0.3736, 0.1004, 0.9991},
                                 {0.2348, 0.1451, 0.3522, 0.2883, 0.3047, 0.6650},
                                 {0.4047, 0.8828, 0.8732, 0.5743, 0.1091, 0.0381}};
  double s = 0;
  for (int i = 0; i < 4; ++i) {
    double e = 0;
    for (int j = 0; j < 6; ++j) e += a[i][j] * (x[std::size_t(j)] - p[i][j]) * (x[std::size_t(j)] - p[i][j]);
    s += alpha[i] * std::exp(-e);
  }
  return -s;
}

// The best value after each of `trials` evaluations of f, by GP search
// (gp) or uniform random search, with `workers` trials in flight: each new
// trial is suggested while the workers - 1 before it are still pending
// (they finish in the order they started).
template <class F>
std::vector<double> best_so_far(F&& f, std::size_t dims, int trials, int workers, bool gp, std::uint64_t seed) {
  Rng rng(seed, 11);
  std::vector<std::vector<double>> x, pending;
  std::vector<double> y, best;
  auto finish_oldest = [&] {
    x.push_back(pending.front());
    y.push_back(f(pending.front()));
    pending.erase(pending.begin());
    best.push_back(best.empty() ? y.back() : std::min(best.back(), y.back()));
  };
  for (int t = 0; t < trials; ++t) {
    if (int(pending.size()) == workers) finish_oldest();
    std::vector<double> p(dims);
    if (gp) p = suggest(x, y, pending, dims, rng);
    else
      for (double& v : p) v = rng.uniform();
    pending.push_back(p);
  }
  while (!pending.empty()) finish_oldest();
  return best;
}

}  // namespace frugal::hpo
