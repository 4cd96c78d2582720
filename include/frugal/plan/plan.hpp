#pragma once
// The plan of one step: the order nodes run in, and where every arena value
// lives. plan/ reasons about sizes only; runtime/ carries the plan out.
#include <map>
#include <optional>
#include <sstream>

#include "budget.hpp"
#include "offsets.hpp"
#include "schedule.hpp"

namespace frugal {

struct PlanOptions {
  bool reorder = true;  // run optimizer updates as soon as their gradient is complete
  bool inplace = true;  // let elementwise outputs take over inputs that die
};

struct Plan {
  std::vector<NodeId> schedule;
  std::vector<plan::Interval> intervals;              // one per arena buffer
  std::vector<std::size_t> offsets;                   // parallel to intervals
  std::vector<int> buffer_of;                         // by value id; -1 outside the arena
  std::vector<std::optional<std::size_t>> offset_of;  // by value id; nullopt outside the arena
  std::size_t arena_bytes = 0;        // what the arena reserves
  std::size_t peak_bytes = 0;         // the highest byte a step writes: the predicted high-water mark
  std::size_t lower_bound_bytes = 0;  // the most bytes live at once: no placement can beat it
  int peak_position = 0;              // where in the schedule that happens
  std::size_t persistent_bytes = 0;   // parameters and optimizer state
  std::map<std::string, std::size_t> persistent_by_kind;

  double arena_ratio() const { return lower_bound_bytes ? double(arena_bytes) / double(lower_bound_bytes) : 1.0; }
  std::size_t total_bytes() const { return arena_bytes + persistent_bytes; }
};

// Plans `g`. `roots` stay live to the end of the step.
inline Plan make_plan(const Graph& g, std::span<const ValueId> roots, PlanOptions o = {}) {
  Plan p;
  std::vector<bool> live = g.live_nodes(roots);
  if (o.reorder) {
    p.schedule = plan::schedule(g, live);
  } else {
    for (NodeId n = 0; n < NodeId(g.num_nodes()); ++n)
      if (live[std::size_t(n)]) p.schedule.push_back(n);
  }
  auto buffers = plan::assign_buffers(g, p.schedule, roots, o.inplace);
  p.intervals = std::move(buffers.intervals);
  p.buffer_of = std::move(buffers.buffer_of);
  auto placement = plan::assign_offsets(p.intervals);
  p.offsets = placement.offset;
  p.arena_bytes = placement.arena_bytes;
  for (std::size_t i = 0; i < p.intervals.size(); ++i)
    p.peak_bytes = std::max(p.peak_bytes, p.offsets[i] + p.intervals[i].used);

  // The lower bound, and where it is reached.
  std::vector<std::ptrdiff_t> live_at(p.schedule.size() + 2, 0);
  for (auto& iv : p.intervals) {
    live_at[std::size_t(iv.first)] += std::ptrdiff_t(iv.bytes);
    live_at[std::size_t(iv.last) + 1] -= std::ptrdiff_t(iv.bytes);
  }
  std::ptrdiff_t cur = 0, best = 0;
  for (std::size_t t = 0; t < p.schedule.size(); ++t)
    if ((cur += live_at[t]) > best) {
      best = cur;
      p.peak_position = int(t);
    }
  p.lower_bound_bytes = std::size_t(best);

  p.offset_of.assign(g.num_values(), std::nullopt);
  for (ValueId v = 0; v < ValueId(g.num_values()); ++v)
    if (p.buffer_of[std::size_t(v)] >= 0) p.offset_of[std::size_t(v)] = p.offsets[std::size_t(p.buffer_of[std::size_t(v)])];
  for (const Value& v : g.values())
    if (!plan::in_arena(v)) {
      p.persistent_bytes += v.meta.nbytes();
      p.persistent_by_kind[v.kind == ValueKind::parameter ? "parameters" : "optimizer state"] += v.meta.nbytes();
    }
  return p;
}

}  // namespace frugal
