#pragma once
// Runs a plan in virtual time: how long one step of it takes on a device
// that is not here (a GPU of a cluster, another machine), from prices of its
// compute, its copies and its collectives.
//
// The plan fixes the order; the simulator only prices it, the way the
// executor runs it:
// - compute runs node after node in schedule order, each once its inputs
//   are ready;
// - a transfer's start is issued when compute reaches it and runs on its
//   link (host to device, device to host, NVMe read, NVMe write; an NVMe
//   transfer is staged through host memory, so it takes both its NVMe link
//   and its PCIe link, one after the other) as soon as the link is free and
//   its source is ready; its done makes compute wait for it;
// - a collective runs on the network: inline (compute waits for it) or,
//   started beside compute (ops::CollectiveStart), from its start to the
//   done that waits for it;
// - an optimizer update offloaded to the host (`..._on_host`) runs on the
//   host's cores, from when its inputs are ready; compute waits for its
//   results only where it reads them.
// Each resource does one thing at a time, in issue order. The step ends when
// the last of them is idle. Ranks of one data-parallel job run the same plan
// in lockstep, so one rank's timeline is the job's.
//
// What it leaves out: the overlap of one step's early fetches with the step
// before (Plan::early_fetches: the simulated step is the first), compute
// slowed by a copy beside it, and stragglers.
#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "../graph/graph.hpp"
#include "node_cost.hpp"
#include "plan.hpp"

namespace frugal::plan {

enum class Collective : std::uint8_t { all_reduce, reduce_scatter, all_gather, broadcast };

inline const char* collective_name(Collective c) {
  switch (c) {
    case Collective::all_reduce: return "all_reduce";
    case Collective::reduce_scatter: return "reduce_scatter";
    case Collective::all_gather: return "all_gather";
    case Collective::broadcast: return "broadcast";
  }
  return "?";
}

// What each kind of work costs on the simulated device, in seconds.
class StepPrices {
 public:
  virtual ~StepPrices() = default;
  virtual double compute_seconds(const Graph& g, NodeId n) const = 0;
  // An optimizer update run on the host (optimizer offload).
  virtual double host_update_seconds(const Graph& g, NodeId n) const = 0;
  virtual double h2d_seconds(std::size_t bytes) const = 0;
  virtual double d2h_seconds(std::size_t bytes) const = 0;
  virtual double nvme_read_seconds(std::size_t bytes) const = 0;
  virtual double nvme_write_seconds(std::size_t bytes) const = 0;
  // `bytes`: the whole buffer (all-reduce), the whole of what is scattered
  // (reduce-scatter's input) or gathered (all-gather's output).
  virtual double collective_seconds(Collective c, std::size_t bytes) const = 0;
};

enum class Resource : std::uint8_t { compute, host, h2d, d2h, nvme_read, nvme_write, network };
inline constexpr int kResources = 7;

inline const char* resource_name(Resource r) {
  switch (r) {
    case Resource::compute: return "compute";
    case Resource::host: return "host update";
    case Resource::h2d: return "host to device";
    case Resource::d2h: return "device to host";
    case Resource::nvme_read: return "NVMe read";
    case Resource::nvme_write: return "NVMe write";
    case Resource::network: return "network";
  }
  return "?";
}

struct StepSimulation {
  double step_seconds = 0;
  double busy_seconds[kResources] = {};  // each resource's total work
  // Compute's idle time waiting for a transfer, a collective or a host update
  // (what overlap did not hide), by what it waited for.
  double waited_seconds[kResources] = {};
  double flops = 0;  // the compute nodes' arithmetic (Op::cost)
  std::size_t bytes_moved[kResources] = {};
  std::map<std::string, double> collective_seconds;  // by collective, busy time
  double busy(Resource r) const { return busy_seconds[int(r)]; }
  double waited(Resource r) const { return waited_seconds[int(r)]; }
};

namespace detail {

// The collective a collective node runs (by the op's name: plan/ sees ops
// as the graph holds them); one it does not know is priced as an
// all-reduce of what it reads (the scalars of a clipped norm, a flag).
inline Collective collective_of(const std::string& op_name) {
  std::string n = op_name;
  if (n.ends_with(".start")) n.resize(n.size() - 6);
  if (n == "reduce_scatter_mean") return Collective::reduce_scatter;
  if (n == "all_gather_shards" || n == "all_gather_parameter") return Collective::all_gather;
  if (n == "broadcast") return Collective::broadcast;
  return Collective::all_reduce;
}

// The bytes a collective node moves, as StepPrices::collective_seconds
// counts them: the floating tensors it reduces or scatters (its inputs; the
// scalars beside them are flags), or the whole tensor it gathers.
inline std::size_t collective_bytes(const Graph& g, const Node& node, Collective c) {
  std::size_t bytes = 0, scalars = 0;
  auto floating_sum = [&](const std::vector<ValueId>& vs) {
    for (ValueId v : vs) {
      const TensorMeta& m = g.value(v).meta;
      if (!is_floating(m.dtype)) continue;
      (m.shape.numel() > 1 ? bytes : scalars) += m.nbytes();
    }
    if (!bytes) bytes = scalars;  // a collective of scalars (a norm) still pays its latency
  };
  if (c == Collective::all_gather) {
    const std::string name = node.op->name();
    if (name.starts_with("all_gather_shards")) bytes = g.value(node.inputs[0]).meta.nbytes();  // the whole parameter
    else floating_sum(node.outputs);
  } else {
    floating_sum(node.inputs);
  }
  return bytes;
}

}  // namespace detail

inline StepSimulation simulate_step(const Graph& g, const Plan& plan, const StepPrices& prices) {
  StepSimulation sim;
  std::vector<double> ready(g.num_values(), 0.0);  // when each value exists
  double free_at[kResources] = {};
  double clock = 0;  // compute's position: every node before it has been issued
  std::map<int, double> slot_done;  // a transfer slot's copy finishes
  std::map<int, Resource> slot_by;  // on this link
  auto run_on = [&](Resource r, double earliest, double seconds) {
    double start = std::max(free_at[int(r)], earliest);
    free_at[int(r)] = start + seconds;
    sim.busy_seconds[int(r)] += seconds;
    return start + seconds;
  };
  auto inputs_ready = [&](const Node& node) {
    double t = 0;
    for (ValueId v : node.inputs) t = std::max(t, ready[std::size_t(v)]);
    return t;
  };
  auto finish = [&](const Node& node, double t) {
    for (ValueId v : node.results()) ready[std::size_t(v)] = t;
  };
  // What compute waited for, charged to the resource whose result it was.
  std::vector<Resource> made_by(g.num_values(), Resource::compute);
  auto compute_waits = [&](const Node& node) {
    double start = clock;
    Resource why = Resource::compute;
    for (ValueId v : node.inputs)
      if (ready[std::size_t(v)] > start) start = ready[std::size_t(v)], why = made_by[std::size_t(v)];
    if (start > clock) sim.waited_seconds[int(why)] += start - clock;
    return start;
  };
  auto mark = [&](const Node& node, Resource r) {
    for (ValueId v : node.results()) made_by[std::size_t(v)] = r;
  };

  for (NodeId n : plan.schedule) {
    const Node& node = g.node(n);
    const Op& op = *node.op;
    if (const TransferOp* t = op.as_transfer()) {
      if (!t->is_start()) {  // a done: compute waits for its copy
        double start = compute_waits(node);
        const double copied = slot_done[t->slot()];
        if (copied > start) sim.waited_seconds[int(slot_by[t->slot()])] += copied - start, start = copied;
        clock = start;
        finish(node, clock);
        continue;
      }
      using K = TransferKind;
      const ValueId from = node.inputs[0];
      const ValueId to = t->kind() == K::write_back_start ? node.inputs[1] : node.outputs[0];
      const std::size_t bytes = g.value(from).meta.nbytes();
      auto home_on_nvme = [&](ValueId v) {
        return std::size_t(v) < plan.nvme_home_of.size() && plan.nvme_home_of[std::size_t(v)].has_value();
      };
      const bool to_nvme = g.value(to).kind == ValueKind::nvme || (t->kind() == K::write_back_start && home_on_nvme(to));
      const bool from_nvme = g.value(from).kind == ValueKind::nvme || (t->kind() == K::fetch_start && home_on_nvme(from));
      double earliest = std::max(clock, ready[std::size_t(from)]);
      double done;
      Resource last;
      if (t->kind() == K::fetch_start) {
        if (from_nvme) {
          earliest = run_on(Resource::nvme_read, earliest, prices.nvme_read_seconds(bytes));
          sim.bytes_moved[int(Resource::nvme_read)] += bytes;
        }
        done = run_on(Resource::h2d, earliest, prices.h2d_seconds(bytes));
        sim.bytes_moved[int(Resource::h2d)] += bytes;
        last = Resource::h2d;
      } else {
        done = run_on(Resource::d2h, earliest, prices.d2h_seconds(bytes));
        sim.bytes_moved[int(Resource::d2h)] += bytes;
        last = Resource::d2h;
        if (to_nvme) {
          done = run_on(Resource::nvme_write, done, prices.nvme_write_seconds(bytes));
          sim.bytes_moved[int(Resource::nvme_write)] += bytes;
          last = Resource::nvme_write;
        }
      }
      slot_done[t->slot()] = done;
      slot_by[t->slot()] = last;
      finish(node, done);
      mark(node, last);
      continue;
    }
    if (op.is_collective()) {
      const Collective c = detail::collective_of(op.name());
      const std::size_t bytes = detail::collective_bytes(g, node, c);
      const double seconds = prices.collective_seconds(c, bytes);
      sim.collective_seconds[collective_name(c)] += seconds;
      sim.bytes_moved[int(Resource::network)] += bytes;
      if (op.name().ends_with(".start")) {  // beside compute
        double done = run_on(Resource::network, std::max(clock, inputs_ready(node)), seconds);
        finish(node, done);
        mark(node, Resource::network);
      } else {  // inline: compute waits for the network
        double start = compute_waits(node);
        double done = run_on(Resource::network, start, seconds);
        sim.waited_seconds[int(Resource::network)] += done - start;
        clock = done;
        finish(node, done);
      }
      continue;
    }
    if (op.name().ends_with("_on_host")) {
      double done = run_on(Resource::host, std::max(clock, inputs_ready(node)), prices.host_update_seconds(g, n));
      finish(node, done);
      mark(node, Resource::host);
      continue;
    }
    // Compute (a collective's done and other views cost nothing but the wait).
    double start = compute_waits(node);
    double seconds = prices.compute_seconds(g, n);
    const Cost c = node_cost(g, n);
    sim.flops += c.flops + c.tile_flops;
    clock = run_on(Resource::compute, start, seconds);
    finish(node, clock);
  }
  sim.step_seconds = clock;
  for (double f : free_at) sim.step_seconds = std::max(sim.step_seconds, f);
  return sim;
}

}  // namespace frugal::plan
