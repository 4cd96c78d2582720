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
      order_.resize(std::size_t(n_));
      std::iota(order_.begin(), order_.end(), 0);
      Rng r(seed_, 0x5eed0000u + std::uint64_t(e));
      for (std::size_t i = order_.size() - 1; i > 0; --i) std::swap(order_[i], order_[r.below(i + 1)]);
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

}  // namespace frugal::data
