#pragma once
// Prices for the step simulator (plan/step_sim.hpp) on one GPU of a Cluster
// (plan/cluster.hpp), a rank of a data-parallel job over `ranks` of its GPUs.
//
// Compute is a roofline: an op takes its launch latency plus the longer of
// its arithmetic at the GPU's dense peak for its dtype (and its exp, log...
// on the special-function units) and its memory
// traffic at HBM bandwidth, each scaled by what real kernels reach of the
// peak (SimAssumptions). Transfers and collectives are the cluster's own
// prices; every GPU of a node streams from NVMe at once (each rank holds a
// shard), so each gets its share of the node's drives. An optimizer update
// offloaded to the host streams its operands through host memory, which
// the node's ranks share.
#include <algorithm>
#include <vector>

#include "cluster.hpp"
#include "step_sim.hpp"

namespace frugal::plan {

struct SimAssumptions {
  // The fraction of the dense peak flop/s large GEMMs reach: cuBLAS reaches
  // about 70-80% on V100, A100 and H100 at the sizes of these models.
  double gemm_efficiency = 0.7;
  // The fraction of HBM bandwidth elementwise kernels reach.
  double stream_efficiency = 0.8;
  // f32 GEMMs on TF32 tensor cores (as torch.backends.cuda.matmul.allow_tf32).
  bool tf32 = false;
};

class ClusterPrices final : public StepPrices {
 public:
  ClusterPrices(Cluster c, int ranks, SimAssumptions a = {}) : c_(std::move(c)), ranks_(ranks), a_(a) {
    if (ranks < 1 || ranks > c_.total_gpus())
      fail("ClusterPrices: ", ranks, " ranks on '", c_.name, "', which has ", c_.total_gpus(), " GPUs");
    if (!(a.gemm_efficiency > 0 && a.gemm_efficiency <= 1) || !(a.stream_efficiency > 0 && a.stream_efficiency <= 1))
      fail("SimAssumptions: efficiencies are fractions of the peak in (0, 1], got gemm ", a.gemm_efficiency,
           ", stream ", a.stream_efficiency);
  }
  const Cluster& cluster() const { return c_; }
  int ranks() const { return ranks_; }
  // GPUs of one node in the job: they share its host memory and drives.
  int ranks_per_node() const { return std::min(ranks_, c_.gpus_per_node); }

  double compute_seconds(const Graph& g, NodeId n) const override {
    Cost cost = node_cost(g, n);
    const double flops = c_.flops(compute_dtype(g, n), a_.tf32) * a_.gemm_efficiency;
    // frugal's CUDA attention kernels run their tiles on the FP32 lanes.
    const double tiles = cost.tile_flops / (c_.f32_flops * a_.gemm_efficiency);
    return c_.op_latency_s + std::max(cost.flops / flops + tiles + cost.transcendentals / c_.transcendentals_per_s(),
                                      cost.bytes / (c_.hbm_bytes_per_s * a_.stream_efficiency));
  }
  double host_update_seconds(const Graph& g, NodeId n) const override {
    return node_cost(g, n).bytes / (c_.host_memory_bytes_per_s / ranks_per_node());
  }
  double h2d_seconds(std::size_t bytes) const override { return c_.h2d_seconds(double(bytes)); }
  double d2h_seconds(std::size_t bytes) const override { return c_.d2h_seconds(double(bytes)); }
  double nvme_read_seconds(std::size_t bytes) const override {
    return c_.nvme_read_seconds(double(bytes), ranks_per_node());
  }
  double nvme_write_seconds(std::size_t bytes) const override {
    return c_.nvme_write_seconds(double(bytes), ranks_per_node());
  }
  double collective_seconds(Collective c, std::size_t bytes) const override {
    if (ranks_ == 1) return 0;
    switch (c) {
      case Collective::all_reduce: return c_.all_reduce_seconds(double(bytes), ranks_);
      case Collective::reduce_scatter: return c_.reduce_scatter_seconds(double(bytes), ranks_);
      case Collective::all_gather: return c_.all_gather_seconds(double(bytes), ranks_);
      case Collective::broadcast: return c_.broadcast_seconds(double(bytes), ranks_);
    }
    return 0;
  }

 private:
  // The dtype an op computes in: its first floating input's (a cast's or a
  // loss's output may be wider than the GEMMs that fed it). A cluster has no
  // f64 rate: Cluster::flops says so.
  static DType compute_dtype(const Graph& g, NodeId n) {
    for (ValueId v : g.node(n).inputs)
      if (is_floating(g.value(v).meta.dtype)) return g.value(v).meta.dtype;
    return DType::f32;
  }
  Cluster c_;
  int ranks_;
  SimAssumptions a_;
};

}  // namespace frugal::plan
