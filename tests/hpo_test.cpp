// frugal-hpo's search (tools/frugal-hpo/search.hpp): the Gaussian process
// against a posterior computed by hand, and the search against random search
// on Branin and Hartmann-6.
#include <catch2/catch.hpp>

#include <cmath>

#include "../tools/frugal-hpo/search.hpp"

using namespace frugal;
using namespace frugal::hpo;

TEST_CASE("hpo: the Gaussian process's posterior is the one computed by hand", "[hpo]") {
  // Two points in one dimension, a fixed kernel: K = [[s + n, c], [c, s + n]]
  // with c = k(0.2, 0.7); at x* the mean is k*^T K^-1 y and the variance
  // s - k*^T K^-1 k*, with the 2 x 2 inverse written out.
  MaternKernel k{{0.4}, 1.5, 0.01};
  const double r = std::sqrt(5.0) * 0.5 / 0.4;
  const double c = 1.5 * (1 + r + r * r / 3) * std::exp(-r);
  auto kstar = [&](double a, double b) {
    const double q = std::sqrt(5.0) * std::abs(a - b) / 0.4;
    return 1.5 * (1 + q + q * q / 3) * std::exp(-q);
  };
  const double y0 = 1.0, y1 = -2.0, xs = 0.55;
  const double a = 1.5 + 0.01, det = a * a - c * c;
  const double k0 = kstar(0.2, xs), k1 = kstar(0.7, xs);
  // K^-1 = [[a, -c], [-c, a]] / det
  const double w0 = (a * k0 - c * k1) / det, w1 = (-c * k0 + a * k1) / det;
  const double mean = w0 * y0 + w1 * y1, var = 1.5 - (w0 * k0 + w1 * k1);
  Gp gp;
  REQUIRE(gp.fit({{0.2}, {0.7}}, {y0, y1}, k));
  auto [m, v] = gp.predict({xs});
  CHECK(m == Approx(mean).epsilon(1e-12));
  CHECK(v == Approx(var).epsilon(1e-10));
  // The log marginal likelihood: -y^T K^-1 y / 2 - log det K / 2 - log 2 pi.
  const double fit = (a * y0 * y0 - 2 * c * y0 * y1 + a * y1 * y1) / det;
  CHECK(gp.log_marginal_likelihood() == Approx(-0.5 * fit - 0.5 * std::log(det) - std::log(2 * M_PI)).epsilon(1e-12));
  // Expected improvement: against its closed form at one point.
  CHECK(expected_improvement(0.0, 1.0, 0.0) == Approx(1 / std::sqrt(2 * M_PI)).epsilon(1e-12));
  CHECK(expected_improvement(2.0, 0.0, 1.0) == 0.0);
}

TEST_CASE("hpo: the search beats random search at equal trials on Branin and Hartmann-6", "[hpo]") {
  struct Case {
    const char* name;
    double (*f)(const std::vector<double>&);
    std::size_t dims;
    int trials;
  };
  for (Case c : {Case{"branin", branin, 2, 24}, Case{"hartmann6", hartmann6, 6, 40}}) {
    double gp = 0, random = 0;
    const int seeds = 4;
    for (std::uint64_t seed = 1; seed <= std::uint64_t(seeds); ++seed) {
      gp += best_so_far(c.f, c.dims, c.trials, 2, true, seed).back() / seeds;
      random += best_so_far(c.f, c.dims, c.trials, 2, false, seed).back() / seeds;
    }
    INFO(c.name << ": mean best " << gp << " (search) and " << random << " (random)");
    CHECK(gp < random);
  }
}
