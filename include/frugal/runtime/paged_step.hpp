#pragma once
// A step run op by op under a run-time manager of whole tensors, for what
// cannot be planned ahead: a shape seen for the first time, where solving a
// budget would cost more than the step, or a device share that changes from
// run to run. No budget is solved: the step's graph, captured and scheduled
// with nothing evicted (plan_training or plan_inference with no budget),
// tells the manager when every tensor is used next, and it keeps the
// tensors in a device pool of `capacity` bytes as it goes (CPPE's idea:
// prefetch and eviction that know each other, instead of LRU):
//
// - before op i, each tensor it reads or writes that is not on the device
//   comes (a demand fetch), evicting the resident tensors used furthest
//   ahead; a tensor op i makes needs room but no copy;
// - then the tensors the rest of the step reads are fetched in the order
//   they are needed, each evicting only tensors used after it (so nothing is
//   evicted that the prefetcher would bring back sooner), until the first
//   one there is no room for;
// - an evicted tensor the device wrote since it came is written back to the
//   host first; an activation is freed without a copy after its last use.
//
// These are the decisions plan::simulate_next_use makes on trace() (the
// same policy in virtual time), so its counts are this manager's. Tensors
// sit at 256-byte aligned offsets, as in a planned arena, so every kernel
// takes the same paths and a paged run computes bit for bit what the
// step's static plan computes; when the pool has the bytes but not in one
// piece, the resident tensors are moved down to close the gaps (counted).
//
// Parameters and optimizer state are the user's tensors: they stay on the
// device between runs once fetched, the ones a run wrote are copied back
// into the user's tensors at its end, and a run that fails leaves them as
// they were (a written parameter evicted mid-run goes to a copy of the
// manager's own, not to the user's tensor). Call parameters_changed() after
// writing them between runs. Copies here are synchronous: on the CPU
// backend, the only one this runs on today, the "device" is memory too.
// The overlap of copies and compute is what the simulator prices.
#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "../plan/access_trace.hpp"
#include "../plan/next_use.hpp"
#include "compile.hpp"
#include "threads.hpp"

namespace frugal {

class PagedStep {
 public:
  struct Stats {
    std::size_t faults = 0;         // demand fetches of tensors with content on the host
    std::size_t prefetches = 0;     // fetches ahead of the op that reads them
    std::size_t bytes_in = 0;       // host to pool (slot bytes: sizes rounded up to 256)
    std::size_t bytes_out = 0;      // pool to host: write-backs of evicted tensors
    std::size_t evictions = 0;      // tensors evicted to make room (dead ones freed aside)
    std::size_t compactions = 0;    // times the pool's gaps were closed to fit a tensor
    std::size_t bytes_compacted = 0;
    std::size_t bytes_flushed = 0;  // written parameters and state copied to the user's tensors at a run's end
    std::size_t peak_bytes = 0;     // the most the pool held at once
  };

  // `planned`: the step planned with no budget; `opt`: the optimizer it was
  // planned with (a training step), or null. Refuses a pool smaller than
  // the largest op's tensors (whole-tensor management needs them at once),
  // naming the op and the bytes.
  PagedStep(const PlannedStep& planned, Optimizer* opt, std::size_t capacity, CompileOptions o = {})
      : graph_(planned.graph), schedule_(planned.plan.schedule), inputs_(planned.inputs), loss_(planned.loss),
        outputs_(planned.outputs), opt_(opt), layout_(planned.optimizer_layout), capacity_(capacity),
        threads_(o.threads), trace_(trace_of(planned)), next_(trace_), slots_(trace_.tensors.size()) {
    backend_ = detail::backend_for(o);
    if (!backend_->host_addressable())
      fail<BudgetError>("PagedStep: backend '", backend_->name(), "' keeps its tensors in memory of its own; the run-time "
                        "manager moves tensors within host-addressable memory only (the CPU backend) for now");
    if (!planned.plan.decisions.empty())
      fail("PagedStep: give it the step planned with no budget (plan_training or plan_inference with Budget{}); "
           "this plan already moves tensors itself");
    const Graph& g = *graph_;
    for (NodeId n : schedule_) {
      const Node& node = g.node(n);
      if (node.op->is_collective() || node.op->as_transfer())
        fail("PagedStep: op ", node.op->name(), " (a collective or a transfer) cannot run under the run-time manager; "
             "page a single-process step planned with no budget");
    }
    const std::size_t largest = trace_.largest_op(), need = trace_.ops.empty() ? 0 : trace_.op_bytes(largest);
    if (need > capacity_)
      throw BudgetError(cat("PagedStep: a pool of ", format_bytes(capacity_), " (", capacity_, " bytes) cannot hold op ",
                            largest, " (", g.node(schedule_[largest]).op->name(), ")'s tensors at once; give it at least ",
                            format_bytes(need), " (", need, " bytes)"),
                        need);
    pool_ = static_cast<unsigned char*>(backend_->allocate(std::max<std::size_t>(capacity_, kAlignment)));
    if (!pool_) fail("PagedStep: could not allocate a pool of ", format_bytes(capacity_));
  }
  PagedStep(const PagedStep&) = delete;
  PagedStep& operator=(const PagedStep&) = delete;
  ~PagedStep() {
    if (pool_) backend_->deallocate(pool_);
  }

  // Runs the step on `inputs` (in the order it was planned with); returns
  // the loss (NaN for an inference step, whose outputs output() gives).
  template <class... Ts>
  float run(const Ts&... inputs) {
    const std::array<const Tensor*, sizeof...(Ts)> list{&inputs...};
    return run_inputs(list);
  }
  float run_inputs(std::span<const Tensor* const> inputs);

  const Tensor& output(std::size_t i = 0) const { return outputs_host_.at(i); }
  // Counts over every run so far, and over the last run alone.
  const Stats& stats() const { return total_; }
  const Stats& last_run() const { return last_; }
  std::int64_t steps_run() const { return steps_; }
  std::size_t capacity() const { return capacity_; }
  // The accesses of one run as the manager sees them: tensor t is value t,
  // its bytes its slot's; the step's results live to its end. What
  // plan::simulate_next_use replays to price this manager.
  const plan::AccessTrace& trace() const { return trace_; }
  // The same for a planned step, without a pool: its largest_op_bytes() is
  // the least pool it can run in; its footprint() the most one run has live
  // at once (a later run also finds the last run's persistents in the pool).
  static plan::AccessTrace trace_of(const PlannedStep& planned);
  // After writing parameters or optimizer state between runs: the pool's
  // copies are dropped and fetched again.
  void parameters_changed() { drop_all(); }

 private:
  struct Slot {
    std::size_t offset = 0;
    bool resident = false, dirty = false, populated = false;
    const void* host = nullptr;         // where its content lives off the pool
    std::unique_ptr<void, void (*)(void*)> own{nullptr, std::free};  // a home of the manager's own
  };

  std::size_t slot_bytes(ValueId v) const { return trace_.tensors[std::size_t(v)].bytes; }
  bool make_room(std::size_t bytes, std::size_t i, const std::vector<ValueId>& keep, std::size_t before);
  void evict(ValueId v);
  void place(ValueId v, bool prefetch);
  std::size_t allocate(std::size_t bytes);
  void release(ValueId v);
  void* home_for_write(ValueId v);
  void drop_all();
  void finish_run();
  TensorRef ref(ValueId v) const {
    const Value& val = graph_->value(v);
    return {pool_ + slots_[std::size_t(v)].offset, val.meta.dtype, &val.meta.shape};
  }

  std::shared_ptr<const Graph> graph_;
  std::vector<NodeId> schedule_;
  std::vector<ValueId> inputs_;
  ValueId loss_ = kNoValue;
  std::vector<ValueId> outputs_;
  Optimizer* opt_ = nullptr;
  std::shared_ptr<const Optimizer::Layout> layout_;  // the state and shards it trains (Optimizer::trains)
  std::size_t capacity_ = 0;
  int threads_ = 0;
  std::shared_ptr<Backend> backend_;
  unsigned char* pool_ = nullptr;
  plan::AccessTrace trace_;
  plan::NextUses next_;  // over trace_: declared after it
  std::vector<Slot> slots_;
  std::map<std::size_t, ValueId> by_offset_;    // the resident tensors, in pool order
  std::size_t used_ = 0;
  std::vector<Tensor> outputs_host_;
  Stats total_, last_;
  std::int64_t steps_ = 0;
};

// Tensor t of the trace is value t. A value the schedule never touches
// stays in the trace with its bytes and no access.
inline plan::AccessTrace PagedStep::trace_of(const PlannedStep& p) {
  const Graph& g = *p.graph;
  const std::size_t V = g.num_values(), N = p.plan.schedule.size();
  plan::AccessTrace trace;
  trace.tensors.resize(V);
  for (ValueId v = 0; v < ValueId(V); ++v) {
    const Value& val = g.value(v);
    const bool persistent = is_persistent(val.kind);
    if (persistent && !val.external.defined())
      fail("internal error: PagedStep: ", plan::describe_value(g, v), " has no tensor of its own");
    trace.tensors[std::size_t(v)] = {align_up(std::max<std::size_t>(val.meta.nbytes(), 1)), persistent,
                                     persistent || val.producer < 0, plan::describe_value(g, v)};
  }
  std::vector<long> last(V, -1);
  trace.ops.resize(N);
  for (std::size_t i = 0; i < N; ++i) {
    const Node& node = g.node(p.plan.schedule[i]);
    plan::TraceOp& op = trace.ops[i];
    op.reads.assign(node.inputs.begin(), node.inputs.end());
    op.writes = plan::written_by(node);
    for (const auto* list : {&op.reads, &op.writes})
      for (int v : *list) last[std::size_t(v)] = long(i);
  }
  std::vector<char> result(V, 0);
  for (ValueId r : p.roots) result[std::size_t(r)] = 1;
  for (ValueId v : p.outputs) result[std::size_t(v)] = 1;
  if (p.loss != kNoValue) result[std::size_t(p.loss)] = 1;
  for (ValueId v = 0; v < ValueId(V); ++v)
    if (last[std::size_t(v)] >= 0 && !trace.tensors[std::size_t(v)].persistent && !result[std::size_t(v)])
      trace.ops[std::size_t(last[std::size_t(v)])].dies.push_back(v);
  trace.steps = 1;
  return trace;
}

// Room for `bytes` at op i, evicting as the next-use manager chooses (none
// of `keep`, none used before op `before`). False (and nothing evicted)
// where there is none.
inline bool PagedStep::make_room(std::size_t bytes, std::size_t i, const std::vector<ValueId>& keep,
                                 std::size_t before) {
  std::vector<int> resident;
  for (const auto& [offset, v] : by_offset_) resident.push_back(v);
  const auto victims = next_.victims(resident, used_, bytes, capacity_, i, keep, before);
  if (!victims) return false;
  for (int v : *victims) evict(v);
  return true;
}

// A home off the pool for a value the device wrote: the manager's own (a
// parameter's too, so a run that fails leaves the user's tensor alone).
inline void* PagedStep::home_for_write(ValueId v) {
  Slot& s = slots_[std::size_t(v)];
  if (!s.own) {
    void* p = std::aligned_alloc(kAlignment, slot_bytes(v));
    if (!p) fail("PagedStep: out of host memory writing back ", trace_.tensors[std::size_t(v)].name);
    s.own.reset(p);
  }
  return s.own.get();
}

inline void PagedStep::evict(ValueId v) {
  Slot& s = slots_[std::size_t(v)];
  if (s.dirty) {
    void* home = home_for_write(v);
    backend_->copy_to_host(home, pool_ + s.offset, graph_->value(v).meta.nbytes());
    s.host = home;
    s.dirty = false;
    last_.bytes_out += slot_bytes(v);
  }
  ++last_.evictions;
  release(v);
}

inline void PagedStep::release(ValueId v) {
  Slot& s = slots_[std::size_t(v)];
  by_offset_.erase(s.offset);
  s.resident = false;
  used_ -= slot_bytes(v);
}

// The lowest gap of `bytes`; where the bytes are free but not in one piece,
// the resident tensors move down, in order, to close the gaps first.
inline std::size_t PagedStep::allocate(std::size_t bytes) {
  std::size_t at = 0;
  for (const auto& [offset, v] : by_offset_) {
    if (offset - at >= bytes) return at;
    at = offset + slot_bytes(v);
  }
  if (capacity_ - at >= bytes) return at;
  std::map<std::size_t, ValueId> moved;
  at = 0;
  for (const auto& [offset, v] : by_offset_) {
    if (offset != at) {
      std::memmove(pool_ + at, pool_ + offset, slot_bytes(v));
      last_.bytes_compacted += slot_bytes(v);
    }
    slots_[std::size_t(v)].offset = at;
    moved[at] = v;
    at += slot_bytes(v);
  }
  by_offset_ = std::move(moved);
  ++last_.compactions;
  return at;
}

inline void PagedStep::place(ValueId v, bool prefetch) {
  Slot& s = slots_[std::size_t(v)];
  const std::size_t bytes = slot_bytes(v);
  s.offset = allocate(bytes);
  by_offset_[s.offset] = v;
  s.resident = true;
  used_ += bytes;
  last_.peak_bytes = std::max(last_.peak_bytes, used_);
  if (!s.populated) {  // made here by its first writer: room, no copy
    s.populated = true;
    return;
  }
  backend_->copy_to_device(pool_ + s.offset, s.host, graph_->value(v).meta.nbytes());
  last_.bytes_in += bytes;
  if (prefetch) ++last_.prefetches;
  else ++last_.faults;
}

// Everything off the pool, nothing written back: a failed run, changed
// parameters, or the end of a run's activations.
inline void PagedStep::drop_all() {
  for (Slot& s : slots_) {
    s.resident = s.dirty = s.populated = false;
    s.host = nullptr;
  }
  by_offset_.clear();
  used_ = 0;
}

inline float PagedStep::run_inputs(std::span<const Tensor* const> inputs) {
  const Graph& g = *graph_;
  if (inputs.size() != inputs_.size())
    fail("PagedStep::run: expected ", inputs_.size(), " inputs, got ", inputs.size());
  for (std::size_t k = 0; k < inputs.size(); ++k) {
    const Value& v = g.value(inputs_[k]);
    if (inputs[k]->dtype() != v.meta.dtype || inputs[k]->shape() != v.meta.shape)
      fail<ShapeError>("PagedStep::run: input ", k, " ('", v.name, "') is ", dtype_name(inputs[k]->dtype()),
                       inputs[k]->shape().str(), " but the step was planned for ", v.meta.str());
  }
  ScopedThreads threads(threads_);
  last_ = Stats{};
  // Where each tensor's content is: the user's tensors, the inputs given;
  // a persistent the pool still holds from the last run is there already.
  for (ValueId v = 0; v < ValueId(g.num_values()); ++v) {
    Slot& s = slots_[std::size_t(v)];
    if (s.resident) continue;
    const Value& val = g.value(v);
    s.populated = trace_.tensors[std::size_t(v)].from_host;
    s.host = is_persistent(val.kind) ? val.external.raw() : nullptr;
  }
  for (std::size_t k = 0; k < inputs.size(); ++k) slots_[std::size_t(inputs_[k])].host = inputs[k]->raw();
  last_.peak_bytes = used_;
  Optimizer::RunStart before;
  if (opt_) before = opt_->start_run(layout_);
  try {
    const std::size_t N = schedule_.size();
    std::vector<TensorRef> in, out;
    for (std::size_t i = 0; i < N; ++i) {
      const plan::TraceOp& op = trace_.ops[i];
      std::vector<ValueId> here;
      for (const auto* list : {&op.reads, &op.writes})
        for (int t : *list)
          if (std::find(here.begin(), here.end(), t) == here.end()) here.push_back(t);
      for (ValueId t : here) {
        if (slots_[std::size_t(t)].resident) continue;
        if (!make_room(slot_bytes(t), i, here, i))
          fail("internal error: PagedStep: no room for op ", i, "'s tensors in a pool checked to hold them");
        place(t, false);
      }
      // Ahead: what the rest of the step reads, in the order it is needed.
      bool room = true;
      for (std::size_t j = i + 1; room && j < N; ++j)
        for (int t : trace_.ops[j].reads) {
          const Slot& s = slots_[std::size_t(t)];
          if (s.resident || !s.populated) continue;
          if (!make_room(slot_bytes(t), i, here, j)) {
            room = false;
            break;
          }
          place(t, true);
        }
      const Node& node = g.node(schedule_[i]);
      in.clear();
      out.clear();
      for (ValueId v : node.inputs) in.push_back(ref(v));
      for (ValueId v : node.results()) out.push_back(ref(v));
      void* workspace = nullptr;
      std::size_t workspace_bytes = 0;
      if (node.has_workspace) {
        workspace = ref(node.outputs.back()).data;
        workspace_bytes = g.value(node.outputs.back()).meta.nbytes();
      }
      backend_->kernel_for(*node.op)(*node.op, KernelArgs{in, out, std::uint64_t(steps_), workspace, workspace_bytes});
      for (int t : op.writes) slots_[std::size_t(t)].dirty = true;
      for (int t : op.dies) {
        Slot& s = slots_[std::size_t(t)];
        if (s.resident) release(t);
        s.dirty = s.populated = false;
      }
    }
    backend_->synchronize();
    finish_run();
  } catch (...) {
    if (opt_) opt_->undo_run(before);
    drop_all();  // the user's tensors were never written: the pool's copies go
    throw;
  }
  ++steps_;
  for (auto [sum, add] : {std::pair{&total_.faults, last_.faults}, {&total_.prefetches, last_.prefetches},
                          {&total_.bytes_in, last_.bytes_in}, {&total_.bytes_out, last_.bytes_out},
                          {&total_.evictions, last_.evictions}, {&total_.compactions, last_.compactions},
                          {&total_.bytes_compacted, last_.bytes_compacted}, {&total_.bytes_flushed, last_.bytes_flushed}})
    *sum += add;
  total_.peak_bytes = std::max(total_.peak_bytes, last_.peak_bytes);
  if (loss_ == kNoValue) return std::numeric_limits<float>::quiet_NaN();
  const Tensor& l = outputs_host_.front();
  if (l.dtype() == DType::f64) return float(l.data<double>()[0]);
  return l.data<float>()[0];
}

// The results to the caller, the written persistents into the user's
// tensors; activations and inputs leave the pool, persistents stay.
inline void PagedStep::finish_run() {
  const Graph& g = *graph_;
  std::vector<ValueId> results;
  if (loss_ != kNoValue) results.push_back(loss_);
  results.insert(results.end(), outputs_.begin(), outputs_.end());
  outputs_host_.clear();
  for (ValueId v : results) {
    const Value& val = g.value(v);
    Tensor t(val.meta.shape, val.meta.dtype);
    const Slot& s = slots_[std::size_t(v)];
    if (s.resident) backend_->copy_to_host(t.raw(), pool_ + s.offset, t.nbytes());
    else if (s.host) std::memcpy(t.raw(), s.host, t.nbytes());
    outputs_host_.push_back(std::move(t));
  }
  for (ValueId v = 0; v < ValueId(g.num_values()); ++v) {
    Slot& s = slots_[std::size_t(v)];
    const Value& val = g.value(v);
    if (!is_persistent(val.kind)) {
      if (s.resident) release(v);
      s.dirty = s.populated = false;
      continue;
    }
    void* user = val.external.raw();
    if (s.resident && (s.dirty || (s.host && s.host != user))) {  // written in the pool, or fetched from its written copy
      backend_->copy_to_host(user, pool_ + s.offset, val.meta.nbytes());
      last_.bytes_flushed += slot_bytes(v);
    } else if (!s.resident && s.host && s.host != user) {
      std::memcpy(user, s.host, val.meta.nbytes());  // written, evicted to the manager's copy
      last_.bytes_flushed += slot_bytes(v);
    }
    s.dirty = false;
    s.host = user;
  }
}

}  // namespace frugal
