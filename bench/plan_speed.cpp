// How long planning takes as graphs grow: capture + autograd, then the
// planner (schedule, buffers, offsets) and the verifier, timed separately.
//
//   plan_speed [--layers N ...]   (default: GPT blocks giving ~1k to ~20k nodes)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "../tools/model_zoo.hpp"

using namespace frugal;
using clk = std::chrono::steady_clock;

static double ms_since(clk::time_point t) { return std::chrono::duration<double, std::milli>(clk::now() - t).count(); }

int main(int argc, char** argv) {
  std::vector<int> layers{6, 30, 60, 120};
  if (argc > 2 && std::string(argv[1]) == "--layers") {
    layers.clear();
    for (int i = 2; i < argc; ++i) layers.push_back(std::stoi(argv[i]));
  }
  std::printf("| gpt blocks | graph nodes | planned ops | capture+autograd ms | plan ms (median of 5) | verify ms | arena/lower bound |\n");
  std::printf("|---:|---:|---:|---:|---:|---:|---:|\n");
  for (int L : layers) {
    zoo::Config c{.family = "gpt", .batch = 2, .layers = L, .width = 64, .seq = 32, .heads = 4, .vocab = 64};
    auto w = zoo::make(c);
    auto t0 = clk::now();
    PlannedStep ps = zoo::plan(w, {}, {.verify = false});
    double capture_and_plan = ms_since(t0);
    std::vector<double> plan_ms;
    Plan p;
    for (int r = 0; r < 5; ++r) {
      auto t = clk::now();
      p = make_plan(*ps.graph, ps.roots);
      plan_ms.push_back(ms_since(t));
    }
    std::sort(plan_ms.begin(), plan_ms.end());
    auto t1 = clk::now();
    bool ok = plan::verify(*ps.graph, p, ps.roots).ok();
    double verify_ms = ms_since(t1);
    std::printf("| %d | %zu | %zu | %.1f | %.1f | %.1f%s | %.3f |\n", L, ps.graph->num_nodes(), p.schedule.size(),
                capture_and_plan - plan_ms[2], plan_ms[2], verify_ms, ok ? "" : " (FAILED)", p.arena_ratio());
  }
}
