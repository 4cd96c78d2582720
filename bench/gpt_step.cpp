// The peer's gpt workload in frugal (shared/peer/torch_bench.py): vocab 512,
// context 128, 4 layers, d_model 256, 4 heads, MLP 4x, pre-norm, exact GELU,
// untied head, batch 8, AdamW(lr 3e-4, betas (0.9, 0.95), eps 1e-8,
// weight_decay 0.1), one fixed batch, f32. Prints the median step time and a
// RESULT line; with --profile, the time per op kind (from timing each
// kernel separately, so slightly more than a plain step; thread CPU time
// with --threads 1, wall time otherwise).
//
//   g++ -std=c++20 -O3 -fopenmp -Iinclude -I/usr/include/x86_64-linux-gnu/openblas-openmp
//       bench/gpt_step.cpp /usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.so -o /tmp/gpt_step
//   /tmp/gpt_step [--threads 2] [--steps 30] [--warmup 3] [--profile]
#include <omp.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <frugal/frugal.hpp>
#include <frugal/runtime/executor.hpp>
#include <map>
#include <string>
#include <vector>

using namespace frugal;

namespace {
// CPU time of the process, in ms: on a machine shared with other work, wall
// time measures the neighbours too; with one thread, CPU time does not.
double cpu_ms(clockid_t clock = CLOCK_PROCESS_CPUTIME_ID) {
  timespec ts;
  clock_gettime(clock, &ts);
  return double(ts.tv_sec) * 1e3 + double(ts.tv_nsec) * 1e-6;
}
double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
}  // namespace

int main(int argc, char** argv) {
  int threads = 2, steps = 30, warmup = 3;
  bool profile = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--threads" && i + 1 < argc)
      threads = std::atoi(argv[++i]);
    else if (a == "--steps" && i + 1 < argc)
      steps = std::atoi(argv[++i]);
    else if (a == "--warmup" && i + 1 < argc)
      warmup = std::atoi(argv[++i]);
    else if (a == "--profile")
      profile = true;
    else {
      std::fprintf(stderr, "usage: gpt_step [--threads N] [--steps N] [--warmup N] [--profile]\n");
      return 2;
    }
  }
  const std::int64_t B = 8, T = 128;
  nn::manual_seed(0);
  nn::Gpt gpt;  // the peer's defaults
  optim::AdamW opt(gpt.parameters(), {.lr = 3e-4, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1});
  Step step = compile([&](Var idx, Var tgt) { return gpt.loss(idx, tgt); },
                      {input<std::int32_t>({B, T}, "idx"), input<std::int32_t>({B, T}, "targets")}, opt, {},
                      {.threads = threads});
  Tensor idx({B, T}, DType::i32), tgt({B, T}, DType::i32);
  Rng rng(0);
  for (std::int64_t i = 0; i < B * T; ++i) {
    idx.data<std::int32_t>()[i] = std::int32_t(rng.below(512));
    tgt.data<std::int32_t>()[i] = std::int32_t(rng.below(512));
  }
  float first = 0, last = 0;
  for (int i = 0; i < warmup; ++i) {
    float l = step.run(idx, tgt);
    if (i == 0) first = l;
  }
  std::vector<double> ms, cpu;
  for (int i = 0; i < steps; ++i) {
    const double c0 = cpu_ms();
    auto t0 = std::chrono::steady_clock::now();
    last = step.run(idx, tgt);
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    cpu.push_back(cpu_ms() - c0);
  }
  const double median = median_of(ms), fastest = *std::min_element(ms.begin(), ms.end());
  std::printf(
      "gpt step (peer workload), %d threads: median %.1f ms, min %.1f ms, median CPU time %.1f ms over %d "
      "steps; %lld parameters; arena %.1f MiB; loss %.4f -> %.4f\n",
      threads, median, fastest, median_of(cpu), steps, (long long)gpt.num_parameters(),
      double(step.arena_bytes()) / (1 << 20), first, last);
  std::printf(
      "RESULT {\"workload\": \"gpt\", \"threads\": %d, \"ms_step_median\": %.3f, \"ms_step_min\": %.3f, "
      "\"cpu_ms_step_median\": %.3f, \"loss_first\": %.6f, \"loss_last\": %.6f}\n",
      threads, median, fastest, median_of(cpu), first, last);

  if (profile) {
    // Time every kernel of the plan on its own, by op name and phase.
    const Graph& g = step.graph();
    auto backend = make_backend("cpu");
    omp_set_num_threads(threads);  // this thread's count, as a step's run sets it
    Executor ex(std::shared_ptr<const Graph>(&g, [](const Graph*) {}), step.plan(), *backend);
    const std::vector<ValueId> ins = g.values_of_kind(ValueKind::input);
    std::map<std::string, double> by_op;
    double total = 0;
    const int reps = 5;
    for (int r = 0; r < reps; ++r) {
      // Buffers are reused within a step: stage the inputs again every pass.
      std::memcpy(ex.address(ins.at(0)), idx.raw(), idx.nbytes());
      std::memcpy(ex.address(ins.at(1)), tgt.raw(), tgt.nbytes());
      for (NodeId n : step.plan().schedule) {
        const Node& node = g.node(n);
        std::vector<TensorRef> in, out;
        for (ValueId v : node.inputs) in.push_back({ex.address(v), g.value(v).meta.dtype, &g.value(v).meta.shape});
        for (ValueId v : node.results()) out.push_back({ex.address(v), g.value(v).meta.dtype, &g.value(v).meta.shape});
        void* ws = node.has_workspace ? ex.address(node.outputs.back()) : nullptr;
        std::size_t wsb = node.has_workspace ? g.value(node.outputs.back()).meta.nbytes() : 0;
        const Kernel& k = backend->kernel_for(*node.op);
        const double t0 = threads == 1 ? cpu_ms(CLOCK_THREAD_CPUTIME_ID) : 0;
        auto w0 = std::chrono::steady_clock::now();
        k(*node.op, KernelArgs{in, out, 0, ws, wsb});
        const double t =
            (threads == 1 ? cpu_ms(CLOCK_THREAD_CPUTIME_ID) - t0
                          : std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - w0).count()) /
            reps;
        by_op[std::string(phase_name(node.phase)) + " " + node.op->name()] += t;
        total += t;
      }
    }
    std::vector<std::pair<double, std::string>> rows;
    for (auto& [k, v] : by_op) rows.push_back({v, k});
    std::sort(rows.rbegin(), rows.rend());
    std::printf("per op (each kernel timed alone, %s, mean of %d): total %.1f ms\n",
                threads == 1 ? "thread CPU time" : "wall time", reps, total);
    for (auto& [v, k] : rows) std::printf("  %8.2f ms  %5.1f%%  %s\n", v, 100 * v / total, k.c_str());
  }
}
