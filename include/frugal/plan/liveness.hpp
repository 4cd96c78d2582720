#pragma once
// When each arena value is live, over a schedule of nodes.
#include <algorithm>
#include <vector>

#include "../graph/graph.hpp"

namespace frugal::plan {

// Values that live in the step's arena (everything but persistent state).
inline bool in_arena(const Value& v) { return v.kind == ValueKind::input || v.kind == ValueKind::activation; }

// A value occupies the arena from the schedule position that writes it
// through the last position that reads it, inclusive: a node's outputs and
// inputs are live together, so a kernel never writes over what it reads.
struct Interval {
  ValueId value = kNoValue;
  std::size_t bytes = 0;  // rounded up to kAlignment
  int first = 0;
  int last = 0;
  bool overlaps(const Interval& o) const { return first <= o.last && o.first <= last; }
};

// Inputs are written before position 0 (the step copies them in); `roots`
// (the loss, kept gradients, outputs) stay live through the end.
inline std::vector<Interval> liveness(const Graph& g, const std::vector<NodeId>& schedule,
                                      std::span<const ValueId> roots) {
  const int end = int(schedule.size());
  std::vector<int> first(g.num_values(), -1), last(g.num_values(), -1);
  for (ValueId v : g.values_of_kind(ValueKind::input)) first[std::size_t(v)] = last[std::size_t(v)] = 0;
  for (int pos = 0; pos < end; ++pos) {
    const Node& n = g.node(schedule[std::size_t(pos)]);
    for (ValueId o : n.outputs) first[std::size_t(o)] = last[std::size_t(o)] = pos;
    for (ValueId i : n.inputs) last[std::size_t(i)] = std::max(last[std::size_t(i)], pos);
  }
  for (ValueId r : roots) last[std::size_t(r)] = std::max(last[std::size_t(r)], std::max(end - 1, 0));
  std::vector<Interval> out;
  for (ValueId v = 0; v < ValueId(g.num_values()); ++v) {
    const Value& val = g.value(v);
    if (!in_arena(val) || first[std::size_t(v)] < 0) continue;
    out.push_back({v, align_up(std::max<std::size_t>(val.meta.nbytes(), 1)), first[std::size_t(v)],
                   last[std::size_t(v)]});
  }
  return out;
}

// The largest sum of simultaneously live bytes: no placement can do better.
inline std::size_t live_bytes_lower_bound(const std::vector<Interval>& intervals, int positions) {
  std::vector<std::ptrdiff_t> delta(std::size_t(positions) + 2, 0);
  for (auto& iv : intervals) {
    delta[std::size_t(iv.first)] += std::ptrdiff_t(iv.bytes);
    delta[std::size_t(iv.last) + 1] -= std::ptrdiff_t(iv.bytes);
  }
  std::ptrdiff_t cur = 0, best = 0;
  for (auto d : delta) best = std::max(best, cur += d);
  return std::size_t(best);
}

}  // namespace frugal::plan
