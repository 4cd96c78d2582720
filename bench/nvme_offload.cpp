// ZeRO-Infinity's NVMe offload in frugal (plan/nvme_home.hpp): what the
// host keeps and what a step costs when the optimizer state, and then the
// f32 parameters too, live in the NVMe file between steps, against keeping
// them in memory and against ZeRO-Offload (the state on the host, updated
// there). One process per mode (so each one's resident memory is its own),
// a gpt from tools/model_zoo.hpp trained with AdamW.
//
// Per mode: the plan's device bytes (on the CPU backend, host memory too)
// and bytes on NVMe, the resident set after the last step (the host memory
// the model holds between steps) and its growth over the process before
// compiling, the undo journal (host bytes that let a step whose NVMe read
// fails part way be undone: the parameters it updates in place), and the
// median step time over the steps after the first two.
//
//   nvme_offload --mode memory|host|nvme|nvme+params --nvme-dir DIR
//                [--layers 4] [--width 512] [--vocab 8192] [--seq 128]
//                [--batch 4] [--steps 10] [--threads 2]
//
// bench/nvme-offload runs every mode, alternating, and prints the table.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <frugal/frugal.hpp>

#include "../tools/model_zoo.hpp"

using namespace frugal;

int main(int argc, char** argv) try {
  std::string mode = "memory", dir;
  zoo::Config c{.family = "gpt", .batch = 4, .layers = 4, .width = 512, .seq = 128, .heads = 8, .vocab = 8192};
  int steps = 10, threads = 2;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) fail("nvme_offload: ", a, " needs a value");
      return argv[++i];
    };
    if (a == "--mode") mode = next();
    else if (a == "--nvme-dir") dir = next();
    else if (a == "--layers") c.layers = std::stoi(next());
    else if (a == "--width") c.width = std::stoi(next());
    else if (a == "--vocab") c.vocab = std::stoi(next());
    else if (a == "--seq") c.seq = std::stoi(next());
    else if (a == "--batch") c.batch = std::stoi(next());
    else if (a == "--steps") steps = std::stoi(next());
    else if (a == "--threads") threads = std::stoi(next());
    else fail("nvme_offload: unknown option ", a);
  }
  if (mode != "memory" && mode != "host" && mode != "nvme" && mode != "nvme+params")
    fail("nvme_offload: --mode takes memory, host, nvme or nvme+params");
  if (mode.starts_with("nvme") && dir.empty()) fail("nvme_offload: --mode ", mode, " needs --nvme-dir");
  if (steps < 3) fail("nvme_offload: --steps must be at least 3");

  const std::size_t rss_before = current_rss_bytes();
  zoo::Workload w = zoo::make(c);
  CompileOptions o;
  o.threads = threads;
  o.replan = false;  // one plan throughout: the modes differ in where the state lives, nothing else
  if (mode == "host") o.offload_optimizer = true;
  o.plan.nvme_offload.optimizer_state = mode.starts_with("nvme");
  o.plan.nvme_offload.parameters = mode == "nvme+params";
  Step step = zoo::compile(w, Budget{.nvme_dir = dir}, o);
  std::vector<double> ms;
  float loss = 0;
  for (int s = 0; s < steps; ++s) {
    auto batch = w.batch(std::uint64_t(s + 1));
    const auto t0 = std::chrono::steady_clock::now();
    loss = step.run(batch[0], batch[1]);
    const double t = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (s >= 2) ms.push_back(t);
  }
  const std::size_t rss_after = current_rss_bytes();
  std::sort(ms.begin(), ms.end());
  const Plan& p = step.plan();
  std::size_t state = 0, params = 0;
  for (auto& st : w.opt->state()) state += st.tensor.nbytes();  // (brings them back: after the RSS reading)
  for (auto& t : w.model->parameters()) params += t.nbytes();
  std::printf("{\"mode\":\"%s\",\"parameters_bytes\":%zu,\"optimizer_state_bytes\":%zu,\"device_bytes\":%zu,"
              "\"on_host_bytes\":%zu,\"on_nvme_bytes\":%zu,\"nvme_file_bytes\":%zu,\"rss_bytes\":%zu,"
              "\"rss_growth_bytes\":%zu,\"undo_journal_bytes\":%zu,\"step_ms_median\":%.1f,\"last_loss\":%.9g}\n",
              mode.c_str(), params, state, p.total_bytes(), p.offloaded_bytes, p.nvme_home_bytes, p.nvme_bytes, rss_after,
              rss_after - std::min(rss_after, rss_before), step.undo_journal_bytes(), ms[ms.size() / 2], double(loss));
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "nvme_offload: %s\n", e.what());
  return 1;
}
