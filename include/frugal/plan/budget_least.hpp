#pragma once
// The least device memory a budget problem's options reach, found without
// reading a single price, so that the smallest feasible budget (and with it
// whether a budget fits) is the same under every DeviceProfile (DESIGN.md,
// invariant 4). Prices only choose among plans that fit (budget_solve.hpp).
//
// The problem's options come priced: an overlapped transfer frees the device
// only between where its copies finish and start, which the compute times
// decide. Its just-in-time twin (evicted right after the use before the
// window, fetched right before the use after it) frees the whole window and
// holds the same host or NVMe bytes, so it is never worse in memory. The
// memory view keeps only such price-free options (Option::price_free: keep,
// recompute, just in time) and gives them canonical costs that read no rate,
// so the view, and every answer found on it, is the same whatever the
// prices were. Its least peak is the least peak of the whole problem.
//
// On the view, a problem of up to kExactPositions positions is solved by the
// exact solver (bounded by branch-and-bound nodes, not seconds, so that an
// answer it cannot prove is still the same on every machine); a larger one
// by the greedy, then by a local search that moves single candidates to
// lower the peak, and then, where that answer is above
// least_memory_lower_bound and CBC is there, by CBC's branch and cut from it
// (budget_cbc.hpp), which proves the least on every real step measured.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "budget_cbc.hpp"
#include "budget_exact.hpp"
#include "least_memory_cache.hpp"

namespace frugal::plan {

inline constexpr int kExactPositions = 40;
// Branch-and-bound nodes per GLPK run in the least-memory search: enough to
// prove the steps of up to kExactPositions ops seen so far, and a bound that
// ends at the same node on every machine.
inline constexpr int kLeastMemoryNodeLimit = 20000;
// Seconds per exact least-memory search: a backstop only; the node limit is
// what normally ends an unproved search, and only it is machine-independent.
inline constexpr double kLeastMemoryBackstopSeconds = 120;
// Kicks of the iterated local search (kick_least_memory): a count, not a
// time, so the answer is the same on every machine. Each kick is a whole
// local search: 256 found no more than 32 on the steps measured (the
// peer's gpt gains its 2.1 MB at the 18th) and cost a 12-layer gpt 10 s.
inline constexpr int kLeastMemoryKicks = 32;
// Branch-and-bound nodes of CBC's least-peak search (budget_cbc.hpp), run
// where the local search's answer is above the lower bound: the real steps
// measured close in a few hundred at most (bench/budget_gap --real). A
// count, so the answer is the same on every machine; the seconds are a
// backstop only.
inline constexpr int kLeastMemoryCbcNodeLimit = 2000;
inline constexpr double kLeastMemoryCbcBackstopSeconds = 60;

// A fixed preference among options that reads no rate: fewer bytes moved
// off the device, then a host update (which copies nothing: its state
// stays where it lives) before recomputation before a host round trip
// before an NVMe one (a spill, or a home there). Only used to break ties among answers of equal peak.
inline double canonical_cost(const Candidate& c, const Option& o) {
  const double weight = o.choice == Choice::host_update ? 0.5
                        : o.choice == Choice::recompute ? 1
                        : o.choice == Choice::host      ? 2
                        : o.choice == Choice::nvme || o.choice == Choice::nvme_home ? 3
                                                                                    : 0;
  return weight * (1 + double(c.bytes) / double(1 << 20));
}

struct MemoryView {
  BudgetProblem problem;            // the price-free options, canonically priced
  std::vector<std::vector<int>> to_full;  // per candidate: view option -> option of the full problem
};

inline MemoryView memory_view(const BudgetProblem& p) {
  MemoryView v;
  BudgetProblem& q = v.problem;
  q.positions = p.positions;
  q.base = p.base;
  q.op_ms.assign(std::size_t(std::max(p.positions, 0)), 0.0);
  q.device_budget = p.device_budget;
  q.host_budget = p.host_budget;
  q.nvme_budget = p.nvme_budget;
  // Which full options each candidate keeps, in a fixed order (by choice;
  // there is at most one price-free option of each choice).
  std::vector<std::vector<int>> full_to_view(p.candidates.size());
  for (std::size_t i = 0; i < p.candidates.size(); ++i) {
    const auto& opts = p.candidates[i].options;
    std::vector<int> keep{0};
    for (int j = 1; j < int(opts.size()); ++j)
      if (opts[std::size_t(j)].price_free) keep.push_back(j);
    std::stable_sort(keep.begin() + 1, keep.end(),
                     [&](int a, int b) { return opts[std::size_t(a)].choice < opts[std::size_t(b)].choice; });
    full_to_view[i].assign(opts.size(), -1);
    for (int k = 0; k < int(keep.size()); ++k) full_to_view[i][std::size_t(keep[std::size_t(k)])] = k;
    v.to_full.push_back(std::move(keep));
  }
  for (std::size_t i = 0; i < p.candidates.size(); ++i) {
    const Candidate& c = p.candidates[i];
    Candidate d{c.value, c.bytes, c.before, c.after, c.wraps, {}, c.segment_boundary};
    for (int j : v.to_full[i]) {
      Option o = c.options[std::size_t(j)];
      o.cost_ms = j == 0 ? 0.0 : canonical_cost(c, o);
      o.reason.clear();
      for (Requirement& r : o.requires_) {  // option masks name the view's options
        std::uint32_t mask = 0;
        const auto& map = full_to_view[std::size_t(r.candidate)];
        for (std::size_t k = 0; k < map.size() && k < 32; ++k)
          if (((r.allowed >> k) & 1u) && map[k] >= 0 && map[k] < 32) mask |= 1u << map[k];
        r.allowed = mask;
      }
      d.options.push_back(std::move(o));
    }
    q.candidates.push_back(std::move(d));
  }
  return v;
}

// A view answer as a choice vector of the full problem.
inline std::vector<int> full_choice(const MemoryView& v, const std::vector<int>& view_choice) {
  std::vector<int> out(view_choice.size());
  for (std::size_t i = 0; i < view_choice.size(); ++i) out[i] = v.to_full[i][std::size_t(view_choice[i])];
  return out;
}

// Lowers the peak by local moves while one lowers it, or keeps it and
// leaves fewer positions at it, within the host and NVMe limits and every
// requirement. A move sets one candidate's option where that frees bytes at
// a peak position, together with what the requirements then ask: a
// candidate the new option requires in some state is moved into it, and one
// whose option required the old state (a recomputation needing its input
// kept) is moved to the option of its own that holds the fewest bytes at
// the peak. Deterministic: candidates and options in index order, the first
// improving move taken, and the next scan resumes at the candidate just
// moved, wrapping around; the search ends when a whole scan finds no move
// (a deep model's step of 14,000 candidates scanned from the first one
// after every move spent its minutes trying the same early candidates
// again). Requirements are repaired as a chain
// (RequirementRepair), so a recomputation that needs its inputs recomputed
// earlier moves them with it.
inline Solution improve_least_memory(const BudgetProblem& p, Solution s, int max_rounds = 512) {
  const std::size_t n = std::size_t(std::max(p.positions, 0));
  const std::size_t C = p.candidates.size();
  const RequirementRepair repair(p);
  std::vector<std::pair<std::size_t, int>> undo, was_list, now_list;
  std::vector<DevicePiece> pieces;                   // judge()'s scratch
  std::vector<std::pair<int, std::int64_t>> events;
  std::size_t start = 0;  // where the scan resumes: the last candidate moved
  // The choice's profiles, kept by the moves taken (each round rebuilt them,
  // twice, and on a tiled 20T step's 200,000 candidates that was most of the
  // search); whether it meets every requirement, which each move taken keeps.
  Profiles pr = profiles(p, s.choice);
  bool met = requirements_met(p, s.choice);
  std::vector<int> round_start;
  // The candidates whose option holds host (NVMe) bytes, in index order:
  // the only ones that can make room there. Kept by the moves taken too:
  // listing them each round read every candidate's option, half a tiled
  // 20T step's search.
  std::vector<std::size_t> on_host, on_nvme;
  for (std::size_t k = 0; k < C; ++k) {
    const Option& held = p.candidates[k].options[std::size_t(s.choice[k])];
    if (!held.host.empty()) on_host.push_back(k);
    if (!held.nvme.empty()) on_nvme.push_back(k);
  }
  auto hold = [](std::vector<std::size_t>& list, std::size_t k, bool holds) {
    auto at = std::lower_bound(list.begin(), list.end(), k);
    const bool listed = at != list.end() && *at == k;
    if (holds && !listed) list.insert(at, k);
    if (!holds && listed) list.erase(at);
  };
  for (int round = 0; round < max_rounds && n > 0; ++round) {
    Evaluation now;
    for (std::size_t t = 0; t < n; ++t) {
      now.device_peak = std::max(now.device_peak, pr.device[t]);
      now.host_peak = std::max(now.host_peak, pr.host[t]);
      now.nvme_peak = std::max(now.nvme_peak, pr.nvme[t]);
    }
    now.requirements_met = met;
    round_start = s.choice;
    const std::int64_t peak = now.device_peak;
    const PeakPositions peaks(pr.device, peak);
    const std::vector<int>& at_peak = peaks.at;
    const RangeMax device_max(pr.device);
    const RangeMax host_max(p.host_budget ? pr.host : std::vector<std::int64_t>{}),
        nvme_max(p.nvme_budget ? pr.nvme : std::vector<std::int64_t>{});
    auto at_peak_bytes = [&](const Option& o) { return peaks.bytes(o); };
    auto improves_with = [&](const Evaluation& e, const std::vector<int>& c) {  // e: c's evaluation
      if (!fits_target(p, e, e.device_peak) || e.device_peak > peak) return false;
      if (e.device_peak < peak) return true;
      std::size_t count = 0;
      for (std::int64_t b : profiles(p, c).device) count += b == peak;
      return count < at_peak.size();
    };
    auto improves = [&](const std::vector<int>& c) { return improves_with(evaluate(p, c), c); };
    // From a choice that meets every requirement and limit, a move is judged
    // by what it changes alone (its pieces of each tier), not by evaluating
    // the whole choice again: on a deep model's thousands of candidates
    // that evaluation, per tried move, was the search's whole time. The
    // verdict is the same as improves()'s.
    const bool incremental = now.requirements_met && (p.host_budget == 0 || now.host_peak <= p.host_budget) &&
                             (p.nvme_budget == 0 || now.nvme_peak <= p.nvme_budget);
    struct Verdict {
      bool improves = false, requirements_met = true, above_peak = false, host_over = false, nvme_over = false;
      int over_at = -1;             // a position the move takes over the host (else NVMe) limit
      std::int64_t overshoot = 0;  // by how many bytes there
    };
    auto judge = [&](const std::vector<int>& trial) {
      Verdict v;
      for (auto& [c, k] : now_list) v.requirements_met = v.requirements_met && repair.may_choose(trial, c, k);
      std::size_t count = at_peak.size();
      tier_change_into(pieces, events, p, was_list, now_list);
      for (const DevicePiece& pc : pieces) {
        if (pc.bytes < 0) {  // every peak position in it drops below the peak
          count -= std::size_t(peaks.within({pc.first, pc.last}));
          continue;
        }
        const std::int64_t most = device_max(pc.first, pc.last);
        if (most + pc.bytes > peak) {
          v.above_peak = true;
        } else if (most + pc.bytes == peak) {  // some rise to the peak: count them
          for (int t = pc.first; t <= pc.last; ++t) count += std::size_t(pr.device[std::size_t(t)] + pc.bytes == peak);
        }
      }
      auto over = [&](std::vector<MemEffect> Option::*tier, const RangeMax& most, std::int64_t limit) {
        if (limit == 0) return false;
        tier_change_into(pieces, events, p, was_list, now_list, tier);
        for (const DevicePiece& pc : pieces)
          if (pc.bytes > 0 && most(pc.first, pc.last) + pc.bytes > limit) {
            if (v.over_at < 0) {
              v.over_at = most.argmax(pc.first, pc.last);
              v.overshoot = most(pc.first, pc.last) + pc.bytes - limit;
            }
            return true;
          }
        return false;
      };
      v.host_over = over(&Option::host, host_max, p.host_budget);
      v.nvme_over = over(&Option::nvme, nvme_max, p.nvme_budget);
      v.improves = v.requirements_met && !v.above_peak && !v.host_over && !v.nvme_over && count < at_peak.size();
      return v;
    };
    std::vector<int> trial = s.choice;  // tried in place; each try is undone

    bool moved = false;
    for (std::size_t step = 0; step < C && !moved; ++step) {
      const std::size_t i = (start + step) % C;
      const int was = s.choice[i];
      const Option& from = p.candidates[i].options[std::size_t(was)];
      for (int j = 0; j < int(p.candidates[i].options.size()) && !moved; ++j) {
        if (j == was) continue;
        const Option& to = p.candidates[i].options[std::size_t(j)];
        if (!peaks.frees(from, to)) continue;
        trial[i] = j;
        undo.clear();
        auto revert = [&] {
          for (auto it = undo.rbegin(); it != undo.rend(); ++it) trial[it->first] = it->second;
          trial[i] = was;
        };
        if (!repair.repair(trial, i, at_peak_bytes, undo)) {
          revert();
          continue;
        }
        Verdict v;
        if (incremental) {
          was_list.assign(1, {i, was});
          for (auto [c, old] : undo)
            if (std::none_of(was_list.begin(), was_list.end(), [&](auto& w) { return w.first == c; }))
              was_list.push_back({c, old});
          now_list.clear();
          for (auto [c, old] : was_list) now_list.push_back({c, trial[c]});
          v = judge(trial);
        } else {
          const Evaluation e = evaluate(p, trial);
          v.improves = improves_with(e, trial);
          v.requirements_met = e.requirements_met;
          v.above_peak = e.device_peak > peak;
          v.host_over = p.host_budget && e.host_peak > p.host_budget;
          v.nvme_over = p.nvme_budget && e.nvme_peak > p.nvme_budget;
        }
        if (v.improves) {
          s.choice = trial;
          moved = true;
          break;
        }
        // Over the host or NVMe limit: make room by moving one candidate that
        // holds bytes there (and nothing at the peak positions) to its option
        // with the fewest bytes at the peak among those holding less there.
        const bool host_over = v.host_over, nvme_over = v.nvme_over;
        if (!v.requirements_met || (!host_over && !nvme_over) || v.above_peak) {
          revert();
          continue;
        }
        // Only a candidate holding at least the overshoot in that tier where
        // the move goes over it can bring it back under (v.over_at; the slow
        // path does not say where, so there every holder is tried).
        auto holds_at = [&](std::size_t k) {
          if (v.over_at < 0) return true;
          const Option& held = p.candidates[k].options[std::size_t(trial[k])];
          std::int64_t bytes = 0;
          for (const MemEffect& e : host_over ? held.host : held.nvme)
            if (!e.span.empty() && e.span.first <= v.over_at && v.over_at <= e.span.last) bytes += e.bytes;
          return bytes >= v.overshoot;
        };
        for (std::size_t k : host_over ? on_host : on_nvme) {
          if (moved) break;
          if (k == i || trial[k] != s.choice[k] || !holds_at(k)) continue;
          int best = -1;
          std::int64_t best_bytes = 0;
          for (int m = 0; m < int(p.candidates[k].options.size()); ++m) {
            const Option& o = p.candidates[k].options[std::size_t(m)];
            if (m == trial[k] || !(host_over ? o.host : o.nvme).empty() || !repair.may_choose(trial, k, m)) continue;
            const std::int64_t b = at_peak_bytes(o);
            if (best < 0 || b < best_bytes) best = m, best_bytes = b;
          }
          if (best < 0) continue;
          if (incremental) {  // the pair judged by its pieces too
            was_list.push_back({k, trial[k]});
            now_list.push_back({k, best});
            trial[k] = best;
            if (judge(trial).improves) s.choice = trial, moved = true;
            trial[k] = was_list.back().second;
            was_list.pop_back();
            now_list.pop_back();
            continue;
          }
          std::vector<int> pair = trial;
          pair[k] = best;
          if (improves(pair)) {
            s.choice = std::move(pair);
            moved = true;
          }
        }
        if (!moved) revert();
      }
      if (moved) start = i;
    }
    if (!moved) break;
    // A move taken meets every requirement (judged so, or evaluated so).
    met = true;
    for (std::size_t c = 0; c < C; ++c) {
      if (round_start[c] == s.choice[c]) continue;
      const Option &was = p.candidates[c].options[std::size_t(round_start[c])],
                   &is = p.candidates[c].options[std::size_t(s.choice[c])];
      hold(on_host, c, !is.host.empty());
      hold(on_nvme, c, !is.nvme.empty());
      for (auto [tier, prof] : {std::pair{&Option::device, &pr.device}, std::pair{&Option::host, &pr.host},
                                std::pair{&Option::nvme, &pr.nvme}}) {
        for (const MemEffect& e : was.*tier)
          for (int t = e.span.first; !e.span.empty() && t <= e.span.last; ++t) (*prof)[std::size_t(t)] -= e.bytes;
        for (const MemEffect& e : is.*tier)
          for (int t = e.span.first; !e.span.empty() && t <= e.span.last; ++t) (*prof)[std::size_t(t)] += e.bytes;
      }
    }
  }
  s.eval = evaluate(p, s.choice);
  s.feasible = fits_target(p, s.eval, s.eval.device_peak);
  return s;
}

namespace detail {

// Bytes times positions a candidate holds the device for when kept: the
// order in which the starts below move candidates off it.
inline double kept_area(const BudgetProblem& p, const Candidate& c) {
  return double(c.bytes) * double(c.wraps ? p.positions - (c.before - c.after) : c.after - c.before);
}

// `order` sorted by kept_area, largest first.
inline void sort_by_kept_area(const BudgetProblem& p, std::vector<std::size_t>& order) {
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return kept_area(p, p.candidates[a]) > kept_area(p, p.candidates[b]);
  });
}

// Each candidate of `order` still kept takes the option that frees the most
// device bytes over the whole step, while the host and NVMe limits leave
// room and the requirements hold.
inline void move_off_freeing_most(const BudgetProblem& p, std::vector<int>& choice,
                                  const std::vector<std::size_t>& order) {
  auto freed = [](const Option& o) { return -double(device_area(o)); };
  const RequirementRepair index(p);
  // The host and NVMe profiles with their range maxima, updated by each
  // move: tier_fits and may_choose walked every position and every
  // candidate per option tried, this start's whole time on a deep model.
  const Profiles pr = profiles(p, choice);
  RangeAddMax host(pr.host), nvme(pr.nvme);
  std::vector<std::pair<int, std::int64_t>> events;
  // tier_fits(profile, add, limit), by the profile's range maxima over the
  // pieces of constant addition, the gaps between them (addition 0)
  // included: the whole profile must stay within the limit.
  auto fits = [&](const RangeAddMax& most, const std::vector<MemEffect>& add, std::int64_t limit) {
    if (limit == 0 || add.empty() || p.positions == 0) return true;
    events.clear();
    for (const MemEffect& e : add)
      if (!e.span.empty()) events.push_back({e.span.first, e.bytes}), events.push_back({e.span.last + 1, -e.bytes});
    events.push_back({0, 0});
    events.push_back({p.positions, 0});
    std::sort(events.begin(), events.end());
    std::int64_t level = 0;
    for (std::size_t k = 0; k < events.size();) {
      const int t = events[k].first;
      for (; k < events.size() && events[k].first == t; ++k) level += events[k].second;
      const int last = k < events.size() ? std::min(events[k].first, p.positions) - 1 : p.positions - 1;
      if (t < p.positions && t <= last && most(t, last) + level > limit) return false;
    }
    return true;
  };
  for (int pass = 0; pass < 2; ++pass)  // a second pass takes what needed another's choice first
    for (std::size_t i : order) {
      if (choice[i] != 0) continue;
      int best = 0;
      double best_freed = 0;
      bool best_free = false;  // requires nothing of others, so it blocks no one's later choice
      for (int j = 1; j < int(p.candidates[i].options.size()); ++j) {
        const Option& o = p.candidates[i].options[std::size_t(j)];
        const double f = freed(o);
        const bool free = o.requires_.empty();
        if (f < best_freed || (f == best_freed && (best != 0 && (best_free || !free))) || f <= 0) continue;
        if (!index.may_choose(choice, i, j)) continue;
        if (!fits(host, o.host, p.host_budget) || !fits(nvme, o.nvme, p.nvme_budget)) continue;
        best = j, best_freed = f, best_free = free;
      }
      if (best == 0) continue;
      choice[i] = best;
      // What keep held becomes what `best` holds: its effects alone change.
      const Option& o = p.candidates[i].options[std::size_t(best)];
      for (const MemEffect& e : o.host)
        if (!e.span.empty()) host.add(e.span.first, e.span.last, e.bytes);
      for (const MemEffect& e : o.nvme)
        if (!e.span.empty()) nvme.add(e.span.first, e.span.last, e.bytes);
    }
}

// device_area, for an option that holds nothing on the host or NVMe: the
// recomputations' repairs keep their inputs on the device rather than fill
// the host and NVMe past their limits, which move_off_freeing_most checks.
inline std::int64_t kept_on_device_area(const Option& o) {
  return o.host.empty() && o.nvme.empty() ? device_area(o) : std::numeric_limits<std::int64_t>::max();
}

// Checkpointing's recomputations on top of `choice`: every activation still
// kept that is not a segment boundary recomputed as late as it can be (its
// recomputation option at the latest position), what those need of their
// inputs repaired into place, latest readers first.
//
// Each move is made in place and undone if refused. Where the choice met
// every requirement before a move, it meets them after it exactly when each
// candidate the move changed may hold its new option (its own requirements,
// and those of every option requiring something of it): the rest read what
// they read before. A copy of the choice and a walk over every requirement
// per move made this quadratic (a 20T-parameter GPT tiled 16 ways: minutes).
inline void recompute_between_boundaries(const BudgetProblem& p, std::vector<int>& choice) {
  const RequirementRepair repair(p);
  std::vector<std::size_t> order;
  for (std::size_t i = 0; i < p.candidates.size(); ++i)
    if (!p.candidates[i].wraps && !p.candidates[i].segment_boundary && choice[i] == 0) order.push_back(i);
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return p.candidates[a].after > p.candidates[b].after; });
  bool met = requirements_met(p, choice);
  std::vector<std::pair<std::size_t, int>> undo;
  auto revert = [&](std::size_t i, int was) {
    for (auto u = undo.rbegin(); u != undo.rend(); ++u) choice[u->first] = u->second;
    choice[i] = was;
  };
  for (std::size_t i : order) {
    const auto& opts = p.candidates[i].options;
    int latest = -1;
    for (int j = 1; j < int(opts.size()); ++j)
      if (opts[std::size_t(j)].choice == Choice::recompute &&
          (latest < 0 || opts[std::size_t(j)].in_start > opts[std::size_t(latest)].in_start))
        latest = j;
    if (latest < 0 || choice[i] == latest) continue;
    const int was = choice[i];
    choice[i] = latest;
    undo.clear();
    bool ok = repair.repair(choice, i, kept_on_device_area, undo);
    if (ok && met) {
      ok = repair.may_choose(choice, i, latest);
      for (std::size_t u = 0; ok && u < undo.size(); ++u)
        ok = repair.may_choose(choice, undo[u].first, choice[undo[u].first]);
    } else if (ok) {
      ok = requirements_met(p, choice);
    }
    if (!ok) {
      revert(i, was);
      continue;
    }
    // Only where the device holds less for it: an earlier reader's short
    // recomputation can ask for a long-lived input to be kept again.
    std::int64_t before = device_area(opts[std::size_t(was)]), after = device_area(opts[std::size_t(latest)]);
    for (std::size_t u = 0; u < undo.size(); ++u) {
      const auto [k, old] = undo[u];  // the first move of each candidate holds its old option
      if (k == i || std::any_of(undo.begin(), undo.begin() + std::ptrdiff_t(u), [&](auto& e) { return e.first == k; }))
        continue;
      before += device_area(p.candidates[k].options[std::size_t(old)]);
      after += device_area(p.candidates[k].options[std::size_t(choice[k])]);
    }
    if (after < before) met = true;
    else revert(i, was);
  }
}

}  // namespace detail

// A start for the local search that the peak-by-peak greedy can miss: every
// candidate, largest first (bytes times window), at the option that frees the
// most device bytes over the whole step, while the host and NVMe limits leave
// room and the requirements hold. With no host limit that is every value
// swapped just in time: each position at its own least.
inline Solution transfer_start(const BudgetProblem& p) {
  std::vector<std::size_t> order(p.candidates.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  detail::sort_by_kept_area(p, order);
  std::vector<int> choice(p.candidates.size(), 0);
  detail::move_off_freeing_most(p, choice, order);
  return make_solution(p, std::move(choice), std::numeric_limits<std::int64_t>::max());
}

// Checkpointing's plan (Chen et al.'s segments) as a start: segment
// boundaries kept, every other activation recomputed as late as it can be.
// The peak-by-peak greedy rarely gets there: keeping a boundary frees
// nothing at a peak by itself, only the later recomputations it allows do.
inline Solution checkpoint_start(const BudgetProblem& p) {
  std::vector<int> choice(p.candidates.size(), 0);
  detail::recompute_between_boundaries(p, choice);
  return make_solution(p, std::move(choice), std::numeric_limits<std::int64_t>::max());
}

// ZeRO-Infinity's plan as a start: the persistents (parameters, optimizer
// state) off the device first, largest first, each where the host and NVMe
// limits still take it; then checkpointing's recomputations; then what is
// still on the device (the boundaries) off it where the limits leave room.
// Where the host and NVMe cannot hold everything, the other starts fill
// them with activations first (one activation of a deep model's forward
// holds more bytes times positions than a layer's state shard), and a
// persistent left on the device then holds its bytes at every position
// (on a 1T-parameter GPT on a DGX-2 the other starts ended at 75.7 GiB a
// GPU at best; this one at 17.6 GiB).
inline Solution offload_checkpoint_start(const BudgetProblem& p) {
  std::vector<std::size_t> persistents, rest;
  for (std::size_t i = 0; i < p.candidates.size(); ++i) (p.candidates[i].wraps ? persistents : rest).push_back(i);
  detail::sort_by_kept_area(p, persistents);
  detail::sort_by_kept_area(p, rest);
  std::vector<int> choice(p.candidates.size(), 0);
  detail::move_off_freeing_most(p, choice, persistents);
  detail::recompute_between_boundaries(p, choice);
  detail::move_off_freeing_most(p, choice, rest);
  return make_solution(p, std::move(choice), std::numeric_limits<std::int64_t>::max());
}

// Kicks a local optimum off its plateau (iterated local search): each
// evicted candidate in turn is kept instead, with what the requirements
// then ask, which may raise the peak for a moment; the local search runs
// again from there, and the first kick that ends lower is taken and the
// kicking starts over. At most max_kicks kicks, in index order: the same
// answer on every machine.
inline Solution kick_least_memory(const BudgetProblem& p, Solution s, int max_kicks) {
  const RequirementRepair repair(p);
  std::vector<std::pair<std::size_t, int>> undo;
  int kicks = 0;
  for (bool better = true; better && kicks < max_kicks;) {
    better = false;
    const PeakPositions peaks(profiles(p, s.choice).device, s.eval.device_peak);
    auto at_peak_bytes = [&](const Option& o) { return peaks.bytes(o); };
    for (std::size_t i = 0; i < p.candidates.size() && kicks < max_kicks && !better; ++i) {
      if (s.choice[i] == 0) continue;
      std::vector<int> trial = s.choice;
      trial[i] = 0;
      undo.clear();
      if (!repair.repair(trial, i, at_peak_bytes, undo) || !requirements_met(p, trial)) continue;
      ++kicks;
      Solution t = improve_least_memory(p, make_solution(p, std::move(trial), std::numeric_limits<std::int64_t>::max()));
      if (t.feasible && t.eval.device_peak < s.eval.device_peak) {
        s = std::move(t);
        better = true;
      }
    }
  }
  return s;
}

// A lower bound on the least device peak any choice of the problem's options
// reaches: the larger of
// - at each position, its base bytes plus, for every candidate, the fewest
//   bytes any of its options holds there (each position alone, as if each
//   could choose for it; ignores host and NVMe limits and requirements), and
// - with GLPK, the linear relaxation of the least-peak integer program
//   (budget_ilp.hpp), which keeps the limits and requirements but lets a
//   candidate take fractions of options.
// For checking the search (tests, bench/budget_gap); compile does not run it.
// At each position, its base bytes plus, for every candidate, the fewest
// bytes any of its options holds there (each position as if it alone chose).
inline std::vector<std::int64_t> least_bytes_by_position(const BudgetProblem& p) {
  const std::size_t n = std::size_t(std::max(p.positions, 0));
  std::vector<std::int64_t> least(p.base.begin(), p.base.end());
  for (const Candidate& c : p.candidates) {
    std::vector<std::int64_t> fewest(n, std::numeric_limits<std::int64_t>::max());
    for (const Option& o : c.options) {
      std::vector<std::int64_t> d = detail::dense_effect(p, o.device);
      for (std::size_t t = 0; t < n; ++t) fewest[t] = std::min(fewest[t], d[t]);
    }
    for (std::size_t t = 0; t < n; ++t) least[t] += fewest[t];
  }
  return least;
}

// A lower bound on the least device peak: each position's least bytes,
// then the linear relaxation's optimum, unless the first already reaches
// `enough` (an answer in hand, which it then proves the least: the
// relaxation of a deep model's step takes minutes and cannot raise it), or
// the program is too large to build (detail::kIlpCoefficientLimit).
inline std::int64_t least_memory_lower_bound(const BudgetProblem& p,
                                             std::int64_t enough = std::numeric_limits<std::int64_t>::max()) {
  std::int64_t bound = 0;
  for (std::int64_t b : least_bytes_by_position(p)) bound = std::max(bound, b);
  if (bound >= enough) return bound;
#ifdef FRUGAL_HAVE_GLPK
  if (!p.candidates.empty() && detail::ilp_position_coefficients(p) <= detail::kIlpCoefficientLimit) {
    detail::IlpModel m = detail::build_ilp(p, 0, true);
    if (m.infeasible.empty()) {
      double lp = 0;
      if (detail::run_glpk_relaxation(p, m, lp)) bound = std::max(bound, std::int64_t(std::ceil(lp - 1e-6 * std::abs(lp))));
    }
  }
#endif
  return bound;
}

// The local searches alone: from the greedy's answer, from transfer_start,
// checkpoint_start and offload_checkpoint_start, then kicked. A fifth start: the least the
// search reaches with no transfer at all (host pool and NVMe closed), which
// is feasible under any limit; moving from there spends a small host pool
// where it helps most, where the greedy can spend it early on values that
// recomputation would have freed anyway.
inline Solution least_memory_heuristic(const BudgetProblem& view) {
  Solution best = improve_least_memory(view, solve_min_memory(view));
  auto take = [&](Solution s) {
    if (s.feasible && (!best.feasible || s.eval.device_peak < best.eval.device_peak)) best = std::move(s);
  };
  take(improve_least_memory(view, transfer_start(view)));
  take(improve_least_memory(view, checkpoint_start(view)));
  if (view.host_budget > 0 || view.nvme_budget > 0)  // with no limit, transfer_start moves every persistent too
    take(improve_least_memory(view, offload_checkpoint_start(view)));
  if (view.host_budget > 0 || view.nvme_budget > 0) {  // with no limit, transfer_start is already each position's least
    BudgetProblem closed = view;
    closed.host_budget = closed.nvme_budget = 1;
    Solution on_device = improve_least_memory(closed, solve_min_memory(closed));
    if (on_device.feasible) take(improve_least_memory(view, std::move(on_device)));
  }
  return kick_least_memory(view, std::move(best), kLeastMemoryKicks);
}

// The least device peak the view reaches: the local searches, closed by
// CBC where the lower bound does not prove them the least; on problems of up
// to kExactPositions positions, GLPK's exact answer (or, unproved, the best
// its node limit allows) where it is lower. Reads no price.
inline Solution least_memory_search(const BudgetProblem& view) {
  Solution greedy = least_memory_heuristic(view);
  if (view.positions > kExactPositions || !kExactSolverHasGlpk) {
    // Where the bound does not already prove the local search's answer the
    // least, CBC closes the gap from it (and can only lower it), if its
    // program fits in memory.
    if (kHaveCbc && greedy.feasible && detail::ilp_position_coefficients(view) <= detail::kIlpCoefficientLimit &&
        greedy.eval.device_peak > least_memory_lower_bound(view, greedy.eval.device_peak)) {
      CbcLeast c = cbc_least_peak(view, greedy, kLeastMemoryCbcNodeLimit, kLeastMemoryCbcBackstopSeconds);
      if (c.solution.feasible && c.solution.eval.device_peak < greedy.eval.device_peak) greedy = std::move(c.solution);
    }
    if (view.positions > kExactPositions) return greedy;
  }
  if (!kExactSolverHasGlpk && option_combinations(view) > kExhaustiveCombinationLimit) return greedy;
  ExactResult r = solve_exact_min_memory(view, kLeastMemoryBackstopSeconds, kLeastMemoryNodeLimit);
  if (r.solution.feasible && r.solution.eval.device_peak <= greedy.eval.device_peak) return r.solution;
  return greedy;
}

// least_memory_search's answer, found once per process for each view
// (least_memory_cache.hpp): the same step compiled again gets it at once.
inline Solution least_memory(const BudgetProblem& view) {
  std::string key = least_memory_key(view);
  if (std::optional<Solution> hit = LeastMemoryCache::instance().find(key)) return *std::move(hit);
  Solution s = least_memory_search(view);
  LeastMemoryCache::instance().insert(std::move(key), s);
  return s;
}

// A tighter lower bound on the least device peak, by row generation: the
// least-peak integer program with the device rows of only some positions is
// a relaxation of the whole one (fewer constraints), so its optimum, or
// GLPK's least open bound where the node limit stops it unproved, is a lower
// bound. Start from the rows where the position-wise bound and a heuristic
// answer peak; add the rows the relaxation's own answer breaks most; stop
// when its answer fits every row (then the bound is the exact least) or
// after `rounds`. Unlike the linear relaxation it cannot mix fractions of
// options, which is what makes that bound loose on steps with chains of
// recomputations and a small host pool. For checking the search (tests,
// bench/budget_gap); compile does not run it.
inline std::int64_t least_memory_row_bound(const BudgetProblem& p, int node_limit = 2000, int rounds = 12,
                                           bool* exact = nullptr) {
  if (exact) *exact = false;
  std::int64_t bound = least_memory_lower_bound(p);
#ifdef FRUGAL_HAVE_GLPK
  if (p.candidates.empty() || p.positions == 0) return bound;
  detail::IlpModel full = detail::build_ilp(p, 0, true);
  if (!full.infeasible.empty()) return bound;
  std::vector<std::size_t> device_rows, other_rows;
  for (std::size_t k = 0; k < full.rows.size(); ++k)
    (full.rows[k].tier == 0 ? device_rows : other_rows).push_back(k);
  if (device_rows.empty()) return bound;
  std::vector<char> in(full.rows.size(), 0);
  auto add_top = [&](const std::vector<std::int64_t>& at, int how_many) {
    std::vector<std::size_t> order(device_rows);
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      return at[std::size_t(full.rows[a].position)] > at[std::size_t(full.rows[b].position)];
    });
    int added = 0;
    for (std::size_t k : order) {
      if (added >= how_many) break;
      if (!in[k]) in[k] = 1, ++added;
    }
    return added;
  };
  add_top(profiles(p, least_memory_heuristic(p).choice).device, 4);
  add_top(least_bytes_by_position(p), 4);
  for (int round = 0; round < rounds; ++round) {
    detail::IlpModel m = full;
    m.rows.clear();
    for (std::size_t k : other_rows) m.rows.push_back(full.rows[k]);
    for (std::size_t k : device_rows)
      if (in[k]) m.rows.push_back(full.rows[k]);
    // No time limit: the node limit ends a run, the same on every machine.
    const detail::GlpkAnswer a = detail::run_glpk(p, m, 1e9, node_limit);
    const bool proved = a.ret == 0 && a.status == GLP_OPT;
    const bool has = a.has_solution();
    // In bytes: a proved optimum, else the least bound still open (never
    // above an answer found).
    double lb = proved ? a.objective : a.open_bound_seen ? a.open_bound : -1;
    if (!proved && has) lb = std::min(lb, a.objective);
    if (lb > 0) bound = std::max(bound, std::int64_t(std::ceil(lb - 1e-6 * std::abs(lb))));  // GLPK's tolerance
    if (!has) break;
    const Evaluation e = evaluate(p, a.choice);
    if (proved && fits_target(p, e, e.device_peak) && e.device_peak <= bound) {  // fits every row, in exact bytes: the exact least
      if (exact) *exact = true;
      return std::max(bound, e.device_peak);
    }
    if (add_top(profiles(p, a.choice).device, 4) == 0) break;
  }
#else
  (void)node_limit, (void)rounds;
#endif
  return bound;
}

}  // namespace frugal::plan
