#pragma once
// An independent check of a Plan. It shares no code with the planner: it
// replays the schedule over the arena byte ranges and tracks which values
// still hold their data, so a wrong schedule, a wrong offset or an unsafe
// in-place write shows up as a read of clobbered memory.
#include <sstream>
#include <string>
#include <vector>

#include "plan.hpp"

namespace frugal::plan {

struct VerifyReport {
  std::vector<std::string> errors;
  bool ok() const { return errors.empty(); }
  std::string str() const {
    std::ostringstream os;
    for (std::size_t i = 0; i < errors.size() && i < 20; ++i) os << errors[i] << "\n";
    if (errors.size() > 20) os << "... and " << errors.size() - 20 << " more\n";
    return os.str();
  }
};

inline VerifyReport verify(const Graph& g, const Plan& p, std::span<const ValueId> roots) {
  VerifyReport r;
  auto err = [&](auto&&... parts) { r.errors.push_back(cat(parts...)); };
  auto arena = [&](ValueId v) {
    const Value& val = g.value(v);
    return val.kind == ValueKind::input || val.kind == ValueKind::activation;
  };
  auto label = [&](ValueId v) {
    const Value& val = g.value(v);
    if (val.producer < 0) return cat("value ", v, " ('", val.name, "' ", val.meta.str(), ")");
    return cat("value ", v, " (", g.node(val.producer).op->name(), " output ", val.meta.str(), ")");
  };

  // 1. The schedule: each node once, after everything it reads and waits for.
  const int end = int(p.schedule.size());
  std::vector<int> pos_of(g.num_nodes(), -1);
  for (int t = 0; t < end; ++t) {
    NodeId n = p.schedule[std::size_t(t)];
    if (n < 0 || n >= NodeId(g.num_nodes())) {
      err("schedule position ", t, " names node ", n, ", which does not exist");
      return r;
    }
    if (pos_of[std::size_t(n)] >= 0) err("node ", n, " (", g.node(n).op->name(), ") is scheduled twice");
    pos_of[std::size_t(n)] = t;
  }
  for (int t = 0; t < end; ++t) {
    const Node& node = g.node(p.schedule[std::size_t(t)]);
    for (ValueId in : node.inputs) {
      NodeId prod = g.value(in).producer;
      if (prod >= 0 && (pos_of[std::size_t(prod)] < 0 || pos_of[std::size_t(prod)] >= t))
        err(node.op->name(), " at position ", t, " reads ", label(in), " before it is written");
    }
    for (NodeId a : node.after)
      if (pos_of[std::size_t(a)] > t)
        err(node.op->name(), " at position ", t, " writes state that node ", a, " (", g.node(a).op->name(),
            ") still has to read");
  }

  // 2. Every arena value has an aligned place inside the arena.
  std::vector<ValueId> present;
  for (ValueId v = 0; v < ValueId(g.num_values()); ++v) {
    if (!arena(v)) continue;
    NodeId prod = g.value(v).producer;
    if (prod >= 0 && pos_of[std::size_t(prod)] < 0) continue;  // never computed
    present.push_back(v);
    if (v >= ValueId(p.offset_of.size()) || !p.offset_of[std::size_t(v)]) {
      err(label(v), " has no arena offset");
      continue;
    }
    std::size_t off = *p.offset_of[std::size_t(v)];
    if (off % kAlignment) err(label(v), " sits at offset ", off, ", not a multiple of ", kAlignment);
    if (off + g.value(v).meta.nbytes() > p.arena_bytes)
      err(label(v), " at offset ", off, " ends past the arena (", p.arena_bytes, " bytes)");
  }
  if (!r.ok()) return r;

  // 3. Replay: which values still hold their bytes.
  std::vector<int> last_read(g.num_values(), -1);
  for (int t = 0; t < end; ++t)
    for (ValueId in : g.node(p.schedule[std::size_t(t)]).inputs) last_read[std::size_t(in)] = t;
  for (ValueId v : roots) last_read[std::size_t(v)] = end;
  auto begin_of = [&](ValueId v) { return *p.offset_of[std::size_t(v)]; };
  auto end_of = [&](ValueId v) { return begin_of(v) + std::max<std::size_t>(g.value(v).meta.nbytes(), 1); };
  auto overlap = [&](ValueId a, ValueId b) { return begin_of(a) < end_of(b) && begin_of(b) < end_of(a); };
  auto same_range = [&](ValueId a, ValueId b) { return begin_of(a) == begin_of(b) && end_of(a) == end_of(b); };

  std::vector<ValueId> holding;                       // values whose bytes are intact (and still needed)
  std::vector<ValueId> clobbered_by(g.num_values(), kNoValue);
  std::vector<char> written(g.num_values(), 0);
  auto write = [&](ValueId v, const Node* node, int t) {
    // A view placed on its input's bytes writes nothing: every value that
    // holds those bytes (its input, and what that input is itself a view of
    // or took over in place) still holds them.
    if (node && node->op->is_view() && v == node->outputs[0] && arena(node->inputs[0]) &&
        same_range(v, node->inputs[0])) {
      holding.push_back(v);
      written[std::size_t(v)] = 1;
      return;
    }
    std::vector<ValueId> keep;
    for (ValueId w : holding) {
      if (!overlap(v, w)) {
        keep.push_back(w);
        continue;
      }
      bool sanctioned = false;
      if (node) {
        for (int i : node->inplace)
          if (node->inputs[std::size_t(i)] == w && same_range(v, w) && g.value(w).meta.shape == g.value(v).meta.shape)
            sanctioned = true;
        bool is_input = std::find(node->inputs.begin(), node->inputs.end(), w) != node->inputs.end();
        if (is_input && !sanctioned)
          err(node->op->name(), " at position ", t, " writes ", label(v), " over its own input ", label(w),
              ", which its kernel does not allow");
      }
      clobbered_by[std::size_t(w)] = v;
    }
    keep.push_back(v);
    holding = std::move(keep);
    written[std::size_t(v)] = 1;
  };
  for (ValueId v : present)
    if (g.value(v).kind == ValueKind::input) write(v, nullptr, -1);
  for (int t = 0; t < end; ++t) {
    const Node& node = g.node(p.schedule[std::size_t(t)]);
    // A collective's done reads the inputs its start wrote outputs over in
    // place (plan/liveness.hpp): only to keep them until the collective ends.
    const bool done = dynamic_cast<const ops::CollectiveDone*>(node.op.get()) != nullptr;
    auto taken_by_start = [&](ValueId in) {
      const ValueId by = clobbered_by[std::size_t(in)];
      if (!done || by == kNoValue || g.value(by).producer != g.value(node.inputs[0]).producer) return false;
      return same_range(by, in);
    };
    for (ValueId in : node.inputs) {
      if (!arena(in)) continue;
      if (std::find(holding.begin(), holding.end(), in) == holding.end() && !taken_by_start(in))
        err(node.op->name(), " at position ", t, " reads ", label(in),
            written[std::size_t(in)] ? cat(" after ", label(clobbered_by[std::size_t(in)]), " overwrote it")
                                     : std::string(" that was never written"));
    }
    for (std::size_t a = 0; a < node.outputs.size(); ++a)
      for (std::size_t b = a + 1; b < node.outputs.size(); ++b)
        if (overlap(node.outputs[a], node.outputs[b]))
          err(node.op->name(), " at position ", t, ": two of its outputs share memory");
    for (ValueId out : node.outputs)
      if (arena(out)) write(out, &node, t);
    // Forget what nobody reads again, so the replay stays small.
    std::erase_if(holding, [&](ValueId v) { return last_read[std::size_t(v)] <= t; });
  }
  for (ValueId v : roots)
    if (arena(v) && std::find(holding.begin(), holding.end(), v) == holding.end())
      err("the step's result ", label(v), " is overwritten before the step ends");

  // 4. Fetches issued by the step before: nothing else may use their bytes
  // from that point to the end of the step, nor in the next step before the
  // fetch, and their source must be written back by then.
  for (const auto& e : p.early_fetches) {
    if (e.fetch < 0 || e.fetch >= end || e.after < 0 || e.after >= end) {
      err("an early fetch names positions ", e.fetch, " and ", e.after, " outside the schedule");
      continue;
    }
    const Node& f = g.node(p.schedule[std::size_t(e.fetch)]);
    auto* tr = f.op->as_transfer();
    if (!tr || tr->kind() != ops::TransferKind::fetch_start) {
      err("position ", e.fetch, " is marked as an early fetch but runs ", f.op->name());
      continue;
    }
    const ValueId dst = f.outputs[0];
    auto touches = [&](ValueId v) { return arena(v) && overlap(v, dst); };
    for (int t = 0; t < end; ++t) {
      if (t < e.fetch || t > e.after) {
        const Node& m = g.node(p.schedule[std::size_t(t)]);
        for (ValueId v : m.inputs)
          if (touches(v))
            err("the early fetch of ", label(dst), " at position ", e.fetch, " (issued after position ", e.after,
                " of the step before) overlaps ", label(v), " read at position ", t);
        for (ValueId v : m.outputs)
          if (touches(v))
            err("the early fetch of ", label(dst), " overlaps ", label(v), " written at position ", t);
      }
      const Node& m = g.node(p.schedule[std::size_t(t)]);
      auto* w = m.op->as_transfer();
      if (w && w->kind() == ops::TransferKind::write_back_done && m.inputs[1] == f.inputs[0] && t > e.after)
        err("the early fetch of ", label(dst), " reads its source before position ", t, " writes it back");
    }
    for (ValueId v : roots)
      if (arena(v) && overlap(v, dst)) err("the early fetch of ", label(dst), " overlaps the step's result ", label(v));
  }

  // 5. Host and NVMe copies: each has a slot, and two copies alive at the
  // same time never share bytes.
  struct Held {
    ValueId v;
    int from, to;
  };
  std::vector<Held> held;
  for (int t = 0; t < end; ++t) {
    const Node& node = g.node(p.schedule[std::size_t(t)]);
    for (ValueId o : node.outputs)
      if (g.value(o).kind == ValueKind::host || g.value(o).kind == ValueKind::nvme) held.push_back({o, t, t});
    for (ValueId in : node.inputs)
      for (auto& h : held)
        if (h.v == in) h.to = t;
  }
  for (auto& h : held)
    if (std::size_t(h.v) >= p.tier_offset_of.size() || !p.tier_offset_of[std::size_t(h.v)])
      err(label(h.v), " is a ", value_kind_name(g.value(h.v).kind), " with no slot in its tier");
  if (!r.ok()) return r;
  for (std::size_t i = 0; i < held.size(); ++i)
    for (std::size_t j = i + 1; j < held.size(); ++j) {
      const Held &a = held[i], &b = held[j];
      if (g.value(a.v).kind != g.value(b.v).kind || a.to < b.from || b.to < a.from) continue;
      std::size_t ab = *p.tier_offset_of[std::size_t(a.v)], bb = *p.tier_offset_of[std::size_t(b.v)];
      if (ab < bb + g.value(b.v).meta.nbytes() && bb < ab + g.value(a.v).meta.nbytes())
        err(label(a.v), " and ", label(b.v), " share bytes of the ", value_kind_name(g.value(a.v).kind),
            " tier while both are held");
    }
  return r;
}

}  // namespace frugal::plan
