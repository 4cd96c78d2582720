#pragma once
// One epoch of batches of many graphs, chosen by the memory each batch is
// predicted to need (balancing as in "memory-balanced batching" for GNNs on
// particle-track graphs), for one rank or R ranks stepping together.
//
// The bytes come from a callback over a candidate batch's graph indices, so
// this layer needs no planner: a program asks plan_training for the batch's
// shape (bench/graph_batching.cpp caches that per size bucket). Strategies:
//   - random: a seeded shuffle cut into batches of `graphs_per_batch`;
//   - sorted: graphs sorted by their own predicted bytes, cut into batches
//     of `graphs_per_batch` (similar graphs together), the batches' order
//     shuffled;
//   - packed: first-fit decreasing by predicted bytes: graphs, largest first
//     (ties in a seeded order, so batches differ from epoch to epoch), each
//     into the first batch whose prediction with it stays within `budget`,
//     else into a new batch; then the batches' order shuffled. No packed
//     batch is predicted over the budget, as the callback says for that very
//     batch (no additivity assumed); a graph over the budget alone is a
//     DataError naming it;
//   - mixed: the same first-fit within `budget`, but over the graphs in a
//     seeded random order instead of largest first. The peak is bounded as
//     packed's, and each batch mixes graphs of all sizes as random's do.
//     Train with this one: first-fit decreasing puts the largest graphs in
//     batches of their own and the smallest together, so where a graph's
//     size says something about its labels (in track events the share of
//     fake edges grows with the event) its batches' label mix swings from
//     step to step and training slows (bench/track_training.cpp: at equal
//     epochs packed reached F1 0.74 where random and mixed reached 0.95).
// With R ranks, batch b runs at step b / R on rank b % R. packed, mixed and
// sorted put batches of similar predicted bytes in one step (packed and
// mixed sort their batches by bytes, group R neighbours into a step, shuffle
// the steps), so ranks that wait for each other wait less; packed and mixed
// split their fullest batches until there are a multiple of R, and random
// and sorted pad the last step with empty batches (that rank sits the step
// out).
//
// Every epoch visits every graph exactly once, and an epoch's batches
// depend only on (seed, epoch): a resumed run sees the same batches.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <numeric>
#include <span>
#include <vector>

#include "../core/error.hpp"
#include "../core/rng.hpp"

namespace frugal::data {

enum class BatchStrategy { random, sorted, packed, mixed };

inline const char* strategy_name(BatchStrategy s) {
  return s == BatchStrategy::random   ? "random"
         : s == BatchStrategy::sorted ? "sorted"
         : s == BatchStrategy::packed ? "packed"
                                      : "mixed";
}

// The predicted device bytes of a batch of these graphs (dataset indices).
using BatchBytes = std::function<std::size_t(std::span<const std::int64_t>)>;

struct BatchOptions {
  BatchStrategy strategy = BatchStrategy::mixed;
  std::int64_t graphs_per_batch = 16;  // random and sorted
  std::size_t budget = 0;              // packed and mixed: the most bytes a batch may be predicted to need
  std::int64_t ranks = 1;
  std::uint64_t seed = 0;
};

struct EpochBatches {
  std::int64_t ranks = 1;
  std::vector<std::vector<std::int64_t>> batches;  // batch b: step b / ranks, rank b % ranks
  std::vector<std::size_t> bytes;                  // [batches] predicted bytes (0 for an empty batch)

  std::int64_t steps() const { return std::int64_t(batches.size()) / ranks; }
};

namespace balanced_detail {

inline void shuffle(std::vector<std::int64_t>& v, Rng& r) {
  for (std::size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[r.below(i)]);
}

// The batches in the order of `order` (a permutation of their ids).
inline void reorder(EpochBatches& e, const std::vector<std::int64_t>& order) {
  EpochBatches out;
  out.ranks = e.ranks;
  for (std::int64_t b : order) {
    out.batches.push_back(std::move(e.batches[std::size_t(b)]));
    out.bytes.push_back(e.bytes[std::size_t(b)]);
  }
  e = std::move(out);
}

inline std::vector<std::int64_t> iota(std::size_t n) {
  std::vector<std::int64_t> v(n);
  std::iota(v.begin(), v.end(), 0);
  return v;
}

// Groups of `ranks` neighbouring batches (in the order given) become steps,
// in a seeded order.
inline void shuffle_steps(EpochBatches& e, Rng& r) {
  const std::size_t R = std::size_t(e.ranks), steps = e.batches.size() / R;
  std::vector<std::int64_t> step_order = iota(steps), order;
  shuffle(step_order, r);
  for (std::int64_t s : step_order)
    for (std::size_t k = 0; k < R; ++k) order.push_back(s * std::int64_t(R) + std::int64_t(k));
  reorder(e, order);
}

}  // namespace balanced_detail

// The batches of `epoch` over graphs 0..graphs-1 (see the header comment).
inline EpochBatches epoch_batches(std::int64_t graphs, const BatchBytes& bytes_of, const BatchOptions& o,
                                  std::int64_t epoch) {
  namespace bd = balanced_detail;
  if (graphs < 1) fail<DataError>("epoch_batches: no graphs to batch");
  if (o.ranks < 1) fail<DataError>("epoch_batches: ranks must be at least 1, got ", o.ranks);
  if (!bytes_of) fail<DataError>("epoch_batches: needs a callback for the predicted bytes of a batch");
  const bool by_budget = o.strategy == BatchStrategy::packed || o.strategy == BatchStrategy::mixed;
  if (!by_budget && o.graphs_per_batch < 1)
    fail<DataError>("epoch_batches: ", strategy_name(o.strategy), " batching needs graphs_per_batch >= 1, got ",
                    o.graphs_per_batch);
  if (by_budget && o.budget == 0)
    fail<DataError>("epoch_batches: ", strategy_name(o.strategy),
                    " batching needs a budget in bytes (BatchOptions::budget)");
  Rng r(o.seed, 0xba7c0000u + std::uint64_t(epoch));
  EpochBatches e;
  e.ranks = o.ranks;
  std::vector<std::int64_t> order = bd::iota(std::size_t(graphs));
  bd::shuffle(order, r);
  auto one = [&](std::int64_t g) { return bytes_of(std::span<const std::int64_t>(&g, 1)); };

  if (!by_budget) {
    if (o.strategy == BatchStrategy::sorted) {
      std::vector<std::size_t> alone(static_cast<std::size_t>(graphs));
      for (std::int64_t g = 0; g < graphs; ++g) alone[std::size_t(g)] = one(g);
      std::stable_sort(order.begin(), order.end(),
                       [&](std::int64_t a, std::int64_t b) { return alone[std::size_t(a)] > alone[std::size_t(b)]; });
    }
    for (std::size_t at = 0; at < order.size(); at += std::size_t(o.graphs_per_batch)) {
      const std::size_t end = std::min(order.size(), at + std::size_t(o.graphs_per_batch));
      e.batches.emplace_back(order.begin() + std::ptrdiff_t(at), order.begin() + std::ptrdiff_t(end));
      e.bytes.push_back(bytes_of(e.batches.back()));
    }
    while (e.batches.size() % std::size_t(o.ranks) != 0) e.batches.emplace_back(), e.bytes.push_back(0);
    if (o.strategy == BatchStrategy::sorted) bd::shuffle_steps(e, r);
    return e;
  }

  // packed: first-fit decreasing, ties in the shuffled order; mixed:
  // first-fit in the shuffled order.
  std::vector<std::size_t> alone(static_cast<std::size_t>(graphs));
  for (std::int64_t g = 0; g < graphs; ++g) {
    alone[std::size_t(g)] = one(g);
    if (alone[std::size_t(g)] > o.budget)
      fail<DataError>("epoch_batches: graph ", g, " alone is predicted to need ", alone[std::size_t(g)],
                      " bytes, over the budget of ", o.budget,
                      " per batch; raise the budget or leave the graph out (or split it)");
  }
  if (o.strategy == BatchStrategy::packed)
    std::stable_sort(order.begin(), order.end(),
                     [&](std::int64_t a, std::int64_t b) { return alone[std::size_t(a)] > alone[std::size_t(b)]; });
  for (std::int64_t g : order) {
    bool placed = false;
    for (std::size_t b = 0; b < e.batches.size() && !placed; ++b) {
      e.batches[b].push_back(g);
      const std::size_t with = bytes_of(e.batches[b]);
      if (with <= o.budget) e.bytes[b] = with, placed = true;
      else e.batches[b].pop_back();
    }
    if (!placed) e.batches.push_back({g}), e.bytes.push_back(alone[std::size_t(g)]);
  }
  // Split the batch of most graphs in two until the ranks divide the batches
  // (each half checked again: the callback need not be monotone).
  while (e.batches.size() % std::size_t(o.ranks) != 0) {
    std::vector<std::int64_t> by_count = bd::iota(e.batches.size());
    std::stable_sort(by_count.begin(), by_count.end(), [&](std::int64_t a, std::int64_t b) {
      return e.batches[std::size_t(a)].size() > e.batches[std::size_t(b)].size();
    });
    bool split = false;
    for (std::int64_t b : by_count) {
      std::vector<std::int64_t>& whole = e.batches[std::size_t(b)];
      if (whole.size() < 2) break;
      std::vector<std::int64_t> lo(whole.begin(), whole.begin() + std::ptrdiff_t(whole.size() / 2)),
          hi(whole.begin() + std::ptrdiff_t(whole.size() / 2), whole.end());
      const std::size_t lo_bytes = bytes_of(lo), hi_bytes = bytes_of(hi);
      if (lo_bytes > o.budget || hi_bytes > o.budget) continue;
      whole = std::move(lo);
      e.bytes[std::size_t(b)] = lo_bytes;
      e.batches.push_back(std::move(hi));
      e.bytes.push_back(hi_bytes);
      split = true;
      break;
    }
    if (!split) {  // every batch is one graph (or will not split within the budget): pad
      while (e.batches.size() % std::size_t(o.ranks) != 0) e.batches.emplace_back(), e.bytes.push_back(0);
    }
  }
  // Batches of similar bytes side by side, R to a step, then the steps shuffled.
  std::vector<std::int64_t> by_bytes = bd::iota(e.batches.size());
  std::stable_sort(by_bytes.begin(), by_bytes.end(),
                   [&](std::int64_t a, std::int64_t b) { return e.bytes[std::size_t(a)] > e.bytes[std::size_t(b)]; });
  bd::reorder(e, by_bytes);
  bd::shuffle_steps(e, r);
  return e;
}

}  // namespace frugal::data
