// Memory-balanced graph batches, trained (issue 19): the edge classifier of
// nn/edge_classifier.hpp trained on synthetic track events
// (data/track_graphs.hpp) for the same number of epochs under each batch
// strategy of data/balanced_batches.hpp (random, sorted, packed: first-fit
// decreasing, and mixed: first-fit in random order), every batch padded to its size
// bucket (data/bucket_padding.hpp) and run through a ShapeCache, one
// compiled step per bucket shape. bench/graph_batching.cpp predicts the
// bytes; this one runs the steps and measures them.
//
//   cmake --build build --target track_training
//   nice -n 10 build/bench/track_training [--events 1000] [--epochs 20] [--hidden 64] [--ranks 4]
//       [--seed 19] [--bucket 1.19] [--lr 0.003] [--per-batch 0] [--budget-scale 1] [--max-steps 24]
//       [--threads 1]
//
// One thread by default: on a small shared machine a second compute thread
// waits on a busy core, and a step of a few milliseconds then took 0.3 s.
//
// Same for every strategy: the initial weights, the split (the first 80% of
// the events train, the rest test), AdamW with --lr, the epochs, the bucket
// rule. The packed budget is the largest training event's predicted bytes
// alone (times --budget-scale): the least any batching can have. The bytes
// a sampler sees for a batch are plan_training(...).plan.total_bytes() of
// its bucket's padded shape, unconstrained (cached per bucket). random and
// sorted take --per-batch graphs a batch; 0 (the default) takes as many as
// make packed's batch count of epoch 0, so all four run (about) the same
// steps per epoch: equal epochs are then also equal steps. The test metrics
// (accuracy, and precision, recall and F1 of the true edges) are over every
// candidate edge of the test events, after each epoch.
//
// What is measured, per batch: the step that ran it (its bucket's compiled
// step) reports Step::measured_device_bytes() after the run: the highest
// arena byte written so far (the arena is filled with a marker and scanned)
// plus the parameters and optimizer state its plan keeps on the device. All
// batches of a bucket run the same static plan, so that is each batch's
// peak. The ShapeCache's total budget is set far above what its --max-steps
// steps need together, so every step is planned unconstrained (nothing
// recomputed or offloaded) and the measured peak is the padded batch's
// whole need; the bench reports the largest gap between a batch's
// measurement and its bucket's unconstrained plan (the planner's prediction:
// buffers are rounded up to 256 bytes, so the topmost one may leave its last
// bytes unwritten). On this CPU backend the "device" arena
// is host memory, but the executor accounts for it as it would on a GPU.
// Per rank: batch b runs at step b / R on rank b % R (simulated: training
// itself is one model stepping through the batches in order, not R
// replicas averaging gradients).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <frugal/data/balanced_batches.hpp>
#include <frugal/data/bucket_padding.hpp>
#include <frugal/data/track_graphs.hpp>
#include <frugal/frugal.hpp>
#include <frugal/nn/edge_classifier.hpp>

using namespace frugal;

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
double mib(double b) { return b / (1024.0 * 1024.0); }
double quantile(std::vector<std::size_t> v, double q) {
  std::sort(v.begin(), v.end());
  return double(v[std::size_t(std::llround(q * double(v.size() - 1)))]);
}

std::vector<InputSpec> train_specs(std::int64_t N, std::int64_t E) {
  return {input<float>({N, 3}, "x"), input<std::int32_t>({E}, "src"), input<std::int32_t>({E}, "dst"),
          input<float>({E, 3}, "edge_attr"), input<std::int32_t>({E}, "edge_label")};
}

// Unconstrained plan bytes of a training step per padded bucket shape.
class BucketBytes {
 public:
  BucketBytes(nn::EdgeClassifier& model, optim::AdamW& opt) : model_(model), opt_(opt) {}
  std::size_t operator()(std::int64_t Np, std::int64_t Ep) {
    auto [it, fresh] = cache_.try_emplace({Np, Ep}, 0);
    if (fresh)
      it->second = plan_training([&](Var x, Var s, Var d, Var e, Var y) { return model_.loss(x, s, d, e, y); },
                                 train_specs(Np, Ep), opt_)
                       .plan.total_bytes();
    return it->second;
  }

 private:
  nn::EdgeClassifier& model_;
  optim::AdamW& opt_;
  std::map<std::pair<std::int64_t, std::int64_t>, std::size_t> cache_;
};

struct Metrics {
  std::int64_t tp = 0, fp = 0, tn = 0, fn = 0;
  double accuracy() const { return double(tp + tn) / double(tp + fp + tn + fn); }
  double precision() const { return tp + fp ? double(tp) / double(tp + fp) : 0; }
  double recall() const { return tp + fn ? double(tp) / double(tp + fn) : 0; }
  double f1() const { return tp ? 2 * precision() * recall() / (precision() + recall()) : 0; }
};

// Test-set metrics (class 1, a true track segment, is the positive class):
// the test events in fixed groups of 8, padded to buckets, one inference
// step per bucket shape (they read the model's current weights).
class Evaluator {
 public:
  Evaluator(nn::EdgeClassifier& model, const std::vector<data::GraphSample>& graphs, std::vector<std::int64_t> test,
            data::BucketRule rule, int threads)
      : model_(model), threads_(threads) {
    for (std::size_t at = 0; at < test.size(); at += 8) {
      std::vector<std::int64_t> ids(test.begin() + std::ptrdiff_t(at),
                                    test.begin() + std::ptrdiff_t(std::min(test.size(), at + 8)));
      batches_.push_back(data::pad_to_bucket(data::batch_graphs(graphs, ids), rule));
    }
  }
  Metrics operator()() {
    Metrics m;
    for (const data::PaddedBatch& p : batches_) {
      const auto key = std::make_pair(p.x.shape()[0], p.src.shape()[0]);
      auto it = steps_.find(key);
      if (it == steps_.end()) {
        std::vector<InputSpec> specs = train_specs(key.first, key.second);
        specs.pop_back();  // no labels
        it = steps_.emplace(key, std::make_unique<Step>(compile_inference(
                                     [&](Var x, Var s, Var d, Var e) { return model_.forward(x, s, d, e); }, specs, {},
                                     {.threads = threads_})))
                 .first;
      }
      it->second->run(p.x, p.src, p.dst, p.edge_attr);
      const float* logit = it->second->output().data<float>();
      const std::int32_t* label = p.edge_label.data<std::int32_t>();
      for (std::int64_t k = 0; k < p.edges; ++k) {
        const bool pred = logit[2 * k + 1] > logit[2 * k], truth = label[k] == 1;
        (pred ? (truth ? m.tp : m.fp) : (truth ? m.fn : m.tn)) += 1;
      }
    }
    return m;
  }

 private:
  nn::EdgeClassifier& model_;
  int threads_;
  std::vector<data::PaddedBatch> batches_;
  std::map<std::pair<std::int64_t, std::int64_t>, std::unique_ptr<Step>> steps_;
};

struct Row {
  std::string name;
  std::int64_t per_batch = 0;  // 0: packed (as many as fit)
  std::size_t batches_per_epoch = 0, steps_per_epoch = 0;
  std::vector<std::size_t> measured;  // every non-empty batch of every epoch
  std::size_t over = 0;
  std::size_t plan_gap = 0;  // the largest |unconstrained plan - measured| bytes of a batch
  std::vector<std::size_t> rank_peak;  // over all epochs
  double step_spread = 0;              // mean over steps of (max - min) / max across ranks
  double train_s = 0, compile_s = 0;   // all epochs: running the steps; compiling new shapes
  std::size_t compiled = 0, shapes = 0;
  std::vector<double> f1_by_epoch, loss_by_epoch;
  Metrics final_metrics;
};

}  // namespace

int main(int argc, char** argv) {
  std::int64_t events = 1000, epochs = 20, hidden = 64, ranks = 4, per_batch = 0, max_steps = 24;
  int threads = 1;
  std::uint64_t seed = 19;
  double ratio = 1.19, lr = 3e-3, budget_scale = 1.0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    const char* v = argv[i + 1];
    if (a == "--events") events = std::atoll(v);
    else if (a == "--epochs") epochs = std::atoll(v);
    else if (a == "--hidden") hidden = std::atoll(v);
    else if (a == "--ranks") ranks = std::atoll(v);
    else if (a == "--per-batch") per_batch = std::atoll(v);
    else if (a == "--max-steps") max_steps = std::atoll(v);
    else if (a == "--threads") threads = std::atoi(v);
    else if (a == "--seed") seed = std::uint64_t(std::atoll(v));
    else if (a == "--bucket") ratio = std::atof(v);
    else if (a == "--lr") lr = std::atof(v);
    else if (a == "--budget-scale") budget_scale = std::atof(v);
    else {
      std::fprintf(stderr, "track_training: unknown option %s\n", a.c_str());
      return 2;
    }
  }
  data::TrackGraphOptions to;
  to.events = events;
  to.seed = seed;
  const std::vector<data::GraphSample> graphs = data::track_graphs(to);
  const std::int64_t G = events * 8 / 10;  // events 0..G-1 train, G.. test
  std::vector<std::int64_t> test_ids;
  for (std::int64_t g = G; g < events; ++g) test_ids.push_back(g);
  const data::BucketRule rule{.base = 64, .ratio = ratio};

  nn::manual_seed(seed);
  nn::EdgeClassifier model(3, 3, hidden);
  std::vector<Tensor> params = model.parameters(), initial;
  for (const Tensor& p : params) initial.push_back(p.clone());
  optim::AdamW plan_opt(params, {.lr = lr});  // for planning only: the same state bytes as a training run's
  BucketBytes bucket_bytes(model, plan_opt);
  const data::BatchBytes bytes_of = [&](std::span<const std::int64_t> ids) {
    std::int64_t n = 0, e = 0;
    for (std::int64_t g : ids) n += graphs[std::size_t(g)].nodes(), e += graphs[std::size_t(g)].edges();
    return bucket_bytes(rule.bucket(n + 1), rule.bucket(e));
  };

  std::size_t budget = 0;
  for (std::int64_t g = 0; g < G; ++g) budget = std::max(budget, bytes_of(std::span<const std::int64_t>(&g, 1)));
  budget = std::size_t(double(budget) * budget_scale);
  if (per_batch == 0) {
    data::BatchOptions o{.strategy = data::BatchStrategy::packed, .budget = budget, .ranks = 1, .seed = seed};
    const std::size_t packed = data::epoch_batches(G, bytes_of, o, 0).batches.size();
    per_batch = (G + std::int64_t(packed) - 1) / std::int64_t(packed);
  }

  Evaluator evaluate(model, graphs, test_ids, rule, threads);
  std::int64_t test_edges = 0, test_true = 0;
  for (std::int64_t g : test_ids)
    for (std::int32_t l : graphs[std::size_t(g)].edge_label.to_vector<std::int32_t>()) ++test_edges, test_true += l;

  std::vector<Row> rows;
  for (const std::string name : {"random", "sorted", "packed", "mixed"}) {
    const data::BatchStrategy strategy = name == "random"   ? data::BatchStrategy::random
                                         : name == "sorted" ? data::BatchStrategy::sorted
                                         : name == "packed" ? data::BatchStrategy::packed
                                                            : data::BatchStrategy::mixed;
    Row row;
    row.name = name;
    row.per_batch = strategy == data::BatchStrategy::packed || strategy == data::BatchStrategy::mixed ? 0 : per_batch;
    row.rank_peak.assign(std::size_t(ranks), 0);
    for (std::size_t i = 0; i < params.size(); ++i) std::memcpy(params[i].raw(), initial[i].raw(), params[i].nbytes());
    optim::AdamW opt(params, {.lr = lr});
    // Far above what max_steps steps need together: every step unconstrained.
    const Budget total{.device = std::size_t(1) << 40};
    std::unique_ptr<ShapeCache> cache = cache_shapes(
        [&](Var x, Var s, Var d, Var e, Var y) { return model.loss(x, s, d, e, y); }, train_specs(1, 1), opt, total,
        {.threads = threads}, std::size_t(max_steps));
    std::map<std::pair<std::int64_t, std::int64_t>, int> shapes;
    data::BatchOptions o{.strategy = strategy, .graphs_per_batch = per_batch, .budget = budget, .ranks = ranks, .seed = seed};
    double spread_sum = 0;
    std::size_t spread_steps = 0;
    for (std::int64_t ep = 0; ep < epochs; ++ep) {
      const data::EpochBatches e = data::epoch_batches(G, bytes_of, o, ep);
      std::vector<std::size_t> measured(e.batches.size(), 0);
      double loss_sum = 0;
      std::size_t nonempty = 0;
      for (std::size_t b = 0; b < e.batches.size(); ++b) {
        if (e.batches[b].empty()) continue;  // that rank sits the step out
        ++nonempty;
        const data::PaddedBatch p = data::pad_to_bucket(data::batch_graphs(graphs, e.batches[b]), rule);
        const std::vector<Tensor> in = p.inputs();
        shapes[{p.x.shape()[0], p.src.shape()[0]}] += 1;
        const auto t0 = Clock::now();
        const std::size_t before = cache->compiled();
        Step& step = cache->step_for(in);
        if (cache->compiled() != before) row.compile_s += seconds_since(t0);
        const auto t1 = Clock::now();
        std::vector<const Tensor*> ptrs;
        for (const Tensor& t : in) ptrs.push_back(&t);
        loss_sum += step.run_inputs(ptrs);
        row.train_s += seconds_since(t1);
        measured[b] = step.measured_device_bytes();
        row.measured.push_back(measured[b]);
        row.over += measured[b] > budget;
        {
          const std::size_t planned = bytes_of(e.batches[b]);
          row.plan_gap = std::max(row.plan_gap, planned > measured[b] ? planned - measured[b] : measured[b] - planned);
        }
        if (std::getenv("TT_DEBUG"))
          std::fprintf(stderr, "%s ep %lld b %zu shape %lld x %lld run %.3f s measured %zu plan %zu bucket %zu\n",
                       row.name.c_str(), (long long)ep, b, (long long)p.x.shape()[0], (long long)p.src.shape()[0],
                       seconds_since(t1), measured[b], step.plan().total_bytes(), bytes_of(e.batches[b]));
        auto& peak = row.rank_peak[b % std::size_t(ranks)];
        peak = std::max(peak, measured[b]);
      }
      row.batches_per_epoch = nonempty;
      row.steps_per_epoch = std::size_t(e.steps());
      for (std::int64_t st = 0; st < e.steps(); ++st) {
        auto first = measured.begin() + st * ranks;
        const auto [mn, mx] = std::minmax_element(first, first + ranks);
        spread_sum += double(*mx - *mn) / double(*mx);
        ++spread_steps;
      }
      row.loss_by_epoch.push_back(loss_sum / double(nonempty));
      row.final_metrics = evaluate();
      row.f1_by_epoch.push_back(row.final_metrics.f1());
    }
    row.step_spread = spread_sum / double(spread_steps);
    row.compiled = cache->compiled();
    row.shapes = shapes.size();
    rows.push_back(std::move(row));
  }

  std::vector<std::size_t> n, ed;
  for (std::int64_t g = 0; g < G; ++g) n.push_back(std::size_t(graphs[std::size_t(g)].nodes())), ed.push_back(std::size_t(graphs[std::size_t(g)].edges()));
  std::printf("%lld track events (seed %llu), %lld train / %lld test; train hits median %.0f, max %.0f; edges median "
              "%.0f, max %.0f\n",
              static_cast<long long>(events), static_cast<unsigned long long>(seed), static_cast<long long>(G),
              static_cast<long long>(events - G), quantile(n, 0.5), quantile(n, 1), quantile(ed, 0.5), quantile(ed, 1));
  {  // the label mix by event size (why packed's batches differ from step to step)
    std::vector<std::int64_t> by_size(static_cast<std::size_t>(G));
    for (std::int64_t g = 0; g < G; ++g) by_size[std::size_t(g)] = g;
    std::sort(by_size.begin(), by_size.end(),
              [&](std::int64_t a, std::int64_t b) { return graphs[std::size_t(a)].edges() < graphs[std::size_t(b)].edges(); });
    auto true_share = [&](std::size_t from, std::size_t to) {
      double t = 0, all = 0;
      for (std::size_t i = from; i < to; ++i)
        for (std::int32_t l : graphs[std::size_t(by_size[i])].edge_label.to_vector<std::int32_t>()) t += l, all += 1;
      return 100 * t / all;
    };
    std::printf("true edges: %.1f%% in the smaller half of the training events (by edges), %.1f%% in the largest "
                "10%%\n",
                true_share(0, std::size_t(G) / 2), true_share(std::size_t(G) * 9 / 10, std::size_t(G)));
  }
  std::printf("model: edge classifier, hidden %lld, %lld parameters, AdamW lr %g, %lld epochs; buckets 64*%.2f^k; "
              "budget %.2f MiB (largest training event alone x %.2f); random and sorted: %lld graphs a batch; "
              "%lld simulated ranks\n",
              static_cast<long long>(hidden), static_cast<long long>(model.num_parameters()), lr,
              static_cast<long long>(epochs), ratio, mib(double(budget)), budget_scale,
              static_cast<long long>(per_batch), static_cast<long long>(ranks));
  std::printf("test: %lld edges, %.1f%% true; the majority class (all %s) has accuracy %.2f%%\n\n",
              static_cast<long long>(test_edges), 100.0 * double(test_true) / double(test_edges),
              2 * test_true > test_edges ? "true" : "fake",
              100.0 * double(std::max(test_true, test_edges - test_true)) / double(test_edges));
  std::printf("| strategy | graphs/batch | batches/epoch | steps/epoch | measured max MiB | p95 | median | over budget | "
              "shapes (compiles) | train s/epoch (+compile) | test acc | precision | recall | F1 |\n"
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  for (const Row& r : rows)
    std::printf("| %s | %s | %zu | %zu | %.2f | %.2f | %.2f | %zu of %zu | %zu (%zu) | %.2f (+%.2f) | %.2f%% | %.3f | "
                "%.3f | %.3f |\n",
                r.name.c_str(), r.per_batch ? std::to_string(r.per_batch).c_str() : "fit", r.batches_per_epoch,
                r.steps_per_epoch, mib(quantile(r.measured, 1)), mib(quantile(r.measured, 0.95)),
                mib(quantile(r.measured, 0.5)), r.over, r.measured.size(), r.shapes, r.compiled,
                r.train_s / double(epochs), r.compile_s / double(epochs), 100 * r.final_metrics.accuracy(),
                r.final_metrics.precision(), r.final_metrics.recall(), r.final_metrics.f1());
  std::printf("\n| strategy | rank peaks MiB (rank 0..%lld) | rank peak max/min | step spread across ranks | test F1 by "
              "epoch | train loss by epoch |\n|---|---|---:|---:|---|---|\n",
              static_cast<long long>(ranks - 1));
  for (const Row& r : rows) {
    std::string peaks, f1, loss;
    for (std::size_t p : r.rank_peak) peaks += (peaks.empty() ? "" : " / ") + std::to_string(mib(double(p))).substr(0, 5);
    for (double v : r.f1_by_epoch) f1 += (f1.empty() ? "" : " ") + std::to_string(v).substr(0, 5);
    for (double v : r.loss_by_epoch) loss += (loss.empty() ? "" : " ") + std::to_string(v).substr(0, 5);
    const auto [mn, mx] = std::minmax_element(r.rank_peak.begin(), r.rank_peak.end());
    std::printf("| %s | %s | %.2f | %.1f%% | %s | %s |\n", r.name.c_str(), peaks.c_str(),
                double(*mx) / double(std::max<std::size_t>(*mn, 1)), 100 * r.step_spread, f1.c_str(), loss.c_str());
  }
  const double random_peak = quantile(rows[0].measured, 1);
  std::printf("\nmeasured peak vs random: sorted %+.1f%%, packed %+.1f%%, mixed %+.1f%%; the largest gap between a "
              "batch's measurement and its bucket's unconstrained plan: %zu / %zu / %zu / %zu bytes\n",
              100 * (quantile(rows[1].measured, 1) / random_peak - 1), 100 * (quantile(rows[2].measured, 1) / random_peak - 1),
              100 * (quantile(rows[3].measured, 1) / random_peak - 1), rows[0].plan_gap, rows[1].plan_gap,
              rows[2].plan_gap, rows[3].plan_gap);
  return 0;
}
