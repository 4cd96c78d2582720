#pragma once
#include "var.hpp"

namespace frugal {

namespace detail {
inline Graph*& current_graph_slot() {
  thread_local Graph* g = nullptr;
  return g;
}
}  // namespace detail

// The graph a capture is recording into on this thread, or null outside one.
// Modules use it to turn their parameters into Vars.
inline Graph* current_graph() { return detail::current_graph_slot(); }

// Makes `g` the current graph for the lifetime of the scope.
class CaptureScope {
 public:
  explicit CaptureScope(Graph& g) : previous_(detail::current_graph_slot()) { detail::current_graph_slot() = &g; }
  ~CaptureScope() { detail::current_graph_slot() = previous_; }
  CaptureScope(const CaptureScope&) = delete;
  CaptureScope& operator=(const CaptureScope&) = delete;

 private:
  Graph* previous_;
};

// The Var of a parameter (or other persistent tensor) in the current capture.
inline Var persistent_var(const Tensor& t, ValueKind kind, const std::string& name) {
  Graph* g = current_graph();
  if (!g) fail(value_kind_name(kind), " '", name, "' was used outside a capture: call the model inside compile(...)");
  return {g, g->add_persistent(t, kind, name)};
}

// A tensor every step reads and none writes (a fixed feature matrix, a
// graph's adjacency), as a Var in the current capture. Unlike a step input,
// it is bound once: run() does not copy it in, and under a tight budget the
// planner can keep it on the host between its reads, like a parameter. The
// program keeps the tensor alive while the step lives; after changing its
// contents between steps, call step.parameters_changed().
inline Var constant(const Tensor& t, const std::string& name) { return persistent_var(t, ValueKind::constant, name); }

}  // namespace frugal
