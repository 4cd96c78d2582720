// Memory managers for steps whose shapes change, compared in simulation on
// access traces recorded from real frugal steps (plan/access_trace.hpp,
// plan/paging_sim.hpp): a gpt whose sequence length changes every step,
// and a gcn whose mini-batches have different node counts. Each distinct
// shape is compiled once (a plan per shape bucket) with no budget, and
// its schedule appended to the trace in a seeded random order of shapes;
// ops are priced by the CUDA backend's default DeviceProfile (the trace
// stands for a GPU), and the links are that profile's copy rate and
// latency, which is also the page fault's latency.
//
// The device is the trace's footprint over 1 + oversubscription (at least
// the largest op's bytes, which whole-tensor management needs). Printed:
// each manager's virtual time, stalls, faults and bytes moved, and the
// next-use manager's speedup over each of the others. A row marked * ran
// at less oversubscription than asked: the largest op set the device.
//
// Then the next-use manager for real (runtime/paged_step.hpp, the CPU
// backend): a gpt step in a pool of the same oversubscription, against the
// static plan compiled for a device budget of the same bytes. Measured: the
// time to get a runnable step (PagedStep: capture and schedule only; the
// static step: its budget solve too), the median step time over --runs, and
// the bytes the manager moved.
//
//   paging_sim [--steps 12] [--seed 1] [--oversubscription 0.5,0.75] [--runs 7] [--json]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <sstream>

#include <frugal/frugal.hpp>
#include <frugal/plan/paging_sim.hpp>
#include <frugal/runtime/paged_step.hpp>

#include "../tools/model_zoo.hpp"

using namespace frugal;
using namespace frugal::plan;

namespace {

struct Workload {
  std::string name;
  std::vector<zoo::Config> shapes;
};

AccessTrace record(const Workload& w, int steps, std::uint64_t seed, const CostModel& cm) {
  std::map<int, std::pair<std::unique_ptr<zoo::Workload>, std::unique_ptr<Step>>> compiled;
  AccessTrace trace;
  Rng r(seed);
  for (int s = 0; s < steps; ++s) {
    const int k = int(r.below(std::uint64_t(w.shapes.size())));
    auto& slot = compiled[k];
    if (!slot.second) {
      nn::manual_seed(7);  // the same weights (and names) for every shape
      slot.first = std::make_unique<zoo::Workload>(zoo::make(w.shapes[std::size_t(k)]));
      slot.second = std::make_unique<Step>(zoo::compile(*slot.first));
    }
    append_step(trace, slot.second->graph(), slot.second->plan(), cm);
  }
  return trace;
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// The paged gpt step against its static plan under the same device bytes.
void measure_real(const std::vector<double>& over, int runs, bool json) {
  const zoo::Config c{.family = "gpt", .batch = 4, .layers = 2, .width = 128, .seq = 64, .heads = 4, .vocab = 256};
  const CompileOptions o{.threads = 1};
  zoo::Workload probe = zoo::make(c);
  const AccessTrace sizing = PagedStep::trace_of(zoo::plan(probe, {}, o));
  auto timed = [&](auto&& run_once) {
    std::vector<double> ms;
    for (int k = 0; k < runs; ++k) {
      const auto t0 = std::chrono::steady_clock::now();
      run_once(k);
      ms.push_back(ms_since(t0));
    }
    return median(ms);
  };
  if (!json)
    std::printf("\n%s, 1 thread, CPU backend: median of %d steps\n\n"
                "| oversubscription | device MiB | step | ready in ms | step ms | MiB in | MiB out | compactions |\n"
                "|---:|---:|---|---:|---:|---:|---:|---:|\n",
                c.name().c_str(), runs);
  for (double x : over) {
    const std::size_t bytes = std::max(std::size_t(double(sizing.footprint()) / (1 + x)), sizing.largest_op_bytes());
    zoo::Workload wp = zoo::make(c), ws = zoo::make(c);
    auto t0 = std::chrono::steady_clock::now();
    PagedStep paged(zoo::plan(wp, {}, o), wp.opt.get(), bytes, o);
    const double paged_ready = ms_since(t0);
    const double paged_ms = timed([&](int k) {
      auto b = wp.batch(std::uint64_t(k));
      paged.run(b[0], b[1]);
    });
    const auto st = paged.stats();
    double static_ready = -1, static_ms = -1;
    std::string static_note;
    try {
      t0 = std::chrono::steady_clock::now();
      Step s = zoo::compile(ws, Budget{.device = bytes}, CompileOptions{.threads = 1, .replan = false});
      static_ready = ms_since(t0);
      static_ms = timed([&](int k) {
        auto b = ws.batch(std::uint64_t(k));
        s.run(b[0], b[1]);
      });
    } catch (const BudgetError& e) {
      static_note = cat("infeasible: needs ", e.smallest_feasible_bytes, " bytes");
    }
    if (json) {
      std::printf("{\"real\":true,\"oversubscription\":%g,\"device_bytes\":%zu,\"paged_ready_ms\":%.3f,"
                  "\"paged_step_ms\":%.3f,\"paged_bytes_in\":%zu,\"paged_bytes_out\":%zu,\"static_ready_ms\":%.3f,"
                  "\"static_step_ms\":%.3f}\n",
                  x, bytes, paged_ready, paged_ms, st.bytes_in / std::size_t(runs), st.bytes_out / std::size_t(runs),
                  static_ready, static_ms);
      continue;
    }
    std::printf("| %.0f%% | %.2f | paged (next use, run time) | %.1f | %.2f | %.2f | %.2f | %zu |\n", 100 * x,
                double(bytes) / (1 << 20), paged_ready, paged_ms, double(st.bytes_in) / runs / (1 << 20),
                double(st.bytes_out) / runs / (1 << 20), st.compactions / std::size_t(runs));
    if (static_note.empty())
      std::printf("| %.0f%% | %.2f | static plan (budget solve) | %.1f | %.2f | | | |\n", 100 * x,
                  double(bytes) / (1 << 20), static_ready, static_ms);
    else
      std::printf("| %.0f%% | %.2f | static plan: %s | | | | | |\n", 100 * x, double(bytes) / (1 << 20),
                  static_note.c_str());
  }
}

std::vector<double> parse_list(const std::string& s) {
  std::vector<double> out;
  std::stringstream ss(s);
  for (std::string x; std::getline(ss, x, ',');) out.push_back(std::stod(x));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 12;
  std::uint64_t seed = 1;
  std::vector<double> over{0.5, 0.75};
  bool json = false;
  int runs = 7;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) fail("paging_sim: ", a, " needs a value");
      return argv[++i];
    };
    if (a == "--steps") steps = std::stoi(next());
    else if (a == "--seed") seed = std::stoull(next());
    else if (a == "--oversubscription") over = parse_list(next());
    else if (a == "--json") json = true;
    else if (a == "--runs") runs = std::max(1, std::stoi(next()));
    else {
      std::fprintf(stderr, "paging_sim: unknown argument '%s'\n", a.c_str());
      return 2;
    }
  }
  const DeviceProfile gpu = DeviceProfile::defaults("cuda", 1);
  const CostModel cm(gpu);
  std::vector<Workload> workloads;
  {
    Workload g{"gpt, sequence length 32-256", {}};
    for (int seq : {32, 64, 128, 256})
      g.shapes.push_back({.family = "gpt", .batch = 8, .layers = 4, .width = 256, .seq = seq, .heads = 4, .vocab = 512});
    workloads.push_back(std::move(g));
    Workload n{"gcn, mini-batches of 256-2048 nodes", {}};
    for (int nodes : {256, 512, 1024, 2048})
      n.shapes.push_back({.family = "gcn", .batch = nodes, .layers = 2, .width = 256, .features = 512, .classes = 16});
    workloads.push_back(std::move(n));
  }
  if (!json)
    std::printf("| workload | oversubscription | device MiB | manager | ms | stall ms | faults | MiB in | MiB out | next use's speedup |\n"
                "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|\n");
  std::string js = "[";
  for (const Workload& w : workloads) {
    const AccessTrace trace = record(w, steps, seed, cm);
    for (double x : over) {
      PagingOptions o;
      o.capacity = std::max(std::size_t(double(trace.footprint()) / (1 + x)), trace.largest_op_bytes());
      o.h2d = o.d2h = CopyLink{gpu.copy_bytes, gpu.copy_latency_s};
      o.fault_latency_s = gpu.copy_latency_s;
      std::vector<PagingResult> rs{simulate_pages(trace, o, 4096), simulate_pages(trace, o, 2 << 20),
                                   simulate_pages(trace, o, 64 << 10, 32), simulate_next_use(trace, o)};
      const double mine = rs.back().ms;
      for (const PagingResult& r : rs) {
        if (json) {
          js += cat(js.size() > 1 ? "," : "", "{\"workload\":\"", w.name, "\",\"oversubscription\":", x,
                    ",\"footprint_bytes\":", trace.footprint(), ",\"largest_op_bytes\":", trace.largest_op_bytes(), ",\"device_bytes\":", o.capacity, ",\"manager\":\"",
                    r.policy, "\",\"ms\":", r.ms, ",\"compute_ms\":", r.compute_ms, ",\"faults\":", r.faults,
                    ",\"bytes_in\":", r.bytes_in, ",\"bytes_out\":", r.bytes_out, "}");
        } else {
          // The oversubscription run: below the asked one where the largest
          // op raised the device (marked *).
          const double real = double(trace.footprint()) / double(o.capacity) - 1;
          std::printf("| %s | %.0f%%%s | %.1f of %.1f | %s | %.2f | %.2f | %zu | %.1f | %.1f | %.2fx |\n", w.name.c_str(),
                      100 * real, real < x - 1e-9 ? "*" : "", double(o.capacity) / (1 << 20),
                      double(trace.footprint()) / (1 << 20), r.policy.c_str(),
                      r.ms, r.stall_ms(), r.faults, double(r.bytes_in) / (1 << 20), double(r.bytes_out) / (1 << 20),
                      r.ms / mine);
        }
      }
    }
  }
  if (json) std::printf("%s]\n", js.c_str());
  measure_real(over, runs, json);  // with --json, one line per oversubscription after the array
  return 0;
}
