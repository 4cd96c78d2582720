#pragma once
// Which arena buffer each value lives in, and when each buffer is live.
//
// A buffer is the memory of one value, or of several: a view (reshape)
// shares its input's buffer, and an elementwise op may write its output over
// an input that dies at that op (in place). A buffer occupies the arena from
// the position that first writes it through the last position that reads any
// of its values, inclusive, so a kernel never writes over what it still reads.
#include <algorithm>
#include <vector>

#include "../graph/graph.hpp"
#include "../ops/collective.hpp"

namespace frugal::plan {

// Host pool and NVMe slots are aligned for O_DIRECT.
inline constexpr std::size_t kTierAlignment = 4096;

// Values that live in the step's arena (everything but persistent state).
inline bool in_arena(const Value& v) { return v.kind == ValueKind::input || v.kind == ValueKind::activation; }

struct Interval {
  ValueId value = kNoValue;  // the buffer's first value
  std::size_t bytes = 0;     // rounded up to kAlignment
  std::size_t used = 0;      // bytes actually written: the largest of its values
  int first = 0;
  int last = 0;
  bool overlaps(const Interval& o) const { return first <= o.last && o.first <= last; }
};

struct Buffers {
  std::vector<Interval> intervals;  // one per buffer
  std::vector<int> buffer_of;       // by value id; -1 outside the arena
};

// Inputs are written before position 0 (the step copies them in); `roots`
// (the loss, kept gradients, outputs) stay live through position `end`, one
// past the last op.
inline Buffers assign_buffers(const Graph& g, const std::vector<NodeId>& schedule, std::span<const ValueId> roots,
                              bool inplace = true) {
  const int end = int(schedule.size());
  std::vector<int> last(g.num_values(), -1);
  // The same, not counting a collective's done (ops::CollectiveDone): a
  // collective run beside compute may write its output over its input, which
  // its done reads only to keep it in place while the collective runs.
  std::vector<int> last_but_done(g.num_values(), -1);
  for (int pos = 0; pos < end; ++pos) {
    const Node& node = g.node(schedule[std::size_t(pos)]);
    const bool done = dynamic_cast<const ops::CollectiveDone*>(node.op.get()) != nullptr;
    for (ValueId i : node.inputs) {
      last[std::size_t(i)] = pos;
      if (!done) last_but_done[std::size_t(i)] = pos;
    }
  }
  for (ValueId r : roots) last[std::size_t(r)] = last_but_done[std::size_t(r)] = end;  // past the last op: nothing may reuse them

  Buffers b;
  b.buffer_of.assign(g.num_values(), -1);
  std::vector<int> buffer_last_but_done;  // by buffer
  auto open = [&](ValueId v, int pos) {
    b.buffer_of[std::size_t(v)] = int(b.intervals.size());
    std::size_t bytes = g.value(v).meta.nbytes();
    b.intervals.push_back({v, align_up(std::max<std::size_t>(bytes, 1)), bytes, pos, std::max(pos, last[std::size_t(v)])});
    buffer_last_but_done.push_back(std::max(pos, last_but_done[std::size_t(v)]));
  };
  auto join = [&](ValueId v, int buffer) {
    b.buffer_of[std::size_t(v)] = buffer;
    Interval& iv = b.intervals[std::size_t(buffer)];
    iv.last = std::max(iv.last, last[std::size_t(v)]);
    int& l = buffer_last_but_done[std::size_t(buffer)];
    l = std::max(l, last_but_done[std::size_t(v)]);
  };
  for (ValueId v : g.values_of_kind(ValueKind::input)) open(v, 0);

  for (int pos = 0; pos < end; ++pos) {
    const Node& node = g.node(schedule[std::size_t(pos)]);
    std::vector<int> taken;  // buffers this node's outputs already took over
    const bool started = dynamic_cast<const ops::CollectiveStart*>(node.op.get()) != nullptr;
    for (std::size_t k = 0; k < node.outputs.size(); ++k) {
      ValueId out = node.outputs[k];
      if (!in_arena(g.value(out))) continue;  // a host or NVMe copy
      const TensorMeta& om = g.value(out).meta;
      int chosen = -1;
      if (node.op->is_view() && k == 0 && b.buffer_of[std::size_t(node.inputs[0])] >= 0) {
        chosen = b.buffer_of[std::size_t(node.inputs[0])];  // a view shares memory whatever its lifetime
      } else if (inplace) {
        for (int i : node.inplace) {
          ValueId in = node.inputs[std::size_t(i)];
          int buf = b.buffer_of[std::size_t(in)];
          const TensorMeta& im = g.value(in).meta;
          bool same = im.dtype == om.dtype && im.shape == om.shape;
          bool dies_here = buf >= 0 && (started ? buffer_last_but_done[std::size_t(buf)]
                                                : b.intervals[std::size_t(buf)].last) == pos;
          if (same && dies_here && std::find(taken.begin(), taken.end(), buf) == taken.end()) {
            chosen = buf;
            break;
          }
        }
      }
      if (chosen >= 0) {
        join(out, chosen);
        taken.push_back(chosen);
      } else {
        open(out, pos);
      }
    }
  }
  return b;
}

}  // namespace frugal::plan
