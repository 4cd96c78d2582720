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
#include "checks.hpp"
#include "loss_scaling.hpp"

namespace frugal {

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

  // Collectives run through graph ops (an i64 scalar the ops advance in
  // place). Every collective op of every step writes it, so a graph orders
  // its collectives as they were captured, identically on every rank.
  Tensor& collectives_run() {
    if (!sequence_.defined()) sequence_ = Tensor(Shape{}, DType::i64);
    return sequence_;
  }

 private:
  Tensor sequence_;
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

// Inputs (g, sequence [, skip]) -> g averaged over the ranks: the rank-order
// sum of Communicator::all_reduce_sum divided by size(), in g's dtype.
// `sequence` is Communicator::collectives_run(), written in place: the graph
// orders the collectives as captured, and a writer is never recomputed (a
// collective run again on one rank would wait forever for the others).
// `skip`, an f32 scalar every rank computes alike (gradient accumulation's
// micro-steps): where set, nothing is communicated and the output is not
// read.
class AllReduceMean final : public Op {
 public:
  ~AllReduceMean() override;
  AllReduceMean(std::shared_ptr<Communicator> c, std::string what) : comm_(std::move(c)), what_(std::move(what)) {
    if (!comm_) fail("all_reduce_mean: no communicator");
  }
  Communicator& communicator() const { return *comm_; }
  const std::string& what() const { return what_; }
  std::string name() const override { return "all_reduce_mean"; }
  bool is_collective() const override { return true; }
  std::vector<TensorMeta> infer(std::span<const TensorMeta> in) const override {
    expect_collective_inputs(name(), in, 1);
    expect_floating(name(), in[0]);
    return {in[0]};
  }
  std::vector<int> mutated_inputs() const override { return {1}; }
  std::vector<int> inplace_inputs() const override { return {0}; }
  Cost cost(std::span<const TensorMeta> in, std::span<const TensorMeta>) const override {
    // A ring's traffic: each element leaves and arrives 2 (n - 1) / n times.
    const double n = double(comm_->size());
    return {double(in[0].shape.numel()) * (n - 1), 2 * (n - 1) / n * double(in[0].nbytes()) * 2};
  }

 private:
  std::shared_ptr<Communicator> comm_;
  std::string what_;
};

}  // namespace frugal::ops

namespace frugal {

// g averaged over the ranks of `comm` (an identity on one rank); skipped
// where `skip` (an f32 scalar) is set.
inline Var all_reduce_mean(Var g, const std::shared_ptr<Communicator>& comm, std::string what,
                           std::optional<Var> skip = {}) {
  // A buffer: persistent, written by the step, neither a parameter nor optimizer state.
  Var sequence = persistent_var(comm->collectives_run(), ValueKind::buffer, "communicator.collectives_run");
  std::vector<Var> in{g, sequence};
  if (skip) in.push_back(*skip);
  return frugal::apply(std::make_shared<ops::AllReduceMean>(comm, std::move(what)), in)[0];
}

}  // namespace frugal
