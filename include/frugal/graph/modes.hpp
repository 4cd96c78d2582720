#pragma once
// Train/eval modes during a capture. A module's train()/eval() flag is read
// when its forward() is captured (dropout on or off, batch norm on batch or
// running statistics), and the captured graph keeps that choice: a flag
// changed after compile cannot reach the step. So a capture records every
// flag it read, and the step compares them before each run, reporting a
// change instead of silently running in the old mode. A capture may also
// force one mode for all modules (compile_inference runs them in eval mode):
// then the flags are neither read nor changed.
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace frugal {

// One module's flag as a capture read it. The flag is shared with the
// module, so a step outliving its module still reads valid memory.
struct ModeRead {
  std::shared_ptr<const bool> flag;
  std::string module;  // the module's qualified name ("" for the top one)
  bool training;       // the flag's value when captured
};

// What the modules of one capture run in, and the flags it read.
struct CaptureModes {
  std::optional<bool> forced;  // set: every module runs so, whatever its flag
  std::vector<ModeRead> reads;

  // The mode a module with this flag runs in inside this capture.
  bool read(const std::shared_ptr<bool>& flag, const std::string& module) {
    if (forced) return *forced;
    for (auto& r : reads)
      if (r.flag == flag) return r.training;  // the first read decides, as in the graph
    reads.push_back({flag, module, *flag});
    return *flag;
  }
};

namespace detail {
inline CaptureModes*& current_modes_slot() {
  thread_local CaptureModes* m = nullptr;
  return m;
}
}  // namespace detail

// The modes of the capture running on this thread, or null outside one.
inline CaptureModes* current_capture_modes() { return detail::current_modes_slot(); }

// Makes `m` the current capture's modes for the lifetime of the scope.
class ModeScope {
 public:
  explicit ModeScope(CaptureModes& m) : previous_(detail::current_modes_slot()) { detail::current_modes_slot() = &m; }
  ~ModeScope() { detail::current_modes_slot() = previous_; }
  ModeScope(const ModeScope&) = delete;
  ModeScope& operator=(const ModeScope&) = delete;

 private:
  CaptureModes* previous_;
};

// The error a step reports when a flag it was captured under has changed.
inline std::string mode_change_message(const ModeRead& r) {
  const std::string who = r.module.empty() ? "the top-level module" : "module '" + r.module + "'";
  const char* now = r.training ? "eval" : "train";
  const char* then = r.training ? "train" : "eval";
  return who + " was switched to " + now + " mode after this step was compiled in " + then +
         " mode; a compiled step keeps the mode it was captured in (dropout, batch norm), so it would "
         "silently run in " + then + " mode. Switch the module back with " + (r.training ? "train()" : "eval()") +
         " before running this step, or compile a step for " + now +
         " mode (compile_inference runs modules in eval mode; CompileOptions::training forces a mode)";
}

}  // namespace frugal
