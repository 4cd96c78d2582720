#pragma once
// The defence against a poisoned replay pool: before a transition may be
// sampled for training, it is scored, and the suspicious ones are filtered.
//
// Every `every` environment steps the whole pool is rescored:
//  1. Features: each transition's (s, a), every dimension standardised over
//     the pool; what it should explain: r and Δs = s' - s, standardised too.
//  2. k-means on (s, a) (k-means++ seeding from a Philox stream keyed by the
//     seed and the rescoring's number, Lloyd iterations on a subsample of at
//     most 4096 transitions, then every transition assigned to its nearest
//     centre); k at most --clusters, and at least 8 transitions per
//     coefficient of a cluster's regression.
//  3. Risk: how far a transition sits from what its cluster says, as robust
//     z-scores within the cluster (median and 1.4826 × MAD):
//       z_dist    its distance to the centre (a perturbed state lies off the
//                 states the environment visits);
//       z_reward  its residual of r under a linear model of (r, Δs) on
//                 (1, s, a) fitted to the cluster (refitted without the
//                 points beyond 3 robust sigmas): locally, the reward is a
//                 smooth function of state and action, and a flipped one
//                 does not fit its neighbours;
//       z_dyn     the RMS of its Δs residuals under that model: a state or
//                 next state moved by noise does not follow the dynamics.
//     risk = max(z_dist, z_reward, z_dyn).
//  4. Value: |TD error| = |Q(s, a) - y| under the current critic and targets
//     (the score step), as a robust z-score over the pool: how much the
//     critic would move on it.
//  5. Filtered: risk > threshold (plainly inconsistent with its cluster), or
//     value > threshold with risk > threshold / 2 (a transition that would
//     pull the critic hard AND sits off its cluster). A large TD error alone
//     is not enough: clean but rare transitions (the first swing-ups) carry
//     large errors and are exactly what the critic must learn from.
// Transitions added since the last rescoring are not sampled until scored.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "agent.hpp"
#include "replay.hpp"

namespace ddpg {

struct DefenceOptions {
  int clusters = 32;
  double threshold = 4.0;
  std::int64_t every = 250;  // environment steps between rescorings
};

// What one rescoring found (summed over the run by the caller).
struct DefenceReport {
  std::int64_t scored = 0, filtered = 0, poisoned = 0, poisoned_filtered = 0;
};

namespace detail {
// Median and MAD of v (reordered).
inline std::pair<double, double> median_mad(std::vector<double>& v) {
  if (v.empty()) return {0, 0};
  auto mid = v.begin() + std::ptrdiff_t(v.size() / 2);
  std::nth_element(v.begin(), mid, v.end());
  const double med = *mid;
  for (double& x : v) x = std::abs(x - med);
  std::nth_element(v.begin(), mid, v.end());
  return {med, *mid};
}
inline double robust_z(double x, double med, double mad, double floor) {
  return (x - med) / std::max(1.4826 * mad, floor);
}
}  // namespace detail

// k-means++ then Lloyd on rows of x (n × d); returns k × d centres.
inline std::vector<double> kmeans(const std::vector<double>& x, std::int64_t n, int d, int k, frugal::Rng& rng,
                                  int iterations = 15) {
  std::vector<double> c(static_cast<std::size_t>(k * d));
  auto dist2 = [&](std::int64_t i, const double* ctr) {
    double s = 0;
    for (int j = 0; j < d; ++j) s += (x[std::size_t(i * d + j)] - ctr[j]) * (x[std::size_t(i * d + j)] - ctr[j]);
    return s;
  };
  std::vector<double> best(static_cast<std::size_t>(n), 1e300);
  std::int64_t first = std::int64_t(rng.below(std::uint64_t(n)));
  std::copy_n(&x[std::size_t(first * d)], d, c.begin());
  for (int m = 1; m < k; ++m) {
    double total = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      best[std::size_t(i)] = std::min(best[std::size_t(i)], dist2(i, &c[std::size_t((m - 1) * d)]));
      total += best[std::size_t(i)];
    }
    double u = rng.uniform() * total;
    std::int64_t pick = n - 1;
    for (std::int64_t i = 0; i < n; ++i) {
      u -= best[std::size_t(i)];
      if (u <= 0) {
        pick = i;
        break;
      }
    }
    std::copy_n(&x[std::size_t(pick * d)], d, c.begin() + std::ptrdiff_t(m * d));
  }
  std::vector<int> of(static_cast<std::size_t>(n));
  for (int it = 0; it < iterations; ++it) {
    for (std::int64_t i = 0; i < n; ++i) {
      double bd = 1e300;
      for (int m = 0; m < k; ++m) {
        const double dd = dist2(i, &c[std::size_t(m * d)]);
        if (dd < bd) bd = dd, of[std::size_t(i)] = m;
      }
    }
    std::vector<double> sum(static_cast<std::size_t>(k * d), 0.0);
    std::vector<std::int64_t> cnt(static_cast<std::size_t>(k), 0);
    for (std::int64_t i = 0; i < n; ++i) {
      ++cnt[std::size_t(of[std::size_t(i)])];
      for (int j = 0; j < d; ++j) sum[std::size_t(of[std::size_t(i)] * d + j)] += x[std::size_t(i * d + j)];
    }
    for (int m = 0; m < k; ++m)
      if (cnt[std::size_t(m)])
        for (int j = 0; j < d; ++j) c[std::size_t(m * d + j)] = sum[std::size_t(m * d + j)] / double(cnt[std::size_t(m)]);
  }
  return c;
}

class Defence {
 public:
  explicit Defence(DefenceOptions o) : o_(o) {}
  const DefenceOptions& options() const { return o_; }

  // Rescores the whole pool (the `round`-th time) and sets which slots may
  // be sampled. `learner` gives the TD errors (null: risk alone, as before
  // the first update).
  DefenceReport rescore(ReplayBuffer& buf, Learner* learner, std::uint64_t seed, std::uint64_t round) {
    DefenceReport rep;
    const std::int64_t n = buf.size();
    if (n == 0) return rep;
    const int od = buf.obs_dim(), ad = buf.act_dim(), dx = od + ad, dy = 1 + od;
    // 1. standardised features: (s, a) to cluster on; Δs = s' - s and r to predict
    std::vector<double> x(static_cast<std::size_t>(n * dx)), y(static_cast<std::size_t>(n * dy));
    for (std::int64_t i = 0; i < n; ++i) {
      double* row = &x[std::size_t(i * dx)];
      for (int j = 0; j < od; ++j) row[j] = buf.s(i)[j];
      for (int j = 0; j < ad; ++j) row[od + j] = buf.a(i)[j];
      double* out = &y[std::size_t(i * dy)];
      out[0] = buf.r(i);
      for (int j = 0; j < od; ++j) out[1 + j] = double(buf.s2(i)[j]) - double(buf.s(i)[j]);
    }
    standardise(x, n, dx);
    standardise(y, n, dy);
    // 2. k-means on a subsample, then every transition to its nearest centre;
    // at least 8 transitions per coefficient of a cluster's regression
    frugal::Rng rng(seed, kKmeans + round);
    const int k = int(std::max<std::int64_t>(1, std::min<std::int64_t>(o_.clusters, n / (8 * (dx + 1)))));
    const std::int64_t m = std::min<std::int64_t>(n, 4096);
    std::vector<double> sub(static_cast<std::size_t>(m * dx));
    for (std::int64_t i = 0; i < m; ++i) {
      const std::int64_t src = m == n ? i : std::int64_t(rng.below(std::uint64_t(n)));
      std::copy_n(&x[std::size_t(src * dx)], dx, sub.begin() + std::ptrdiff_t(i * dx));
    }
    const std::vector<double> c = kmeans(sub, m, dx, k, rng);
    std::vector<int> of(static_cast<std::size_t>(n));
    std::vector<double> dist(static_cast<std::size_t>(n));
    std::vector<std::vector<std::int64_t>> members(static_cast<std::size_t>(k));
    for (std::int64_t i = 0; i < n; ++i) {
      double bd = 1e300;
      for (int q = 0; q < k; ++q) {
        double s = 0;
        for (int j = 0; j < dx; ++j) s += std::pow(x[std::size_t(i * dx + j)] - c[std::size_t(q * dx + j)], 2);
        if (s < bd) bd = s, of[std::size_t(i)] = q;
      }
      dist[std::size_t(i)] = std::sqrt(bd);
      members[std::size_t(of[std::size_t(i)])].push_back(i);
    }
    // 3. risk within each cluster: distance to the centre, and the residuals
    // of a linear model of (r, Δs) on (1, s, a) fitted to the cluster
    // (least squares, refitted without the points beyond 3 robust sigmas)
    risk_.assign(static_cast<std::size_t>(n), 0);
    std::vector<double> res(static_cast<std::size_t>(n * dy));
    for (int q = 0; q < k; ++q) {
      const auto& mem = members[std::size_t(q)];
      if (mem.empty()) continue;
      std::vector<double> dq;
      for (std::int64_t i : mem) dq.push_back(dist[std::size_t(i)]);
      const auto [med_d, mad_d] = detail::median_mad(dq);
      std::vector<char> inlier(mem.size(), 1);
      std::vector<double> zr(mem.size()), zs(mem.size());
      for (int pass = 0; pass < 2; ++pass) {
        fit_residuals(x, y, dx, dy, mem, inlier, res);
        std::vector<double> med(static_cast<std::size_t>(dy)), scale(static_cast<std::size_t>(dy));
        for (int j = 0; j < dy; ++j) {
          std::vector<double> col;
          for (std::size_t u = 0; u < mem.size(); ++u) col.push_back(res[std::size_t(mem[u] * dy + j)]);
          const auto [md, mad] = detail::median_mad(col);
          med[std::size_t(j)] = md;
          scale[std::size_t(j)] = std::max(1.4826 * mad, 1e-3);
        }
        for (std::size_t u = 0; u < mem.size(); ++u) {
          const double* rr = &res[std::size_t(mem[u] * dy)];
          zr[u] = std::abs(rr[0] - med[0]) / scale[0];
          double ss = 0;
          for (int j = 1; j < dy; ++j) ss += std::pow((rr[j] - med[std::size_t(j)]) / scale[std::size_t(j)], 2);
          zs[u] = std::sqrt(ss / double(dy - 1));
          inlier[u] = zr[u] < 3 && zs[u] < 3;
        }
      }
      for (std::size_t u = 0; u < mem.size(); ++u) {
        const double zd = detail::robust_z(dist[std::size_t(mem[u])], med_d, mad_d, 1e-3);
        risk_[std::size_t(mem[u])] = std::max({zd, zr[u], zs[u]});
      }
    }
    // 4. value: TD errors under the current networks
    value_.assign(std::size_t(n), 0);
    if (learner) {
      td_errors(buf, *learner, value_);
      std::vector<double> tmp = value_;
      auto [med, mad] = detail::median_mad(tmp);
      for (double& v : value_) v = detail::robust_z(v, med, mad, 1e-6);
    }
    // 5. filter
    for (std::int64_t i = 0; i < n; ++i) {
      const double risk = risk_[std::size_t(i)], value = value_[std::size_t(i)];
      const bool drop = risk > o_.threshold || (value > o_.threshold && risk > o_.threshold / 2);
      buf.set_usable(i, !drop);
      ++rep.scored;
      rep.filtered += drop;
      rep.poisoned += buf.poisoned(i);
      rep.poisoned_filtered += drop && buf.poisoned(i);
    }
    return rep;
  }

  // |Q(s, a) - y| of every transition in the pool, by the score step in
  // chunks (the last one padded with copies of the first transition).
  static void td_errors(const ReplayBuffer& buf, Learner& learner, std::vector<double>& out) {
    const Hyper& h = learner.hyper();
    const std::int64_t C = h.score_chunk, n = buf.size();
    frugal::Tensor s({C, h.obs}), a({C, h.act}), r({C, 1}), s2({C, h.obs}), nd({C, 1});
    for (std::int64_t first = 0; first < n; first += C) {
      for (std::int64_t k = 0; k < C; ++k) {
        const std::int64_t i = first + k < n ? first + k : 0;
        buf.copy_out(i, s.data<float>() + k * h.obs, a.data<float>() + k * h.act, r.data<float>() + k,
                     s2.data<float>() + k * h.obs, nd.data<float>() + k);
      }
      learner.score_step().run(s, a, r, s2, nd);
      const float* e = learner.score_step().output().data<float>();
      for (std::int64_t k = 0; k < C && first + k < n; ++k) out[std::size_t(first + k)] = e[k];
    }
  }

  // Each column of the n × d rows to mean 0, standard deviation 1.
  static void standardise(std::vector<double>& x, std::int64_t n, int d) {
    for (int j = 0; j < d; ++j) {
      double m = 0, v = 0;
      for (std::int64_t i = 0; i < n; ++i) m += x[std::size_t(i * d + j)];
      m /= double(n);
      for (std::int64_t i = 0; i < n; ++i) v += std::pow(x[std::size_t(i * d + j)] - m, 2);
      const double sd = std::sqrt(v / double(n)) + 1e-8;
      for (std::int64_t i = 0; i < n; ++i) x[std::size_t(i * d + j)] = (x[std::size_t(i * d + j)] - m) / sd;
    }
  }
  // Least squares of y (dy outputs) on (1, x) over the inliers of `mem`
  // (ridge 1e-3 per point), and the residuals of every member into res.
  static void fit_residuals(const std::vector<double>& x, const std::vector<double>& y, int dx, int dy,
                            const std::vector<std::int64_t>& mem, const std::vector<char>& inlier,
                            std::vector<double>& res) {
    const int p = dx + 1;
    std::vector<double> A(static_cast<std::size_t>(p * p), 0.0), B(static_cast<std::size_t>(p * dy), 0.0);
    std::vector<double> f(static_cast<std::size_t>(p));
    std::size_t used = 0;
    for (std::size_t u = 0; u < mem.size(); ++u) {
      if (!inlier[u]) continue;
      ++used;
      f[0] = 1;
      for (int j = 0; j < dx; ++j) f[std::size_t(1 + j)] = x[std::size_t(mem[u] * dx + j)];
      for (int a = 0; a < p; ++a) {
        for (int b = 0; b < p; ++b) A[std::size_t(a * p + b)] += f[std::size_t(a)] * f[std::size_t(b)];
        for (int o = 0; o < dy; ++o) B[std::size_t(a * dy + o)] += f[std::size_t(a)] * y[std::size_t(mem[u] * dy + o)];
      }
    }
    for (int a = 0; a < p; ++a) A[std::size_t(a * p + a)] += 1e-3 * double(std::max<std::size_t>(used, 1));
    // Gauss-Jordan with partial pivoting (A is symmetric positive definite).
    for (int col = 0; col < p; ++col) {
      int piv = col;
      for (int r = col + 1; r < p; ++r)
        if (std::abs(A[std::size_t(r * p + col)]) > std::abs(A[std::size_t(piv * p + col)])) piv = r;
      for (int b = 0; b < p; ++b) std::swap(A[std::size_t(col * p + b)], A[std::size_t(piv * p + b)]);
      for (int o = 0; o < dy; ++o) std::swap(B[std::size_t(col * dy + o)], B[std::size_t(piv * dy + o)]);
      const double d = A[std::size_t(col * p + col)];
      for (int r = 0; r < p; ++r) {
        if (r == col) continue;
        const double fct = A[std::size_t(r * p + col)] / d;
        if (fct == 0) continue;
        for (int b = 0; b < p; ++b) A[std::size_t(r * p + b)] -= fct * A[std::size_t(col * p + b)];
        for (int o = 0; o < dy; ++o) B[std::size_t(r * dy + o)] -= fct * B[std::size_t(col * dy + o)];
      }
    }
    for (int a = 0; a < p; ++a)
      for (int o = 0; o < dy; ++o) B[std::size_t(a * dy + o)] /= A[std::size_t(a * p + a)];
    for (std::int64_t i : mem)
      for (int o = 0; o < dy; ++o) {
        double pred = B[std::size_t(o)];
        for (int j = 0; j < dx; ++j) pred += x[std::size_t(i * dx + j)] * B[std::size_t((1 + j) * dy + o)];
        res[std::size_t(i * dy + o)] = y[std::size_t(i * dy + o)] - pred;
      }
  }

  const std::vector<double>& risk() const { return risk_; }
  const std::vector<double>& value() const { return value_; }

 private:
  DefenceOptions o_;
  std::vector<double> risk_, value_;
};

}  // namespace ddpg
