#pragma once
// The gradient all-reduce of data parallelism: the communicator sums the
// ranks' values in rank order into the output (the input's memory where the
// planner lets it take it over), then each element is divided by the rank
// count in its own dtype, as a mean over a global batch divides.
#include <cstring>

#include "../../core/half.hpp"
#include "../../ops/collective.hpp"
#include "../../runtime/backend.hpp"

#include "abi.hpp"

namespace frugal::cpu::inline FRUGAL_KERNEL_ABI {

namespace detail {
template <class T>
void divide_by(void* data, std::size_t n, int ranks) {
  T* x = static_cast<T*>(data);
  for (std::size_t i = 0; i < n; ++i) x[i] = x[i] / T(ranks);
}
template <class T>
void divide_by_widened(void* data, std::size_t n, int ranks) {  // bf16, f16: in f32, rounded once
  T* x = static_cast<T*>(data);
  for (std::size_t i = 0; i < n; ++i) x[i] = T(float(x[i]) / float(ranks));
}
// x[i] / ranks in x's dtype: the mean every gradient collective ends with.
inline void divide_by_ranks(void* data, std::size_t n, DType dtype, int ranks, const char* op) {
  if (ranks == 1) return;
  switch (dtype) {
    case DType::f32: divide_by<float>(data, n, ranks); break;
    case DType::f64: divide_by<double>(data, n, ranks); break;
    case DType::bf16: divide_by_widened<BFloat16>(data, n, ranks); break;
    case DType::f16: divide_by_widened<Half>(data, n, ranks); break;
    default: fail(op, ": dtype ", dtype_name(dtype), " is not a floating type");
  }
}
}  // namespace detail

// A collective's optional skip flag (input `at`), set on gradient
// accumulation's micro-steps: the same on every rank.
inline bool collective_skipped(const KernelArgs& a, std::size_t at) {
  return a.in.size() > at && a.in[at].as<float>()[0] != 0.0f;
}

inline void all_reduce_mean_kernel(const ops::AllReduceMean& op, const KernelArgs& a) {
  const TensorRef& g = a.in[0];
  const TensorRef& out = a.out[0];
  const std::size_t n = std::size_t(g.numel());
  if (collective_skipped(a, 2)) {  // nothing reads the output: zeros, not stale bytes
    std::memset(out.data, 0, n * dtype_size(g.dtype));
    return;
  }
  if (out.data != g.data) std::memcpy(out.data, g.data, n * dtype_size(g.dtype));
  std::int64_t& run = *a.in[1].as<std::int64_t>();
  Communicator& c = op.communicator();
  c.all_reduce_sum(out.data, n, g.dtype, a.workspace,
                   cat(op.what(), ", step ", a.step + 1, ", collective ", run + 1, " of this communicator"));
  detail::divide_by_ranks(out.data, n, g.dtype, c.size(), "all_reduce_mean");
  ++run;
}

inline std::size_t all_reduce_mean_workspace(const ops::AllReduceMean& op, std::span<const TensorMeta> in,
                                             std::span<const TensorMeta>) {
  return op.communicator().all_reduce_workspace(std::size_t(in[0].shape.numel()), in[0].dtype);
}

// ops::CollectiveStart and CollectiveDone for a table. The start's kernel
// is the table's kernel for the inner collective, with its scratch and
// in-place choices; the executor runs it on the step's communication
// thread. The done's is nothing: the executor waits for the start there,
// and its output is a view. `t` lives as long as its backend.
inline void add_collective_start(KernelTable& t) {
  const KernelTable* table = &t;
  auto inner_entry = [table](const ops::CollectiveStart& op) -> const KernelEntry& {
    const KernelEntry* e = table->find(op.inner());
    if (!e) fail("collective start: this backend has no kernel for ", op.inner().name());
    return *e;
  };
  t.add<ops::CollectiveStart>(
      [inner_entry](const ops::CollectiveStart& op, const KernelArgs& a) { inner_entry(op).run(op.inner(), a); },
      [inner_entry](const ops::CollectiveStart& op, std::span<const TensorMeta> in, std::span<const TensorMeta> out) {
        const KernelEntry& ie = inner_entry(op);
        return ie.workspace ? ie.workspace(op.inner(), in, out) : std::size_t(0);
      });
  t.add<ops::CollectiveDone>([](const ops::CollectiveDone&, const KernelArgs&) {});
}

}  // namespace frugal::cpu
