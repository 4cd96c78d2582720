#pragma once
// The collectives and the sharded update of ZeRO stages 1 to 3
// (ops/zero.hpp). The update runs the backend's own kernel for the
// optimizer's op on the shard, so its arithmetic is the unsharded update's.
// And the host update of optimizer offload (ops/host_update.hpp).
#include <algorithm>
#include <cstring>
#include <vector>

#include "../../ops/host_update.hpp"
#include "../../ops/zero.hpp"
#include "../../runtime/backend.hpp"

#include "abi.hpp"
#include "collective.hpp"

namespace frugal::cpu::inline FRUGAL_KERNEL_ABI {

namespace detail {
// Scratch of reduce_scatter_mean. One gradient: the gradient padded to
// ranks * chunk elements (unless it already is that long), the rank's chunk
// (unless the output is a whole chunk), then the communicator's own. A
// bucket: every rank's chunks of every gradient packed rank by rank (ranks
// * C elements, C the sum of the chunks), the rank's C summed, then the
// communicator's own.
struct ReduceScatterScratch {
  std::size_t padded = 0, chunk = 0, comm = 0;
  static ReduceScatterScratch of(const ops::ReduceScatterMean& op, DType dtype) {
    const std::size_t es = dtype_size(dtype);
    const std::vector<ZeroShard>& shards = op.shards();
    if (shards.size() == 1) {
      const ZeroShard& s = shards[0];
      const std::size_t whole = std::size_t(s.chunk) * std::size_t(s.ranks);
      return {std::size_t(s.numel) == whole ? 0 : align_up(whole * es),
              s.length == s.chunk ? 0 : align_up(std::size_t(s.chunk) * es),
              op.communicator().reduce_scatter_workspace(std::size_t(s.chunk), dtype)};
    }
    const std::size_t c = bucket_chunk(op);
    return {align_up(c * std::size_t(shards[0].ranks) * es), align_up(c * es),
            op.communicator().reduce_scatter_workspace(c, dtype)};
  }
  static std::size_t bucket_chunk(const ops::ReduceScatterMean& op) {
    std::size_t c = 0;
    for (const ZeroShard& s : op.shards()) c += std::size_t(s.chunk);
    return c;
  }
  std::size_t total() const { return padded + chunk + comm; }
};
}  // namespace detail

inline void reduce_scatter_mean_kernel(const ops::ReduceScatterMean& op, const KernelArgs& a) {
  const std::vector<ZeroShard>& shards = op.shards();
  const std::size_t k = shards.size();
  const DType dtype = a.in[0].dtype;
  const std::size_t es = dtype_size(dtype);
  if (collective_skipped(a, k + 1)) {  // nothing reads the outputs: zeros, not stale bytes
    for (std::size_t i = 0; i < k; ++i) std::memset(a.out[i].data, 0, std::size_t(shards[i].length) * es);
    return;
  }
  const auto scratch = detail::ReduceScatterScratch::of(op, dtype);
  auto* ws = static_cast<unsigned char*>(a.workspace);
  std::int64_t& run = *a.in[k].as<std::int64_t>();
  Communicator& c = op.communicator();
  const std::string what = detail::collective_label(op.what(), a, run);
  if (k == 1) {
    const ZeroShard& s = shards[0];
    const void* send = a.in[0].data;
    if (scratch.padded) {
      const std::size_t whole = std::size_t(s.chunk) * std::size_t(s.ranks);
      std::memcpy(ws, a.in[0].data, std::size_t(s.numel) * es);
      std::memset(ws + std::size_t(s.numel) * es, 0, (whole - std::size_t(s.numel)) * es);
      send = ws;
    }
    void* recv = scratch.chunk ? ws + scratch.padded : a.out[0].data;
    c.reduce_scatter_sum(send, recv, std::size_t(s.chunk), dtype, ws + scratch.padded + scratch.chunk, what);
    if (recv != a.out[0].data) std::memcpy(a.out[0].data, recv, std::size_t(s.length) * es);
    detail::divide_by_ranks(a.out[0].data, std::size_t(s.length), dtype, c.size(), "reduce_scatter_mean");
  } else {
    // Rank r's block holds chunk r of every gradient in turn, zero past a
    // gradient's end; the rank's block comes back summed, and each output
    // is its gradient's part of it.
    const std::size_t chunks = detail::ReduceScatterScratch::bucket_chunk(op);
    unsigned char* packed = ws;
    unsigned char* summed = ws + scratch.padded;
    for (int r = 0; r < shards[0].ranks; ++r) {
      unsigned char* block = packed + std::size_t(r) * chunks * es;
      for (std::size_t i = 0; i < k; ++i) {
        const ZeroShard& s = shards[i];
        const std::int64_t from = std::int64_t(r) * s.chunk;
        const std::int64_t have = std::clamp<std::int64_t>(s.numel - from, 0, s.chunk);
        if (have > 0) std::memcpy(block, a.in[i].as<unsigned char>() + std::size_t(from) * es, std::size_t(have) * es);
        std::memset(block + std::size_t(have) * es, 0, std::size_t(s.chunk - have) * es);
        block += std::size_t(s.chunk) * es;
      }
    }
    c.reduce_scatter_sum(packed, summed, chunks, dtype, ws + scratch.padded + scratch.chunk, what);
    std::size_t at = 0;
    for (std::size_t i = 0; i < k; ++i) {
      std::memcpy(a.out[i].data, summed + at * es, std::size_t(shards[i].length) * es);
      detail::divide_by_ranks(a.out[i].data, std::size_t(shards[i].length), dtype, c.size(), "reduce_scatter_mean");
      at += std::size_t(shards[i].chunk);
    }
  }
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

// The two gathers: every rank's updated shard into the parameter (stages 1
// and 2; the shard lies inside it), and the parameter from the shards
// (stage 3), both through gather_chunks (ops/zero.hpp).
inline std::size_t all_gather_shards_workspace(const ops::AllGatherShards& op, std::span<const TensorMeta> in,
                                               std::span<const TensorMeta>) {
  return gather_scratch_bytes(op.shard(), in[0].dtype, true);
}

inline void all_gather_shards_kernel(const ops::AllGatherShards& op, const KernelArgs& a) {
  if (op.signals()) a.out[0].as<float>()[0] = 0.0f;
  if (collective_skipped(a, 2)) return;  // the update it follows was skipped too
  const ZeroShard& s = op.shard();
  const TensorRef& p = a.in[0];
  std::int64_t& run = *a.in[1].as<std::int64_t>();
  const std::string what =
      detail::collective_label(op.what(), a, run, op.signals() ? "gather of updated shards" : "collective");
  gather_chunks(op.communicator(), s, p.as<unsigned char>() + std::size_t(s.offset) * dtype_size(p.dtype), p.data,
                p.dtype, a.workspace, true, what);
  ++run;
}

inline std::size_t all_gather_parameter_workspace(const ops::AllGatherParameter& op, std::span<const TensorMeta> in,
                                                  std::span<const TensorMeta>) {
  return gather_scratch_bytes(op.shard(), in[0].dtype, false);
}

inline void all_gather_parameter_kernel(const ops::AllGatherParameter& op, const KernelArgs& a) {
  std::int64_t& run = *a.in[1].as<std::int64_t>();
  gather_chunks(op.communicator(), op.shard(), a.in[0].data, a.out[0].data, a.in[0].dtype, a.workspace, false,
                detail::collective_label(op.what(), a, run));
  ++run;
}

// The kernel of ops::ShardedUpdate for a table: the table's kernel for the
// inner op, run with input 0 narrowed to the shard. `t` is the table it is
// added to, which lives as long as its backend.
inline void add_sharded_update(KernelTable& t) {
  const KernelTable* table = &t;
  auto inner_entry = [table](const ops::ShardedUpdate& op) -> const KernelEntry& {
    return table->inner(op.inner(), "sharded update");
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

// The kernel of ops::HostUpdate: the table's kernel for the update it
// wraps. On the CPU the host is where every kernel runs; what changes is
// that the state it reads lives at its home, outside the arena.
inline void add_host_update(KernelTable& t) { t.add_forwarding<ops::HostUpdate>("host update"); }

}  // namespace frugal::cpu
