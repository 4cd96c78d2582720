#pragma once
// What the cuda_* tests share: the skip rule (exit 77, "skipped: no CUDA
// device", which ctest reads as SKIP_RETURN_CODE 77) and a plain check
// counter, so the tests need no Catch2 (a lent GPU machine may not have it).
#include <algorithm>
#include <cmath>
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

// A GPU run under `b` (or, where the planner cannot meet it, at the least
// feasible budget its error names: feasibility depends only on the graph
// and the budget) against the unconstrained GPU run `free_run`: bit for bit,
// within the budget by measurement and by audit, and, where `must_bind`,
// with decisions made. train(budget, audit) runs the test's step.
template <class Train>
void check_budgeted_run(Train&& train, const Run& free_run, frugal::Budget b, const std::string& label, bool must_bind) {
  Run r;
  try {
    r = train(b, true);
  } catch (const frugal::BudgetError& e) {
    std::printf("%s (%zu bytes) is infeasible: %s\n", label.c_str(), b.device, e.what());
    expect(e.smallest_feasible_bytes > 0 && e.smallest_feasible_bytes < free_run.total_planned,
           "an infeasible share names a smaller least feasible budget");
    b.device = e.smallest_feasible_bytes;
    r = train(b, true);
  }
  const std::string tag = label + " (" + std::to_string(b.device) + " bytes)";
  std::printf("%s: %zu decisions, measured device bytes %zu, audit high-water %zu (predicted %zu), canary %s\n",
              tag.c_str(), r.decisions, r.device_bytes, r.audit.high_water, r.audit.predicted,
              r.audit.canary_intact ? "intact" : "TOUCHED");
  expect(same_bits(free_run, r), tag + ": losses and parameters are bitwise the unconstrained GPU run's");
  expect(r.device_bytes <= b.device, tag + ": measured device bytes " + std::to_string(r.device_bytes) + " <= budget");
  expect(r.audit.canary_intact, tag + ": nothing written beyond the predicted peak");
  expect(r.audit.high_water <= r.audit.predicted, tag + ": the audit's high-water mark is at most the predicted peak");
  if (must_bind) expect(r.decisions > 0, tag + ": the budget binds (the planner made decisions)");
}

// The CPU and GPU runs' losses, step by step, within `tolerance` (each test
// derives its own), and the GPU run learns: its steps 0 and 16 see the same
// batch (a stream of four, repeated), and the loss falls between them.
inline void check_cpu_matches_gpu(const Run& cpu, const Run& gpu, double tolerance) {
  double worst = 0;
  for (std::size_t s = 0; s < cpu.losses.size() && s < gpu.losses.size(); ++s) {
    const double d = std::fabs(double(cpu.losses[s]) - double(gpu.losses[s]));
    worst = std::max(worst, d);
    expect(d <= tolerance, "step " + std::to_string(s) + ": cpu loss " + std::to_string(cpu.losses[s]) + " gpu loss " +
                               std::to_string(gpu.losses[s]));
  }
  expect(cpu.losses.size() == gpu.losses.size(), "the CPU and GPU runs took as many steps");
  expect(gpu.losses.size() > 16 && gpu.losses[16] < gpu.losses[0],
         "the GPU run learns (batch 0's loss falls from step 0 to step 16)");
  std::printf("%zu steps cpu vs gpu: largest |loss difference| %.3g (tolerance %.3g); loss %.4f -> %.4f\n",
              gpu.losses.size(), worst, tolerance, double(gpu.losses.front()), double(gpu.losses.back()));
}

}  // namespace cuda_test
