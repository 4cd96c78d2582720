// One training workload, frugal's side of the comparison with the PyTorch
// peer (../shared/peer/torch_bench.py): the same four workloads, shapes,
// optimizers and hyper-parameters, synthetic data, one fixed batch reused
// every step, so no data loading is timed. It prints one line
// `RESULT {json}` with the same keys the peer prints; bench/train-vs-peer
// runs both, alternately, one process per run, and tabulates the ratios.
//
//   train_bench --workload mlp|resnet|resnet-bf16|gpt|gpt-bf16|gcn [--threads 2] [--steps N]
//               [--warmup N] [--seed N] [--budget BYTES|N%|min]
//               [--host BYTES] [--nvme-dir DIR] [--audit] [--fuse|--no-fuse] [--ab] [--vs WORKLOAD]
//               [--show-live] [--least-saved]
//
// --budget runs the step within a device byte budget (bytes such as 48MiB,
// a percentage of the unconstrained device bytes, or `min`: the smallest
// budget the planner can meet). The RESULT then also says what the planner
// did: device bytes, the smallest feasible budget, the predicted step time
// and how many values it recomputes, swaps to host or spills to NVMe.
// bench/budget-curve sweeps budgets with it. An infeasible budget exits
// with status 3 and a message naming the smallest feasible one.
// --fuse / --no-fuse plan the step with or without merging elementwise
// chains and BatchNorm + ReLU (PlanOptions::fuse, on by default), to
// measure what fusion saves.
// --ab compiles the step twice, fused and unfused, and runs them step by
// step alternately in one process (so machine noise hits both alike),
// printing `AB {json}` with both medians and whether every loss was
// bitwise the same.
// --vs OTHER compiles this workload and OTHER and runs them step by step
// alternately in one process, printing `VS {json}` with both medians and
// the median of the per-step ratios OTHER / this (resnet --vs resnet-bf16:
// what bf16 costs against f32 on a shared, noisy machine).
// --show-live prints to stderr the arena values live where the backward
// starts and at the plan's peak, and every decision's reason: where the
// memory goes, to compare with what the peer saves for its backward.
// --least-saved plans with PlanOptions::least_saved_activations: as few
// forward activations held where the backward starts as the budget allows,
// at a time cost (what torch.utils.checkpoint minimises).
// --audit runs two more steps with the arena pattern-filled afterwards and
// reports the bytes the step really wrote (audit_*), so device bytes can
// be checked against the budget.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <sys/resource.h>

#include "train_workloads.hpp"

using namespace frugal;

namespace {

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : (v[(v.size() - 1) / 2] + v[v.size() / 2]) / 2;
}

// Steps of two compiled workloads, alternately in one process (so machine
// noise hits both alike; which goes first alternates too): the step times
// after warmup, and whether every pair of losses was bitwise the same.
struct Alternated {
  std::vector<double> ms[2];
  bool same = true;
};
Alternated alternate(std::unique_ptr<bench::Workload> (&w)[2], int steps, int warmup) {
  if (warmup < 0) warmup = w[0]->default_warmup;
  if (steps < 0) steps = w[0]->default_steps;
  Alternated r;
  for (int s = 0; s < warmup + steps; ++s) {
    float loss[2];
    for (int k = 0; k < 2; ++k) {
      const int f = (s + k) % 2;
      auto t0 = std::chrono::steady_clock::now();
      loss[f] = w[f]->step();
      if (s >= warmup) r.ms[f].push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    r.same = r.same && std::memcmp(&loss[0], &loss[1], sizeof(float)) == 0;
  }
  return r;
}

// Fused and unfused steps of one workload, alternately in one process.
int run_ab(const std::string& workload, int threads, int steps, int warmup, std::uint64_t seed) {
  std::unique_ptr<bench::Workload> w[2];
  for (int f = 0; f < 2; ++f) {
    nn::manual_seed(seed);
    w[f] = bench::make_workload(workload, threads);
    w[f]->plan_options().plan.fuse = f == 0;
    w[f]->compile(Budget{});
  }
  const Alternated r = alternate(w, steps, warmup);
  const Plan &pf = w[0]->compiled().plan(), &pu = w[1]->compiled().plan();
  std::printf("AB {\"workload\":\"%s\",\"threads\":%d,\"steps\":%zu,\"ms_fused_median\":%.3f,\"ms_unfused_median\":%.3f,"
              "\"fused_over_unfused\":%.3f,\"losses_bitwise_equal\":%s,\"fused_chains\":%d,\"fused_away_bytes\":%zu,"
              "\"peak_fused\":%zu,\"peak_unfused\":%zu}\n",
              workload.c_str(), threads, r.ms[0].size(), median_of(r.ms[0]), median_of(r.ms[1]),
              median_of(r.ms[0]) / median_of(r.ms[1]), r.same ? "true" : "false", pf.fused_chains, pf.fused_away_bytes,
              pf.peak_bytes, pu.peak_bytes);
  return r.same ? 0 : 1;
}

// Two workloads (resnet and resnet-bf16, say), alternately in one process:
// both medians, and the median over steps of the ratio of each second
// workload's step to the first's taken beside it.
int run_vs(const std::string& a, const std::string& b, int threads, int steps, int warmup, std::uint64_t seed) {
  std::unique_ptr<bench::Workload> w[2];
  const std::string names[2] = {a, b};
  for (int f = 0; f < 2; ++f) {
    nn::manual_seed(seed);
    w[f] = bench::make_workload(names[f], threads);
    w[f]->compile(Budget{});
  }
  const Alternated r = alternate(w, steps, warmup);
  std::vector<double> ratio;
  for (std::size_t i = 0; i < r.ms[0].size(); ++i) ratio.push_back(r.ms[1][i] / r.ms[0][i]);
  std::printf("VS {\"workload\":\"%s\",\"vs\":\"%s\",\"threads\":%d,\"steps\":%zu,\"ms_median\":%.3f,"
              "\"ms_vs_median\":%.3f,\"ms_min\":%.3f,\"ms_vs_min\":%.3f,\"vs_over_workload_median_ratio\":%.3f}\n",
              a.c_str(), b.c_str(), threads, r.ms[0].size(), median_of(r.ms[0]), median_of(r.ms[1]),
              *std::min_element(r.ms[0].begin(), r.ms[0].end()), *std::min_element(r.ms[1].begin(), r.ms[1].end()),
              median_of(ratio));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string workload = "mlp";
  int threads = 2, steps = -1, warmup = -1;
  std::uint64_t seed = 0;
  std::string budget_arg;
  Budget budget;
  bool audit = false, show_live = false, fuse = CompileOptions{}.plan.fuse, ab = false, least_saved = false;
  std::string vs;
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
    else if (a == "--budget") budget_arg = next();
    else if (a == "--host") budget.host = parse_bytes(next());
    else if (a == "--nvme-dir") budget.nvme_dir = next();
    else if (a == "--audit") audit = true;
    else if (a == "--show-live") show_live = true;
    else if (a == "--no-fuse") fuse = false;
    else if (a == "--fuse") fuse = true;
    else if (a == "--ab") ab = true;
    else if (a == "--vs") vs = next();
    else if (a == "--least-saved") least_saved = true;
    else {
      std::fprintf(stderr, "train_bench: unknown argument '%s'\n", a.c_str());
      return 2;
    }
  }
  try {
    if (ab) return run_ab(workload, threads, steps, warmup, seed);
    if (!vs.empty()) return run_vs(workload, vs, threads, steps, warmup, seed);
    const double rss_start = double(peak_rss_bytes()) / (1 << 20);
    nn::manual_seed(seed);
    std::unique_ptr<bench::Workload> w = bench::make_workload(workload, threads);
    w->plan_options().plan.fuse = fuse;
    w->plan_options().plan.least_saved_activations = least_saved;
    if (warmup < 0) warmup = w->default_warmup;
    if (steps < 0) steps = w->default_steps;

    // What the budget means for this step: planned first, without an arena.
    const std::size_t unconstrained = w->plan(Budget{}).plan.total_bytes();
    auto least_feasible = [&] {
      if (unconstrained <= 1) return unconstrained;
      Budget b = budget;
      b.device = unconstrained - 1;
      try {
        return w->plan(b).plan.min_feasible_bytes;
      } catch (const BudgetError&) {
        return unconstrained;  // nothing can be moved off the device
      }
    };
    std::size_t min_feasible = 0;
    if (budget_arg == "min") {
      budget.device = min_feasible = least_feasible();
    } else if (!budget_arg.empty()) {
      budget.device = parse_bytes(budget_arg, unconstrained);  // a percentage is of the unconstrained step
    }

    auto c0 = std::chrono::steady_clock::now();
    w->compile(budget);
    const double compile_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - c0).count();
    const Plan& p = w->compiled().plan();
    // A binding budget searched the smallest feasible one; otherwise ask.
    if (min_feasible == 0)
      min_feasible = budget.device && budget.device < unconstrained ? p.min_feasible_bytes : least_feasible();
    const double rss_setup = double(peak_rss_bytes()) / (1 << 20);

    // Process CPU time over wall time in the timed steps, as the peer
    // reports it: 2.0 with two threads busy; far less means the machine was
    // shared and the times are inflated.
    auto cpu_s = [] {
      rusage ru{};
      getrusage(RUSAGE_SELF, &ru);
      return double(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) + 1e-6 * double(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
    };
    double cpu_timed = 0;
    std::vector<double> losses, ms;
    for (int s = 0; s < warmup + steps; ++s) {
      const double cpu0 = cpu_s();
      auto t0 = std::chrono::steady_clock::now();
      float loss = w->step();
      auto t1 = std::chrono::steady_clock::now();
      losses.push_back(loss);
      if (s >= warmup) {
        ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
        cpu_timed += cpu_s() - cpu0;
      }
      if (!std::isfinite(loss)) fail("train_bench: ", workload, ": the loss is ", loss, " at step ", s);
    }
    std::vector<double> sorted = ms;
    std::sort(sorted.begin(), sorted.end());
    double med = sorted.empty() ? 0 : (sorted[(sorted.size() - 1) / 2] + sorted[sorted.size() / 2]) / 2;
    double mean = 0;
    for (double m : ms) mean += m / double(ms.size());
    const double cpu_util = mean > 0 ? cpu_timed / (mean * double(ms.size()) / 1e3) : 0;
    // After the timed steps, so the pattern fills do not disturb them.
    std::string audit_json;
    if (audit) {
      Step::Audit au = w->audit();
      const std::size_t device_written = au.high_water + p.persistent_bytes;
      audit_json = cat(",\"audit_high_water_bytes\":", au.high_water, ",\"audit_device_bytes\":", device_written,
                       ",\"audit_canary_intact\":", au.canary_intact ? "true" : "false",
                       ",\"audit_within_budget\":",
                       budget.device == 0 || device_written <= budget.device ? "true" : "false");
    }
    // What the peer's activation_mib counts (tensors autograd saves; with
    // torch.utils.checkpoint, the segment boundaries), so the two compare.
    const Graph& g = w->compiled().graph();
    const int first_backward = plan::backward_start(g, p.schedule);
    const std::size_t saved_activation_bytes = plan::saved_for_backward_bytes(g, p);
    audit_json += cat(",\"saved_activation_bytes\":", saved_activation_bytes);
    if (show_live) {
      for (int at : {first_backward, p.peak_position}) {
        if (at < 0) continue;
        std::fprintf(stderr, "live at position %d (%s%s): bytes [first, last] value\n", at,
                     g.node(p.schedule[std::size_t(at)]).op->name().c_str(),
                     at == first_backward ? ", the backward's start" : ", the peak");
        for (const auto& iv : p.intervals)
          if (iv.first <= at && at <= iv.last)
            std::fprintf(stderr, "  %9zu [%d,%d] %s\n", iv.bytes, iv.first, iv.last, plan::describe_value(g, iv.value).c_str());
      }
      for (auto& d : p.decisions) std::fprintf(stderr, "decision: %s\n", d.reason.c_str());
    }

    std::printf(
        "RESULT {\"workload\":\"%s\",\"impl\":\"frugal\",\"threads\":%d,\"warmup\":%d,\"steps\":%d,\"batch\":%lld,"
        "\"unit\":\"%s\",\"params\":%lld,\"ms_step_median\":%.4f,\"ms_step_min\":%.4f,\"ms_step_mean\":%.4f,"
        "\"samples_per_s\":%.3f,\"peak_rss_mib\":%.2f,\"rss_at_start_mib\":%.2f,\"rss_after_setup_mib\":%.2f,"
        "\"arena_mib\":%.3f,\"loss_first\":%.6f,\"loss_last\":%.6f,"
        "\"budget\":\"%s\",\"budget_bytes\":%zu,\"host_budget_bytes\":%zu,\"device_bytes\":%zu,"
        "\"unconstrained_bytes\":%zu,\"min_feasible_bytes\":%zu,\"persistent_bytes\":%zu,\"arena_bytes\":%zu,"
        "\"peak_bytes\":%zu,\"predicted_step_ms\":%.4f,"
        "\"decisions\":{\"recompute\":%zu,\"swap_host\":%zu,\"spill_nvme\":%zu},"
        "\"fused_chains\":%d,\"fused_away_bytes\":%zu,\"offloaded_bytes\":%zu,\"host_bytes\":%zu,\"nvme_bytes\":%zu,\"compile_ms\":%.1f,\"cpu_util\":%.3f%s}\n",
        workload.c_str(), threads, warmup, steps, (long long)w->batch, w->unit.c_str(), (long long)w->params, med,
        sorted.empty() ? 0 : sorted.front(), mean, double(w->batch) / (med / 1e3),
        double(peak_rss_bytes()) / (1 << 20), rss_start, rss_setup, double(w->arena_bytes()) / (1 << 20),
        losses.front(), losses.back(), budget_arg.c_str(), budget.device, budget.host, p.total_bytes(),
        unconstrained, min_feasible, p.persistent_bytes, p.arena_bytes, p.peak_bytes, p.predicted_step_ms,
        p.count(plan::Choice::recompute), p.count(plan::Choice::host), p.count(plan::Choice::nvme),
        p.fused_chains, p.fused_away_bytes, p.offloaded_bytes, p.host_bytes, p.nvme_bytes, compile_ms, cpu_util,
        audit_json.c_str());
  } catch (const BudgetError& e) {
    std::fprintf(stderr, "train_bench: %s\n", e.what());
    return 3;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_bench: %s\n", e.what());
    return 1;
  }
}
