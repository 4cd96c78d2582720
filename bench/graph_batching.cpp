// Memory-balanced batches of many graphs (issue 19): the device bytes the
// planner predicts for each batch of synthetic track events
// (data/track_graphs.hpp) under three batch samplers (data/balanced_batches.hpp),
// alone and over R simulated ranks.
//
//   cmake --build build --target graph_batching
//   nice -n 10 build/bench/graph_batching [--events 1000] [--per-batch 16] [--epochs 5] [--ranks 4]
//       [--hidden 64] [--seed 19] [--bucket 1.19]
//
// The model is nn::EdgeClassifier (nn/edge_classifier.hpp, as Exa.TrkX's,
// one round of message passing): a node encoder h = relu(W_n x); an edge MLP
// m = relu(W_e [h_src, h_dst, e]) over the candidate edges; messages summed
// into their destination nodes, h' = relu(W_u (h + Σ m)); edge logits
// W_o [h'_src, h'_dst, m], nll_loss(log_softmax) against the 0/1 edge
// labels (EdgeClassifier::loss, the step bench/track_training.cpp runs);
// AdamW. A batch's predicted bytes are plan_training(...).plan.total_bytes() for
// its shape (nodes N, edges E; unconstrained budget): everything the step
// keeps on the device, parameters and optimizer state included.
//
// Shapes vary per batch, so plans are cached per size bucket: N and E are
// each rounded up to the next of the geometric series 64 * b^k (b =
// --bucket), and the bucket's plan stands for every batch in it. Rounding
// up makes the prediction an upper bound for the batches in the bucket (the
// step that runs them would be planned for the bucket's shape, padded, or
// for its own smaller one), at the price of up to b - 1 more bytes.
//
// Strategies: random (--per-batch graphs, shuffled), sorted (--per-batch
// graphs by size) and packed (first-fit decreasing by predicted bytes under
// a budget). The budget is the least one (binary search) for which packed
// makes no more batches per epoch than random does (no more steps per
// epoch), but never under the largest graph alone, which no batching can go
// below: with a heavy tail that floor decides, and packed then makes fewer,
// fuller batches than random (--per-batch G / that count compares at equal
// steps). With R ranks, random and sorted pad their last step with empty
// batches and packed splits batches to a multiple of R. Each
// strategy runs --epochs epochs (different seeds per epoch); the table gives
// the predicted bytes per batch over all of them (max, p95, median), how
// many batches are over the budget, and with --ranks R, the spread across
// ranks: per step, (max - min) / max of the R batches' bytes, averaged over
// steps, and the largest rank's epoch peak over the smallest's.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include <frugal/data/balanced_batches.hpp>
#include <frugal/data/track_graphs.hpp>
#include <frugal/frugal.hpp>
#include <frugal/nn/edge_classifier.hpp>

using namespace frugal;

namespace {

// Predicted bytes of a training step per batch shape, cached per bucket.
class BucketedPlanner {
 public:
  BucketedPlanner(nn::EdgeClassifier& model, optim::AdamW& opt, double ratio) : model_(model), opt_(opt), ratio_(ratio) {}

  std::int64_t bucket(std::int64_t n) const {
    double b = 64;
    while (b < double(n)) b = std::ceil(b * ratio_);
    return std::int64_t(b);
  }
  std::size_t bytes(std::int64_t nodes, std::int64_t edges) {
    const auto key = std::make_pair(bucket(nodes), bucket(edges));
    auto it = cache_.find(key);
    if (it != cache_.end()) return it->second;
    const auto [N, E] = key;
    const auto t0 = std::chrono::steady_clock::now();
    PlannedStep p = plan_training(
        [&](Var x, Var src, Var dst, Var e, Var y) { return model_.loss(x, src, dst, e, y); },
        {input<float>({N, 3}, "x"), input<std::int32_t>({E}, "src"), input<std::int32_t>({E}, "dst"),
         input<float>({E, 3}, "edge_attr"), input<std::int32_t>({E}, "edge_label")},
        opt_);
    plan_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return cache_[key] = p.plan.total_bytes();
  }
  std::size_t plans() const { return cache_.size(); }
  double plan_seconds() const { return plan_seconds_; }

 private:
  nn::EdgeClassifier& model_;
  optim::AdamW& opt_;
  double ratio_;
  std::map<std::pair<std::int64_t, std::int64_t>, std::size_t> cache_;
  double plan_seconds_ = 0;
};

double mib(double b) { return b / (1024.0 * 1024.0); }

double quantile(std::vector<std::size_t> v, double q) {
  std::sort(v.begin(), v.end());
  return double(v[std::size_t(std::llround(q * double(v.size() - 1)))]);
}

struct Row {
  std::string name;
  std::size_t batches_per_epoch = 0, steps_per_epoch = 0;
  std::vector<std::size_t> bytes;  // every non-empty batch of every epoch
  std::size_t over = 0;
  double step_spread = 0;  // mean over steps of (max - min) / max across ranks
  double rank_peak_ratio = 0;  // the largest rank's peak / the smallest rank's, mean over epochs
};

}  // namespace

int main(int argc, char** argv) {
  std::int64_t events = 1000, per_batch = 16, epochs = 5, ranks = 4, hidden = 64;
  std::uint64_t seed = 19;
  double ratio = 1.19;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    const char* v = argv[i + 1];
    if (a == "--events") events = std::atoll(v);
    else if (a == "--per-batch") per_batch = std::atoll(v);
    else if (a == "--epochs") epochs = std::atoll(v);
    else if (a == "--ranks") ranks = std::atoll(v);
    else if (a == "--hidden") hidden = std::atoll(v);
    else if (a == "--seed") seed = std::uint64_t(std::atoll(v));
    else if (a == "--bucket") ratio = std::atof(v);
    else {
      std::fprintf(stderr, "graph_batching: unknown option %s\n", a.c_str());
      return 2;
    }
  }
  data::TrackGraphOptions to;
  to.events = events;
  to.seed = seed;
  const std::vector<data::GraphSample> graphs = data::track_graphs(to);
  std::vector<std::int64_t> nodes, edges;
  for (const auto& g : graphs) nodes.push_back(g.nodes()), edges.push_back(g.edges());
  {
    std::vector<std::size_t> n(nodes.begin(), nodes.end()), e(edges.begin(), edges.end());
    std::printf("%lld track events (seed %llu): hits median %.0f, p95 %.0f, max %.0f; edges median %.0f, p95 %.0f, "
                "max %.0f\n",
                static_cast<long long>(events), static_cast<unsigned long long>(seed), quantile(n, 0.5),
                quantile(n, 0.95), quantile(n, 1), quantile(e, 0.5), quantile(e, 0.95), quantile(e, 1));
  }

  nn::manual_seed(seed);
  nn::EdgeClassifier model(3, 3, hidden);
  optim::AdamW opt(model.parameters(), {.lr = 1e-3});
  BucketedPlanner planner(model, opt, ratio);
  const data::BatchBytes bytes_of = [&](std::span<const std::int64_t> ids) {
    std::int64_t n = 0, e = 0;
    for (std::int64_t g : ids) n += nodes[std::size_t(g)], e += edges[std::size_t(g)];
    return planner.bytes(n, e);
  };

  const std::int64_t G = events;
  const std::size_t random_batches = std::size_t((G + per_batch - 1) / per_batch);
  // The least budget at which packed makes no more batches than random (epoch 0).
  std::size_t lo = 0, hi = 0;
  for (std::int64_t g = 0; g < G; ++g) lo = std::max(lo, bytes_of(std::span<const std::int64_t>(&g, 1)));
  hi = 2 * lo;
  auto packed_count = [&](std::size_t budget) {
    data::BatchOptions o{.strategy = data::BatchStrategy::packed, .budget = budget, .ranks = 1, .seed = seed};
    return data::epoch_batches(G, bytes_of, o, 0).batches.size();
  };
  while (packed_count(hi) > random_batches) lo = hi, hi *= 2;
  while (hi - lo > hi / 1000) {  // to 0.1%
    const std::size_t mid = lo + (hi - lo) / 2;
    (packed_count(mid) <= random_batches ? hi : lo) = mid;
  }
  const std::size_t budget = hi;

  std::vector<Row> rows;
  for (data::BatchStrategy s : {data::BatchStrategy::random, data::BatchStrategy::sorted, data::BatchStrategy::packed,
                                data::BatchStrategy::mixed}) {
    Row row;
    row.name = data::strategy_name(s);
    data::BatchOptions o{.strategy = s, .graphs_per_batch = per_batch, .budget = budget, .ranks = ranks, .seed = seed};
    double spread_sum = 0, peak_ratio_sum = 0;
    std::size_t steps = 0;
    for (std::int64_t ep = 0; ep < epochs; ++ep) {
      const data::EpochBatches e = data::epoch_batches(G, bytes_of, o, ep);
      std::size_t nonempty = 0;
      std::vector<std::size_t> rank_peak(std::size_t(ranks), 0);
      for (std::size_t b = 0; b < e.batches.size(); ++b) {
        if (e.batches[b].empty()) continue;
        ++nonempty;
        row.bytes.push_back(e.bytes[b]);
        row.over += e.bytes[b] > budget;
        rank_peak[b % std::size_t(ranks)] = std::max(rank_peak[b % std::size_t(ranks)], e.bytes[b]);
      }
      row.batches_per_epoch = nonempty;
      row.steps_per_epoch = std::size_t(e.steps());
      for (std::int64_t st = 0; st < e.steps(); ++st) {
        auto first = e.bytes.begin() + st * ranks;
        const auto [mn, mx] = std::minmax_element(first, first + ranks);
        spread_sum += double(*mx - *mn) / double(*mx);
        ++steps;
      }
      const auto [pmn, pmx] = std::minmax_element(rank_peak.begin(), rank_peak.end());
      peak_ratio_sum += double(*pmx) / double(std::max<std::size_t>(*pmn, 1));
    }
    row.step_spread = spread_sum / double(steps);
    row.rank_peak_ratio = peak_ratio_sum / double(epochs);
    rows.push_back(std::move(row));
  }

  std::printf("model: interaction-network edge classifier, hidden %lld, %lld parameters; %zu bucket plans in %.1f s\n",
              static_cast<long long>(hidden), static_cast<long long>(model.num_parameters()), planner.plans(),
              planner.plan_seconds());
  std::printf("budget %.2f MiB per batch (the least at which packed makes <= %zu batches, as random with %lld "
              "graphs each); %lld epochs, %lld ranks\n\n",
              mib(double(budget)), random_batches, static_cast<long long>(per_batch), static_cast<long long>(epochs),
              static_cast<long long>(ranks));
  std::printf("| strategy | batches/epoch | steps/epoch | max MiB | p95 MiB | median MiB | over budget | step spread across %lld ranks "
              "| rank peak max/min |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
              static_cast<long long>(ranks));
  for (const Row& r : rows)
    std::printf("| %s | %zu | %zu | %.2f | %.2f | %.2f | %zu of %zu | %.1f%% | %.2f |\n", r.name.c_str(), r.batches_per_epoch, r.steps_per_epoch,
                mib(quantile(r.bytes, 1)), mib(quantile(r.bytes, 0.95)), mib(quantile(r.bytes, 0.5)), r.over,
                r.bytes.size(), 100 * r.step_spread, r.rank_peak_ratio);
  const double random_peak = quantile(rows[0].bytes, 1), packed_peak = quantile(rows[2].bytes, 1),
               sorted_peak = quantile(rows[1].bytes, 1);
  std::printf("\npeak vs random: sorted %+.1f%%, packed %+.1f%%\n", 100 * (sorted_peak / random_peak - 1),
              100 * (packed_peak / random_peak - 1));
  return 0;
}
