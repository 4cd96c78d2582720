#pragma once
// Runs a Plan on a Backend: one arena allocated up front, every kernel bound
// and every operand address resolved before the first step, so a step itself
// allocates nothing.
#include <memory>
#include <vector>

#include "../plan/plan.hpp"
#include "backend.hpp"

namespace frugal {

class Executor {
 public:
  Executor(std::shared_ptr<const Graph> graph, const Plan& plan, Backend& backend)
      : graph_(std::move(graph)), backend_(backend) {
    arena_bytes_ = plan.arena_bytes;
    arena_ = static_cast<std::byte*>(backend_.allocate(arena_bytes_ + kCanaryBytes));
    address_.assign(graph_->num_values(), nullptr);
    for (ValueId v = 0; v < ValueId(graph_->num_values()); ++v) {
      const Value& val = graph_->value(v);
      if (plan.offset_of[std::size_t(v)])
        address_[std::size_t(v)] = arena_ + *plan.offset_of[std::size_t(v)];
      else if (val.external.defined())
        address_[std::size_t(v)] = val.external.raw();
    }
    for (NodeId n : plan.schedule) {
      const Node& node = graph_->node(n);
      Bound b{node.op.get(), &backend_.kernel_for(*node.op), {}, {}, nullptr, 0};
      for (ValueId i : node.inputs) b.in.push_back(ref(i));
      for (ValueId o : node.results()) b.out.push_back(ref(o));
      if (node.has_workspace) {
        ValueId w = node.outputs.back();
        b.workspace = ref(w).data;
        b.workspace_bytes = graph_->value(w).meta.nbytes();
      }
      bound_.push_back(std::move(b));
    }
  }
  ~Executor() {
    if (arena_) backend_.deallocate(arena_);
  }
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  void run(std::uint64_t step = 0) {
    for (const Bound& b : bound_) (*b.kernel)(*b.op, KernelArgs{b.in, b.out, step, b.workspace, b.workspace_bytes});
    backend_.synchronize();
  }

  void* address(ValueId v) const { return address_.at(std::size_t(v)); }
  std::size_t arena_bytes() const { return arena_bytes_; }

  // Beyond the arena lies a canary region: a step must never touch it.
  static constexpr std::size_t kCanaryBytes = 4096;

  // For audits: fill the arena and the canary with one byte value...
  void fill(unsigned char pattern) { backend_.fill(arena_, pattern, arena_bytes_ + kCanaryBytes); }
  // ...and, after a step, find one past the highest byte that differs from
  // it: the high-water mark of what the step actually wrote. Scans down from
  // the top through a small host window, so an audit costs no arena-sized copy.
  std::size_t touched_up_to(unsigned char pattern) const {
    unsigned char window[1 << 16];
    std::size_t end = arena_bytes_ + kCanaryBytes;
    while (end > 0) {
      std::size_t begin = end > sizeof window ? end - sizeof window : 0;
      backend_.copy_to_host(window, arena_ + begin, end - begin);
      for (std::size_t i = end - begin; i > 0; --i)
        if (window[i - 1] != pattern) return begin + i;
      end = begin;
    }
    return 0;
  }

 private:
  struct Bound {
    const Op* op;
    const Kernel* kernel;
    std::vector<TensorRef> in, out;
    void* workspace;
    std::size_t workspace_bytes;
  };
  TensorRef ref(ValueId v) const {
    const Value& val = graph_->value(v);
    if (!address_[std::size_t(v)]) fail("internal: value ", v, " (", val.meta.str(), ") has no storage in the plan");
    return {address_[std::size_t(v)], val.meta.dtype, &val.meta.shape};
  }

  std::shared_ptr<const Graph> graph_;
  Backend& backend_;
  std::byte* arena_ = nullptr;
  std::size_t arena_bytes_ = 0;
  std::vector<void*> address_;
  std::vector<Bound> bound_;
};

}  // namespace frugal
