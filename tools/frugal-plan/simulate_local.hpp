#pragma once
// frugal-plan --simulate local --ranks N: the step of an MPI job of N CPU
// ranks on this machine (`mpirun -np N` of a program built on frugal), run
// in virtual time (plan/step_sim.hpp) with a DeviceProfile: this machine's,
// calibrated and cached at the threads the job keeps busy, or --profile FILE
// (for another machine, with --cores saying how many it has). Each rank's plan
// is the one the real job compiles (the same graph, budget and
// communicator size), so its memory is exact; the time is a prediction.
//
// The ranks share the machine: its cores, caches and memory channels. So
// the rates that price a rank are the machine's with all the job's threads
// busy (a profile of min(ranks x threads, cores) threads), divided among the
// ranks; where the threads outnumber the cores, each op's fixed cost also
// stretches with the time-slicing. (On this 2-vCPU machine one thread
// multiplies 99 Gflop/s and two 168: two ranks of one thread each get 84,
// not 99.) MPI's shared-memory transport moves a large message with one
// copy (Open MPI's CMA, MPICH's LMT), so the ranks' link is priced at a
// rank's share of the memcpy rate.
#include <algorithm>
#include <iostream>
#include <thread>

#include <frugal/dist/plan_only.hpp>
#include <frugal/plan/profile_prices.hpp>
#include <frugal/plan/step_sim.hpp>
#include <frugal/runtime/calibrate.hpp>

#include "../model_zoo.hpp"

namespace frugal_plan {

using namespace frugal;

struct LocalArgs {
  zoo::Config model;
  CompileOptions options;  // zero stage, offload, plan switches the user pinned
  int ranks = 1;
  int threads = 0;  // per rank; 0: as the samples pick them, min(2, cores / ranks), at least 1
  int cores = 0;    // 0: this machine's
  std::optional<DeviceProfile> profile;  // the machine's at busy_threads(); none: this machine's, calibrated
  Budget budget;           // per rank
  std::string budget_arg;  // --budget as given: bytes, or N% of the rank's unconstrained step
  double link_latency_s = 5e-6;  // one MPI message over shared memory, each round of a collective
  bool json = false;
};

// The threads of the whole job that run at once on `cores` cores.
inline int busy_threads(int ranks, int threads, int cores) { return std::min(ranks * threads, cores); }

// One rank's rates: the machine's, measured with busy_threads() threads
// (`machine`), shared by `ranks` ranks of `threads` threads on `cores` cores.
inline DeviceProfile rank_profile(const DeviceProfile& machine, int ranks, int threads, int cores) {
  DeviceProfile p = machine;
  p.threads = threads;
  for (double* rate : {&p.gemm_flops, &p.stream_bytes, &p.copy_bytes, &p.transcendentals_per_s, &p.tile_flops})
    *rate /= ranks;
  const double slicing = std::max(1.0, double(ranks) * threads / cores);
  p.op_latency_s *= slicing;
  p.copy_latency_s *= slicing;
  return p;
}

// The step of each of `ranks` data-parallel ranks, as mpirun's ranks plan
// it; `budget_arg` (bytes, or N% of the rank's unconstrained step), where
// given, is each rank's device budget.
inline std::vector<PlannedStep> plan_every_rank(zoo::Workload& w, const Budget& budget,
                                                const std::string& budget_arg, CompileOptions o, int ranks) {
  std::vector<PlannedStep> steps;
  for (int r = 0; r < ranks; ++r) {
    o.communicator = std::make_shared<dist::PlanOnly>(r, ranks);
    Budget b = budget;
    if (!budget_arg.empty())
      b.device = budget_arg.back() == '%' ? parse_bytes(budget_arg, zoo::plan(w, {}, o).plan.total_bytes())
                                          : parse_bytes(budget_arg);
    steps.push_back(zoo::plan(w, b, o));
  }
  return steps;
}

inline int simulate_local(LocalArgs a) {
  if (a.ranks < 1) fail("--simulate local needs --ranks N, N >= 1");
  const int cores = a.cores > 0 ? a.cores : std::max(1, int(std::thread::hardware_concurrency()));
  const int threads = a.threads > 0 ? a.threads : std::clamp(cores / a.ranks, 1, 2);
  const int busy = busy_threads(a.ranks, threads, cores);
  std::string priced_by;
  DeviceProfile machine;
  if (a.profile) {
    machine = *a.profile;
    if (machine.threads != busy)
      fail("--profile: the job keeps ", busy, " thread", busy == 1 ? "" : "s", " busy (", a.ranks, " ranks x ", threads,
           " on ", cores, " cores), and its ranks share the machine's rates at that many; the profile given was "
           "measured with ", machine.threads, " (calibrate one with OMP_NUM_THREADS=", busy,
           " frugal-info --calibrate, or give --threads and --cores to match)");
    priced_by = "the profile given (" + machine.machine + ")";
  } else {
    auto backend = make_backend("cpu");
    machine = load_or_calibrate(*backend, busy, a.budget.nvme_dir);
    priced_by = "this machine's calibrated rates (" + machine.machine + ")";
  }
  if (machine.backend != "cpu")
    fail("--simulate local prices CPU ranks; the profile given is of the ", machine.backend, " backend");
  const DeviceProfile profile = rank_profile(machine, a.ranks, threads, cores);

  zoo::Config c = a.model;
  c.meta = true;
  zoo::Workload w = zoo::make(c);
  // Planned as the job plans (with its CompileOptions: the built-in rates,
  // or FRUGAL_PROFILE's), so that its bytes are the job's; priced below.
  CompileOptions o = a.options;
  o.threads = threads;
  const std::vector<PlannedStep> steps = plan_every_rank(w, a.budget, a.budget_arg, o, a.ranks);

  plan::ProfilePrices prices(profile, plan::RankLink{a.ranks, a.link_latency_s, profile.copy_bytes});
  const PlannedStep& ps = steps.front();
  plan::StepSimulation sim = plan::simulate_step(*ps.graph, ps.plan, prices);

  if (a.json) {
    std::string j = plan::ranks_json(steps, c.family);
    j.pop_back();
    std::ostringstream os;
    os << j << ",\"simulated\":{\"step_seconds\":" << sim.step_seconds << ",\"threads_per_rank\":" << threads
       << ",\"cores\":" << cores << ",\"busy_threads\":" << busy << ",\"link_bytes_per_s\":" << profile.copy_bytes
       << ",\"link_latency_s\":" << a.link_latency_s << ",\"priced_by\":\"" << json_escape(priced_by)
       << "\",\"busy_seconds\":{";
    for (int r = 0; r < plan::kResources; ++r)
      os << (r ? "," : "") << "\"" << plan::resource_name(plan::Resource(r)) << "\":" << sim.busy_seconds[r];
    os << "}}}";
    std::cout << os.str() << "\n";
    return 0;
  }
  std::cout << "frugal-plan: " << c.name() << ", " << a.ranks << " MPI rank" << (a.ranks == 1 ? "" : "s") << " of "
            << threads << " thread" << (threads == 1 ? "" : "s") << " on " << cores << " core"
            << (cores == 1 ? "" : "s") << "\n"
            << plan::ranks_table(steps);
  char line[300];
  std::snprintf(line, sizeof line, "simulated step: %.1f ms (compute %.1f ms, collectives %.1f ms", 1e3 * sim.step_seconds,
                1e3 * sim.busy(plan::Resource::compute), 1e3 * sim.busy(plan::Resource::network));
  std::cout << line << ")\n  priced by " << priced_by << " at " << busy << " thread" << (busy == 1 ? "" : "s")
            << ", shared by the " << a.ranks << " rank" << (a.ranks == 1 ? "" : "s")
            << (a.ranks * threads > cores ? ", time-sliced" : "") << "; ranks joined over shared memory at "
            << format_bytes(std::size_t(profile.copy_bytes)) << "/s each\n";
  return 0;
}

}  // namespace frugal_plan
