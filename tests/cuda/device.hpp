#pragma once
// What the cuda_* tests share: the skip rule (exit 77, "skipped: no CUDA
// device", which ctest reads as SKIP_RETURN_CODE 77) and a plain check
// counter, so the tests need no Catch2 (a lent GPU machine may not have it).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <frugal/frugal.hpp>

namespace cuda_test {

inline int failures = 0;

// The backend, or exit 77 where this program has it but the machine has no
// device; a program built without CUDA is a failure (the test must not
// pass by skipping there).
inline std::shared_ptr<frugal::Backend> cuda_backend_or_skip() {
  try {
    return frugal::make_backend("cuda");
  } catch (const frugal::Error& e) {
    const std::string what = e.what();
    if (what.find("no CUDA device") != std::string::npos) {
      std::printf("skipped: no CUDA device (%s)\n", what.c_str());
      std::exit(77);
    }
    std::printf("FAIL: make_backend(\"cuda\"): %s\n", what.c_str());
    std::exit(1);
  }
}

inline void expect(bool ok, const std::string& what) {
  if (!ok) {
    ++failures;
    std::printf("FAIL: %s\n", what.c_str());
  }
}

inline int finish(const char* name) {
  if (failures) std::printf("%s: %d check(s) failed\n", name, failures);
  else std::printf("%s: all checks passed\n", name);
  return failures ? 1 : 0;
}

// One training run of a step test: the losses, the parameters' bytes after
// the last step, what the plan says, and (when asked) the audit.
struct Run {
  std::vector<float> losses;
  std::vector<std::vector<unsigned char>> params;
  std::size_t device_bytes = 0, budget = 0, unconstrained = 0, total_planned = 0, decisions = 0;
  frugal::Step::Audit audit;
};

// Runs `steps` steps of `step` on batch(0), batch(1), ... and records them;
// the audit (when asked) runs after them on batch(steps), since it runs the
// step twice more.
template <class Batch>
Run record_run(frugal::Step& step, const std::vector<frugal::Tensor>& params, const frugal::Budget& budget, int steps,
               Batch&& batch, bool do_audit) {
  Run r;
  r.budget = budget.device;
  r.unconstrained = step.plan().unconstrained_bytes ? step.plan().unconstrained_bytes : step.plan().total_bytes();
  r.total_planned = step.plan().total_bytes();
  r.decisions = step.plan().decisions.size();
  for (int s = 0; s < steps; ++s) {
    auto [x, y] = batch(s);
    r.losses.push_back(step.run(x, y));
  }
  r.device_bytes = step.measured_device_bytes();
  for (const frugal::Tensor& p : params) {
    auto* b = static_cast<const unsigned char*>(p.raw());
    r.params.emplace_back(b, b + p.nbytes());
  }
  if (do_audit) {
    auto [x, y] = batch(steps);
    r.audit = step.audit(x, y);
  }
  return r;
}

// Losses and parameters bit for bit.
inline bool same_bits(const Run& a, const Run& b) {
  if (a.losses.size() != b.losses.size()) return false;
  for (std::size_t i = 0; i < a.losses.size(); ++i)
    if (std::memcmp(&a.losses[i], &b.losses[i], sizeof(float)) != 0) return false;
  return a.params == b.params;
}

}  // namespace cuda_test
