#pragma once
// Builds the abstract budget problem (budget_problem.hpp) from a graph and
// its schedule. A candidate is a value over one idle window between two of
// its uses:
// - an activation between its producer or one reader and the next reader
//   (recompute it before the next reader, swap it to the host pool, or spill
//   it to NVMe);
// - a parameter or optimizer state between its last use in one step and its
//   first use in the next (keep it on the host and fetch it for the step),
//   and, once it lives on the host, between two of its reads (drop the
//   device copy and fetch it again).
// Transfers are priced against the compute that can hide them: an eviction
// finishes as soon as the ops after it have taken as long as the copy, a
// fetch starts early enough to land before its reader.
#include <functional>
#include <numeric>

#include "../ops/collective.hpp"
#include "../ops/transfer.hpp"
#include "budget.hpp"
#include "budget_problem.hpp"
#include "offload.hpp"
#include "liveness.hpp"
#include "node_cost.hpp"

namespace frugal::plan {

// What the problem is priced with: the time of each scheduled op and of each
// kind of transfer (the cost model's numbers).
struct Prices {
  std::vector<double> op_ms;  // by schedule position
  std::function<double(std::size_t)> copy_ms;
  std::function<double(std::size_t)> nvme_write_ms;
  std::function<double(std::size_t)> nvme_read_ms;
  double overlap_slowdown = 0.1;  // how much an overlapped copy slows compute, as a fraction of its time
  // An update's memory traffic (bytes) run on the host; empty: free (the
  // device is the host).
  std::function<double(double)> host_update_ms;
};

inline constexpr std::size_t kMinPersistentCandidate = 1 << 10;  // smaller state is not worth a transfer
// How deep a recomputation re-creates inputs that are dead where it runs,
// and how many positions each activation may be recomputed before (its
// reader's, and the nearest ones where deeper recomputations read it).
inline constexpr int kMaxInlineDepth = 4;
inline constexpr int kMaxRecomputePositions = 16;

namespace detail {
// Of the positions `ats` (sorted, distinct, each after `before` + 1) at
// which recomputations ask for a window's value, the at most `k` that get
// an option fetching it back just in time: a request at `a` is served by
// the latest chosen position at or before it, whose option keeps the value
// off the device over before+1 .. that position - 1. Chosen to keep the
// most positions off over all the requests (a request no chosen position
// serves keeps it on the device: 0), by dynamic programming over the
// requests in order. From positions alone, never from a price.
inline std::vector<int> fetch_positions(const std::vector<int>& ats, int before, int k) {
  const int n = int(ats.size());
  if (k <= 0 || n == 0) return {};
  if (n <= k) return ats;
  // best[m][j]: the most positions requests j.. keep off with a chosen
  // position at ats[j] and at most m - 1 more after it; next: the next one.
  auto off = [&](int j) { return std::int64_t(ats[std::size_t(j)] - before - 1); };
  std::vector<std::vector<std::int64_t>> best(std::size_t(k) + 1, std::vector<std::int64_t>(std::size_t(n), 0));
  std::vector<std::vector<int>> next(std::size_t(k) + 1, std::vector<int>(std::size_t(n), n));
  for (int m = 1; m <= k; ++m)
    for (int j = n - 1; j >= 0; --j) {
      std::int64_t& b = best[std::size_t(m)][std::size_t(j)];
      b = std::int64_t(n - j) * off(j);  // no position after j
      if (m == 1) continue;
      for (int l = j + 1; l < n; ++l) {
        const std::int64_t v = std::int64_t(l - j) * off(j) + best[std::size_t(m) - 1][std::size_t(l)];
        if (v > b) b = v, next[std::size_t(m)][std::size_t(j)] = l;
      }
    }
  int first = 0;
  for (int j = 1; j < n; ++j)
    if (best[std::size_t(k)][std::size_t(j)] > best[std::size_t(k)][std::size_t(first)]) first = j;
  std::vector<int> chosen;
  for (int j = first, m = k; j < n && m > 0; j = next[std::size_t(m)][std::size_t(j)], --m)
    chosen.push_back(ats[std::size_t(j)]);
  return chosen;
}
}  // namespace detail

// The value whose buffer a view (reshape) reads, following views back.
inline ValueId view_root(const Graph& g, ValueId v) {
  for (;;) {
    const Value& val = g.value(v);
    if (val.producer < 0) return v;
    const Node& n = g.node(val.producer);
    if (!n.op->is_view() || n.outputs.empty() || n.outputs[0] != v) return v;
    v = n.inputs[0];
  }
}

struct BuiltProblem {
  BudgetProblem problem;
  std::vector<int> wrap_of;  // by value id: the wrap-around candidate of a persistent, or -1
};

inline BuiltProblem build_budget_problem(const Graph& g, const std::vector<NodeId>& schedule,
                                         std::span<const ValueId> roots, const Budget& budget, const Prices& prices,
                                         bool inplace = true, bool host_updates = false,
                                         bool recompute_collectives = true,
                                         NvmeHomeOptions nvme_homes = {.automatic = false}) {
  const int T = int(schedule.size());
  BuiltProblem built;
  BudgetProblem& p = built.problem;
  p.positions = T;
  p.op_ms = prices.op_ms;
  p.device_budget = std::int64_t(budget.device);
  p.host_budget = std::int64_t(budget.host);
  p.nvme_budget = std::int64_t(budget.nvme);
  const bool nvme = !budget.nvme_dir.empty();

  // Device bytes with nothing evicted: the arena's live bytes plus every
  // persistent value (they stay on the device unless a candidate moves them).
  Buffers buffers = assign_buffers(g, schedule, roots, inplace);
  std::vector<std::int64_t> diff(std::size_t(T) + 2, 0);
  for (auto& iv : buffers.intervals) {
    int last = std::min(iv.last, T - 1);
    diff[std::size_t(iv.first)] += std::int64_t(iv.bytes);
    diff[std::size_t(last) + 1] -= std::int64_t(iv.bytes);
  }
  // Optimizer state whose update already runs on the host
  // (CompileOptions::offload_optimizer) is none of the device's.
  const std::vector<char> home = persistents_on_host(g, schedule);
  std::int64_t persistent = 0;
  for (ValueId v = 0; v < ValueId(g.num_values()); ++v)
    if (is_persistent(g.value(v).kind) && !home[std::size_t(v)]) persistent += std::int64_t(g.value(v).meta.nbytes());
  p.base.assign(std::size_t(T), 0);
  std::int64_t cur = 0;
  for (int t = 0; t < T; ++t) p.base[std::size_t(t)] = (cur += diff[std::size_t(t)]) + persistent;

  // Prefix sums of op time: compute(x, y) is the time of positions x..y.
  std::vector<double> cum(std::size_t(T) + 1, 0);
  for (int t = 0; t < T; ++t) cum[std::size_t(t) + 1] = cum[std::size_t(t)] + prices.op_ms[std::size_t(t)];
  auto compute = [&](int x, int y) { return y < x ? 0.0 : cum[std::size_t(y) + 1] - cum[std::size_t(x)]; };

  // Uses of every buffer root, by position; which positions mutate a value.
  std::vector<int> pos_of(g.num_nodes(), -1);
  for (int t = 0; t < T; ++t) pos_of[std::size_t(schedule[std::size_t(t)])] = t;
  std::vector<std::vector<int>> uses(g.num_values());
  std::vector<std::vector<int>> mutated_at(g.num_values());
  std::vector<char> is_root(g.num_values(), 0);
  for (ValueId r : roots) is_root[std::size_t(view_root(g, r))] = 1;
  for (int t = 0; t < T; ++t) {
    const Node& n = g.node(schedule[std::size_t(t)]);
    for (ValueId in : n.inputs) {
      auto& u = uses[std::size_t(view_root(g, in))];
      if (u.empty() || u.back() != t) u.push_back(t);
    }
    for (int mi : n.op->mutated_inputs()) mutated_at[std::size_t(n.inputs[std::size_t(mi)])].push_back(t);
  }
  // Optimizer state that only parameter updates read, which may then live
  // on the host with those updates run there (plan/offload.hpp).
  std::vector<char> updatable_on_host(g.num_values(), host_updates ? 1 : 0);
  if (host_updates)
    for (int t = 0; t < T; ++t) {
      const Node& n = g.node(schedule[std::size_t(t)]);
      for (std::size_t i = 0; i < n.inputs.size(); ++i)
        if (!state_updatable_on_host(g, n, i)) updatable_on_host[std::size_t(n.inputs[i])] = 0;
    }

  // What moving a state's update to the host adds to the step: its share
  // of each update's time there, less its share of the device time that
  // update no longer takes (nothing where the device is the host).
  auto host_update_ms = [&](ValueId v) {
    if (!prices.host_update_ms) return 0.0;
    double ms = 0;
    for (int t : mutated_at[std::size_t(v)]) {
      const NodeId id = schedule[std::size_t(t)];
      const Node& n = g.node(id);
      int states = 0;
      for (std::size_t i = 0; i < n.inputs.size(); ++i) states += state_updatable_on_host(g, n, i) ? 1 : 0;
      if (states == 0) continue;
      ms += std::max(0.0, (prices.host_update_ms(node_cost(g, id).bytes) - prices.op_ms[std::size_t(t)]) / states);
    }
    return ms;
  };

  // Where a value must stay in place because a collective runs on it beside
  // compute: from its start to its done (ops::CollectiveStart), by root.
  std::vector<std::vector<std::pair<int, int>>> in_flight(g.num_values());
  for (int t = 0; t < T; ++t) {
    const Node& n = g.node(schedule[std::size_t(t)]);
    if (!dynamic_cast<const ops::CollectiveDone*>(n.op.get())) continue;
    const int s = pos_of[std::size_t(g.value(n.inputs[0]).producer)];
    for (ValueId in : n.inputs) in_flight[std::size_t(view_root(g, in))].push_back({s, t});
    // The done does not read the persistents the start writes (stages 1-2
    // gather updated shards into the parameter itself): those are in
    // flight until it too.
    for (ValueId in : g.node(g.value(n.inputs[0]).producer).inputs)
      if (is_persistent(g.value(in).kind)) in_flight[std::size_t(in)].push_back({s, t});
  }
  // Off the device over positions a+1..b-1 meets such a span.
  auto meets_in_flight = [&](ValueId v, int a, int b) {
    for (auto [s, d] : in_flight[std::size_t(v)])
      if (a + 1 <= d && b - 1 >= s) return true;
    return false;
  };

  // An eviction that starts after position a: where its copy is done, and
  // the time not hidden behind compute.
  auto evict_done = [&](int a, int limit, double ms, double& exposed) {
    int e = a;
    while (e < limit && compute(a + 1, e) < ms) ++e;
    exposed += std::max(0.0, ms - compute(a + 1, e));
    return e;
  };
  // A fetch for a reader at b: where it must start, no earlier than `floor`.
  auto fetch_start = [&](int b, int floor, double ms, double& exposed) {
    int s = b;
    while (s > floor && compute(s, b - 1) < ms) --s;
    exposed += std::max(0.0, ms - compute(s, b - 1));
    return s;
  };
  auto tier_bytes = [](std::size_t b) { return std::int64_t(align_up(std::max<std::size_t>(b, 1), kTierAlignment)); };

  // Candidate gaps, by root value, to state recomputation's requirements.
  struct Gap {
    int a, b, candidate;
  };
  std::vector<std::vector<Gap>> gaps(g.num_values());

  // Persistents: the wrap-around window, then the windows between reads.
  built.wrap_of.assign(g.num_values(), -1);
  for (ValueId v = 0; v < ValueId(g.num_values()); ++v) {
    const Value& val = g.value(v);
    if (!is_persistent(val.kind)) continue;
    const auto& u = uses[std::size_t(v)];
    if (u.empty() || home[std::size_t(v)] || val.meta.nbytes() < kMinPersistentCandidate) continue;
    const std::int64_t bytes = std::int64_t(val.meta.nbytes());
    const bool dirty = !mutated_at[std::size_t(v)].empty();
    const double ci = prices.copy_ms(val.meta.nbytes()), co = dirty ? ci : 0.0;
    // Its last use: a collective started on it beside compute (stages 1-2
    // gather the updated shards into the parameter in place) uses it until
    // its done, and a write back must wait for that.
    int last = u.back();
    for (auto [s0, d] : in_flight[std::size_t(v)]) last = std::max(last, d);
    Candidate c{v, std::size_t(bytes), last, u.front(), true, {Option{}}};
    // A kind pinned to NVMe (PlanOptions::nvme_offload) is offered no other
    // home: the solve chooses between keeping it and its NVMe options, and
    // the pin then moves a kept one there (plan/nvme_home.hpp).
    const bool pinned = nvme && nvme_homes.pins(val.kind);
    for (bool jit : {false, true}) {
      if (pinned) break;
      double exposed = 0;
      int out = jit ? last : dirty ? evict_done(last, T - 1, co, exposed) : last;
      double in_exposed = 0;
      int in = jit ? u.front() : fetch_start(u.front(), 0, ci, in_exposed);
      // A fetch that cannot hide behind the ops before its reader starts in
      // the step before, beside that step's tail (Plan::early_fetches).
      if (!jit && in == 0) in_exposed = std::max(0.0, in_exposed - compute(out + 1, T - 1));
      exposed += in_exposed;
      if (jit) exposed = ci + co;
      // Just in time is the overlapped option's placement whenever the copies
      // cannot start earlier: then that one already is the price-free one.
      if (jit && c.options.size() > 1 && c.options.back().price_free) continue;
      Option o{Choice::host, exposed + prices.overlap_slowdown * (ci + co)};
      o.price_free = out == last && in == u.front();
      o.device = {{{0, in - 1}, -bytes}, {{out + 1, T - 1}, -bytes}};
      o.host = {{{0, T - 1}, bytes}};
      o.out_done = out;
      o.in_start = in;
      o.reason = cat("lives on the host between steps: fetched before its first read (", ci, " ms",
                     !jit && in == 0 ? ", issued during the step before" : "", ")",
                     dirty ? cat(", written back after its update (", co, " ms)") : std::string(), ", ", exposed,
                     " ms not hidden by compute");
      if (o.device[0].span.empty() && o.device[1].span.empty()) continue;
      c.options.push_back(std::move(o));
    }
    // Its home the NVMe file (ZeRO-Infinity): off the device and the host
    // between steps, read before its first use and written back after its
    // update, twice its bytes in the file where the plan keeps the copy the
    // step read until the step has succeeded, once where it writes back in
    // place (NvmeHomeOptions::slots, plan/nvme_home.hpp).
    const std::uint32_t host_staged = ((1u << c.options.size()) - 1) & ~1u;
    if (nvme && (nvme_homes.automatic || pinned) && may_live_on_nvme(val.kind)) {
      const double ri = prices.nvme_read_ms(val.meta.nbytes()), wo = dirty ? prices.nvme_write_ms(val.meta.nbytes()) : 0.0;
      const std::size_t first_nvme = c.options.size();
      for (bool jit : {false, true}) {
        double exposed = 0;
        int out = jit ? last : dirty ? evict_done(last, T - 1, wo, exposed) : last;
        int in = jit ? u.front() : fetch_start(u.front(), 0, ri, exposed);  // never issued in the step before
        if (jit) exposed = ri + wo;
        if (jit && c.options.size() > first_nvme && c.options.back().price_free) continue;
        Option o{Choice::nvme_home, exposed + prices.overlap_slowdown * (ri + wo)};
        o.price_free = out == last && in == u.front();
        o.device = {{{0, in - 1}, -bytes}, {{out + 1, T - 1}, -bytes}};
        o.nvme = {{{0, T - 1}, std::int64_t(nvme_homes.slots) * tier_bytes(val.meta.nbytes())}};
        o.out_done = out;
        o.in_start = in;
        o.reason = cat("lives on NVMe between steps: read before its first use (", ri, " ms)",
                       dirty ? cat(", written back after its update (", wo, " ms)") : std::string(), ", ", exposed,
                       " ms not hidden by compute");
        // Read first and updated last: no device bytes saved, but the host's
        // still are, which is what a pin asks for.
        if (o.device[0].span.empty() && o.device[1].span.empty() && !pinned) continue;
        c.options.push_back(std::move(o));
      }
    }
    const std::uint32_t nvme_staged = ((1u << c.options.size()) - 1) & ~1u & ~host_staged;
    // Its update run on the host, reading it there: off the device the
    // whole step, no copy at all. On a backend whose kernels use host
    // memory (the only ones host_updates is set for) that costs nothing.
    if (updatable_on_host[std::size_t(v)] && val.kind == ValueKind::state && !pinned) {
      Option o{Choice::host_update, host_update_ms(v)};
      o.price_free = true;
      o.device = {{{0, T - 1}, -bytes}};
      o.host = {{{0, T - 1}, bytes}};
      o.reason = "lives on the host, where its update runs and reads it in place (optimizer offload)";
      c.options.push_back(std::move(o));
    }
    if (c.options.size() < 2) continue;
    built.wrap_of[std::size_t(v)] = int(p.candidates.size());
    const int wrap = int(p.candidates.size());
    p.candidates.push_back(std::move(c));
    for (std::size_t k = 0; k + 1 < u.size(); ++k) {
      int a = u[k], b = u[k + 1];
      if (b - a < 2 || meets_in_flight(v, a, b)) continue;
      if (std::find(mutated_at[std::size_t(v)].begin(), mutated_at[std::size_t(v)].end(), a) !=
          mutated_at[std::size_t(v)].end())
        continue;  // a dirty copy would need a write back first
      // A window's drop and fetch again needs a staged copy: fetched again
      // from the home the wrap-around option chose (the host, or NVMe).
      Candidate inner{v, std::size_t(bytes), a, b, false, {Option{}}};
      for (Choice from : {Choice::host, Choice::nvme}) {
        const std::uint32_t staged = from == Choice::host ? host_staged : nvme_staged;
        if (staged == 0) continue;
        const double fi = from == Choice::host ? ci : prices.nvme_read_ms(val.meta.nbytes());
        const std::size_t first = inner.options.size();
        for (bool jit : {false, true}) {
          double ex = jit ? fi : 0;
          int s = jit ? b : fetch_start(b, a + 1, fi, ex);
          if (s - 1 < a + 1) continue;
          if (jit && inner.options.size() > first && inner.options.back().price_free) continue;
          Option d{from, ex + prices.overlap_slowdown * fi};
          d.price_free = s == b;
          d.device = {{{a + 1, s - 1}, -bytes}};
          d.in_start = s;
          d.out_done = a;
          d.requires_ = {{wrap, staged}};
          d.reason = cat("device copy dropped after position ", a, " and fetched again from ",
                         from == Choice::host ? "the host" : "NVMe", " (", fi, " ms, ", ex, " ms not hidden)");
          inner.options.push_back(std::move(d));
        }
      }
      if (inner.options.size() < 2) continue;
      gaps[std::size_t(v)].push_back({a, b, int(p.candidates.size())});
      p.candidates.push_back(std::move(inner));
    }
  }

  // Segment boundaries: forward activations that alone cross the position
  // where they are made (every other forward value made before it has been
  // read for the last time by the forward there).
  std::vector<char> boundary(g.num_values(), 0);
  {
    std::vector<int> last_forward(g.num_values(), -1);
    for (int t = 0; t < T; ++t) {
      const Node& n = g.node(schedule[std::size_t(t)]);
      if (n.phase != Phase::forward) continue;
      for (ValueId in : n.inputs) last_forward[std::size_t(view_root(g, in))] = t;
    }
    std::vector<int> crossing(std::size_t(T) + 1, 0);
    auto crosses = [&](ValueId v) {
      const Value& val = g.value(v);
      return val.kind == ValueKind::activation && !val.is_workspace && val.producer >= 0 &&
             pos_of[std::size_t(val.producer)] >= 0 && last_forward[std::size_t(v)] > pos_of[std::size_t(val.producer)];
    };
    for (ValueId v = 0; v < ValueId(g.num_values()); ++v)
      if (crosses(v)) {
        ++crossing[std::size_t(pos_of[std::size_t(g.value(v).producer)])];
        --crossing[std::size_t(last_forward[std::size_t(v)])];
      }
    for (int t = 1; t <= T; ++t) crossing[std::size_t(t)] += crossing[std::size_t(t) - 1];
    for (ValueId v = 0; v < ValueId(g.num_values()); ++v)
      if (crosses(v) && g.node(g.value(v).producer).phase == Phase::forward &&
          crossing[std::size_t(pos_of[std::size_t(g.value(v).producer)])] == 1)
        boundary[std::size_t(v)] = 1;
  }

  // Activations: every window of two or more positions between uses.
  struct Pending {
    ValueId v;
    int a, b, candidate;
  };
  std::vector<Pending> recompute_later;
  for (ValueId v = 0; v < ValueId(g.num_values()); ++v) {
    const Value& val = g.value(v);
    if (val.kind != ValueKind::activation || val.is_workspace || is_root[std::size_t(v)]) continue;
    if (view_root(g, v) != v || pos_of[std::size_t(val.producer)] < 0) continue;
    std::vector<int> at{pos_of[std::size_t(val.producer)]};
    for (int t : uses[std::size_t(v)]) at.push_back(t);
    const std::int64_t bytes = std::int64_t(align_up(std::max<std::size_t>(val.meta.nbytes(), 1)));
    for (std::size_t k = 0; k + 1 < at.size(); ++k) {
      int a = at[k], b = at[k + 1];
      if (b - a < 2 || meets_in_flight(v, a, b)) continue;
      Candidate c{v, std::size_t(bytes), a, b, false, {Option{}}, boundary[std::size_t(v)] != 0};
      // Overlapped (the copies hide behind compute), or just in time (the
      // copies wait, and the window off the device is as long as it gets).
      auto swap = [&](Choice choice, double out_ms, double in_ms, bool just_in_time) {
        double exposed = 0;
        int e = just_in_time ? a : evict_done(a, b - 1, out_ms, exposed);
        int s = just_in_time ? b : fetch_start(b, e + 1, in_ms, exposed);
        if (just_in_time) exposed = out_ms + in_ms;
        if (s - 1 < e + 1) return;  // no window left between the two copies
        const bool price_free = e == a && s == b;
        if (just_in_time)
          for (const Option& had : c.options)
            if (had.choice == choice && had.price_free) return;  // the overlapped copy is already just in time
        Option o{choice, exposed + prices.overlap_slowdown * (out_ms + in_ms)};
        o.price_free = price_free;
        o.device = {{{e + 1, s - 1}, -bytes}};
        // Named type: g++ 13 finds the braced list ambiguous through the conditional.
        (choice == Choice::host ? o.host : o.nvme) = std::vector<MemEffect>{MemEffect{Span{a, b}, tier_bytes(val.meta.nbytes())}};
        o.out_done = e;
        o.in_start = s;
        o.reason = cat(choice == Choice::host ? "copied to the host pool" : "written to NVMe", " after position ", a,
                       " and back before position ", b, " (", out_ms + in_ms, " ms of copies, ", exposed,
                       " ms not hidden by compute)");
        c.options.push_back(std::move(o));
      };
      const double copy = prices.copy_ms(val.meta.nbytes());
      for (bool jit : {false, true}) {
        swap(Choice::host, copy, copy, jit);
        if (nvme) swap(Choice::nvme, prices.nvme_write_ms(val.meta.nbytes()), prices.nvme_read_ms(val.meta.nbytes()), jit);
      }
      gaps[std::size_t(v)].push_back({a, b, int(p.candidates.size())});
      recompute_later.push_back({v, a, b, int(p.candidates.size())});
      p.candidates.push_back(std::move(c));
    }
  }

  // Recomputation, once every gap is known. A recomputation of v for the
  // window (a, b) runs v's producer again before some position q in a < q
  // <= b (the reader at b, or earlier, where a deeper recomputation needs
  // v), and v's clone serves every reader from q to b. What the producer
  // reads must be on the device at q:
  // - an input kept in its own window there, or itself recomputed before a
  //   position at or before q in that window (a chain: that clone is shared
  //   by its readers and by this one), or fetched just before q = its reader;
  // - an input whose last use is before q is re-created for this
  //   recomputation alone (its producer cloned first, recursively, up to
  //   kMaxInlineDepth deep), or else kept alive until q.
  // Every option is memory-only-defined (price_free): the positions come
  // from the schedule and the readers, never from a price.
  const std::size_t C0 = p.candidates.size();
  std::vector<int> pending_of(C0, -1);
  for (std::size_t k = 0; k < recompute_later.size(); ++k) pending_of[std::size_t(recompute_later[k].candidate)] = int(k);
  // A collective is run again only where every rank will: PlanOptions::
  // recompute_collectives (compile turns it off where the ranks' plans of
  // it differ).
  auto clonable = [&](const Node& n) {
    return n.op->repeatable() && (recompute_collectives || !n.op->is_collective()) && !n.op->as_transfer() &&
           !n.op->is_view() && !n.outputs.empty();
  };
  auto gap_at = [&](ValueId root, int q) -> const Gap* {
    for (const Gap& gp : gaps[std::size_t(root)])
      if (gp.a < q && q <= gp.b) return &gp;
    return nullptr;
  };
  auto last_use = [&](ValueId root) {
    const auto& u = uses[std::size_t(root)];
    const Value& rv = g.value(root);
    int last = u.empty() ? (rv.producer >= 0 ? pos_of[std::size_t(rv.producer)] : -1) : u.back();
    if (is_root[std::size_t(root)]) last = T;  // a step's result lives to the end
    return last;
  };
  // One recomputation of a candidate before position q, as the build sees it.
  struct Plan1 {
    int q = 0;
    bool ok = true;
    std::vector<NodeId> inline_nodes;             // schedule order
    std::vector<std::pair<int, int>> needs;       // (candidate, q): kept, recomputed at <= q, or fetched at q
    std::vector<std::pair<int, int>> keep_needs;  // (candidate, q): persistent windows, on the device at q
    std::vector<MemEffect> extend;                // inputs kept alive until q
    std::int64_t transient = 0;                   // inline clones and the clone's other outputs, at q
    double ms = 0;
    int ops = 0;
  };
  // What running node `n` before q needs; inlines dead inputs recursively.
  std::function<void(NodeId, int, int, Plan1&, std::vector<char>&)> close_over =
      [&](NodeId nid, int q, int depth, Plan1& pl, std::vector<char>& inlined) {
        const Node& n = g.node(nid);
        const int prod = pos_of[std::size_t(nid)];
        pl.ms += prices.op_ms[std::size_t(prod)];
        ++pl.ops;
        const auto writes = n.op->mutated_inputs();
        for (std::size_t i = 0; i < n.inputs.size(); ++i) {
          const ValueId in = n.inputs[i];
          const ValueId root = view_root(g, in);
          // A repeatable op's own writes (a collective's count) only count.
          const bool own_count = std::find(writes.begin(), writes.end(), int(i)) != writes.end();
          // It would read a value already overwritten: a write in [prod, q)
          // (the writes are in schedule order; a state written by every
          // collective has tens of thousands on a tiled 20T step).
          if (!own_count) {
            const std::vector<int>& ms = mutated_at[std::size_t(root)];
            const auto m = std::lower_bound(ms.begin(), ms.end(), prod);
            if (m != ms.end() && *m < q) pl.ok = false;
          }
          const Value& rv = g.value(root);
          if (rv.kind == ValueKind::parameter || rv.kind == ValueKind::state) {
            for (const Gap& gp : gaps[std::size_t(root)])
              if (gp.a < q && q <= gp.b) pl.keep_needs.push_back({gp.candidate, q});
            continue;
          }
          if (const Gap* gp = gap_at(root, q)) {
            pl.needs.push_back({gp->candidate, q});
            continue;
          }
          const int last = last_use(root);
          if (last >= q) continue;  // live at q (read there, or no window to evict it in)
          const bool activation = rv.kind == ValueKind::activation && !rv.is_workspace && rv.producer >= 0 &&
                                  pos_of[std::size_t(rv.producer)] >= 0;
          if (activation && depth < kMaxInlineDepth && clonable(g.node(rv.producer))) {
            if (inlined[std::size_t(rv.producer)]) continue;
            inlined[std::size_t(rv.producer)] = 1;
            const Node& pn = g.node(rv.producer);
            close_over(rv.producer, q, depth + 1, pl, inlined);
            pl.inline_nodes.push_back(rv.producer);
            for (ValueId out : pn.outputs)
              pl.transient += std::int64_t(align_up(std::max<std::size_t>(g.value(out).meta.nbytes(), 1)));
          } else if (rv.kind == ValueKind::activation || rv.kind == ValueKind::input) {
            pl.extend.push_back({{last + 1, q}, std::int64_t(align_up(rv.meta.nbytes()))});
          }
        }
      };

  // Positions each candidate is asked to be recomputed before: its reader,
  // and where deeper recomputations of its dependents read it. A producer
  // comes before its readers in the schedule, so walking candidates by
  // producer position, latest first, sees every demand on a candidate
  // before building its options.
  std::vector<std::vector<int>> demand(C0);
  for (const Pending& r : recompute_later) demand[std::size_t(r.candidate)].push_back(r.b);
  std::vector<std::size_t> order(recompute_later.size());
  std::iota(order.begin(), order.end(), std::size_t(0));
  std::stable_sort(order.begin(), order.end(), [&](std::size_t x, std::size_t y) {
    return pos_of[std::size_t(g.value(recompute_later[x].v).producer)] >
           pos_of[std::size_t(g.value(recompute_later[y].v).producer)];
  });
  std::vector<std::vector<Plan1>> plans(C0);
  // Which producers one recomputation inlines: set by close_over, each one
  // listed in its inline_nodes, and cleared through that list (zeroing a
  // node-sized vector per recomputation was most of a 20T step's build).
  std::vector<char> inlined(g.num_nodes(), 0);
  for (std::size_t k : order) {
    const Pending& r = recompute_later[k];
    const Node& n = g.node(g.value(r.v).producer);
    if (!clonable(n)) continue;
    auto& qs = demand[std::size_t(r.candidate)];
    std::sort(qs.begin(), qs.end());
    qs.erase(std::unique(qs.begin(), qs.end()), qs.end());
    // Latest first (the reader's own position, then the nearest deeper
    // ones); a recomputation must free at least one position.
    std::vector<int> chosen;
    for (std::size_t i = qs.size(); i-- > 0 && int(chosen.size()) < kMaxRecomputePositions;)
      if (qs[i] >= r.a + 2 && qs[i] <= r.b) chosen.push_back(qs[i]);
    for (int q : chosen) {
      Plan1 pl;
      pl.q = q;
      close_over(g.value(r.v).producer, q, 0, pl, inlined);
      for (NodeId m : pl.inline_nodes) inlined[std::size_t(m)] = 0;
      if (!pl.ok) continue;
      for (ValueId out : n.outputs)
        if (out != r.v) pl.transient += std::int64_t(align_up(std::max<std::size_t>(g.value(out).meta.nbytes(), 1)));
      for (auto [c, at] : pl.needs)
        if (pending_of[std::size_t(c)] >= 0 && at < p.candidates[std::size_t(c)].after) demand[std::size_t(c)].push_back(at);
      plans[std::size_t(r.candidate)].push_back(std::move(pl));
    }
  }
  // The options, then their requirements (which name other candidates'
  // recompute options by index).
  std::vector<std::vector<std::pair<int, int>>> rec_options(C0);  // (q, option index)
  for (std::size_t c = 0; c < C0; ++c) {
    Candidate& cand = p.candidates[c];
    for (const Plan1& pl : plans[c]) {
      if (cand.options.size() >= 32) break;  // requirement masks are 32 bits
      const Node& n = g.node(g.value(cand.value).producer);
      Option o{Choice::recompute, pl.ms};
      o.price_free = true;
      o.device = {{{cand.before + 1, pl.q - 1}, -std::int64_t(cand.bytes)}};
      for (const MemEffect& e : pl.extend) o.device.push_back(e);
      if (pl.transient) o.device.push_back({{pl.q, pl.q}, pl.transient});
      o.in_start = pl.q;
      o.inline_nodes = pl.inline_nodes;
      o.reason = cat("recomputed by ", n.op->name(), " before position ", pl.q,
                     pl.q < cand.after ? cat(" (for a deeper recomputation; read again at ", cand.after, ")") : std::string(),
                     pl.ops > 1 ? cat(", re-creating ", pl.ops - 1, " dead input", pl.ops > 2 ? "s" : "", " with it") : std::string(),
                     " (", o.cost_ms, " ms)");
      rec_options[c].push_back({pl.q, int(cand.options.size())});
      cand.options.push_back(std::move(o));
    }
  }
  // A recomputation that reads a value inside one of its windows needs it
  // on the device there: kept, recomputed by then, or fetched back by then.
  // Such positions get options of their own on the window: off the device
  // after the read before it, back just in time for the recomputation
  // (then kept to the window's end). Without them:
  // - ZeRO-3's re-gather of a weight for the forward recomputed before its
  //   backward pinned that weight's shard on the device from its forward to
  //   its backward (117 GiB of a 1T model's 32 GB V100, every shard at once);
  // - a swapped activation could serve only a recomputation run just before
  //   its own reader, so checkpointing's segment inputs could not wait on
  //   the host or NVMe until their segment is recomputed (a 1T GPT's 256 of
  //   them, 87 GiB, stayed on the device).
  // A window has room for few of them (requirement masks are 32 bits), and
  // an option back by `at` serves every recomputation at or after `at`; so
  // all the positions asked of a window are gathered first, and the ones
  // given an option are those that keep the most positions off the device
  // over all the requests (detail::fetch_positions). Taken in the order
  // they were asked, a tiled 20T step's attention input spent its slots on
  // recomputations inside the forward, each freeing a position or two, and
  // its backward's recomputations could only keep it (all 41 layers' qkv,
  // 21 GiB a GPU, at the peak).
  // f(plan, its option's index) for each of candidate c's recomputations
  // that became an option (the first ones: the rest found no room).
  auto each_optioned_plan = [&](std::size_t c, auto&& f) {
    for (std::size_t k = 0; k < rec_options[c].size(); ++k) f(plans[c][k], rec_options[c][k].second);
  };
  std::vector<std::vector<int>> asked(p.candidates.size());
  for (std::size_t c = 0; c < C0; ++c)
    each_optioned_plan(c, [&](const Plan1& pl, int) {
      for (auto [kc, at] : pl.keep_needs) asked[std::size_t(kc)].push_back(at);
      for (auto [ic, at] : pl.needs) asked[std::size_t(ic)].push_back(at);
    });
  for (std::size_t kc = 0; kc < p.candidates.size(); ++kc) {
    std::vector<int>& ats = asked[kc];
    if (ats.empty()) continue;
    Candidate& w = p.candidates[kc];
    const bool persistent = is_persistent(g.value(w.value).kind);
    // The tiers with a just-in-time transfer, and its option (each fetch
    // is a copy of it, back at another position).
    std::vector<std::pair<Choice, std::size_t>> tiers;
    for (Choice tier : {Choice::host, Choice::nvme}) {
      const auto jit = std::find_if(w.options.begin(), w.options.end(),
                                    [&](const Option& o) { return o.choice == tier && o.price_free; });
      if (jit != w.options.end()) tiers.push_back({tier, std::size_t(jit - w.options.begin())});
    }
    // The room is counted as if each tier had its overlapped copy too (the
    // prices decide whether it does), so that which positions get an option
    // does not depend on a price: the smallest feasible budget must not.
    const std::size_t held =
        1 + std::size_t(std::count_if(w.options.begin() + 1, w.options.end(), [](const Option& o) { return o.price_free; })) +
        tiers.size();
    if (tiers.empty() || held >= 32) continue;
    std::sort(ats.begin(), ats.end());
    ats.erase(std::unique(ats.begin(), ats.end()), ats.end());
    // Only where something is off the device before it: at - 1 >= before + 1.
    ats.erase(ats.begin(), std::lower_bound(ats.begin(), ats.end(), w.before + 2));
    const int room = int((32 - held) / tiers.size());
    for (int at : detail::fetch_positions(ats, w.before, room))
      for (auto [tier, jit] : tiers) {
        // A fetch of that tier already back just in time for `at`.
        if (std::any_of(w.options.begin(), w.options.end(),
                        [&](const Option& o) { return o.choice == tier && o.in_done == at; }) ||
            w.options.size() >= 32)
          continue;
        Option d = w.options[jit];
        d.device = {{{w.before + 1, at - 1}, -std::int64_t(w.bytes)}};
        // An activation's copy is needed on that tier only until it is back
        // (a persistent's window holds nothing there: its home does).
        for (MemEffect& e : tier == Choice::host ? d.host : d.nvme) e.span.last = at;
        d.in_start = d.in_done = at;
        const char* where = tier == Choice::host ? "the host" : "NVMe";
        d.reason = persistent ? cat("device copy dropped after position ", w.before, " and fetched again from ", where,
                                    " for a recomputation before position ", at, " (", d.cost_ms, " ms not hidden)")
                              : cat(tier == Choice::host ? "copied to the host pool" : "written to NVMe",
                                    " after position ", w.before, " and back for a recomputation before position ", at,
                                    " (", d.cost_ms, " ms not hidden)");
        w.options.push_back(std::move(d));
      }
  }
  // The options of window kc that are back on the device by `at`.
  auto fetched_by = [&](int kc, int at) {
    const Candidate& w = p.candidates[std::size_t(kc)];
    std::uint32_t allowed = 0;
    for (int j = 1; j < int(w.options.size()) && j < 32; ++j) {
      const Option& o = w.options[std::size_t(j)];
      if (o.choice != Choice::host && o.choice != Choice::nvme) continue;
      if ((o.in_done >= 0 ? o.in_done : w.after) <= at) allowed |= 1u << j;
    }
    return allowed;
  };
  for (std::size_t c = 0; c < C0; ++c)
    each_optioned_plan(c, [&](const Plan1& pl, int option) {
      Option& o = p.candidates[c].options[std::size_t(option)];
      for (auto [kc, at] : pl.keep_needs) o.requires_.push_back({kc, 1u | fetched_by(kc, at)});  // kept, or back
      for (auto [ic, at] : pl.needs) {
        std::uint32_t allowed = 1u;  // kept
        for (auto [q, j] : rec_options[std::size_t(ic)])
          if (q <= at && j < 32) allowed |= 1u << j;  // its clone exists by then
        o.requires_.push_back({ic, allowed | fetched_by(ic, at)});
      }
    });
  return built;
}

}  // namespace frugal::plan
