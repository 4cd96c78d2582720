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
// What a collective kernel's errors call it: the op's `what`, the step,
// and the communicator's count of collectives (or of the ones `counted`
// names, where they have a sequence of their own).
inline std::string collective_label(const std::string& what, const KernelArgs& a, std::int64_t run,
                                    const char* counted = "collective") {
  return cat(what, ", step ", a.step + 1, ", ", counted, " ", run + 1, " of this communicator");
}
}  // namespace detail

// A collective's optional skip flag (input `at`), set on gradient
// accumulation's micro-steps: the same on every rank.
inline bool collective_skipped(const KernelArgs& a, std::size_t at) {
  return a.in.size() > at && a.in[at].as<float>()[0] != 0.0f;
}

inline void all_reduce_mean_kernel(const ops::AllReduceMean& op, const KernelArgs& a) {
  const std::size_t k = std::size_t(op.tensors()), es = dtype_size(a.in[0].dtype);
  const DType dtype = a.in[0].dtype;
  if (collective_skipped(a, k + 1)) {  // nothing reads the outputs: zeros, not stale bytes
    for (std::size_t i = 0; i < k; ++i) std::memset(a.out[i].data, 0, std::size_t(a.out[i].numel()) * es);
    return;
  }
  std::int64_t& run = *a.in[k].as<std::int64_t>();
  Communicator& c = op.communicator();
  const std::string what = detail::collective_label(op.what(), a, run);
  if (k == 1) {
    const std::size_t n = std::size_t(a.in[0].numel());
    if (a.out[0].data != a.in[0].data) std::memcpy(a.out[0].data, a.in[0].data, n * es);
    c.all_reduce_sum(a.out[0].data, n, dtype, a.workspace, what);
    detail::divide_by_ranks(a.out[0].data, n, dtype, c.size(), "all_reduce_mean");
  } else {
    // A bucket: every gradient packed before any output is written (an
    // output may lie over another gradient), reduced as one, unpacked.
    auto* packed = static_cast<unsigned char*>(a.workspace);
    std::size_t n = 0;
    for (std::size_t i = 0; i < k; ++i) {
      const std::size_t b = std::size_t(a.in[i].numel()) * es;
      std::memcpy(packed + n * es, a.in[i].data, b);
      n += std::size_t(a.in[i].numel());
    }
    c.all_reduce_sum(packed, n, dtype, packed + align_up(n * es), what);
    detail::divide_by_ranks(packed, n, dtype, c.size(), "all_reduce_mean");
    std::size_t at = 0;
    for (std::size_t i = 0; i < k; ++i) {
      const std::size_t b = std::size_t(a.out[i].numel()) * es;
      std::memcpy(a.out[i].data, packed + at, b);
      at += b;
    }
  }
  ++run;
}

// A bucket's scratch: the packed gradients, then the reduction's.
inline std::size_t all_reduce_mean_workspace(const ops::AllReduceMean& op, std::span<const TensorMeta> in,
                                             std::span<const TensorMeta>) {
  std::size_t n = 0;
  for (int i = 0; i < op.tensors(); ++i) n += std::size_t(in[std::size_t(i)].shape.numel());
  const std::size_t reduce = op.communicator().all_reduce_workspace(n, in[0].dtype);
  return op.tensors() == 1 ? reduce : align_up(n * dtype_size(in[0].dtype)) + reduce;
}

// ops::CollectiveStart and CollectiveDone for a table. The start's kernel
// is the table's kernel for the inner collective, with its scratch and
// in-place choices; the executor runs it on the step's communication
// thread. The done's is nothing: the executor waits for the start there,
// and its output is a view. `t` lives as long as its backend.
inline void add_collective_start(KernelTable& t) {
  t.add_forwarding<ops::CollectiveStart>("collective start");
  t.add<ops::CollectiveDone>([](const ops::CollectiveDone&, const KernelArgs&) {});
}

}  // namespace frugal::cpu
