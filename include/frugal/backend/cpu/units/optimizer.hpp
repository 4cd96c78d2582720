#pragma once
// Kernel unit (compiled once per program; see ../register.hpp): the fused
// SGD and AdamW updates.
#include "../optimizer.hpp"
#include "../register.hpp"

namespace frugal::cpu {

void add_optimizer_kernels(KernelTable& t, const BackendOptions&) {
  t.add<ops::SgdUpdate>(sgd_kernel);
  t.add<ops::AdamWUpdate>(adamw_kernel);
}

}  // namespace frugal::cpu
