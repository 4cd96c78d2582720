// Data-parallel training speed and memory per rank (issue 16): the peer's
// mlp, resnet and gpt workloads (bench/train_workloads.hpp, as
// ../shared/peer/torch_ddp_bench.py has them: same shapes, optimizers and
// global batch, split evenly over the ranks), run under
//   mpirun -np N dp_bench --workload mlp|resnet|gpt [--threads T] [--steps S] [--warmup W] [--zero 0|1|2|3]
//                         [--overlap auto|0|1] [--bucket-bytes B]
// (--overlap: CompileOptions::overlap_collectives; auto, the default, runs
// the collectives beside compute where a core is free for them.
// --bucket-bytes: CompileOptions::bucket_bytes, 1 MiB unless given; 0, a
// collective per gradient.)
// Prints one line on rank 0: RESULT {json} with the keys the peer's
// run-ddp-peer prints (ms_step_median on rank 0, ms_step_median_slowest,
// peak_rss_mib_per_rank, optimizer_state_bytes_per_rank, loss_first,
// loss_last as the mean over ranks). bench/dp-vs-peer runs both.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <frugal/dist/mpi.hpp>
#include <frugal/frugal.hpp>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "train_workloads.hpp"

using namespace frugal;

namespace {

double state_bytes(const Optimizer& o) {
  double b = 0;
  for (auto& s : o.state()) b += double(s.tensor.nbytes());
  return b;
}

struct Arguments {
  std::string workload = "gpt";
  int threads = 1, steps = 0, warmup = -1;
  std::optional<int> zero;  // ZeRO stage; unset: the planner's choice (stage 0 without a budget)
  std::optional<bool> overlap;  // unset: the planner's choice
  std::optional<std::size_t> bucket_bytes;
};

}  // namespace

int main(int argc, char** argv) {
  Arguments a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--workload") a.workload = v;
    else if (k == "--threads") a.threads = std::stoi(v);
    else if (k == "--steps") a.steps = std::stoi(v);
    else if (k == "--warmup") a.warmup = std::stoi(v);
    else if (k == "--zero") a.zero = std::stoi(v);
    else if (k == "--bucket-bytes") a.bucket_bytes = std::stoull(v);
    else if (k == "--overlap") {
      if (v != "auto") a.overlap = std::stoi(v) != 0;
    }
    else {
      std::cerr << "dp_bench: unknown option " << k << "\n";
      return 2;
    }
  }
  try {
    auto comm = dist::Mpi::world();
    const int n = comm->size(), me = comm->rank();
    std::unique_ptr<bench::Workload> w = bench::make_workload(a.workload, a.threads, {me, n, comm, a.zero});
    w->plan_options().overlap_collectives = a.overlap;
    if (a.bucket_bytes) w->plan_options().bucket_bytes = *a.bucket_bytes;
    w->compile({});
    int steps = w->default_steps, warmup = w->default_warmup;
    if (a.steps > 0) steps = a.steps;
    if (a.warmup >= 0) warmup = a.warmup;
    std::vector<double> ms;
    std::vector<float> losses;
    for (int s = 0; s < warmup + steps; ++s) {
      comm->barrier("dp_bench: step start");  // every rank starts each step together
      const auto t0 = std::chrono::steady_clock::now();
      const float l = w->step();
      const double t = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (s >= warmup) ms.push_back(t);
      losses.push_back(l);
    }
    std::sort(ms.begin(), ms.end());
    const double median = ms[ms.size() / 2];
    // Per rank: median, peak RSS, optimizer state, and the communication
    // time per step (on its thread, and waited for); gathered to every rank.
    const Step::CommunicationTime ct = w->compiled().communication_time();
    const double runs = double(warmup + steps);
    double mine[5] = {median, double(peak_rss_bytes()) / (1 << 20), state_bytes(w->optimizer()),
                      1e3 * ct.communicating / runs, 1e3 * ct.waited / runs};
    std::vector<double> all(std::size_t(5 * n));
    comm->all_gather(mine, all.data(), 5, DType::f64, "dp_bench: results");
    float ends[2] = {losses.front(), losses.back()};
    std::vector<float> all_ends(std::size_t(2 * n));
    comm->all_gather(ends, all_ends.data(), 2, DType::f32, "dp_bench: losses");
    if (me == 0) {
      double slowest = 0, first = 0, last = 0;
      std::string rss = "[", opt_bytes = "[";
      double comm_ms = 0, waited_ms = 0;  // means over ranks
      for (int k = 0; k < n; ++k) {
        slowest = std::max(slowest, all[std::size_t(5 * k)]);
        rss += cat(k ? "," : "", all[std::size_t(5 * k + 1)]);
        opt_bytes += cat(k ? "," : "", std::int64_t(all[std::size_t(5 * k + 2)]));
        comm_ms += all[std::size_t(5 * k + 3)] / n;
        waited_ms += all[std::size_t(5 * k + 4)] / n;
        first += all_ends[std::size_t(2 * k)] / n;
        last += all_ends[std::size_t(2 * k + 1)] / n;
      }
      std::printf("RESULT {\"workload\":\"%s\",\"world\":%d,\"threads\":%d,\"ms_step_median\":%.3f,"
                  "\"ms_step_median_slowest\":%.3f,\"peak_rss_mib_per_rank\":%s],"
                  "\"optimizer_state_bytes_per_rank\":%s],\"loss_first\":%.6f,\"loss_last\":%.6f,\"steps\":%d,"
                  "\"zero_stage\":%d,\"overlap\":%s,\"comm_thread_ms_per_step\":%.3f,\"comm_waited_ms_per_step\":%.3f}\n",
                  a.workload.c_str(), n, a.threads, median, slowest, rss.c_str(), opt_bytes.c_str(), first, last, steps,
                  w->compiled().plan().zero_stage, w->compiled().plan().collectives.find("beside") != std::string::npos ? "true" : "false",
                  comm_ms, waited_ms);
    }
  } catch (const std::exception& e) {
    std::cerr << "dp_bench: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
