#pragma once
// The collectives and the sharded update of ZeRO stages 1 to 3
// (ops/zero.hpp). The update runs the backend's own kernel for the
// optimizer's op on the shard, so its arithmetic is the unsharded update's.
#include <cstring>
#include <vector>

#include "../../ops/zero.hpp"
#include "../../runtime/backend.hpp"

#include "abi.hpp"
#include "collective.hpp"

namespace frugal::cpu::inline FRUGAL_KERNEL_ABI {

namespace detail {
inline std::size_t aligned_part(std::size_t bytes) { return align_up(bytes); }

// x[i] / ranks in x's dtype, as the stage-0 all-reduce divides.
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

// Scratch of reduce_scatter_mean: the gradient padded to ranks * chunk
// elements (unless it already is that long), the rank's chunk (unless the
// output is a whole chunk), then the communicator's own.
struct ReduceScatterScratch {
  std::size_t padded = 0, chunk = 0, comm = 0;
  static ReduceScatterScratch of(const ops::ReduceScatterMean& op, DType dtype) {
    const ZeroShard& s = op.shard();
    const std::size_t es = dtype_size(dtype);
    const std::size_t whole = std::size_t(s.chunk) * std::size_t(s.ranks);
    return {std::size_t(s.numel) == whole ? 0 : aligned_part(whole * es),
            s.length == s.chunk ? 0 : aligned_part(std::size_t(s.chunk) * es),
            op.communicator().reduce_scatter_workspace(std::size_t(s.chunk), dtype)};
  }
  std::size_t total() const { return padded + chunk + comm; }
};
}  // namespace detail

inline void reduce_scatter_mean_kernel(const ops::ReduceScatterMean& op, const KernelArgs& a) {
  const ZeroShard& s = op.shard();
  const TensorRef& g = a.in[0];
  const std::size_t es = dtype_size(g.dtype);
  if (collective_skipped(a, 2)) {
    std::memset(a.out[0].data, 0, std::size_t(s.length) * es);
    return;
  }
  const auto scratch = detail::ReduceScatterScratch::of(op, g.dtype);
  auto* ws = static_cast<unsigned char*>(a.workspace);
  const void* send = g.data;
  if (scratch.padded) {
    const std::size_t whole = std::size_t(s.chunk) * std::size_t(s.ranks);
    std::memcpy(ws, g.data, std::size_t(s.numel) * es);
    std::memset(ws + std::size_t(s.numel) * es, 0, (whole - std::size_t(s.numel)) * es);
    send = ws;
  }
  void* recv = scratch.chunk ? ws + scratch.padded : a.out[0].data;
  std::int64_t& run = *a.in[1].as<std::int64_t>();
  Communicator& c = op.communicator();
  c.reduce_scatter_sum(send, recv, std::size_t(s.chunk), g.dtype, ws + scratch.padded + scratch.chunk,
                       cat(op.what(), ", step ", a.step + 1, ", collective ", run + 1, " of this communicator"));
  if (recv != a.out[0].data) std::memcpy(a.out[0].data, recv, std::size_t(s.length) * es);
  detail::divide_by_ranks(a.out[0].data, std::size_t(s.length), g.dtype, c.size(), "reduce_scatter_mean");
  ++run;
}

inline std::size_t reduce_scatter_mean_workspace(const ops::ReduceScatterMean& op, std::span<const TensorMeta> in,
                                                 std::span<const TensorMeta>) {
  return detail::ReduceScatterScratch::of(op, in[0].dtype).total();
}

inline void shard_slice_kernel(const ops::ShardSlice& op, const KernelArgs& a) {
  const std::size_t es = dtype_size(a.in[0].dtype);
  std::memcpy(a.out[0].data, a.in[0].as<unsigned char>() + std::size_t(op.shard().offset) * es,
              std::size_t(op.shard().length) * es);
}

// Scratch of all_gather_shards: this rank's chunk, padded to a whole one,
// then the gathered chunks unless they fit the parameter exactly (then they
// land in it).
inline std::size_t all_gather_shards_workspace(const ops::AllGatherShards& op, std::span<const TensorMeta> in,
                                               std::span<const TensorMeta>) {
  const ZeroShard& s = op.shard();
  const std::size_t es = dtype_size(in[0].dtype);
  const std::size_t whole = std::size_t(s.chunk) * std::size_t(s.ranks);
  return detail::aligned_part(std::size_t(s.chunk) * es) + (std::size_t(s.numel) == whole ? 0 : whole * es);
}

inline void all_gather_shards_kernel(const ops::AllGatherShards& op, const KernelArgs& a) {
  if (collective_skipped(a, 2)) return;  // the update it follows was skipped too
  const ZeroShard& s = op.shard();
  const TensorRef& p = a.in[0];
  const std::size_t es = dtype_size(p.dtype);
  const std::size_t whole = std::size_t(s.chunk) * std::size_t(s.ranks);
  auto* ws = static_cast<unsigned char*>(a.workspace);
  auto* param = p.as<unsigned char>();
  std::memcpy(ws, param + std::size_t(s.offset) * es, std::size_t(s.length) * es);
  std::memset(ws + std::size_t(s.length) * es, 0, std::size_t(s.chunk - s.length) * es);
  void* recv = std::size_t(s.numel) == whole ? static_cast<void*>(param) : ws + detail::aligned_part(std::size_t(s.chunk) * es);
  std::int64_t& run = *a.in[1].as<std::int64_t>();
  op.communicator().all_gather(ws, recv, std::size_t(s.chunk), p.dtype,
                               cat(op.what(), ", step ", a.step + 1, ", collective ", run + 1, " of this communicator"));
  if (recv != param) std::memcpy(param, recv, std::size_t(s.numel) * es);
  ++run;
}

// Scratch of all_gather_parameter: the shard padded to a whole chunk
// (unless it is one), then the gathered chunks unless they fill the output
// exactly (then they land in it).
inline std::size_t all_gather_parameter_workspace(const ops::AllGatherParameter& op, std::span<const TensorMeta> in,
                                                  std::span<const TensorMeta>) {
  const ZeroShard& s = op.shard();
  const std::size_t es = dtype_size(in[0].dtype);
  const std::size_t whole = std::size_t(s.chunk) * std::size_t(s.ranks);
  return (s.length == s.chunk ? 0 : detail::aligned_part(std::size_t(s.chunk) * es)) +
         (std::size_t(s.numel) == whole ? 0 : whole * es);
}

inline void all_gather_parameter_kernel(const ops::AllGatherParameter& op, const KernelArgs& a) {
  const ZeroShard& s = op.shard();
  const std::size_t es = dtype_size(a.in[0].dtype);
  const std::size_t whole = std::size_t(s.chunk) * std::size_t(s.ranks);
  auto* ws = static_cast<unsigned char*>(a.workspace);
  const void* send = a.in[0].data;
  std::size_t used = 0;
  if (s.length != s.chunk) {
    std::memcpy(ws, a.in[0].data, std::size_t(s.length) * es);
    std::memset(ws + std::size_t(s.length) * es, 0, std::size_t(s.chunk - s.length) * es);
    send = ws;
    used = detail::aligned_part(std::size_t(s.chunk) * es);
  }
  void* recv = std::size_t(s.numel) == whole ? a.out[0].data : static_cast<void*>(ws + used);
  std::int64_t& run = *a.in[1].as<std::int64_t>();
  op.communicator().all_gather(send, recv, std::size_t(s.chunk), a.in[0].dtype,
                               cat(op.what(), ", step ", a.step + 1, ", collective ", run + 1, " of this communicator"));
  if (recv != a.out[0].data) std::memcpy(a.out[0].data, recv, std::size_t(s.numel) * es);
  ++run;
}

// The kernel of ops::ShardedUpdate for a table: the table's kernel for the
// inner op, run with input 0 narrowed to the shard. `t` is the table it is
// added to, which lives as long as its backend.
inline void add_sharded_update(KernelTable& t) {
  const KernelTable* table = &t;
  auto inner_entry = [table](const ops::ShardedUpdate& op) -> const KernelEntry& {
    const KernelEntry* e = table->find(op.inner());
    if (!e) fail("sharded update: this backend has no kernel for ", op.inner().name());
    return *e;
  };
  t.add<ops::ShardedUpdate>(
      [inner_entry](const ops::ShardedUpdate& op, const KernelArgs& a) {
        std::vector<TensorRef> in(a.in.begin(), a.in.end());
        const Shape shard{op.shard().length};
        in[0].data = in[0].as<unsigned char>() + std::size_t(op.shard().offset) * dtype_size(in[0].dtype);
        in[0].shape = &shard;
        KernelArgs narrowed = a;
        narrowed.in = in;
        inner_entry(op).run(op.inner(), narrowed);
      },
      [inner_entry](const ops::ShardedUpdate& op, std::span<const TensorMeta> in, std::span<const TensorMeta> out) {
        const KernelEntry& e = inner_entry(op);
        if (!e.workspace) return std::size_t(0);
        auto m = op.inner_metas(in);
        return e.workspace(op.inner(), m, out);
      });
}

}  // namespace frugal::cpu
