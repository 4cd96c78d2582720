// One training workload, frugal's side of the comparison with the PyTorch
// peer (../shared/peer/torch_bench.py): the same four workloads, shapes,
// optimizers and hyper-parameters, synthetic data, one fixed batch reused
// every step, so no data loading is timed. It prints one line
// `RESULT {json}` with the same keys the peer prints; bench/train-vs-peer
// runs both, alternately, one process per run, and tabulates the ratios.
//
//   train_bench --workload mlp|resnet|gpt|gcn [--threads 2] [--steps N]
//               [--warmup N] [--seed N]
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "train_workloads.hpp"

using namespace frugal;

int main(int argc, char** argv) {
  std::string workload = "mlp";
  int threads = 2, steps = -1, warmup = -1;
  std::uint64_t seed = 0;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) fail("train_bench: ", a, " needs a value");
      return argv[++i];
    };
    if (a == "--workload") workload = next();
    else if (a == "--threads") threads = std::stoi(next());
    else if (a == "--steps") steps = std::stoi(next());
    else if (a == "--warmup") warmup = std::stoi(next());
    else if (a == "--seed") seed = std::stoull(next());
    else {
      std::fprintf(stderr, "train_bench: unknown argument '%s'\n", a.c_str());
      return 2;
    }
  }
  try {
    const double rss_start = double(peak_rss_bytes()) / (1 << 20);
    nn::manual_seed(seed);
    std::unique_ptr<bench::Workload> w = bench::make_workload(workload, threads);
    if (warmup < 0) warmup = w->default_warmup;
    if (steps < 0) steps = w->default_steps;
    const double rss_setup = double(peak_rss_bytes()) / (1 << 20);

    std::vector<double> losses, ms;
    for (int s = 0; s < warmup + steps; ++s) {
      auto t0 = std::chrono::steady_clock::now();
      float loss = w->step();
      auto t1 = std::chrono::steady_clock::now();
      losses.push_back(loss);
      if (s >= warmup) ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
      if (!std::isfinite(loss)) fail("train_bench: ", workload, ": the loss is ", loss, " at step ", s);
    }
    std::vector<double> sorted = ms;
    std::sort(sorted.begin(), sorted.end());
    double med = sorted.empty() ? 0 : (sorted[(sorted.size() - 1) / 2] + sorted[sorted.size() / 2]) / 2;
    double mean = 0;
    for (double m : ms) mean += m / double(ms.size());
    std::printf(
        "RESULT {\"workload\":\"%s\",\"impl\":\"frugal\",\"threads\":%d,\"warmup\":%d,\"steps\":%d,\"batch\":%lld,"
        "\"unit\":\"%s\",\"params\":%lld,\"ms_step_median\":%.4f,\"ms_step_min\":%.4f,\"ms_step_mean\":%.4f,"
        "\"samples_per_s\":%.3f,\"peak_rss_mib\":%.2f,\"rss_at_start_mib\":%.2f,\"rss_after_setup_mib\":%.2f,"
        "\"arena_mib\":%.3f,\"loss_first\":%.6f,\"loss_last\":%.6f}\n",
        workload.c_str(), threads, warmup, steps, (long long)w->batch, w->unit.c_str(), (long long)w->params, med,
        sorted.empty() ? 0 : sorted.front(), mean, double(w->batch) / (med / 1e3),
        double(peak_rss_bytes()) / (1 << 20), rss_start, rss_setup, double(w->arena_bytes()) / (1 << 20),
        losses.front(), losses.back());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_bench: %s\n", e.what());
    return 1;
  }
}
