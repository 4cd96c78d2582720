#pragma once
// Whether a budget problem can fit at all, without searching it. At each
// position every value the step holds is on the device, in the host pool
// or on NVMe (or not held: recomputed later), and each tier's limit holds
// at every position; so for any weights w >= 0, the weighted bytes the
// tiers hold at a position are at most w_device * device limit + w_host *
// host limit + w_nvme * NVMe limit. Where the fewest weighted bytes any
// choice holds at some position exceed that, no choice fits, whatever the
// least-memory search would find. Two weightings are tried: every byte
// alike, and NVMe's counted half (an NVMe home takes two slots, one the
// step reads and one its write back fills, so a persistent costs the same
// there as on the host; counted whole, NVMe looks twice its size). Any
// weights give a true bound, so both hold for homes of one slot too.
//
// A feasibility search (PlanOptions::fit_only, frugal-plan's largest model)
// refuses such a step at once: on a 1T-parameter GPT over one DGX-2, ZeRO
// stages 0 to 2 hold 2 to 16 bytes a parameter per GPU, and their
// least-memory searches took most of each probe's time only to say so.
#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>

#include "budget_problem.hpp"

namespace frugal::plan {

// Integer weights of each tier's bytes.
struct TierWeights {
  std::int64_t device = 1, host = 1, nvme = 1;
};

// At each position, the base bytes plus, for every candidate, the fewest
// weighted bytes any one of its options holds there on the device, the
// host and NVMe together (the base, on the device, weighted too).
inline std::vector<std::int64_t> least_bytes_on_all_tiers(const BudgetProblem& p, TierWeights w = {}) {
  const int n = std::max(p.positions, 0);
  std::vector<std::int64_t> diff(std::size_t(n) + 1, 0);
  std::vector<int> cuts;
  std::vector<std::int64_t> level, fewest;
  for (const Candidate& c : p.candidates) {
    // The positions where some option's bytes change cut the step into
    // segments over which every option holds a constant amount.
    cuts.assign({0, n});
    for (const Option& o : c.options)
      for (const auto* tier : {&o.device, &o.host, &o.nvme})
        for (const MemEffect& e : *tier)
          if (!e.span.empty()) cuts.push_back(std::clamp(e.span.first, 0, n)), cuts.push_back(std::clamp(e.span.last + 1, 0, n));
    std::sort(cuts.begin(), cuts.end());
    cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
    const std::size_t segments = cuts.size() - 1;
    fewest.assign(segments, 0);
    for (std::size_t k = 0; k < c.options.size(); ++k) {
      const Option& o = c.options[k];
      level.assign(segments, 0);
      for (auto [tier, weight] : {std::pair{&o.device, w.device}, std::pair{&o.host, w.host}, std::pair{&o.nvme, w.nvme}})
        for (const MemEffect& e : *tier) {
          if (e.span.empty()) continue;
          for (std::size_t s = 0; s < segments; ++s)
            if (e.span.first <= cuts[s] && cuts[s] <= e.span.last) level[s] += weight * e.bytes;
        }
      for (std::size_t s = 0; s < segments; ++s) fewest[s] = k == 0 ? level[s] : std::min(fewest[s], level[s]);
    }
    for (std::size_t s = 0; s < segments; ++s) {
      diff[std::size_t(cuts[s])] += fewest[s];
      diff[std::size_t(cuts[s + 1])] -= fewest[s];
    }
  }
  std::vector<std::int64_t> least(static_cast<std::size_t>(n));
  std::int64_t run = 0;
  for (int t = 0; t < n; ++t) {
    run += diff[std::size_t(t)];
    least[std::size_t(t)] = w.device * p.base[std::size_t(t)] + run;
  }
  return least;
}

// Where the tiers cannot hold what the step needs: the position, the
// weights that show it, the weighted bytes needed there and the weighted
// limits together, and the device budget that would at least be needed
// with the host and NVMe full.
struct TiersOverflow {
  int position = 0;
  TierWeights weights;
  std::int64_t needed = 0;
  std::int64_t room = 0;
  std::int64_t least_device = 0;
};

// The first weighting (all alike, then NVMe halved) under which some
// position's least weighted bytes exceed the weighted limits, at its worst
// position; nothing where both fit, or where the host or NVMe has no limit
// (0; NVMe counts only where some option uses it).
inline std::optional<TiersOverflow> tiers_overflow(const BudgetProblem& p) {
  if (p.host_budget == 0 || p.positions <= 0) return std::nullopt;
  bool uses_nvme = false;
  for (const Candidate& c : p.candidates)
    for (const Option& o : c.options) uses_nvme = uses_nvme || !o.nvme.empty();
  if (uses_nvme && p.nvme_budget == 0) return std::nullopt;
  const std::int64_t nvme = uses_nvme ? p.nvme_budget : 0;
  for (TierWeights w : {TierWeights{1, 1, 1}, TierWeights{2, 2, 1}}) {
    if (!uses_nvme && w.nvme != w.device) continue;  // the same bound again
    const std::int64_t others = w.host * p.host_budget + w.nvme * nvme;
    const std::int64_t room = w.device * p.device_budget + others;
    const std::vector<std::int64_t> least = least_bytes_on_all_tiers(p, w);
    const auto most = std::max_element(least.begin(), least.end());
    if (*most <= room) continue;
    const std::int64_t device = (*most - others + w.device - 1) / w.device;
    return TiersOverflow{int(most - least.begin()), w, *most, room, device};
  }
  return std::nullopt;
}

}  // namespace frugal::plan
