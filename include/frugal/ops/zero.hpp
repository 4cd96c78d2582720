#pragma once
// ZeRO sharding (stages 1 to 3): each rank keeps the optimizer state of one
// contiguous shard of every parameter and updates only that shard; an
// all-gather then gives every rank the whole updated parameter. Stage 2 also
// reduces each gradient straight to the shard the rank updates (a
// reduce-scatter) instead of averaging it whole. Stage 3 keeps only the
// shard of the parameter too, and gathers the whole one where the step
// reads it.
//
// The arithmetic is stage 0's, element for element: the shard's gradient is
// the same rank-order sum divided by the rank count, and the update is the
// optimizer's own elementwise op run on the shard, so every stage gives the
// same bits.
#include <algorithm>
#include <cstring>
#include <vector>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "../core/tensor.hpp"
#include "../graph/capture.hpp"
#include "checks.hpp"
#include "collective.hpp"

namespace frugal {

// Rank `rank`'s shard of a parameter of `numel` elements split over `ranks`:
// chunks of ceil(numel / ranks) elements, rank r's starting at r * chunk (the
// chunks a reduce-scatter of a zero-padded buffer hands out).
struct ZeroShard {
  int rank = 0, ranks = 1;
  std::int64_t numel = 0;
  std::int64_t chunk = 0;   // ceil(numel / ranks)
  std::int64_t offset = 0;  // rank * chunk
  std::int64_t length = 0;  // this rank's elements: chunk, or fewer on the last ranks

  static ZeroShard of(std::int64_t numel, int rank, int ranks) {
    ZeroShard s{rank, ranks, numel, 0, 0, 0};
    s.chunk = (numel + ranks - 1) / ranks;
    s.offset = std::int64_t(rank) * s.chunk;
    s.length = std::clamp<std::int64_t>(numel - s.offset, 0, s.chunk);
    return s;
  }
  // Every rank's shard holds at least one element. A parameter smaller than
  // that (a bias of 3 over 4 ranks) is not sharded: it is all-reduced and
  // updated whole on every rank, as at stage 0.
  bool every_rank_has_elements() const { return std::int64_t(ranks - 1) * chunk < numel; }
  std::string str() const { return cat("elements [", offset, ", ", offset + length, ") of ", numel); }
};

// Every rank's chunk of a tensor of s.numel elements gathered into `whole`,
// with `scratch` of gather_scratch_bytes() bytes: this rank's s.length
// elements at `shard` are sent from the scratch, zero-padded to a whole
// chunk (from where they are when they are a whole chunk outside `whole`),
// and the chunks land in `whole` when they fill it exactly, else in the
// scratch, copied from there. A collective: every rank calls it in the same
// order. The gathering kernels and Step::gather_parameters share it.
inline std::size_t gather_scratch_bytes(const ZeroShard& s, DType dtype, bool shard_in_whole) {
  const std::size_t es = dtype_size(dtype), chunk = std::size_t(s.chunk), all = chunk * std::size_t(s.ranks);
  const bool padded_send = shard_in_whole || s.length != s.chunk;
  return (padded_send ? align_up(chunk * es) : 0) + (std::size_t(s.numel) == all ? 0 : all * es);
}
inline void gather_chunks(Communicator& comm, const ZeroShard& s, const void* shard, void* whole, DType dtype,
                          void* scratch, bool shard_in_whole, const std::string& what) {
  const std::size_t es = dtype_size(dtype), chunk = std::size_t(s.chunk), all = chunk * std::size_t(s.ranks);
  auto* ws = static_cast<unsigned char*>(scratch);
  const void* send = shard;
  std::size_t used = 0;
  if (shard_in_whole || s.length != s.chunk) {
    std::memcpy(ws, shard, std::size_t(s.length) * es);
    std::memset(ws + std::size_t(s.length) * es, 0, (chunk - std::size_t(s.length)) * es);
    send = ws;
    used = align_up(chunk * es);
  }
  void* recv = std::size_t(s.numel) == all ? whole : static_cast<void*>(ws + used);
  comm.all_gather(send, recv, chunk, dtype, what);
  if (recv != whole) std::memcpy(whole, recv, std::size_t(s.numel) * es);
}
// gather_chunks outside any step, from a shard held apart from `whole`.
inline void gather_shards(Communicator& comm, const ZeroShard& s, const void* shard, void* whole, DType dtype,
                          const std::string& what) {
  std::vector<unsigned char> scratch(gather_scratch_bytes(s, dtype, false));
  gather_chunks(comm, s, shard, whole, dtype, scratch.data(), false, what);
}

}  // namespace frugal

namespace frugal::ops {

// Inputs (g1..gk, sequence [, skip]) -> this rank's shard of each g averaged
// over the ranks: Communicator::reduce_scatter_sum of g zero-padded to
// ranks * chunk elements, divided by the rank count in g's dtype. A bucket
// (k > 1) of gradients of one dtype is one collective: the kernel packs
// each rank's chunks of every gradient together, so one message carries
// them all, and each element's rank-order sum is the one it would get
// alone. `sequence` and `skip` as for AllReduceMean (ops/collective.hpp).
class ReduceScatterMean final : public Op {
 public:
  ~ReduceScatterMean() override;
  ReduceScatterMean(std::shared_ptr<Communicator> c, ZeroShard s, std::string what)
      : ReduceScatterMean(std::move(c), std::vector<ZeroShard>{s}, std::move(what)) {}
  ReduceScatterMean(std::shared_ptr<Communicator> c, std::vector<ZeroShard> shards, std::string what)
      : comm_(std::move(c)), shards_(std::move(shards)), what_(std::move(what)) {
    if (!comm_) fail("reduce_scatter_mean: no communicator");
    if (shards_.empty()) fail("reduce_scatter_mean (", what_, "): a bucket of no gradients");
    for (const ZeroShard& s : shards_)
      if (s.rank != shards_[0].rank || s.ranks != shards_[0].ranks)
        fail("reduce_scatter_mean (", what_, "): a bucket's shards are of one rank of one rank count; ", s.str(),
             " and ", shards_[0].str());
  }
  Communicator& communicator() const { return *comm_; }
  const std::vector<ZeroShard>& shards() const { return shards_; }
  int tensors() const { return int(shards_.size()); }
  const std::string& what() const { return what_; }
  std::string name() const override { return "reduce_scatter_mean"; }
  bool is_collective() const override { return true; }
  std::vector<TensorMeta> infer(std::span<const TensorMeta> in) const override {
    const std::size_t k = shards_.size();
    expect_collective_inputs(name(), in, k);
    std::vector<TensorMeta> out;
    for (std::size_t i = 0; i < k; ++i) {
      expect_float_storage(name(), in[i]);  // bf16/f16 too, as AllReduceMean
      if (in[i].dtype != in[0].dtype)
        fail(name(), " (", what_, "): a bucket's gradients share one dtype; gradient ", i, " is ", dtype_name(in[i].dtype),
             ", gradient 0 ", dtype_name(in[0].dtype));
      if (in[i].shape.numel() != shards_[i].numel)
        fail<ShapeError>(name(), " (", what_, "): gradient ", i, " has ", in[i].shape.numel(),
                         " elements, its shard was cut from ", shards_[i].numel);
      out.push_back({in[i].dtype, Shape{shards_[i].length}});
    }
    return out;
  }
  std::vector<int> mutated_inputs() const override { return {tensors()}; }
  Cost cost(std::span<const TensorMeta> in, std::span<const TensorMeta>) const override {
    // A ring reduce-scatter: each element leaves and arrives (n - 1) / n times.
    const double n = double(comm_->size());
    double elements = 0, bytes = 0;
    for (std::size_t i = 0; i < shards_.size(); ++i) {
      elements += double(in[i].shape.numel());
      bytes += double(in[i].nbytes());
    }
    return {elements * (n - 1) / n, (n - 1) / n * bytes * 2};
  }

 private:
  std::shared_ptr<Communicator> comm_;
  std::vector<ZeroShard> shards_;
  std::string what_;
};

// x (numel elements) -> its elements [offset, offset + length): stage 1 takes
// the rank's shard of a gradient that was averaged whole.
class ShardSlice final : public Op {
 public:
  ~ShardSlice() override;
  explicit ShardSlice(ZeroShard s) : shard_(s) {}
  const ZeroShard& shard() const { return shard_; }
  std::string name() const override { return "shard_slice"; }
  std::vector<TensorMeta> infer(std::span<const TensorMeta> in) const override {
    expect_arity(name(), in, 1);
    if (in[0].shape.numel() != shard_.numel)
      fail<ShapeError>(name(), ": the input has ", in[0].shape.numel(), " elements, the shard was cut from ", shard_.numel);
    return {{in[0].dtype, Shape{shard_.length}}};
  }

 private:
  ZeroShard shard_;
};

// An optimizer's update op (AdamWUpdate, SgdUpdate, or a program's own) run
// on one shard of its parameter: input 0 is the whole parameter, whose
// elements [offset, offset + length) the inner op sees as its input 0; every
// other input is the inner op's own (the shard's gradient and state, the
// loss scaler's scalars). Each backend runs the inner op's kernel on that
// range, so the update's arithmetic is written once.
class ShardedUpdate final : public Op {
 public:
  ~ShardedUpdate() override;
  ShardedUpdate(std::shared_ptr<const Op> inner, ZeroShard s) : inner_(std::move(inner)), shard_(s) {
    if (!inner_) fail("sharded update: no update op");
    if (inner_->mutated_inputs().empty() || inner_->mutated_inputs().front() != 0)
      fail("sharded update: ", inner_->name(), " does not write its input 0, so it is no parameter update");
  }
  const Op& inner() const { return *inner_; }
  const ZeroShard& shard() const { return shard_; }
  std::string name() const override { return inner_->name() + "_sharded"; }
  // The metas the inner op sees: input 0 narrowed to the shard.
  std::vector<TensorMeta> inner_metas(std::span<const TensorMeta> in) const {
    std::vector<TensorMeta> m(in.begin(), in.end());
    if (!m.empty()) m[0].shape = Shape{shard_.length};
    return m;
  }
  std::vector<TensorMeta> infer(std::span<const TensorMeta> in) const override {
    if (in.empty() || in[0].shape.numel() != shard_.numel)
      fail<ShapeError>(name(), ": the parameter has ", in.empty() ? 0 : in[0].shape.numel(),
                       " elements, the shard was cut from ", shard_.numel);
    auto m = inner_metas(in);
    return inner_->infer(m);
  }
  std::vector<int> mutated_inputs() const override { return inner_->mutated_inputs(); }
  Cost cost(std::span<const TensorMeta> in, std::span<const TensorMeta> out) const override {
    auto m = inner_metas(in);
    return inner_->cost(m, out);
  }

 private:
  std::shared_ptr<const Op> inner_;
  ZeroShard shard_;
};

// Inputs (p, sequence [, skip]): every rank's shard of p, gathered into p on
// every rank (Communicator::all_gather of the zero-padded chunks). Writes p
// and the sequence; no output, unless `signals`: then an f32 scalar, for a
// gather run beside compute (ops::CollectiveStart) to end in, its sequence
// Communicator::updated_gathers_run().
class AllGatherShards final : public Op {
 public:
  ~AllGatherShards() override;
  AllGatherShards(std::shared_ptr<Communicator> c, ZeroShard s, std::string what, bool signals = false)
      : comm_(std::move(c)), shard_(s), what_(std::move(what)), signals_(signals) {
    if (!comm_) fail("all_gather_shards: no communicator");
  }
  bool signals() const { return signals_; }
  Communicator& communicator() const { return *comm_; }
  const ZeroShard& shard() const { return shard_; }
  const std::string& what() const { return what_; }
  std::string name() const override { return "all_gather_shards"; }
  bool is_collective() const override { return true; }
  std::vector<TensorMeta> infer(std::span<const TensorMeta> in) const override {
    expect_collective_inputs(name(), in, 1);
    if (in[0].shape.numel() != shard_.numel)
      fail<ShapeError>(name(), " (", what_, "): the parameter has ", in[0].shape.numel(),
                       " elements, the shard was cut from ", shard_.numel);
    if (signals_) return {{DType::f32, Shape{}}};
    return {};
  }
  std::vector<int> mutated_inputs() const override { return {0, 1}; }
  Cost cost(std::span<const TensorMeta> in, std::span<const TensorMeta>) const override {
    const double n = double(comm_->size());
    return {0, (n - 1) / n * double(in[0].nbytes()) * 2};
  }

 private:
  std::shared_ptr<Communicator> comm_;
  ZeroShard shard_;
  std::string what_;
  bool signals_ = false;
};

// ZeRO stage 3: inputs (shard, sequence) -> the whole parameter, gathered
// from every rank's shard (Communicator::all_gather of the zero-padded
// chunks), in the parameter's shape. The forward reads it where it would
// read the parameter; it is a value like an activation, which the planner
// keeps, swaps or frees and gathers again before the backward reads it
// (a recomputation: the shard does not change until the update; the
// sequence it advances only counts).
class AllGatherParameter final : public Op {
 public:
  ~AllGatherParameter() override;
  AllGatherParameter(std::shared_ptr<Communicator> c, ZeroShard s, Shape shape, std::string what)
      : comm_(std::move(c)), shard_(s), shape_(std::move(shape)), what_(std::move(what)) {
    if (!comm_) fail("all_gather_parameter: no communicator");
    if (shape_.numel() != shard_.numel)
      fail<ShapeError>("all_gather_parameter (", what_, "): shape ", shape_.str(), " does not hold the ", shard_.numel,
                       " elements the shard was cut from");
  }
  Communicator& communicator() const { return *comm_; }
  const ZeroShard& shard() const { return shard_; }
  const std::string& what() const { return what_; }
  std::string name() const override { return "all_gather_parameter"; }
  bool is_collective() const override { return true; }
  bool repeatable() const override { return true; }
  std::vector<TensorMeta> infer(std::span<const TensorMeta> in) const override {
    expect_arity(name(), in, 2);
    expect_scalar(name(), "the communicator's collective count", in[1], DType::i64);
    if (in[0].shape.numel() != shard_.length)
      fail<ShapeError>(name(), " (", what_, "): the shard has ", in[0].shape.numel(), " elements, not ", shard_.length);
    return {{in[0].dtype, shape_}};
  }
  std::vector<int> mutated_inputs() const override { return {1}; }
  Cost cost(std::span<const TensorMeta>, std::span<const TensorMeta> out) const override {
    const double n = double(comm_->size());
    return {0, (n - 1) / n * double(out[0].nbytes()) * 2};
  }

 private:
  std::shared_ptr<Communicator> comm_;
  ZeroShard shard_;
  Shape shape_;
  std::string what_;
};

}  // namespace frugal::ops

namespace frugal {

// This rank's shard of each gradient in `bucket` (shards[i] of bucket[i])
// averaged over the ranks of `comm`, as one collective; `overlap`: run
// beside compute (start_collective).
inline std::vector<Var> reduce_scatter_mean(const std::vector<Var>& bucket, const std::shared_ptr<Communicator>& comm,
                                            std::vector<ZeroShard> shards, std::string what,
                                            std::optional<Var> skip = {}, bool overlap = false) {
  return apply_collective(std::make_shared<ops::ReduceScatterMean>(comm, std::move(shards), std::move(what)),
                          collective_inputs(bucket, comm, skip), overlap);
}
inline Var reduce_scatter_mean(Var g, const std::shared_ptr<Communicator>& comm, const ZeroShard& s, std::string what,
                               std::optional<Var> skip = {}, bool overlap = false) {
  return reduce_scatter_mean(std::vector<Var>{g}, comm, {s}, std::move(what), skip, overlap)[0];
}

inline Var shard_slice(Var x, const ZeroShard& s) { return apply1<ops::ShardSlice>({x}, s); }

// Gathers every rank's updated shard of the parameter p into p.
inline void all_gather_shards(Var p, const std::shared_ptr<Communicator>& comm, const ZeroShard& s, std::string what,
                              std::optional<Var> skip = {}) {
  frugal::apply(std::make_shared<ops::AllGatherShards>(comm, s, std::move(what)), collective_inputs({p}, comm, skip));
}
// The same beside compute (start_collective), in the gathers' own sequence:
// returns the scalar its done yields, which the step keeps as a result so
// the done runs before the step ends (nothing in the step reads p after its
// update).
inline Var start_all_gather_shards(Var p, const std::shared_ptr<Communicator>& comm, const ZeroShard& s,
                                   std::string what, std::optional<Var> skip = {}) {
  std::vector<Var> in{p, persistent_var(comm->updated_gathers_run(), ValueKind::buffer, "communicator.updated_gathers_run")};
  if (skip) in.push_back(*skip);
  return start_collective(std::make_shared<ops::AllGatherShards>(comm, s, std::move(what), true), in)[0];
}

}  // namespace frugal
