#pragma once
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "value.hpp"

namespace frugal {

struct Var;
class TransferOp;

// Work an op does, for the cost model and for throughput reports.
struct Cost {
  double flops = 0;
  double bytes = 0;
  // Evaluations of exp, log, tanh, erf and the like. Each costs tens of
  // cycles on a CPU where an add costs one, so GELU, softmax or attention's
  // exponentials bind an op before its bytes or its flops do
  // (DeviceProfile::transcendentals_per_s prices them).
  double transcendentals = 0;
  // Arithmetic in small tiles: fused attention's products over blocks of
  // (query, key) pairs, a head's few dimensions deep, which reach a fraction
  // of a large GEMM's rate (`flops`); DeviceProfile::tile_flops prices it.
  double tile_flops = 0;
};

// What autograd hands an op's backward: its inputs and outputs as Vars, and
// the gradient of the loss with respect to each output (nullopt where no
// gradient flows). The backward returns one entry per input.
struct BackwardArgs {
  std::span<const Var> inputs;
  std::span<const Var> outputs;
  std::span<const std::optional<Var>> grad_outputs;
};

// An operator: shape inference, its backward written as graph ops, and its
// cost. Kernels live in the backends, keyed by the op's C++ type, so graph/
// and ops/ never see a backend.
class Op {
 public:
  virtual ~Op() = default;
  virtual std::string name() const = 0;
  // Checks the inputs and returns the outputs' dtypes and shapes. Throws a
  // ShapeError naming the op and the offending shapes.
  virtual std::vector<TensorMeta> infer(std::span<const TensorMeta> inputs) const = 0;
  // Declared inline here so Op has no key function: a class's vtable and
  // virtual functions are then emitted only in files that make one. Defined
  // in var.hpp, with Var: include that (or graph/graph.hpp's users' var.hpp)
  // where an op is made.
  inline virtual std::vector<std::optional<Var>> backward(const BackwardArgs& args) const;
  virtual Cost cost(std::span<const TensorMeta> inputs, std::span<const TensorMeta> outputs) const {
    if (is_view()) return {};  // its output is its input's memory: nothing is read or written
    double bytes = 0;
    for (auto& m : inputs) bytes += double(m.nbytes());
    for (auto& m : outputs) bytes += double(m.nbytes());
    return {0, bytes};
  }
  // Inputs the op writes in place (optimizer updates write parameters and
  // state). Such an op is kept by dead-code elimination and ordered after
  // every other reader of what it writes.
  virtual std::vector<int> mutated_inputs() const { return {}; }
  // Inputs whose memory the output may take over when they die at this op,
  // in order of preference: the kernel reads element i of such an input
  // before it writes element i of the output, and never reads it again.
  // The input must have the output's shape and dtype.
  virtual std::vector<int> inplace_inputs() const { return {}; }
  // True when the output is input 0 reinterpreted (reshape): it shares that
  // input's memory instead of copying it.
  virtual bool is_view() const { return false; }
  // (Scratch space is not the op's to say: each backend's kernel table
  // answers it for its own kernel, runtime/backend.hpp.)
  // The op as a transfer between memory tiers (ops::Transfer, which the
  // budget planner inserts), or null for every other op. The planner, the
  // verifier, reports and the executor recognise transfers only through this.
  virtual const TransferOp* as_transfer() const { return nullptr; }
  // A collective over the ranks of a data-parallel job (ops/collective.hpp,
  // ops/zero.hpp): its scratch is reported as communication buffers.
  virtual bool is_collective() const { return false; }
  // Running it again gives the same outputs from the same inputs, although
  // it writes one (a collective advances the ranks' collective count, which
  // only numbers the collectives in errors): the planner may recompute it.
  virtual bool repeatable() const { return mutated_inputs().empty(); }
};

// What a transfer is, as plan/ and runtime/ see it (graph/ cannot name
// ops::Transfer, which implements it). A start hands a copy to the copy
// engine; the done with the same slot waits for it.
enum class TransferKind : std::uint8_t { evict_start, evict_done, fetch_start, fetch_done, write_back_start, write_back_done };

class TransferOp : public Op {
 public:
  TransferOp(TransferKind kind, int slot, std::string what) : kind_(kind), slot_(slot), what_(std::move(what)) {}
  TransferKind kind() const { return kind_; }
  int slot() const { return slot_; }
  bool is_start() const {
    return kind_ == TransferKind::evict_start || kind_ == TransferKind::fetch_start ||
           kind_ == TransferKind::write_back_start;
  }
  // What is moved, for plans and errors.
  const std::string& what() const { return what_; }
  const TransferOp* as_transfer() const final { return this; }

 private:
  TransferKind kind_;
  int slot_;
  std::string what_;
};

}  // namespace frugal
