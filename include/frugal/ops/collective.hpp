#pragma once
// Collectives over the ranks of a data-parallel job, and the graph op that
// runs one. The Communicator interface is declared here, beside the op that
// calls it, so that ops/ and the backends can name it; dist/ implements it
// (dist/local.hpp: one rank; dist/mpi.hpp: processes under mpirun).
#include <cstddef>
#include <memory>
#include <optional>
#include <string>

#include "../core/tensor.hpp"
#include "../graph/capture.hpp"
#include "cast.hpp"
#include "checks.hpp"
#include "loss_scaling.hpp"

namespace frugal {

// A collective did not complete: a rank died, stopped or is stuck. The
// communicator it ran on cannot be used again; an elastic job
// (dist/elastic.hpp) goes on without the lost rank.
struct RankFailure : Error {
  using Error::Error;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual std::string name() const = 0;  // "local", "mpi"
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Every rank's `count` elements at `data` (the same count and dtype on
  // every rank) become their element-wise sum, added in rank order,
  // ((x0 + x1) + x2) + ..., in f32 for bf16 and f16 (rounded once): the same
  // bits on every rank and in every call, and the same sums
  // reduce_scatter_sum gives chunk by chunk. `workspace` holds
  // all_reduce_workspace(count, dtype) bytes. `what` names the call in
  // errors ("gradient of 'fc.weight', step 3").
  virtual void all_reduce_sum(void* data, std::size_t count, DType dtype, void* workspace, const std::string& what) = 0;
  virtual std::size_t all_reduce_workspace(std::size_t count, DType dtype) const = 0;
  // `send` holds size() chunks of `count` elements; this rank receives in
  // `recv` the rank-order sum of every rank's chunk rank(). `workspace`:
  // reduce_scatter_workspace(count, dtype) bytes.
  virtual void reduce_scatter_sum(const void* send, void* recv, std::size_t count, DType dtype, void* workspace,
                                  const std::string& what) = 0;
  virtual std::size_t reduce_scatter_workspace(std::size_t count, DType dtype) const = 0;
  // Every rank's `count` elements at `send`, in rank order in `recv`
  // (size() * count elements).
  virtual void all_gather(const void* send, void* recv, std::size_t count, DType dtype, const std::string& what) = 0;
  // `root`'s `count` elements at `data`, on every rank.
  virtual void broadcast(void* data, std::size_t count, DType dtype, int root, const std::string& what) = 0;
  virtual void barrier(const std::string& what) = 0;
  // Whether the calls may come from another thread than the one that made
  // the communicator, one thread at a time (MPI_THREAD_SERIALIZED). Where
  // they may, a step runs its collectives on a thread of their own, beside
  // compute (ops::CollectiveStart).
  virtual bool serialized_threads() const { return false; }
  // The ranks that share this machine's cores (this one included).
  virtual int ranks_on_this_machine() const { return size(); }

  // Collectives run through graph ops (an i64 scalar the ops advance in
  // place). Every collective op of every step writes it, so a graph orders
  // its collectives as they were captured, identically on every rank.
  Tensor& collectives_run() {
    if (!sequence_.defined()) sequence_ = Tensor(Shape{}, DType::i64);
    return sequence_;
  }
  // The same for ZeRO stages 1-2's gathers of updated shards run beside
  // compute: a sequence of their own, so they are ordered among themselves
  // (as the backward completes their gradients) and not after every
  // gradient collective; the schedule, the same on every rank, interleaves
  // the two (compile checks that the ranks' orders agree).
  Tensor& updated_gathers_run() {
    if (!gathers_.defined()) gathers_ = Tensor(Shape{}, DType::i64);
    return gathers_;
  }

 private:
  Tensor sequence_, gathers_;
};

}  // namespace frugal

namespace frugal::ops {

// A collective's inputs: `data` tensors, the sequence counter, and an
// optional skip flag.
inline void expect_collective_inputs(const std::string& op, std::span<const TensorMeta> in, std::size_t data) {
  if (in.size() != data + 1 && in.size() != data + 2)
    fail(op, ": expects ", data + 1, " or ", data + 2, " inputs, got ", in.size());
  expect_scalar(op, "the communicator's collective count", in[data], DType::i64);
  if (in.size() == data + 2) expect_scalar(op, "the skip flag", in[data + 1], DType::f32);
}

// Inputs (g1..gk, sequence [, skip]) -> each g averaged over the ranks:
// the rank-order sum of Communicator::all_reduce_sum divided by size(), in
// g's dtype. A bucket (k > 1) of gradients of one dtype is one collective:
// the kernel packs them into its scratch, reduces that, and unpacks, so one
// message carries them all and each element's sum is the one it would get
// alone. `sequence` is Communicator::collectives_run(), written in place:
// the graph orders the collectives as captured, and a writer is never
// recomputed (a collective run again on one rank would wait forever for the
// others). `skip`, an f32 scalar every rank computes alike (gradient
// accumulation's micro-steps): where set, nothing is communicated and the
// outputs are not read.
class AllReduceMean final : public Op {
 public:
  ~AllReduceMean() override;
  AllReduceMean(std::shared_ptr<Communicator> c, std::string what, int tensors = 1)
      : comm_(std::move(c)), what_(std::move(what)), tensors_(tensors) {
    if (!comm_) fail("all_reduce_mean: no communicator");
    if (tensors_ < 1) fail("all_reduce_mean: a bucket of ", tensors_, " gradients");
  }
  Communicator& communicator() const { return *comm_; }
  const std::string& what() const { return what_; }
  int tensors() const { return tensors_; }
  std::string name() const override { return "all_reduce_mean"; }
  bool is_collective() const override { return true; }
  std::vector<TensorMeta> infer(std::span<const TensorMeta> in) const override {
    const std::size_t k = std::size_t(tensors_);
    expect_collective_inputs(name(), in, k);
    for (std::size_t i = 0; i < k; ++i) {
      expect_float_storage(name(), in[i]);  // bf16/f16 too: the sum adds them in f32 (dist/rank_order_sum.hpp)
      if (in[i].dtype != in[0].dtype)
        fail(name(), " (", what_, "): a bucket's gradients share one dtype; gradient ", i, " is ", dtype_name(in[i].dtype),
             ", gradient 0 ", dtype_name(in[0].dtype));
    }
    return {in.begin(), in.begin() + std::ptrdiff_t(k)};
  }
  std::vector<int> mutated_inputs() const override { return {tensors_}; }
  // A bucket reads every gradient before it writes any output.
  std::vector<int> inplace_inputs() const override {
    std::vector<int> v(static_cast<std::size_t>(tensors_), 0);
    for (int i = 0; i < tensors_; ++i) v[std::size_t(i)] = i;
    return v;
  }
  Cost cost(std::span<const TensorMeta> in, std::span<const TensorMeta>) const override {
    // A ring's traffic: each element leaves and arrives 2 (n - 1) / n times.
    const double n = double(comm_->size());
    double elements = 0, bytes = 0;
    for (int i = 0; i < tensors_; ++i) {
      elements += double(in[std::size_t(i)].shape.numel());
      bytes += double(in[std::size_t(i)].nbytes());
    }
    return {elements * (n - 1), 2 * (n - 1) / n * bytes * 2};
  }

 private:
  std::shared_ptr<Communicator> comm_;
  std::string what_;
  int tensors_;
};

// A collective run beside compute. The start hands `inner` (a collective
// op) to the step's communication thread and returns at once; a done per
// output waits for it (the first to run waits, the others find it
// finished). Compute scheduled between the two overlaps the communication.
//
//   start(in...) -> (out1..outk [, scratch]);  done_j(out_j [, scratch], in...) -> out_j' (a view of out_j)
//   (the dones read the inputs that are not persistent)
//
// The dones read everything the thread reads or writes, so liveness keeps
// the inputs, the outputs and the scratch in place until the collective has
// finished, and readers read out_j', which exists only once it has. An
// output may take over an input in place, as the inner op allows
// (plan/liveness.hpp does not count a done's read of it as a later use).
class CollectiveStart final : public Op {
 public:
  ~CollectiveStart() override;
  explicit CollectiveStart(std::shared_ptr<const Op> inner) : inner_(std::move(inner)) {
    if (!inner_ || !inner_->is_collective()) fail("collective start: needs a collective op to run");
  }
  const Op& inner() const { return *inner_; }
  std::string name() const override { return inner_->name() + ".start"; }
  bool is_collective() const override { return true; }
  std::vector<TensorMeta> infer(std::span<const TensorMeta> in) const override { return inner_->infer(in); }
  std::vector<int> mutated_inputs() const override { return inner_->mutated_inputs(); }
  std::vector<int> inplace_inputs() const override { return inner_->inplace_inputs(); }
  Cost cost(std::span<const TensorMeta> in, std::span<const TensorMeta> out) const override { return inner_->cost(in, out); }

 private:
  std::shared_ptr<const Op> inner_;
};

// Inputs (out_j [, scratch], start's inputs...) -> out_j, once the
// collective that start began has finished.
class CollectiveDone final : public Op {
 public:
  ~CollectiveDone() override;
  explicit CollectiveDone(std::string inner) : inner_(std::move(inner)) {}
  std::string name() const override { return inner_ + ".done"; }
  std::vector<TensorMeta> infer(std::span<const TensorMeta> in) const override {
    if (in.empty()) fail(name(), ": expects the started collective's output");
    return {in[0]};
  }
  bool is_view() const override { return true; }  // and so costs nothing (Op::cost)

 private:
  std::string inner_;
};

}  // namespace frugal::ops

namespace frugal {

// The collective `op` on `in`, as a start and its dones
// (ops::CollectiveStart): the outputs, readable once it has finished. The
// start runs no earlier than the nodes `after` (a prefetch's place: ZeRO
// stage 3 starts a parameter's gather once the one before it is done).
inline std::vector<Var> start_collective(std::shared_ptr<const Op> op, const std::vector<Var>& in,
                                         const std::vector<NodeId>& after = {}) {
  Graph& g = *in.at(0).graph;
  const std::string name = op->name();
  std::vector<ValueId> ids;
  for (const Var& v : in) ids.push_back(v.id);
  g.apply(std::make_shared<ops::CollectiveStart>(std::move(op)), ids);
  if (!after.empty()) {
    std::vector<NodeId> before = g.node(g.last_node()).after;
    before.insert(before.end(), after.begin(), after.end());
    g.set_after(g.last_node(), std::move(before));
  }
  const Node& start = g.node(g.last_node());
  const std::vector<ValueId> outs(start.results().begin(), start.results().end());
  std::vector<ValueId> rest;  // the scratch, if any, and the inputs in the step's memory
  if (start.has_workspace) rest.push_back(start.outputs.back());
  // A persistent (the collective counter) stays put anyway, and a read of it
  // would order the next collective's start, which writes it, after this done.
  for (ValueId v : ids)
    if (!is_persistent(g.value(v).kind)) rest.push_back(v);
  auto done = std::make_shared<ops::CollectiveDone>(name);
  std::vector<Var> result;
  for (ValueId o : outs) {
    std::vector<ValueId> done_in{o};
    done_in.insert(done_in.end(), rest.begin(), rest.end());
    result.push_back(Var{&g, g.apply(done, std::move(done_in))[0]});
  }
  return result;
}

// A collective's inputs: `data`, the communicator's collective counter (a
// buffer: persistent, written by the step, neither a parameter nor
// optimizer state), and the skip flag where there is one.
inline std::vector<Var> collective_inputs(std::vector<Var> data, const std::shared_ptr<Communicator>& comm,
                                          const std::optional<Var>& skip = {}) {
  data.push_back(persistent_var(comm->collectives_run(), ValueKind::buffer, "communicator.collectives_run"));
  if (skip) data.push_back(*skip);
  return data;
}

// The collective `op` on `in`: where it is scheduled, or beside compute
// (`overlap`: start_collective).
inline std::vector<Var> apply_collective(std::shared_ptr<const Op> op, const std::vector<Var>& in, bool overlap) {
  return overlap ? start_collective(std::move(op), in) : frugal::apply(std::move(op), in);
}

// A bucket of gradients of one dtype averaged over the ranks of `comm` in
// one collective (ops::AllReduceMean; an identity on one rank); skipped
// where `skip` (an f32 scalar) is set; `overlap`: beside compute.
inline std::vector<Var> all_reduce_mean(const std::vector<Var>& bucket, const std::shared_ptr<Communicator>& comm,
                                        std::string what, std::optional<Var> skip = {}, bool overlap = false) {
  return apply_collective(std::make_shared<ops::AllReduceMean>(comm, std::move(what), int(bucket.size())),
                          collective_inputs(bucket, comm, skip), overlap);
}
// One gradient.
inline Var all_reduce_mean(Var g, const std::shared_ptr<Communicator>& comm, std::string what,
                           std::optional<Var> skip = {}, bool overlap = false) {
  return all_reduce_mean(std::vector<Var>{g}, comm, std::move(what), skip, overlap)[0];
}

}  // namespace frugal
