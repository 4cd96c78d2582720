#pragma once
// A backend that plans a CUDA device's step where there is none (frugal-plan
// --simulate, a cluster of GPUs planned on a laptop): it answers the
// planner's questions as the CUDA backend would and refuses to run anything.
//
// Why it exists: a plan counts every op's scratch (Op::workspace_bytes, from
// the backend's kernel table), and the CPU's kernels need scratch a GPU's do
// not. A bf16/f16 product on the CPU multiplies f32 images of its operands
// inside its scratch; cuBLASLt reads them as they are. Planned with the CPU
// backend's table, one weight gradient of ZeRO-Infinity's 1T model
// ([25600, 102400] from 7 x 1024 tokens) asked for 13.2 GiB of scratch that
// a V100 running the step never holds.
//
// What it answers: every op the CUDA table has a kernel for is sized by that
// kernel's workspace function (kernel_ops.hpp, the same functions the table
// registers); ops it has none for yet (collectives, the host update) keep
// the host backend's entries. Tiers: it plans the host and NVMe tiers as the
// host backend runs them (host_addressable: the optimizer updated on the
// host, NVMe homes), which is how ZeRO-Offload and ZeRO-Infinity run a GPU's
// step; frugal's CUDA backend does not run those tiers yet (issue 16), so a
// plan made here is frugal's plan for that GPU once it does.
#include <cstddef>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>

#include "../../core/error.hpp"
#include "../../runtime/backend.hpp"
#include "kernel_ops.hpp"

namespace frugal::cuda {

class PlanningBackend final : public Backend {
 public:
  // host: the backend whose entries answer for the ops the CUDA table lacks
  // (make_backend("cpu")). Kept alive: its forwarding entries (a collective
  // started beside compute, a sharded update) look up their inner op in it.
  explicit PlanningBackend(std::shared_ptr<const Backend> host) : host_(std::move(host)), table_(host_->kernels()) {
    for_each_kernel_op([this]<class OpT>(auto ws) {
      KernelEntry* e = table_.entry<OpT>();
      if (!e) e = &table_.add<OpT>(refuse_to_run);
      if constexpr (std::is_same_v<decltype(ws), std::nullptr_t>) {
        e->workspace = nullptr;
      } else {
        e->workspace = [ws](const Op& op, std::span<const TensorMeta> in, std::span<const TensorMeta> out) {
          return std::size_t(ws(static_cast<const OpT&>(op), in, out));
        };
      }
      e->inplace.reset();  // the CUDA table declares none: every candidate the op declares
    });
  }
  std::string name() const override { return "cuda"; }
  const KernelTable& kernels() const override { return table_; }
  void* allocate(std::size_t) override { refuse("allocate device memory"); }
  void deallocate(void*) override {}
  void copy_to_device(void*, const void*, std::size_t) override { refuse("copy to the device"); }
  void copy_to_host(void*, const void*, std::size_t) override { refuse("copy to the host"); }
  void fill(void*, unsigned char, std::size_t) override { refuse("fill device memory"); }
  void transfer(void*, const void*, std::size_t, bool) override { refuse("transfer between tiers"); }

 private:
  [[noreturn]] static void refuse(const char* what) {
    fail("cuda::PlanningBackend cannot ", what, ": it plans a CUDA device's step where there is none (frugal-plan "
         "--simulate); run the step with make_backend(\"cuda\") on a machine with a GPU");
  }
  static void refuse_to_run(const Op& op, const KernelArgs&) {
    fail("cuda::PlanningBackend cannot run ", op.name(), ": it only plans; run the step with make_backend(\"cuda\")");
  }
  std::shared_ptr<const Backend> host_;
  KernelTable table_;
};

}  // namespace frugal::cuda
