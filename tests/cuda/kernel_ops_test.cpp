// cuda_kernel_ops: the list backend/cuda/kernel_ops.hpp gives of the CUDA
// table's ops and of which of them need scratch is the table's own. Planning
// a GPU's step where there is none (cuda::PlanningBackend, frugal-plan
// --simulate) reads that list instead of the table, so a kernel added to the
// table and not to the list would be planned with the CPU's scratch. Needs
// no device: filling a table makes no CUDA call, so this runs (and can fail)
// on every machine that builds the CUDA kernels.
#include <set>
#include <type_traits>
#include <typeindex>

#include <frugal/backend/cuda/cuda_backend.hpp>
#include <frugal/backend/cuda/kernel_ops.hpp>

#include "device.hpp"

namespace cuda_kernel_ops_test {

using namespace frugal;

int run() {
  KernelTable table;
  cuda::register_cuda_kernels(table, cuda::Context{}, BackendOptions{});
  std::set<std::type_index> listed;
  cuda::for_each_kernel_op([&]<class OpT>(auto ws) {
    listed.insert(std::type_index(typeid(OpT)));
    const KernelEntry* e = table.entry<OpT>();
    cuda_test::expect(e != nullptr, cat("kernel_ops.hpp lists ", typeid(OpT).name(), ", which the CUDA table lacks"));
    if (!e) return;
    const bool listed_scratch = !std::is_same_v<decltype(ws), std::nullptr_t>;
    cuda_test::expect(bool(e->workspace) == listed_scratch,
                      cat(typeid(OpT).name(), ": the CUDA table ", e->workspace ? "sizes" : "gives no", " scratch, ",
                          "kernel_ops.hpp ", listed_scratch ? "sizes it" : "gives none"));
  });
  for (const std::type_index& t : table.op_types())
    cuda_test::expect(listed.count(t) == 1,
                      cat("the CUDA table has a kernel for ", t.name(), ", which kernel_ops.hpp does not list"));
  std::printf("%zu ops listed, %zu in the table\n", listed.size(), table.op_types().size());
  return cuda_test::failures ? 1 : 0;
}

}  // namespace cuda_kernel_ops_test
