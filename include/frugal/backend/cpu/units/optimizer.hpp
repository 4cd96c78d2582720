#pragma once
// Kernel unit (compiled once per program; see ../register.hpp): the
// optimizer phase's kernels: the fused SGD and AdamW updates, and the
// gradient all-reduce of data parallelism before them.
#include "../collective.hpp"
#include "../optimizer.hpp"
#include "../register.hpp"

namespace frugal::cpu {

void add_optimizer_kernels(KernelTable& t, const BackendOptions&) {
  t.add<ops::SgdUpdate>(sgd_kernel);
  t.add<ops::AdamWUpdate>(adamw_kernel);
  t.add<ops::AllReduceMean>(all_reduce_mean_kernel, all_reduce_mean_workspace);
}

}  // namespace frugal::cpu
