// frugal-place (tools/frugal-place/placement.hpp): the exact search against
// brute force, annealing against the exact optimum, memory never broken.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <functional>

#include "../tools/frugal-place/placement.hpp"

using namespace frugal;
using namespace frugal::place;

namespace place_test {

// A small instance where lateness matters: deadlines around what the
// devices can finish, memory that some devices lack.
Instance tiny(std::uint64_t seed, int jobs, int servers) {
  Rng r(seed, 3);
  Instance in;
  in.price_per_kwh = r.uniform(0.1, 3.0);
  for (int s = 0; s < servers; ++s)
    in.servers.push_back({cat("s", s), 1 + int(r.below(2)), (s == 0 ? 64 : 8 + 8 * r.below(4)) * (std::uint64_t(1) << 30),
                          r.uniform(0.5, 2), r.uniform(50, 150), r.uniform(200, 700)});
  const Penalty kinds[] = {Penalty::step, Penalty::linear, Penalty::exponential};
  for (int j = 0; j < jobs; ++j) {
    Job v;
    v.name = cat("j", j);
    v.memory = (1 + r.below(48)) * (std::uint64_t(1) << 30);
    v.seconds = r.uniform(600, 7200);
    v.deadline = r.uniform(0.3, 1.5) * 3600 * jobs / servers;
    v.kind = kinds[r.below(3)];
    v.weight = v.kind == Penalty::linear ? r.uniform(0, 2) / 3600 : r.uniform(0, 2);
    v.scale = v.kind == Penalty::exponential && r.below(2) ? 1800 : 0;
    in.jobs.push_back(v);
  }
  return in;
}

// The least cost over every assignment and every order on every device.
double brute_force(const Instance& in) {
  const std::vector<Device> dev = devices_of(in);
  const std::size_t m = dev.size(), n = in.jobs.size();
  double best = std::numeric_limits<double>::infinity();
  std::vector<int> device(n, 0);
  for (;;) {
    Assignment a;
    a.order.resize(m);
    bool fits = true;
    for (std::size_t j = 0; j < n; ++j) {
      a.order[std::size_t(device[j])].push_back(int(j));
      fits = fits && in.jobs[j].memory <= in.servers[std::size_t(dev[std::size_t(device[j])].server)].memory;
    }
    if (fits) {
      // Every combination of orders: permute each device in turn.
      std::function<void(std::size_t)> orders = [&](std::size_t d) {
        if (d == m) {
          best = std::min(best, evaluate(in, a).cost);
          return;
        }
        std::sort(a.order[d].begin(), a.order[d].end());
        do orders(d + 1);
        while (std::next_permutation(a.order[d].begin(), a.order[d].end()));
      };
      orders(0);
    }
    std::size_t k = 0;
    while (k < n && ++device[k] == int(m)) device[k++] = 0;
    if (k == n) break;
  }
  return best;
}

bool fits_memory(const Instance& in, const Assignment& a) {
  const auto dev = devices_of(in);
  for (std::size_t d = 0; d < dev.size(); ++d)
    for (int j : a.order[d])
      if (in.jobs[std::size_t(j)].memory > in.servers[std::size_t(dev[d].server)].memory) return false;
  return true;
}

bool close(double a, double b) { return std::abs(a - b) <= 1e-9 * std::max(1.0, std::abs(b)); }

}  // namespace place_test

using namespace place_test;

TEST_CASE("place: the exact search finds brute force's least cost", "[place]") {
  int penalised = 0;
  for (std::uint64_t seed = 1; seed <= 30; ++seed) {
    const Instance in = tiny(seed, 3 + int(seed % 4), 1 + int(seed % 2));  // 3-6 jobs, up to 4 devices
    INFO("seed " << seed);
    const auto a = exact(in);
    REQUIRE(a);
    const place::Evaluation e = evaluate(in, *a);
    CHECK(close(e.cost, brute_force(in)));
    CHECK(fits_memory(in, *a));
    penalised += e.penalty > 0;
  }
  CHECK(penalised >= 10);  // lateness shaped the answers, not only energy
}

TEST_CASE("place: annealing reaches the exact optimum on small instances", "[place]") {
  int below_greedy = 0;
  for (std::uint64_t seed = 100; seed < 120; ++seed) {
    const Instance in = tiny(seed, 8, 2 + int(seed % 2));
    INFO("seed " << seed);
    const auto best = exact(in);
    REQUIRE(best);
    const double optimum = evaluate(in, *best).cost;
    const Assignment g = greedy(in);
    const AnnealResult r = anneal(in, g);
    CHECK(close(evaluate(in, r.best).cost, r.best_cost));  // its own bookkeeping is the evaluation's
    CHECK(close(r.best_cost, optimum));
    CHECK(r.best_cost <= evaluate(in, g).cost + 1e-12);
    below_greedy += evaluate(in, g).cost > optimum * (1 + 1e-9);
  }
  CHECK(below_greedy >= 5);  // instances where the greedy answer is not already the optimum
}

TEST_CASE("place: no solver puts a job on a device whose memory does not hold it, and a seed gives one answer",
          "[place]") {
  for (std::uint64_t seed = 1; seed <= 10; ++seed) {
    const Instance in = random_instance(60, 8, Penalty(int(seed % 3)), seed);
    const Assignment g = greedy(in);
    CHECK(fits_memory(in, g));
    const AnnealResult r = anneal(in, g, {.seed = seed, .iterations = 30000});
    CHECK(fits_memory(in, r.best));
    CHECK(r.best_cost <= evaluate(in, g).cost + 1e-12);
    const AnnealResult again = anneal(in, g, {.seed = seed, .iterations = 30000});
    CHECK(again.best.order == r.best.order);
  }
}

TEST_CASE("place: a bad instance is an error naming the job or field", "[place]") {
  Instance in = tiny(5, 4, 2);
  in.jobs[2].memory = std::uint64_t(100) << 30;
  CHECK_THROWS_WITH(greedy(in), Catch::Contains("job 'j2' needs 100.0 GiB") && Catch::Contains("the largest device holds 64.0 GiB"));
  auto parse = [](const std::string& text) { return parse_instance(parse_json_object(text, "jobs.json"), "jobs.json"); };
  const std::string server = R"({"name":"a","memory":"16GiB","idle_watts":50,"busy_watts":300})";
  CHECK_THROWS_WITH(parse(R"({"servers":[)" + server + R"(],"jobs":[{"name":"x","memory":1,"seconds":5,"deadline":9,"penalty":"cubic"}]})"),
                    Catch::Contains("jobs.json: jobs[0]: 'penalty' must be \"step\", \"linear\" or \"exponential\", got \"cubic\""));
  CHECK_THROWS_WITH(parse(R"({"servers":[)" + server + R"(],"jobs":[{"name":"x","memory":1,"deadline":9}]})"),
                    Catch::Contains("jobs.json: jobs[0]: 'seconds' is missing"));
  const Instance ok = parse(R"({"price_per_kwh":0.5,"servers":[)" + server +
                            R"(],"jobs":[{"name":"x","memory":"1GiB","seconds":3600,"deadline":1800,"weight":2,"penalty":"step"}]})");
  const place::Evaluation e = evaluate(ok, greedy(ok));
  CHECK(close(e.penalty, 2));                             // an hour against a half-hour deadline: the step
  CHECK(close(e.energy_cost, 0.5 * 300 * 3600 / 3.6e6));  // 0.3 kWh busy at 0.5 per kWh
}
