#pragma once
// The next-use manager's decisions over an access trace, shared by its
// simulation in virtual time (plan/paging_sim.hpp, simulate_next_use) and
// its run-time form (runtime/paged_step.hpp, PagedStep), so the two make
// the same choices by construction.
//
// It knows the current step's graph and not the next one's: within a step
// a tensor's next use is exact; past the step's end, a persistent's is
// predicted at its position in this step, and anything else is never used
// again.
#include <algorithm>
#include <cstddef>
#include <limits>
#include <optional>
#include <vector>

#include "access_trace.hpp"

namespace frugal::plan {

class NextUses {
 public:
  static constexpr std::size_t kNever = std::numeric_limits<std::size_t>::max();

  explicit NextUses(const AccessTrace& trace) : trace_(&trace), uses_(trace.tensors.size()) {
    const std::size_t N = trace.ops.size();
    step_start_.assign(std::size_t(trace.steps) + 1, N);
    for (std::size_t i = N; i-- > 0;) step_start_[std::size_t(trace.ops[i].step)] = i;
    for (std::size_t i = 0; i < N; ++i)
      for (const auto* list : {&trace.ops[i].reads, &trace.ops[i].writes})
        for (int t : *list)
          if (uses_[std::size_t(t)].empty() || uses_[std::size_t(t)].back() != i) uses_[std::size_t(t)].push_back(i);
  }

  // The op after op i that next touches tensor t, as the manager at op i
  // knows it (kNever: not again).
  std::size_t after(int t, std::size_t i) const {
    const auto& u = uses_[std::size_t(t)];
    const int step = trace_->ops[i].step;
    auto it = std::upper_bound(u.begin(), u.end(), i);
    if (it != u.end() && trace_->ops[*it].step == step) return *it;
    if (!trace_->tensors[std::size_t(t)].persistent) return kNever;
    const std::size_t s0 = step_start_[std::size_t(step)], s1 = step_start_[std::size_t(step) + 1];
    auto first = std::lower_bound(u.begin(), u.end(), s0);
    return first != u.end() && *first < s1 ? s1 + (*first - s0) : kNever;
  }

  // What to evict at op i so that `bytes` more fit in `capacity` beside
  // `used`: of the `resident` tensors, none in `keep` and none used before
  // op `before`, those used furthest ahead first (the lower index first
  // among equals), until the bytes fit. Nothing where `bytes` fit already;
  // nullopt where evicting every candidate would not make room.
  std::optional<std::vector<int>> victims(const std::vector<int>& resident, std::size_t used, std::size_t bytes,
                                          std::size_t capacity, std::size_t i, const std::vector<int>& keep,
                                          std::size_t before) const {
    if (used + bytes <= capacity) return std::vector<int>{};
    std::vector<std::pair<std::size_t, int>> ranked;
    for (int v : resident)
      if (std::find(keep.begin(), keep.end(), v) == keep.end())
        if (const std::size_t nu = after(v, i); nu > before) ranked.push_back({nu, v});
    std::sort(ranked.begin(), ranked.end(),
              [](auto& a, auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); });
    std::vector<int> out;
    std::size_t freed = 0;
    for (std::size_t k = 0; used - freed + bytes > capacity && k < ranked.size(); ++k) {
      freed += trace_->tensors[std::size_t(ranked[k].second)].bytes;
      out.push_back(ranked[k].second);
    }
    if (used - freed + bytes > capacity) return std::nullopt;
    return out;
  }

 private:
  const AccessTrace* trace_;
  std::vector<std::vector<std::size_t>> uses_;  // per tensor, the ops that touch it, in order
  std::vector<std::size_t> step_start_;         // per step, its first op; then the trace's end
};

}  // namespace frugal::plan
