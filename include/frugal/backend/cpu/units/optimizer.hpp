#pragma once
// Kernel unit (compiled once per program; see ../register.hpp): the
// optimizer phase's kernels: the fused SGD and AdamW updates (AdamW's on
// f32 master weights too), and the gradient all-reduce of data parallelism
// before them, and ZeRO's sharded update with its reduce-scatter and
// all-gather.
#include "../accumulation.hpp"
#include "../collective.hpp"
#include "../optimizer.hpp"
#include "../zero.hpp"
#include "../register.hpp"

namespace frugal::cpu {

void add_optimizer_kernels(KernelTable& t, const BackendOptions&) {
  t.add<ops::SgdUpdate>(sgd_kernel);
  t.add<ops::AdamWUpdate>(adamw_kernel);
  t.add<ops::AdamWMasterUpdate>(adamw_master_kernel);
  t.add<ops::MicroStepSkip>(micro_step_skip_kernel);
  t.add<ops::AccumulateGradient>(accumulate_gradient_kernel);
  t.add<ops::AllReduceMean>(all_reduce_mean_kernel, all_reduce_mean_workspace);
  t.add<ops::ReduceScatterMean>(reduce_scatter_mean_kernel, reduce_scatter_mean_workspace);
  add_collective_start(t);
  t.add<ops::ShardSlice>(shard_slice_kernel);
  t.add<ops::AllGatherShards>(all_gather_shards_kernel, all_gather_shards_workspace);
  t.add<ops::AllGatherParameter>(all_gather_parameter_kernel, all_gather_parameter_workspace);
  add_sharded_update(t);
  add_host_update(t);
}

}  // namespace frugal::cpu
