#pragma once
// frugal-plan --simulate CLUSTER: plans one rank of a data-parallel job on a
// cluster that is not here (its GPUs' memory as the device budget, its
// node's RAM and NVMe shared by the node's GPUs as the host and NVMe
// budgets, priced by its GPU's rates), with meta tensors so that no
// parameter is allocated, and runs the plan in virtual time
// (plan/step_sim.hpp) on the cluster's links.
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>

#include <frugal/backend/cuda/planning_backend.hpp>
#include <frugal/dist/plan_only.hpp>
#include <frugal/plan/cluster_prices.hpp>
#include <frugal/plan/step_sim.hpp>

#include "../model_zoo.hpp"

namespace frugal_plan {

using namespace frugal;

struct SimulateArgs {
  plan::Cluster cluster;
  zoo::Config model;
  CompileOptions options;  // zero stage, offload, plan switches the user pinned
  int ranks = 0;           // 0: every GPU of the cluster
  std::optional<std::size_t> device_budget, host_budget;  // per rank; default: the cluster's
  plan::SimAssumptions assumptions;
  bool largest = true;  // also search the largest model that fits
  bool json = false;
};

// What a rank of the job gets: its GPU's memory, and its share of its
// node's RAM and NVMe.
inline Budget rank_budget(const SimulateArgs& a, int ranks) {
  const plan::Cluster& c = a.cluster;
  const int per_node = std::min(ranks, c.gpus_per_node);
  Budget b;
  b.device = a.device_budget.value_or(std::size_t(c.hbm_bytes));
  b.host = a.host_budget.value_or(std::size_t(c.host_bytes / per_node));
  if (c.has_nvme()) {
    b.nvme_dir = "(simulated NVMe of " + c.name + ")";  // planned, never opened
    b.nvme = std::size_t(c.nvme_bytes / per_node);
  }
  return b;
}

inline CompileOptions rank_options(const SimulateArgs& a, const DeviceProfile& gpu, int rank, int ranks) {
  CompileOptions o = a.options;
  // Each GPU's step as the CUDA kernels size their scratch, not as the CPU's
  // (which multiply f32 images of bf16/f16 operands); one per process.
  static const auto gpu_kernels = std::make_shared<cuda::PlanningBackend>(make_backend("cpu"));
  o.use_backend = gpu_kernels;
  o.profile = &gpu;
  o.threads = 1;
  if (ranks > 1) {
    o.communicator = std::make_shared<dist::PlanOnly>(rank, ranks);
    // NCCL runs collectives on their own stream, beside compute.
    if (!o.overlap_collectives) o.overlap_collectives = true;
  }
  return o;
}

inline double parameter_count(const zoo::Workload& w) {
  double n = 0;
  for (const Tensor& p : w.model->parameters()) n += double(p.numel());
  return n;
}

// The plan of `rank`, or the BudgetError that says why none fits.
inline PlannedStep plan_rank(const SimulateArgs& a, const zoo::Config& model, const DeviceProfile& gpu, int rank,
                             int ranks, double* params = nullptr) {
  zoo::Config c = model;
  c.meta = true;
  zoo::Workload w = zoo::make(c);
  if (params) *params = parameter_count(w);
  return zoo::plan(w, rank_budget(a, ranks), rank_options(a, gpu, rank, ranks));
}

// Whether some ZeRO stage fits: the least-memory plan only, and a stage
// whose tiers together cannot hold the step refused without a search
// (PlanOptions::fit_only), the same answer as planning it whole.
inline bool fits(const SimulateArgs& a, const zoo::Config& model, const DeviceProfile& gpu, int ranks) {
  SimulateArgs only = a;
  only.options.plan.fit_only = true;
  try {
    plan_rank(only, model, gpu, 0, ranks);
    return true;
  } catch (const BudgetError&) {
    return false;
  }
}

// The search stops here: a deeper graph takes long to plan, and a model
// that fits this deep is reported as fitting at least this deep.
inline constexpr int kMostLayersSearched = 256;

// The most layers at the model's width that still fit, by doubling then
// bisection (fitting is monotone in depth: a deeper model holds more).
inline int largest_layers(const SimulateArgs& a, const DeviceProfile& gpu, int ranks) {
  zoo::Config c = a.model;
  // Each probe said on stderr as it ends: at a 1T-parameter width a probe
  // takes a minute and the search a quarter of an hour.
  auto ok = [&](int layers) {
    c.layers = layers;
    const auto t0 = std::chrono::steady_clock::now();
    const bool fit = fits(a, c, gpu, ranks);
    std::cerr << "frugal-plan: largest model: " << layers << " layers " << (fit ? "fit" : "do not fit") << " ("
              << std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() << " s)\n";
    return fit;
  };
  if (!ok(1)) return 0;
  int lo = 1, hi = 2;
  while (hi <= kMostLayersSearched && ok(hi)) lo = hi, hi *= 2;
  if (lo == kMostLayersSearched) return lo;
  while (hi - lo > 1) {
    int mid = lo + (hi - lo) / 2;
    (ok(mid) ? lo : hi) = mid;
  }
  return lo;
}

inline plan::Cluster read_cluster(const std::string& what) {
  const bool is_file = what.find('/') != std::string::npos || what.ends_with(".json");
  if (!is_file) return plan::Cluster::preset(what);
  std::ifstream in(what, std::ios::binary);
  if (!in) fail<DataError>(what, ": cannot read the cluster file: ", std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  return plan::Cluster::from_json(text.str(), what);
}

inline std::string fmt(double v, int precision = 3) {
  std::ostringstream os;
  os.precision(precision);
  os << v;
  return os.str();
}

// What the budget solve did to activations and persistents, by choice.
inline std::string decisions_summary(const Plan& p) {
  std::map<std::string, std::pair<int, std::size_t>> by;
  for (const auto& d : p.decisions) {
    auto& [n, bytes] = by[plan::choice_name(d.choice)];
    ++n;
    bytes += d.bytes;
  }
  std::string s;
  for (const auto& [choice, nb] : by)
    s += cat(s.empty() ? "" : "; ", nb.first, " ", choice, " (", format_bytes(nb.second), ")");
  return s.empty() ? "none: everything stays on the device" : s;
}

inline int simulate(SimulateArgs a) {
  const plan::Cluster& cl = a.cluster;
  const int ranks = a.ranks ? a.ranks : cl.total_gpus();
  if (ranks > cl.total_gpus())
    fail("--ranks ", ranks, ": cluster '", cl.name, "' has ", cl.total_gpus(), " GPUs (", cl.nodes, " nodes of ",
         cl.gpus_per_node, "); give at most that, or more nodes in the cluster file");
  const DeviceProfile gpu = cl.device_profile(a.model.dtype, a.assumptions.tf32, std::min(ranks, cl.gpus_per_node));
  const Budget budget = rank_budget(a, ranks);
  double params = 0;
  std::vector<PlannedStep> steps;
  std::vector<int> rank_ids{0};
  if (ranks > 1) rank_ids.push_back(ranks - 1);  // the last shard is the shortest; the ranks between are like 0
  try {
    for (int r : rank_ids) steps.push_back(plan_rank(a, a.model, gpu, r, ranks, &params));
  } catch (const BudgetError& e) {
    std::cerr << "frugal-plan: " << a.model.name() << " does not fit " << ranks << " ranks of " << cl.name
              << " (per rank: " << format_bytes(budget.device) << " of GPU memory, " << format_bytes(budget.host)
              << " of host memory, " << format_bytes(budget.nvme) << " of NVMe):\n"
              << e.what() << "\n";
    return 1;
  }
  plan::ClusterPrices prices(cl, ranks, a.assumptions);
  const PlannedStep& ps = steps.front();
  plan::StepSimulation sim = plan::simulate_step(*ps.graph, ps.plan, prices);
  const double tokens = double(a.model.batch) * a.model.seq * ranks;
  const double tokens_per_s = tokens / sim.step_seconds;
  // Model flop/s as papers report them: 6 flops per parameter per token
  // (forward and backward), 8 with full recomputation; the plan's own count
  // (every op's arithmetic, recomputation included) beside it.
  const double model_flops = 6 * params * double(a.model.batch) * a.model.seq;
  const double peak = cl.flops(a.model.dtype, a.assumptions.tf32);
  int largest = -1;
  if (a.largest) largest = largest_layers(a, gpu, ranks);
  zoo::Config big = a.model;
  double largest_params = 0;
  if (largest > 0) {
    big.layers = largest;
    big.meta = true;
    largest_params = parameter_count(zoo::make(big));
  }

  auto rows = plan::rank_rows(steps);
  if (a.json) {
    std::ostringstream os;
    os << "{\"cluster\":\"" << json_escape(cl.name) << "\",\"gpu\":\"" << json_escape(cl.gpu) << "\",\"nodes\":" << cl.nodes
       << ",\"gpus_per_node\":" << cl.gpus_per_node << ",\"ranks\":" << ranks << ",\"model\":\""
       << json_escape(a.model.name()) << "\",\"parameters\":" << params << ",\"budget\":{\"device\":" << budget.device
       << ",\"host\":" << budget.host << ",\"nvme\":" << budget.nvme << "},\"per_rank\":"
       << plan::ranks_json(steps, a.model.family) << ",\"rank_ids\":[" << rank_ids[0]
       << (rank_ids.size() > 1 ? "," + std::to_string(rank_ids[1]) : std::string()) << "],\"zero_stage\":"
       << ps.plan.zero_stage << ",\"zero_reason\":\"" << json_escape(ps.plan.zero_reason) << "\",\"optimizer_offload\":\""
       << json_escape(ps.plan.optimizer_offload) << "\",\"decisions\":\"" << json_escape(decisions_summary(ps.plan))
       << "\",\"step_seconds\":" << sim.step_seconds << ",\"tokens_per_s\":" << tokens_per_s
       << ",\"model_tflops_per_gpu\":" << model_flops / sim.step_seconds / 1e12
       << ",\"plan_tflops_per_gpu\":" << sim.flops / sim.step_seconds / 1e12 << ",\"peak_tflops_per_gpu\":" << peak / 1e12
       << ",\"busy_seconds\":{";
    for (int r = 0; r < plan::kResources; ++r)
      os << (r ? "," : "") << "\"" << plan::resource_name(plan::Resource(r)) << "\":" << sim.busy_seconds[r];
    os << "},\"waited_seconds\":{";
    for (int r = 0; r < plan::kResources; ++r)
      os << (r ? "," : "") << "\"" << plan::resource_name(plan::Resource(r)) << "\":" << sim.waited_seconds[r];
    os << "},\"largest_layers\":" << largest << ",\"largest_parameters\":" << largest_params << "}";
    std::cout << os.str() << "\n";
    return 0;
  }
  std::cout << "frugal-plan: " << a.model.name() << " (" << fmt(params / 1e9, 4) << "B parameters) on " << ranks
            << " ranks of " << cl.name << " (" << cl.nodes << " x " << cl.gpus_per_node << " " << cl.gpu << ")\n"
            << "  per rank: " << format_bytes(budget.device) << " GPU memory, " << format_bytes(budget.host)
            << " host memory, " << (budget.nvme ? format_bytes(budget.nvme) + " NVMe" : std::string("no NVMe")) << "\n";
  std::cout << "  rank   stage  parameters  optimizer state  gradients*  activations*  device total  |  host  of it "
               "state  of it params  |  NVMe  of it state  of it params\n";
  for (std::size_t k = 0; k < rows.size(); ++k) {
    const plan::RankRow& r = rows[k];
    char line[400];
    std::snprintf(line, sizeof line, "  %5d  %5d  %10s  %15s  %10s  %12s  %12s  |  %10s  %11s  %12s  |  %10s  %11s  %12s\n",
                  rank_ids[k], r.zero_stage, format_bytes(r.parameters).c_str(), format_bytes(r.optimizer_state).c_str(),
                  format_bytes(r.gradients).c_str(), format_bytes(r.activations).c_str(), format_bytes(r.total).c_str(),
                  format_bytes(r.host).c_str(), format_bytes(r.host_state).c_str(),
                  format_bytes(r.host_parameters).c_str(), format_bytes(r.nvme).c_str(),
                  format_bytes(r.nvme_state).c_str(), format_bytes(r.nvme_parameters).c_str());
    std::cout << line;
  }
  if (ranks > 2) std::cout << "  (ranks 1 to " << ranks - 2 << " hold what rank 0 holds; * at the rank's peak)\n";
  std::cout << "  ZeRO stage " << ps.plan.zero_stage << ": " << ps.plan.zero_reason << "\n";
  if (!ps.plan.optimizer_offload.empty()) std::cout << "  optimizer offload: " << ps.plan.optimizer_offload << "\n";
  std::cout << "  budget decisions: " << decisions_summary(ps.plan) << "\n";
  std::cout << "simulated step: " << fmt(sim.step_seconds, 4) << " s, " << fmt(tokens_per_s, 4) << " tokens/s, "
            << fmt(model_flops / sim.step_seconds / 1e12, 3) << " model TFLOP/s per GPU ("
            << fmt(100 * model_flops / sim.step_seconds / peak, 3) << "% of the " << fmt(peak / 1e12, 4)
            << " TFLOP/s peak; " << fmt(sim.flops / sim.step_seconds / 1e12, 3)
            << " counting every op the plan runs)\n";
  std::cout << "  busy:";
  for (int r = 0; r < plan::kResources; ++r)
    if (sim.busy_seconds[r] > 0) std::cout << " " << plan::resource_name(plan::Resource(r)) << " " << fmt(sim.busy_seconds[r], 4) << " s;";
  std::cout << "\n  compute waited for:";
  bool any = false;
  for (int r = 0; r < plan::kResources; ++r)
    if (sim.waited_seconds[r] > 0)
      std::cout << " " << plan::resource_name(plan::Resource(r)) << " " << fmt(sim.waited_seconds[r], 4) << " s;", any = true;
  std::cout << (any ? "" : " nothing") << "\n";
  if (largest == 0) std::cout << "largest model that fits: not even one layer at width " << a.model.width << "\n";
  else if (largest > 0)
    std::cout << "largest model that fits: " << (largest == kMostLayersSearched ? "at least " : "") << largest
              << " layers at width " << a.model.width << ", " << fmt(largest_params / 1e9, 4) << "B parameters\n";
  return 0;
}

}  // namespace frugal_plan
