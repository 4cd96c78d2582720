#pragma once
// The heuristic budget solver. While the device peak is over the target, it
// evicts, at the peak position, the candidate whose option frees the most
// bytes there per millisecond it costs (Capuchin's "memory saving per
// second"). Then it walks the choices back, dearest first, and undoes every
// one the target does not need. With target 0 it finds the least device
// memory its options can reach.
#include <algorithm>
#include <limits>

#include "budget_problem.hpp"

namespace frugal::plan {

struct Solution {
  std::vector<int> choice;  // option index per candidate
  Evaluation eval;
  bool feasible = false;  // eval.fits() for the target it was solved for
};

// Whether candidate i may switch to option j under `choice`: j's own
// requirements hold, and no other chosen option forbids it.
inline bool may_choose(const BudgetProblem& p, const std::vector<int>& choice, std::size_t i, int j) {
  for (auto& r : p.candidates[i].options[std::size_t(j)].requires_)
    if (!((r.allowed >> choice[std::size_t(r.candidate)]) & 1u)) return false;
  for (std::size_t k = 0; k < p.candidates.size(); ++k) {
    if (k == i) continue;
    for (auto& r : p.candidates[k].options[std::size_t(choice[k])].requires_)
      if (std::size_t(r.candidate) == i && !((r.allowed >> j) & 1u)) return false;
  }
  return true;
}

inline std::int64_t bytes_at(const std::vector<MemEffect>& effects, int t) {
  std::int64_t b = 0;
  for (auto& e : effects)
    if (e.span.contains(t)) b += e.bytes;
  return b;
}

// The positions where a device profile reaches `peak`, and what an option
// holds there in all: the local searches move candidates by the bytes they
// free at the peak, and repair requirements with the options that hold the
// fewest bytes there.
struct PeakPositions {
  std::vector<int> at;
  std::vector<int> before;  // before[t]: how many of `at` lie before position t
  PeakPositions(const std::vector<std::int64_t>& device, std::int64_t peak) : before(device.size() + 1, 0) {
    for (std::size_t t = 0; t < device.size(); ++t) {
      if (device[t] == peak) at.push_back(int(t));
      before[t + 1] = int(at.size());
    }
  }
  // How many peak positions [first, last] holds (by counts, not a walk: a
  // deep model's plateau has thousands).
  std::int64_t within(const Span& s) const {
    return s.empty() ? 0 : before[std::size_t(s.last) + 1] - before[std::size_t(s.first)];
  }
  std::int64_t bytes(const Option& o) const {
    std::int64_t b = 0;
    for (auto& e : o.device) b += e.bytes * within(e.span);
    return b;
  }
  // Whether switching a candidate from `from` to `to` frees bytes at some
  // peak position.
  bool frees(const Option& from, const Option& to) const {
    events.clear();
    for (auto& e : from.device)
      if (!e.span.empty()) events.push_back({e.span.first, -e.bytes}), events.push_back({e.span.last + 1, e.bytes});
    for (auto& e : to.device)
      if (!e.span.empty()) events.push_back({e.span.first, e.bytes}), events.push_back({e.span.last + 1, -e.bytes});
    std::sort(events.begin(), events.end());
    std::int64_t level = 0;
    for (std::size_t k = 0; k < events.size();) {
      const int t = events[k].first;
      for (; k < events.size() && events[k].first == t; ++k) level += events[k].second;
      if (level < 0 && k < events.size() && within({t, events[k].first - 1}) > 0) return true;
    }
    return false;
  }

 private:
  mutable std::vector<std::pair<int, std::int64_t>> events;  // frees()'s scratch
};

// The highest value of a profile over any span, in constant time (a sparse
// table): a move's long pieces (a persistent's option spans the whole step)
// are judged without a walk over their positions.
class RangeMax {
 public:
  explicit RangeMax(const std::vector<std::int64_t>& v) : value_(v) {
    std::vector<int> first(v.size());
    for (std::size_t t = 0; t < v.size(); ++t) first[t] = int(t);
    at_.push_back(std::move(first));
    for (std::size_t w = 1; 2 * w <= v.size(); w *= 2) {
      const std::vector<int>& prev = at_.back();
      std::vector<int> next(v.size() - 2 * w + 1);
      for (std::size_t t = 0; t < next.size(); ++t) next[t] = higher(prev[t], prev[t + w]);
      at_.push_back(std::move(next));
    }
  }
  std::int64_t operator()(int first, int last) const { return value_[std::size_t(argmax(first, last))]; }
  // A position of the span where the profile is highest (the first such
  // of two halves' answers): where a move that goes over a limit goes over.
  int argmax(int first, int last) const {
    const std::size_t n = std::size_t(last - first + 1);
    std::size_t k = 0;
    while ((std::size_t(2) << k) <= n) ++k;
    return higher(at_[k][std::size_t(first)], at_[k][std::size_t(last) + 1 - (std::size_t(1) << k)]);
  }

 private:
  int higher(int a, int b) const { return value_[std::size_t(b)] > value_[std::size_t(a)] ? b : a; }
  std::vector<std::int64_t> value_;
  std::vector<std::vector<int>> at_;
};

// A profile that changes by additions over spans, with the highest value
// over any span in logarithmic time (a segment tree whose nodes keep their
// own pending addition): passes that take moves one at a time (cheapen,
// undo_unneeded) add each taken move's pieces instead of rebuilding the
// profile from every candidate, which on a 1T-parameter step was most of a
// budgeted compile's time.
class RangeAddMax {
 public:
  explicit RangeAddMax(const std::vector<std::int64_t>& v) : n_(int(v.size())) {
    while (leaves_ < n_) leaves_ *= 2;
    most_.assign(2 * std::size_t(leaves_), kNone);
    added_.assign(2 * std::size_t(leaves_), 0);
    for (int t = 0; t < n_; ++t) most_[std::size_t(leaves_ + t)] = v[std::size_t(t)];
    for (int i = leaves_ - 1; i >= 1; --i)
      most_[std::size_t(i)] = std::max(most_[std::size_t(2 * i)], most_[std::size_t(2 * i + 1)]);
  }
  void add(int first, int last, std::int64_t bytes) {
    if (first <= last && n_ > 0) add(1, 0, leaves_ - 1, first, last, bytes);
  }
  // The highest value over [first, last].
  std::int64_t operator()(int first, int last) const { return most(1, 0, leaves_ - 1, first, last); }
  // The highest value, or 0 where it is below 0 or there are no positions
  // (as Evaluation::device_peak counts it).
  std::int64_t peak() const { return n_ > 0 ? std::max<std::int64_t>(0, most_[1]) : 0; }

 private:
  // Below any profile and far from overflowing when additions reach it.
  static constexpr std::int64_t kNone = std::numeric_limits<std::int64_t>::min() / 4;
  void add(int i, int lo, int hi, int first, int last, std::int64_t bytes) {
    if (last < lo || hi < first) return;
    if (first <= lo && hi <= last) {
      most_[std::size_t(i)] += bytes;
      added_[std::size_t(i)] += bytes;
      return;
    }
    const int mid = lo + (hi - lo) / 2;
    add(2 * i, lo, mid, first, last, bytes);
    add(2 * i + 1, mid + 1, hi, first, last, bytes);
    most_[std::size_t(i)] =
        std::max(most_[std::size_t(2 * i)], most_[std::size_t(2 * i + 1)]) + added_[std::size_t(i)];
  }
  std::int64_t most(int i, int lo, int hi, int first, int last) const {
    if (last < lo || hi < first) return kNone;
    if (first <= lo && hi <= last) return most_[std::size_t(i)];
    const int mid = lo + (hi - lo) / 2;
    return std::max(most(2 * i, lo, mid, first, last), most(2 * i + 1, mid + 1, hi, first, last)) +
           added_[std::size_t(i)];
  }
  int n_ = 0, leaves_ = 1;
  std::vector<std::int64_t> most_, added_;  // by node: highest value below it, addition pending at it
};

// Device bytes times positions an option adds (negative where it frees).
inline std::int64_t device_area(const Option& o) {
  std::int64_t a = 0;
  for (auto& e : o.device)
    if (!e.span.empty()) a += e.bytes * std::int64_t(e.span.last - e.span.first + 1);
  return a;
}

// Repairs the requirements a changed choice breaks, in place: a candidate
// the change requires in some state moves to the allowed option that holds
// the fewest bytes where `bytes_of` looks, and one whose option required
// the old state of a changed candidate moves to its own such option; each
// moved candidate is checked in turn, so a chain of recomputations (each
// needing its input recomputed no later than itself) moves as one. `fixed`
// (the candidate whose change started it) is never moved. Every change is
// logged in `undo` (candidate, option it had) so the caller can revert.
struct RequirementRepair {
  const BudgetProblem& p;
  std::vector<std::vector<std::size_t>> requirers;  // by candidate: candidates with an option requiring it
  explicit RequirementRepair(const BudgetProblem& problem) : p(problem), requirers(problem.candidates.size()) {
    for (std::size_t k = 0; k < p.candidates.size(); ++k)
      for (auto& o : p.candidates[k].options)
        for (auto& r : o.requires_)
          if (std::size_t(r.candidate) != k) requirers[std::size_t(r.candidate)].push_back(k);
    for (auto& v : requirers) v.erase(std::unique(v.begin(), v.end()), v.end());
  }
  static bool allows(const Requirement& r, int option) { return ((r.allowed >> option) & 1u) != 0; }
  // may_choose, through the index of who requires whom (may_choose walks
  // every candidate).
  bool may_choose(const std::vector<int>& choice, std::size_t c, int m) const {
    for (auto& r : p.candidates[c].options[std::size_t(m)].requires_)
      if (!allows(r, choice[std::size_t(r.candidate)])) return false;
    return allowed_by_others(choice, c, m);
  }
  // Whether every chosen option requiring something of c allows option m.
  bool allowed_by_others(const std::vector<int>& choice, std::size_t c, int m) const {
    for (std::size_t k : requirers[c])
      for (auto& r : p.candidates[k].options[std::size_t(choice[k])].requires_)
        if (std::size_t(r.candidate) == c && !allows(r, m)) return false;
    return true;
  }
  template <class BytesOf>
  bool repair(std::vector<int>& choice, std::size_t fixed, const BytesOf& bytes_of,
              std::vector<std::pair<std::size_t, int>>& undo, int max_moves = 256) const {
    std::vector<std::size_t> work{fixed};
    int moves = 0;
    auto move = [&](std::size_t c, int m) {
      undo.push_back({c, choice[c]});
      choice[c] = m;
      work.push_back(c);
      return ++moves <= max_moves;
    };
    // The best option of c satisfying `ok`, or -1.
    auto best_of = [&](std::size_t c, auto ok) {
      int best = -1;
      std::int64_t best_bytes = 0;
      for (int m = 0; m < int(p.candidates[c].options.size()); ++m) {
        if (m == choice[c] || !ok(m)) continue;
        const std::int64_t b = bytes_of(p.candidates[c].options[std::size_t(m)]);
        if (best < 0 || b < best_bytes) best = m, best_bytes = b;
      }
      return best;
    };
    while (!work.empty()) {
      const std::size_t c = work.back();
      work.pop_back();
      // What c's option needs of others.
      for (const Requirement& r : p.candidates[c].options[std::size_t(choice[c])].requires_) {
        const std::size_t d = std::size_t(r.candidate);
        if (allows(r, choice[d])) continue;
        if (d == fixed || d == c) return false;
        int m = best_of(d, [&](int k) { return allows(r, k) && allowed_by_others(choice, d, k); });
        if (m < 0 || !move(d, m)) return false;
      }
      // Those whose option needed c's old state.
      for (std::size_t k : requirers[c]) {
        bool broken = false;
        for (auto& r : p.candidates[k].options[std::size_t(choice[k])].requires_)
          broken = broken || (std::size_t(r.candidate) == c && !allows(r, choice[c]));
        if (!broken) continue;
        if (k == fixed) return false;
        int m = best_of(k, [&](int j) {
          for (auto& r : p.candidates[k].options[std::size_t(j)].requires_)
            if (std::size_t(r.candidate) == c && !allows(r, choice[c])) return false;
          return allowed_by_others(choice, k, j);
        });
        if (m < 0 || !move(k, m)) return false;
      }
    }
    return true;
  }
};

// The net change of a tier's bytes (`tier`: &Option::device, ::host or
// ::nvme) from switching candidates' options (each (candidate, option it
// had) in `was`, the option it takes in `now`), as pieces of constant
// change, in position order (zero changes left out): a move's effect
// without evaluating the whole choice again.
struct DevicePiece {
  int first, last;
  std::int64_t bytes;
};
// Into `pieces`, with `events` as scratch (the local search judges millions
// of moves: allocating per move was a third of its time).
inline void tier_change_into(std::vector<DevicePiece>& pieces, std::vector<std::pair<int, std::int64_t>>& events,
                             const BudgetProblem& p, const std::vector<std::pair<std::size_t, int>>& was,
                             const std::vector<std::pair<std::size_t, int>>& now,
                             std::vector<MemEffect> Option::*tier = &Option::device) {
  events.clear();
  pieces.clear();
  auto add = [&](const std::vector<MemEffect>& effects, int sign) {
    for (auto& e : effects)
      if (!e.span.empty()) events.push_back({e.span.first, sign * e.bytes}), events.push_back({e.span.last + 1, -sign * e.bytes});
  };
  for (std::size_t w = 0; w < was.size(); ++w) {
    const auto& opts = p.candidates[was[w].first].options;
    add(opts[std::size_t(was[w].second)].*tier, -1);
    add(opts[std::size_t(now[w].second)].*tier, 1);
  }
  std::sort(events.begin(), events.end());
  std::int64_t level = 0;
  for (std::size_t k = 0; k < events.size();) {
    const int at = events[k].first;
    for (; k < events.size() && events[k].first == at; ++k) level += events[k].second;
    if (k < events.size() && level != 0) pieces.push_back({at, events[k].first - 1, level});
  }
}
inline std::vector<DevicePiece> tier_change(const BudgetProblem& p, const std::vector<std::pair<std::size_t, int>>& was,
                                            const std::vector<std::pair<std::size_t, int>>& now,
                                            std::vector<MemEffect> Option::*tier = &Option::device) {
  std::vector<DevicePiece> pieces;
  std::vector<std::pair<int, std::int64_t>> events;
  tier_change_into(pieces, events, p, was, now, tier);
  return pieces;
}

// Sets back to keep, dearest first, every eviction in `choice` that the
// device peak does not need to stay at or under `bound` (requirements kept).
// Each undo is judged by what it changes: the requirements through the
// index of who requires whom, the peak through the profile's range maximum,
// updated by the undos taken (evaluating the whole choice per undo made
// this pass quadratic: a fifth of a 1T-parameter step's budgeted compile).
inline Solution undo_unneeded(const BudgetProblem& p, std::vector<int> choice, std::int64_t bound) {
  Solution s;
  s.choice = std::move(choice);
  std::vector<std::size_t> chosen;
  for (std::size_t i = 0; i < s.choice.size(); ++i)
    if (s.choice[i] != 0) chosen.push_back(i);
  std::stable_sort(chosen.begin(), chosen.end(), [&](std::size_t a, std::size_t b) {
    return p.candidates[a].options[std::size_t(s.choice[a])].cost_ms >
           p.candidates[b].options[std::size_t(s.choice[b])].cost_ms;
  });
  const RequirementRepair index(p);
  const bool keep_requires_nothing = std::all_of(p.candidates.begin(), p.candidates.end(), [](const Candidate& c) {
    return c.options.empty() || c.options[0].requires_.empty();
  });
  if (keep_requires_nothing && requirements_met(p, s.choice)) {
    // Keep (option 0) requires nothing, so an undo that no chosen option
    // forbids leaves every requirement met.
    RangeAddMax device(profiles(p, s.choice).device);
    std::vector<DevicePiece> pieces;
    std::vector<std::pair<int, std::int64_t>> events;
    std::vector<std::pair<std::size_t, int>> was(1), now(1);
    for (std::size_t i : chosen) {
      if (!index.may_choose(s.choice, i, 0)) continue;
      was[0] = {i, s.choice[i]};
      now[0] = {i, 0};
      tier_change_into(pieces, events, p, was, now);
      for (const DevicePiece& pc : pieces) device.add(pc.first, pc.last, pc.bytes);
      if (device.peak() <= bound) {
        s.choice[i] = 0;
        continue;
      }
      for (const DevicePiece& pc : pieces) device.add(pc.first, pc.last, -pc.bytes);
    }
  } else {  // unmet already: only an undo that meets them all may pass
    for (std::size_t i : chosen) {
      int was = s.choice[i];
      if (!index.may_choose(s.choice, i, 0)) continue;
      s.choice[i] = 0;
      Evaluation e = evaluate(p, s.choice);
      if (!e.requirements_met || e.device_peak > bound) s.choice[i] = was;
    }
  }
  s.eval = evaluate(p, s.choice);
  s.feasible = s.eval.requirements_met && s.eval.device_peak <= bound;
  return s;
}

// Whether switching options as `was` -> `now` keeps a tier (`tier` of each
// option) within `limit` (0: none) over its profile, whose highest value
// over a span `most(first, last)` gives (RangeMax, RangeAddMax): by the
// move's net change, so a move of several parts that each fit alone but not
// together is refused, and one that trades a tier's bytes for others is not.
template <class Most>
bool change_fits(const BudgetProblem& p, const Most& most, const std::vector<std::pair<std::size_t, int>>& was,
                 const std::vector<std::pair<std::size_t, int>>& now, std::vector<MemEffect> Option::*tier,
                 std::int64_t limit) {
  if (limit == 0) return true;
  for (const DevicePiece& pc : tier_change(p, was, now, tier))
    if (pc.bytes > 0 && most(pc.first, pc.last) + pc.bytes > limit) return false;
  return true;
}

// Above this many candidates solve_greedy takes several moves a round.
inline constexpr std::size_t kBatchMovesAbove = 1000;

inline Solution solve_greedy(const BudgetProblem& p, std::int64_t target) {
  Solution s;
  s.choice.assign(p.candidates.size(), 0);
  const RequirementRepair repair(p);
  // Each round lowers the bytes at the current peak; a move may also switch
  // a candidate already evicted to a dearer option that frees more there.
  for (std::size_t round = 0; round <= 4 * p.candidates.size(); ++round) {
    Profiles pr = profiles(p, s.choice);
    // The host and NVMe limits judged by range maxima: a persistent's
    // option spans the whole step, and walking it per move tried was most
    // of a deep model's greedy.
    const RangeMax host_max(p.host_budget ? pr.host : std::vector<std::int64_t>{}),
        nvme_max(p.nvme_budget ? pr.nvme : std::vector<std::int64_t>{});
    int peak = 0;
    for (int t = 1; t < p.positions; ++t)
      if (pr.device[std::size_t(t)] > pr.device[std::size_t(peak)]) peak = t;
    if (p.positions == 0 || pr.device[std::size_t(peak)] <= target) break;
    // A move sets one candidate's option, together with what its
    // requirements then ask of others (a persistent's inner window needs the
    // persistent to live on the host first; a recomputation needs its inputs
    // kept or recomputed no later than itself), RequirementRepair.
    double best_score = -1;
    std::vector<std::pair<std::size_t, int>> best;
    std::vector<std::pair<std::size_t, int>> undo, move_was;
    // Large problems (a model of hundreds of layers) take several moves per
    // round, best first, while they free no more at the peak together than
    // it is over the target: one move a round made their solve quadratic in
    // the candidates (minutes at 5000). Small ones take one, as always.
    const bool batch = p.candidates.size() > kBatchMovesAbove;
    struct Scored {
      double score;
      std::int64_t saving;
      std::vector<std::pair<std::size_t, int>> move;
    };
    std::vector<Scored> scored;
    auto at_peak = [&](const Option& o) { return bytes_at(o.device, peak); };
    for (std::size_t i = 0; i < p.candidates.size(); ++i) {
      const auto& opts = p.candidates[i].options;
      for (int j = 1; j < int(opts.size()); ++j) {
        if (j == s.choice[i]) continue;
        // Cheap test first: the candidate alone must free bytes at the peak.
        if (bytes_at(opts[std::size_t(j)].device, peak) >= bytes_at(opts[std::size_t(s.choice[i])].device, peak)) continue;
        undo.clear();
        undo.push_back({i, s.choice[i]});
        s.choice[i] = j;
        bool ok = repair.repair(s.choice, i, at_peak, undo);
        std::int64_t saving = 0;
        double cost = 0;
        std::vector<std::pair<std::size_t, int>> move;
        move_was.clear();
        if (ok) {
          for (auto [c, was_option] : undo) {
            if (std::find_if(move.begin(), move.end(), [&](auto& m) { return m.first == c; }) != move.end()) continue;
            // The first entry for c holds the option it had before the move.
            const Option& was = p.candidates[c].options[std::size_t(was_option)];
            const Option& oc = p.candidates[c].options[std::size_t(s.choice[c])];
            saving += bytes_at(was.device, peak) - bytes_at(oc.device, peak);
            cost += oc.cost_ms - was.cost_ms;
            move.push_back({c, s.choice[c]});
            move_was.push_back({c, was_option});
          }
          ok = saving > 0 && change_fits(p, host_max, move_was, move, &Option::host, p.host_budget) &&
               change_fits(p, nvme_max, move_was, move, &Option::nvme, p.nvme_budget);
        }
        for (auto it = undo.rbegin(); it != undo.rend(); ++it) s.choice[it->first] = it->second;
        if (!ok || saving <= 0) continue;
        double score = double(saving) / (std::max(cost, 0.0) + 1e-3);
        if (batch) scored.push_back({score, saving, move});
        if (score > best_score) {
          best_score = score;
          best = move;
        }
      }
    }
    if (best_score < 0) break;  // nothing frees bytes at the peak: this is as low as it goes
    if (!batch) {
      for (auto [c, k] : best) s.choice[c] = k;
      continue;
    }
    std::stable_sort(scored.begin(), scored.end(), [](const Scored& a, const Scored& b) { return a.score > b.score; });
    const std::int64_t excess = pr.device[std::size_t(peak)] - target;
    std::int64_t freed = 0;
    std::vector<char> touched(p.candidates.size(), 0);
    std::vector<std::pair<std::size_t, int>> was;
    RangeAddMax host(pr.host), nvme(pr.nvme);
    // A move must leave every position it adds bytes to below this round's
    // peak: one that lifts another position to it only moves the peak, and
    // such moves undid each other round after round (a candidate's options
    // free different spans, so the best at one peak is the worst at the
    // next) until the round limit, minutes into a deep model's solve.
    RangeAddMax device(pr.device);
    const std::int64_t peak_bytes = pr.device[std::size_t(peak)];
    for (const Scored& m : scored) {
      if (freed >= excess) break;
      bool disjoint = true;
      for (auto [c, k] : m.move) disjoint = disjoint && !touched[c];
      if (!disjoint) continue;
      // A move holds together (an option and the ones its requirements
      // moved), so it is set whole, then checked beside the moves taken:
      // part by part it may pass through a state no requirement allows.
      was.clear();
      for (auto [c, k] : m.move) {
        was.push_back({c, s.choice[c]});
        s.choice[c] = k;
      }
      bool ok = true;
      for (auto [c, k] : m.move) ok = ok && repair.may_choose(s.choice, c, k);
      const std::vector<DevicePiece> change = ok ? tier_change(p, was, m.move) : std::vector<DevicePiece>{};
      for (const DevicePiece& pc : change) ok = ok && (pc.bytes <= 0 || device(pc.first, pc.last) + pc.bytes < peak_bytes);
      // The host and NVMe bytes of the moves taken this round count too.
      ok = ok && change_fits(p, host, was, m.move, &Option::host, p.host_budget) &&
           change_fits(p, nvme, was, m.move, &Option::nvme, p.nvme_budget);
      if (!ok) {
        for (auto it = was.rbegin(); it != was.rend(); ++it) s.choice[it->first] = it->second;
        continue;
      }
      for (auto [tier, prof] : {std::pair{&Option::host, &host}, std::pair{&Option::nvme, &nvme}})
        for (const DevicePiece& pc : tier_change(p, was, m.move, tier)) prof->add(pc.first, pc.last, pc.bytes);
      for (const DevicePiece& pc : change) device.add(pc.first, pc.last, pc.bytes);
      for (auto [c, k] : m.move) touched[c] = 1;
      freed += m.saving;
    }
    // No move lowers the peak without lifting another position to it: as
    // low as this search goes (the local searches after it go on).
    if (freed == 0) break;
  }
  // Undo what the target does not need, dearest first.
  s = undo_unneeded(p, std::move(s.choice), std::max(target, evaluate(p, s.choice).device_peak));
  s.feasible = s.eval.requirements_met && s.eval.device_peak <= target &&
               (p.host_budget == 0 || s.eval.host_peak <= p.host_budget) &&
               (p.nvme_budget == 0 || s.eval.nvme_peak <= p.nvme_budget);
  return s;
}

// The least device memory the options reach (and a cheap way to reach it).
inline Solution solve_min_memory(const BudgetProblem& p) { return solve_greedy(p, 0); }

}  // namespace frugal::plan
