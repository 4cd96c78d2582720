#pragma once
// The plan of one step: the order nodes run in, and where every arena value
// lives. plan/ reasons about sizes only; runtime/ carries the plan out.
#include <map>
#include <optional>
#include <sstream>

#include "budget.hpp"
#include "offsets.hpp"

namespace frugal {

struct Plan {
  std::vector<NodeId> schedule;
  std::vector<plan::Interval> intervals;
  std::vector<std::size_t> offsets;                 // parallel to intervals
  std::vector<std::optional<std::size_t>> offset_of;  // by value id; nullopt outside the arena
  std::size_t arena_bytes = 0;
  std::size_t lower_bound_bytes = 0;
  std::size_t persistent_bytes = 0;  // parameters and optimizer state
  std::map<std::string, std::size_t> persistent_by_kind;

  double arena_ratio() const { return lower_bound_bytes ? double(arena_bytes) / double(lower_bound_bytes) : 1.0; }
  std::size_t total_bytes() const { return arena_bytes + persistent_bytes; }

  std::string summary() const {
    std::ostringstream os;
    os << "plan: " << schedule.size() << " ops, " << intervals.size() << " arena values\n"
       << "  arena        " << format_bytes(arena_bytes) << "  (live-bytes lower bound "
       << format_bytes(lower_bound_bytes) << ", ratio " << arena_ratio() << ")\n";
    for (auto& [kind, bytes] : persistent_by_kind) os << "  " << kind << (kind.size() < 12 ? std::string(13 - kind.size(), ' ') : " ") << format_bytes(bytes) << "\n";
    os << "  total        " << format_bytes(total_bytes()) << "\n";
    return os.str();
  }
};

// Plans `g` in capture order. `roots` stay live to the end of the step.
inline Plan make_plan(const Graph& g, std::span<const ValueId> roots) {
  Plan p;
  std::vector<bool> live = g.live_nodes(roots);
  for (NodeId n = 0; n < NodeId(g.num_nodes()); ++n)
    if (live[std::size_t(n)]) p.schedule.push_back(n);
  p.intervals = plan::liveness(g, p.schedule, roots);
  auto placement = plan::assign_offsets(p.intervals);
  p.offsets = placement.offset;
  p.arena_bytes = placement.arena_bytes;
  p.lower_bound_bytes = plan::live_bytes_lower_bound(p.intervals, int(p.schedule.size()));
  p.offset_of.assign(g.num_values(), std::nullopt);
  for (std::size_t i = 0; i < p.intervals.size(); ++i) p.offset_of[std::size_t(p.intervals[i].value)] = p.offsets[i];
  for (const Value& v : g.values())
    if (!plan::in_arena(v)) {
      p.persistent_bytes += v.meta.nbytes();
      p.persistent_by_kind[v.kind == ValueKind::parameter ? "parameters" : "optimizer state"] += v.meta.nbytes();
    }
  return p;
}

}  // namespace frugal
