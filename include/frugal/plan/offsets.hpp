#pragma once
// Offsets in one arena for values with known lifetimes: greedy by size,
// best fit among the gaps left by already-placed values that overlap in time
// (the "greedy by size" arena planner of TFLite and ggml).
#include <algorithm>
#include <cstdint>
#include <iterator>
#include <map>
#include <numeric>

#include "liveness.hpp"

namespace frugal::plan {

struct Placement {
  std::vector<std::size_t> offset;  // parallel to the intervals
  std::size_t arena_bytes = 0;
};

namespace detail {

// The bytes taken by placed intervals, found by time: those overlapping
// [a, b] are those covering a, and those starting in (a, b]. The first are
// kept in a segment tree over positions, each interval at the nodes that
// split its span (a walk from the root to a's leaf meets each interval
// covering a once); the second in a segment tree over first positions, each
// interval at its leaf's ancestors ((a, b] splits into a few nodes). A node
// keeps only the union of its intervals' offset ranges, as disjoint ranges:
// the best-fit scan reads the union of the ranges it is given, so unions of
// parts give the same gaps as every range, and neighbouring buffers packed
// end to end are one range. What a step of 150,000 buffers (a 20T-parameter
// GPT's, tiled) needs: listing and sorting every overlapping buffer took
// minutes per placement.
class PlacedByTime {
 public:
  explicit PlacedByTime(int positions) {
    while (leaves_ < positions) leaves_ *= 2;
    covering_.resize(std::size_t(2 * leaves_));
    starting_.resize(std::size_t(2 * leaves_));
  }
  void add(const Interval& v, std::size_t begin, std::size_t end) {
    cover(1, 0, leaves_ - 1, v.first, v.last, begin, end);
    for (int node = leaves_ + v.first; node >= 1; node /= 2) take(starting_[std::size_t(node)], begin, end);
  }
  // The offset ranges [begin, end) whose union is what the intervals
  // overlapping v in time take, appended to `out` (unsorted).
  void busy(const Interval& v, std::vector<std::pair<std::size_t, std::size_t>>& out) const {
    auto append = [&](const Ranges& r) { out.insert(out.end(), r.begin(), r.end()); };
    for (int node = 1, lo = 0, hi = leaves_ - 1;;) {
      append(covering_[std::size_t(node)]);
      if (lo == hi) break;
      const int mid = lo + (hi - lo) / 2;
      if (v.first <= mid) node = 2 * node, hi = mid;
      else node = 2 * node + 1, lo = mid + 1;
    }
    // First positions in (v.first, v.last]: bottom-up over the leaves' range.
    for (int l = leaves_ + v.first + 1, r = leaves_ + v.last + 1; l < r; l /= 2, r /= 2) {
      if (l & 1) append(starting_[std::size_t(l++)]);
      if (r & 1) append(starting_[std::size_t(--r)]);
    }
  }

 private:
  using Ranges = std::map<std::size_t, std::size_t>;  // begin -> end, disjoint, not touching
  static void take(Ranges& m, std::size_t b, std::size_t e) {
    auto it = m.upper_bound(b);
    if (it != m.begin())
      if (auto prev = std::prev(it); prev->second >= b) {
        b = prev->first;
        e = std::max(e, prev->second);
        it = m.erase(prev);
      }
    while (it != m.end() && it->first <= e) {
      e = std::max(e, it->second);
      it = m.erase(it);
    }
    m.emplace_hint(it, b, e);
  }
  void cover(int node, int lo, int hi, int first, int last, std::size_t b, std::size_t e) {
    if (last < lo || hi < first) return;
    if (first <= lo && hi <= last) {
      take(covering_[std::size_t(node)], b, e);
      return;
    }
    const int mid = lo + (hi - lo) / 2;
    cover(2 * node, lo, mid, first, last, b, e);
    cover(2 * node + 1, mid + 1, hi, first, last, b, e);
  }
  int leaves_ = 1;
  std::vector<Ranges> covering_, starting_;
};

}  // namespace detail

// Every interval holds at least one byte (liveness.hpp rounds up), so its
// range is never empty: an empty one would split a gap the union closes.
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
  std::vector<std::pair<std::size_t, std::size_t>> busy;  // [begin, end): their union is what overlapping values take
  for (std::size_t i : order) {
    busy.clear();
    placed.busy(iv[i], busy);
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
    placed.add(iv[i], p.offset[i], p.offset[i] + iv[i].bytes);
  }
  return p;
}

}  // namespace frugal::plan
