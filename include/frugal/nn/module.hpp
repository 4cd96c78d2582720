#pragma once
// Modules hold named parameters and submodules; forward() works on Vars.
#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "../graph/capture.hpp"
#include "../graph/modes.hpp"
#include "../runtime/nvme_homes.hpp"

namespace frugal::nn {

class Module {
 public:
  Module() = default;
  virtual ~Module() = default;
  // Submodules point at their parent: a module stays where it was built.
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // Registers a submodule the caller keeps alive (usually a member).
  template <class M>
  M& register_module(std::string name, M& child) {
    static_assert(std::is_base_of_v<Module, M>, "register_module takes an nn::Module");
    for (auto& [n, _] : children_)
      if (n == name) fail("module '", qualified_name(), "' already has a submodule named '", name, "'");
    child.parent_ = this;
    child.name_in_parent_ = name;
    children_.push_back({std::move(name), &child});
    return child;
  }
  template <class M>
  std::shared_ptr<M> register_module(std::string name, std::shared_ptr<M> child) {
    register_module(std::move(name), *child);
    owned_.push_back(child);
    return child;
  }

  // The reference returned stays valid for the module's life, however many
  // more parameters and buffers are registered after it.
  Tensor& register_parameter(std::string name, Tensor t) {
    for (auto& [n, _] : params_)
      if (n == name) fail("module '", qualified_name(), "' already has a parameter named '", name, "'");
    for (auto& [n, _] : buffers_)
      if (n == name) fail("module '", qualified_name(), "' already has a buffer named '", name, "'");
    params_.push_back({std::move(name), std::move(t)});
    return params_.back().second;
  }

  // A buffer is persistent state the model keeps but the optimizer does not
  // train (BatchNorm's running statistics). Ops may update it in place.
  Tensor& register_buffer(std::string name, Tensor t) {
    for (auto& [n, _] : buffers_)
      if (n == name) fail("module '", qualified_name(), "' already has a buffer named '", name, "'");
    for (auto& [n, _] : params_)
      if (n == name) fail("module '", qualified_name(), "' already has a parameter named '", name, "'");
    buffers_.push_back({std::move(name), std::move(t)});
    return buffers_.back().second;
  }

  // Buffers of this module and all below it, depth first, named like
  // PyTorch's state_dict keys ("bn1.running_mean").
  std::vector<std::pair<std::string, Tensor>> named_buffers() const {
    std::vector<std::pair<std::string, Tensor>> out;
    collect_buffers("", out);
    return out;
  }
  std::vector<Tensor> buffers() const {
    std::vector<Tensor> out;
    for (auto& [_, t] : named_buffers()) out.push_back(t);
    return out;
  }

  // Parameters of this module and all below it, depth first, named like
  // PyTorch's state_dict keys ("fc1.weight"). One a step keeps on NVMe
  // between steps (PlanOptions::nvme_offload) gets its bytes back first, so
  // what this returns reads and writes the current weights.
  std::vector<std::pair<std::string, Tensor>> named_parameters() const {
    std::vector<std::pair<std::string, Tensor>> out;
    collect("", out);
    for (auto& [_, t] : out) NvmeHomes::registry().bring_back(t.raw());
    return out;
  }
  std::vector<Tensor> parameters() const {
    std::vector<Tensor> out;
    for (auto& [_, t] : named_parameters()) out.push_back(t);
    return out;
  }
  std::int64_t num_parameters() const {
    std::int64_t n = 0;
    for (auto& t : parameters()) n += t.numel();
    return n;
  }

  void train(bool on = true) {
    *training_ = on;
    for (auto& [_, c] : children_) c->train(on);
  }
  void eval() { train(false); }
  // The mode this module runs in. Inside a capture it is the capture's
  // (graph/modes.hpp): the flag, recorded so the step can report a later
  // change, or the mode the capture forces (eval for compile_inference).
  bool is_training() const {
    if (CaptureModes* m = current_capture_modes()) return m->read(training_, qualified_name());
    return *training_;
  }

  std::string qualified_name() const {
    if (!parent_) return "";
    std::string up = parent_->qualified_name();
    return up.empty() ? name_in_parent_ : up + "." + name_in_parent_;
  }

 protected:
  // The Var of one of this module's parameters in the current capture.
  Var var(const Tensor& t) const {
    for (auto& [n, p] : params_)
      if (p.raw() == t.raw()) {
        std::string q = qualified_name();
        return persistent_var(t, ValueKind::parameter, q.empty() ? n : q + "." + n);
      }
    fail("module '", qualified_name(), "': tensor is not one of its registered parameters");
  }
  // The Var of one of this module's buffers in the current capture: a buffer
  // value, bound to the buffer's storage, that ops may read or update.
  Var buffer_var(const Tensor& t) const {
    for (auto& [n, b] : buffers_)
      if (b.raw() == t.raw()) {
        std::string q = qualified_name();
        return persistent_var(t, ValueKind::buffer, q.empty() ? n : q + "." + n);
      }
    fail("module '", qualified_name(), "': tensor is not one of its registered buffers");
  }

 private:
  void collect(const std::string& prefix, std::vector<std::pair<std::string, Tensor>>& out) const {
    for (auto& [n, t] : params_) out.push_back({prefix + n, t});
    for (auto& [n, c] : children_) c->collect(prefix + n + ".", out);
  }
  void collect_buffers(const std::string& prefix, std::vector<std::pair<std::string, Tensor>>& out) const {
    for (auto& [n, t] : buffers_) out.push_back({prefix + n, t});
    for (auto& [n, c] : children_) c->collect_buffers(prefix + n + ".", out);
  }

  // Deques: register_parameter/register_buffer return references into them,
  // and a deque's push_back never moves the elements already there.
  std::deque<std::pair<std::string, Tensor>> params_;
  std::deque<std::pair<std::string, Tensor>> buffers_;
  std::vector<std::pair<std::string, Module*>> children_;
  std::vector<std::shared_ptr<Module>> owned_;
  Module* parent_ = nullptr;
  std::string name_in_parent_;
  // Shared with the steps captured from this module, which check it.
  std::shared_ptr<bool> training_ = std::make_shared<bool>(true);
};

// A module with one input and one output: what Sequential chains.
class Layer : public Module {
 public:
  virtual Var forward(Var x) = 0;
  Var operator()(Var x) { return forward(x); }
};

}  // namespace frugal::nn
