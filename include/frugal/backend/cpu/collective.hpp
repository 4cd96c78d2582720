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
  const int ranks = c.size();
  if (ranks > 1) switch (g.dtype) {
      case DType::f32: detail::divide_by<float>(out.data, n, ranks); break;
      case DType::f64: detail::divide_by<double>(out.data, n, ranks); break;
      case DType::bf16: detail::divide_by_widened<BFloat16>(out.data, n, ranks); break;
      case DType::f16: detail::divide_by_widened<Half>(out.data, n, ranks); break;
      default: fail("all_reduce_mean: dtype ", dtype_name(g.dtype), " is not a floating type");
    }
  ++run;
}

inline std::size_t all_reduce_mean_workspace(const ops::AllReduceMean& op, std::span<const TensorMeta> in,
                                             std::span<const TensorMeta>) {
  return op.communicator().all_reduce_workspace(std::size_t(in[0].shape.numel()), in[0].dtype);
}

}  // namespace frugal::cpu
