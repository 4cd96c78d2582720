#pragma once
// Streaming quantiles in bounded memory: a merging t-digest (Dunning and
// Ertl, "Computing extremely accurate quantiles using t-digests"). Samples
// are buffered, and when the buffer fills they are sorted together with the
// current centroids and merged greedily under the k1 scale function
// k(q) = compression / (2 pi) * asin(2q - 1): a centroid may span at most one
// unit of k. Centroids are therefore narrow at the tails and wide (about
// pi / compression of the rank) at the median; two neighbours always span
// more than one unit together, so there are never more than
// compression + 1 of them (centroid_bound()).
//
// Every buffer is sized in the constructor, so add() and merge() never
// allocate: op timings are recorded inside the step, which allocates nothing.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <numbers>
#include <vector>

#include "../core/error.hpp"

namespace frugal {

class StreamingQuantiles {
 public:
  explicit StreamingQuantiles(double compression = 100) : compression_(compression) {
    if (!(compression >= 10 && compression <= 10000))
      fail("StreamingQuantiles: compression ", compression,
           " is out of range: use 10..10000 (100 keeps rank errors near 1% at the median)");
    bound_ = std::size_t(std::ceil(compression)) + 1;
    buffer_cap_ = 2 * bound_;
    merged_.resize(bound_);
    work_.resize(buffer_cap_ + bound_);
  }

  void add(double x) {
    if (!std::isfinite(x)) fail("StreamingQuantiles::add: sample ", x, " is not a finite number");
    add_weighted(x, 1.0);
    ++count_;
    if (count_ == 1) min_ = max_ = x;
    min_ = std::min(min_, x);
    max_ = std::max(max_, x);
  }

  // Folds another digest's samples into this one (as if they had been added
  // here), without allocating.
  void merge(const StreamingQuantiles& other) {
    if (other.count_ == 0) return;
    if (&other == this) {  // every sample twice: same centroids, double weight
      flush();
      for (std::size_t i = 0; i < n_merged_; ++i) merged_[i].weight *= 2;
      count_ *= 2;
      return;
    }
    for (std::size_t i = 0; i < other.n_merged_; ++i) add_weighted(other.merged_[i].mean, other.merged_[i].weight);
    for (std::size_t i = 0; i < other.n_work_; ++i) add_weighted(other.work_[i].mean, other.work_[i].weight);
    min_ = count_ == 0 ? other.min_ : std::min(min_, other.min_);
    max_ = count_ == 0 ? other.max_ : std::max(max_, other.max_);
    count_ += other.count_;
  }

  // The value below which a fraction q of the samples lie, interpolated
  // linearly between centroid centres (and the exact min and max at the
  // ends). Flushes buffered samples into the centroids first, so it is const
  // in meaning but must not race with another call on the same digest.
  double quantile(double q) const {
    if (count_ == 0)
      fail("StreamingQuantiles::quantile: no samples were added; add at least one before asking for a quantile");
    if (!(q >= 0 && q <= 1)) fail("StreamingQuantiles::quantile: q = ", q, " is outside [0, 1]");
    flush();
    double index = q * double(count_);
    double prev_rank = 0, prev_value = min_, before = 0;
    for (std::size_t i = 0; i < n_merged_; ++i) {
      const Centroid& c = merged_[i];
      double rank = before + c.weight / 2;
      if (index <= rank) return interpolate(prev_rank, prev_value, rank, c.mean, index);
      prev_rank = rank, prev_value = c.mean;
      before += c.weight;
    }
    return interpolate(prev_rank, prev_value, double(count_), max_, index);
  }

  std::uint64_t count() const { return count_; }
  double min() const {
    if (count_ == 0) fail("StreamingQuantiles::min: no samples were added");
    return min_;
  }
  double max() const {
    if (count_ == 0) fail("StreamingQuantiles::max: no samples were added");
    return max_;
  }
  double compression() const { return compression_; }
  // Centroids after folding in the buffer; never more than centroid_bound().
  std::size_t centroid_count() const {
    flush();
    return n_merged_;
  }
  std::size_t centroid_bound() const { return bound_; }
  // Bytes this digest holds, fixed at construction.
  std::size_t memory_bytes() const { return sizeof(*this) + (merged_.size() + work_.size()) * sizeof(Centroid); }

 private:
  struct Centroid {
    double mean;
    double weight;
  };

  static double interpolate(double r0, double v0, double r1, double v1, double r) {
    if (r1 <= r0) return v1;
    return v0 + (v1 - v0) * std::clamp((r - r0) / (r1 - r0), 0.0, 1.0);
  }

  void add_weighted(double mean, double weight) {
    if (n_work_ == buffer_cap_) flush();
    work_[n_work_++] = {mean, weight};
  }

  // The largest rank fraction a centroid starting at rank fraction q0 may
  // reach: one unit of k further.
  double rank_limit(double q0) const {
    constexpr double pi = std::numbers::pi;
    double k0 = compression_ / (2 * pi) * std::asin(std::clamp(2 * q0 - 1, -1.0, 1.0));
    double k1 = std::min(k0 + 1, compression_ / 4);
    return (std::sin(2 * pi * k1 / compression_) + 1) / 2;
  }

  // Sorts the buffer together with the centroids and merges them left to
  // right (or, every other time, right to left, so the small bias of a
  // greedy pass does not pile up on one side).
  void flush() const {
    if (n_work_ == 0) return;
    std::copy(merged_.begin(), merged_.begin() + std::ptrdiff_t(n_merged_), work_.begin() + std::ptrdiff_t(n_work_));
    std::size_t n = n_work_ + n_merged_;
    std::sort(work_.begin(), work_.begin() + std::ptrdiff_t(n),
              [](const Centroid& a, const Centroid& b) { return a.mean < b.mean; });
    if (reverse_) std::reverse(work_.begin(), work_.begin() + std::ptrdiff_t(n));
    double total = 0;
    for (std::size_t i = 0; i < n; ++i) total += work_[i].weight;
    n_merged_ = 0;
    Centroid cur = work_[0];
    double before = 0;  // weight of the centroids already emitted
    double limit = total * rank_limit(0);
    for (std::size_t i = 1; i < n; ++i) {
      const Centroid& x = work_[i];
      if (before + cur.weight + x.weight <= limit) {
        cur.weight += x.weight;
        cur.mean += (x.mean - cur.mean) * x.weight / cur.weight;
      } else {
        emit(cur);
        before += cur.weight;
        limit = total * rank_limit(before / total);
        cur = x;
      }
    }
    emit(cur);
    if (reverse_) std::reverse(merged_.begin(), merged_.begin() + std::ptrdiff_t(n_merged_));
    reverse_ = !reverse_;
    n_work_ = 0;
  }

  void emit(const Centroid& c) const {
    if (n_merged_ < bound_) {
      merged_[n_merged_++] = c;
      return;
    }
    // Not reachable by the bound argument above; rounding must not overflow
    // the fixed buffer, so fold into the last centroid instead.
    Centroid& last = merged_[n_merged_ - 1];
    last.weight += c.weight;
    last.mean += (c.mean - last.mean) * c.weight / last.weight;
  }

  double compression_;
  std::size_t bound_ = 0, buffer_cap_ = 0;
  // Flushing reorganises the samples without changing what they are, so
  // the storage is mutable and quantile() stays const.
  mutable std::vector<Centroid> merged_;  // sorted by mean; n_merged_ in use
  mutable std::vector<Centroid> work_;    // unmerged samples; room for the centroids too
  mutable std::size_t n_merged_ = 0, n_work_ = 0;
  mutable bool reverse_ = false;
  std::uint64_t count_ = 0;
  double min_ = 0, max_ = 0;
};

}  // namespace frugal
