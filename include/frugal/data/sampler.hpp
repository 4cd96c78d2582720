#pragma once
// Epoch-wise shuffling that a resumed run reproduces: the permutation of
// epoch e is a Fisher-Yates shuffle driven by Philox(seed) on stream e, so
// the batch of any step is known from (seed, step) alone.
#include <cstdint>
#include <numeric>
#include <vector>

#include "../core/error.hpp"
#include "../core/rng.hpp"

namespace frugal::data {

namespace detail {
// Epoch e's order of n items: Fisher-Yates driven by Philox(seed) on stream e.
inline void shuffle(std::vector<std::int64_t>& order, std::int64_t n, std::uint64_t seed, std::int64_t e) {
  order.resize(std::size_t(n));
  std::iota(order.begin(), order.end(), 0);
  Rng r(seed, 0x5eed0000u + std::uint64_t(e));
  for (std::size_t i = order.size() - 1; i > 0; --i) std::swap(order[i], order[r.below(i + 1)]);
}
}  // namespace detail

class EpochSampler {
 public:
  // `n` items in batches of `batch`; the last partial batch of an epoch is dropped.
  EpochSampler(std::int64_t n, std::int64_t batch, std::uint64_t seed) : n_(n), batch_(batch), seed_(seed) {
    if (batch <= 0 || n < batch) fail("EpochSampler: ", n, " items cannot make a batch of ", batch);
  }
  std::int64_t batches_per_epoch() const { return n_ / batch_; }
  std::int64_t epoch_of(std::int64_t step) const { return step / batches_per_epoch(); }

  // The item indices of `step`'s batch.
  const std::int64_t* batch(std::int64_t step) {
    const std::int64_t e = epoch_of(step);
    if (e != epoch_) {
      detail::shuffle(order_, n_, seed_, e);
      epoch_ = e;
    }
    return order_.data() + (step % batches_per_epoch()) * batch_;
  }

 private:
  std::int64_t n_, batch_;
  std::uint64_t seed_;
  std::int64_t epoch_ = -1;
  std::vector<std::int64_t> order_;
};

// The same shuffles as one stream of items: position p is item
// order_e[p mod n] of epoch e = p / n. A job that counts the samples it
// has drawn (an elastic one, whose batch per rank changes with the rank
// count) takes positions [seen, seen + batch) each step, so every item of
// an epoch is drawn once, whatever the batches were.
class EpochStream {
 public:
  EpochStream(std::int64_t n, std::uint64_t seed) : n_(n), seed_(seed) {
    if (n <= 0) fail("EpochStream: ", n, " items");
  }
  std::int64_t size() const { return n_; }
  std::int64_t epoch_of(std::int64_t position) const { return position / n_; }
  std::int64_t item(std::int64_t position) {
    if (position < 0) fail("EpochStream: position ", position);
    const std::int64_t e = epoch_of(position);
    if (e != epoch_) {
      detail::shuffle(order_, n_, seed_, e);
      epoch_ = e;
    }
    return order_[std::size_t(position % n_)];
  }

 private:
  std::int64_t n_;
  std::uint64_t seed_;
  std::int64_t epoch_ = -1;
  std::vector<std::int64_t> order_;
};

}  // namespace frugal::data
