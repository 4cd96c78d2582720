#pragma once
// Offsets in one arena for values with known lifetimes: greedy by size,
// best fit among the gaps left by already-placed values that overlap in time
// (the "greedy by size" arena planner of TFLite and ggml).
#include <algorithm>
#include <cstdint>
#include <map>
#include <numeric>

#include "liveness.hpp"

namespace frugal::plan {

struct Placement {
  std::vector<std::size_t> offset;  // parallel to the intervals
  std::size_t arena_bytes = 0;
};

namespace detail {

// The placed intervals, found by time: those overlapping [a, b] are those
// covering a, and those starting in (a, b]. The first are kept in a segment
// tree over positions, each interval at the nodes that split its span, so a
// walk from the root to a's leaf meets each interval covering a exactly
// once; the second in a map by first position. Asking only these, not every
// placed interval, is what keeps a step of 150,000 buffers (a 20T-parameter
// GPT's, tiled) from taking minutes per placement.
class PlacedByTime {
 public:
  explicit PlacedByTime(int positions) {
    while (leaves_ < positions) leaves_ *= 2;
    covering_.resize(std::size_t(2 * leaves_));
  }
  void add(const Interval& v, std::uint32_t id) {
    cover(1, 0, leaves_ - 1, v.first, v.last, id);
    by_first_.emplace(v.first, id);
  }
  template <class Visit>
  void overlapping(const Interval& v, Visit&& visit) const {
    for (int node = 1, lo = 0, hi = leaves_ - 1;;) {
      for (std::uint32_t id : covering_[std::size_t(node)]) visit(id);
      if (lo == hi) break;
      const int mid = lo + (hi - lo) / 2;
      if (v.first <= mid) node = 2 * node, hi = mid;
      else node = 2 * node + 1, lo = mid + 1;
    }
    for (auto it = by_first_.upper_bound(v.first); it != by_first_.end() && it->first <= v.last; ++it) visit(it->second);
  }

 private:
  void cover(int node, int lo, int hi, int first, int last, std::uint32_t id) {
    if (last < lo || hi < first) return;
    if (first <= lo && hi <= last) {
      covering_[std::size_t(node)].push_back(id);
      return;
    }
    const int mid = lo + (hi - lo) / 2;
    cover(2 * node, lo, mid, first, last, id);
    cover(2 * node + 1, mid + 1, hi, first, last, id);
  }
  int leaves_ = 1;
  std::vector<std::vector<std::uint32_t>> covering_;
  std::multimap<int, std::uint32_t> by_first_;
};

}  // namespace detail

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
  int positions = 1;
  for (const Interval& v : iv) positions = std::max(positions, v.last + 1);
  detail::PlacedByTime placed(positions);
  std::vector<std::pair<std::size_t, std::size_t>> busy;  // [begin, end) of overlapping placed values
  for (std::size_t i : order) {
    busy.clear();
    placed.overlapping(iv[i], [&](std::uint32_t j) { busy.push_back({p.offset[j], p.offset[j] + iv[j].bytes}); });
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
    placed.add(iv[i], std::uint32_t(i));
  }
  return p;
}

}  // namespace frugal::plan
