#pragma once
// Offsets in one arena for values with known lifetimes: greedy by size,
// best fit among the gaps left by already-placed values that overlap in time
// (the "greedy by size" arena planner of TFLite and ggml).
#include <algorithm>
#include <numeric>

#include "liveness.hpp"

namespace frugal::plan {

struct Placement {
  std::vector<std::size_t> offset;  // parallel to the intervals
  std::size_t arena_bytes = 0;
};

inline Placement assign_offsets(const std::vector<Interval>& iv) {
  std::vector<std::size_t> order(iv.size());
  std::iota(order.begin(), order.end(), 0);
  // Larger first; among equals, longer-lived first; then by value id, so the
  // result does not depend on the sort's tie-breaking.
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    if (iv[a].bytes != iv[b].bytes) return iv[a].bytes > iv[b].bytes;
    int la = iv[a].last - iv[a].first, lb = iv[b].last - iv[b].first;
    if (la != lb) return la > lb;
    return iv[a].value < iv[b].value;
  });
  Placement p;
  p.offset.assign(iv.size(), 0);
  std::vector<std::size_t> placed;
  std::vector<std::pair<std::size_t, std::size_t>> busy;  // [begin, end) of overlapping placed values
  for (std::size_t i : order) {
    busy.clear();
    for (std::size_t j : placed)
      if (iv[i].overlaps(iv[j])) busy.push_back({p.offset[j], p.offset[j] + iv[j].bytes});
    std::sort(busy.begin(), busy.end());
    std::size_t best = SIZE_MAX, best_gap = SIZE_MAX, cursor = 0;
    for (auto [b, e] : busy) {
      if (b > cursor && b - cursor >= iv[i].bytes && b - cursor < best_gap) {
        best = cursor;
        best_gap = b - cursor;
      }
      cursor = std::max(cursor, e);
    }
    p.offset[i] = best != SIZE_MAX ? best : cursor;
    p.arena_bytes = std::max(p.arena_bytes, p.offset[i] + iv[i].bytes);
    placed.push_back(i);
  }
  return p;
}

}  // namespace frugal::plan
