// Neighbour-sampled training of a graph whose features do not fit the
// device budget (issue 19): GraphSAGE on the synthetic power-law graph
// (data/power_law.hpp, 2M nodes by default) with per-layer fanouts, each
// batch's feature rows gathered on the host and only they entering the
// budget (data/sampled_batches.hpp), steps planned per size bucket and cached
// (ShapeCache) within one device budget smaller than the feature matrix.
//
//   cmake --build build --target sampled_training
//   nice -n 10 build/bench/sampled_training [--nodes 2000000] [--batch 1024] [--fanouts 10,5]
//       [--hidden 64] [--epochs 2] [--budget-mib 32] [--signal 0.25] [--bucket 1.1] [--eval 16384]
//       [--order original|halo|rcm] [--threads 1] [--loaders 1] [--seed 0]
//
// What it prints, per epoch: steps, wall time, the time the training loop
// waited for the loader (sampling and gather made ahead by data::Prefetch
// on --loaders threads, that many batches ahead) against the time the
// loader worked (summed over its threads), the steps' share of the
// time, the device bytes all cached steps held together (measured: each
// arena's high-water mark and the persistents on the device) against the
// budget, and the shapes compiled and evicted. Then the accuracy on --eval
// test nodes (sampled as in training) for the model and for the same model
// trained with no neighbours (fanouts 0), and one epoch with the loader run
// inline (no overlap) for comparison. Pages: the distinct 4 KiB pages of
// the host feature matrix each batch's gather reads, summed over the epoch
// (an exact count, no cache model): the bytes a device reading the features
// in place through unified memory would migrate at least, which the vertex
// order (--order) changes.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <memory>
#include <optional>
#include <unordered_set>
#include <vector>

#include <frugal/data/power_law.hpp>
#include <frugal/data/reorder.hpp>
#include <frugal/data/sampled_batches.hpp>
#include <frugal/frugal.hpp>

using namespace frugal;
namespace fd = frugal::data;

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
double mib(double b) { return b / (1024.0 * 1024.0); }

struct Sage : nn::Module {
  nn::SAGEConv c1, c2;
  Sage(std::int64_t in, std::int64_t hidden, std::int64_t classes) : c1(in, hidden), c2(hidden, classes) {
    register_module("c1", c1);
    register_module("c2", c2);
  }
  Var forward(Var x, const std::vector<SparseVar>& b) { return c2(relu(c1(x, b[0])), b[1]); }
};

struct Options {
  std::int64_t nodes = 2'000'000, batch = 1024, hidden = 64, epochs = 2, eval = 16384, threads = 1, loaders = 1;
  std::vector<std::int64_t> fanouts{10, 5};
  double budget_mib = 32, signal = 0.25, bucket = 1.1;
  std::string order = "original";
  std::uint64_t seed = 0;
};

// A batch and what making it cost.
struct Made {
  fd::SampledBatch batch;
  double seconds = 0;
  std::int64_t pages = 0;  // distinct 4 KiB pages of the feature matrix its gather read
};

struct EpochReport {
  double seconds = 0, waited = 0, loader = 0, stepping = 0, loss = 0;
  std::int64_t steps = 0, real_nodes = 0, padded_nodes = 0;
  std::size_t most_device = 0, most_step = 0;
};

class Trainer {
 public:
  Trainer(const fd::NodeClassification& d, const Options& o, std::vector<std::int64_t> fanouts)
      : d_(d), o_(o), model_(d.features.shape()[1], o.hidden, d.classes), opt_(model_.parameters(), {.lr = 0.01}),
        loader_(d.adjacency, d.features, d.labels, d.train,
                {.batch_size = o.batch, .fanouts = std::move(fanouts), .bucket = {.ratio = o.bucket}, .seed = o.seed}) {
    CompileOptions co{.threads = int(o.threads)};
    auto fn = fd::step_over_blocks<2>(
        [this](Var x, Var y, const std::vector<SparseVar>& b) { return cross_entropy(model_.forward(x, b), y); });
    cache_ = cache_shapes(fn, fd::sampled_input_specs(2), opt_, Budget{.device = std::size_t(o.budget_mib * 1048576)}, co);
  }
  Sage& model() { return model_; }
  ShapeCache& cache() { return *cache_; }
  std::int64_t steps_per_epoch() const { return loader_.steps_per_epoch(); }

  // count_pages: also count the pages its gather read (a cost of the
  // measurement, not of the loader; outside `seconds`).
  Made make(std::int64_t step, bool count_pages) {
    const auto t0 = Clock::now();
    Made m{loader_.batch(step), 0, 0};
    m.seconds = seconds_since(t0);
    if (!count_pages) return m;
    const std::size_t row_bytes = std::size_t(d_.features.shape()[1]) * 4;
    std::unordered_set<std::int64_t> pages;
    for (std::int64_t g : m.batch.graph.nodes)
      if (g >= 0) pages.insert(std::int64_t(std::size_t(g) * row_bytes / 4096));
    m.pages = std::int64_t(pages.size());
    return m;
  }

  EpochReport epoch(std::int64_t e, bool overlap) {
    EpochReport r;
    const std::int64_t first = e * steps_per_epoch(), n = steps_per_epoch();
    const auto t0 = Clock::now();
    std::optional<fd::Prefetch<Made>> ahead;
    if (overlap) ahead.emplace([this](std::int64_t s) { return make(s, false); }, first, int(o_.loaders));
    for (std::int64_t s = first; s < first + n; ++s) {
      const auto w = Clock::now();
      Made m = overlap ? ahead->next() : make(s, false);
      r.waited += seconds_since(w);
      r.loader += m.seconds;
      r.real_nodes += m.batch.graph.real_nodes;
      r.padded_nodes += std::int64_t(m.batch.graph.nodes.size());
      const auto st = Clock::now();
      Step& step = cache_->step_for(m.batch.inputs);
      r.loss += cache_->run(m.batch.inputs) / double(n);
      r.stepping += seconds_since(st);
      r.most_step = std::max(r.most_step, step.measured_device_bytes());
      r.most_device = std::max(r.most_device, cache_->broker().measured_device_bytes());
      ++r.steps;
    }
    ahead.reset();  // waits for the batch made past the epoch's end
    r.seconds = seconds_since(t0);
    return r;
  }

  // Accuracy on the first `count` test nodes (ids carry no structure: a
  // random sample), in sampled batches of the training fanouts.
  double accuracy(std::int64_t count, const std::vector<std::int64_t>& fanouts) {
    cache_.reset();  // its bytes go to the inference steps
    model_.eval();
    std::vector<std::int64_t> nodes(d_.test.begin(), d_.test.begin() + std::min<std::size_t>(std::size_t(count), d_.test.size()));
    fd::NeighborLoader test(d_.adjacency, d_.features, d_.labels, nodes,
                            {.batch_size = std::min<std::int64_t>(o_.batch, std::int64_t(nodes.size())),
                             .fanouts = fanouts, .bucket = {.ratio = o_.bucket}, .seed = o_.seed + 1});
    auto fn = fd::step_over_blocks<2>([this](Var x, Var, const std::vector<SparseVar>& b) { return model_.forward(x, b); });
    CompileOptions co{.threads = int(o_.threads)};
    ShapeCache eval(Budget{.device = std::size_t(o_.budget_mib * 1048576)}, fd::sampled_input_specs(2),
                    [&](const std::vector<InputSpec>& s, const Budget& b) { return compile_inference(fn, s, b, co); },
                    [&](const std::vector<InputSpec>& s, const Budget& b) { return plan_inference(fn, s, b, co); });
    std::int64_t right = 0, total = 0;
    for (std::int64_t s = 0; s < test.steps_per_epoch(); ++s) {
      fd::SampledBatch b = test.batch(s);
      eval.run(b.inputs);
      const float* z = eval.step_for(b.inputs).output().data<float>();
      for (std::int64_t i = 0; i < b.graph.seeds; ++i, ++total) {
        const float* row = z + i * d_.classes;
        right += std::max_element(row, row + d_.classes) - row == b.inputs[1].data<std::int32_t>()[i];
      }
    }
    return double(right) / double(total);
  }

 private:
  const fd::NodeClassification& d_;
  const Options& o_;
  Sage model_;
  optim::AdamW opt_;
  fd::NeighborLoader loader_;
  std::unique_ptr<ShapeCache> cache_;
};

std::vector<std::int64_t> parse_list(const char* s) {
  std::vector<std::int64_t> v;
  for (const char* p = s; *p;) {
    char* end = nullptr;
    v.push_back(std::strtoll(p, &end, 10));
    p = *end == ',' ? end + 1 : end;
    if (end == p && *p) break;
  }
  return v;
}

void print_epoch(const char* what, std::int64_t e, const EpochReport& r, std::size_t budget, const ShapeCache& c) {
  std::printf("| %s | %lld | %lld | %.2f | %.3f | %.2f | %.2f | %.2f | %.2f | %.2f | %.1f%% | %zu / %zu |\n", what,
              static_cast<long long>(e), static_cast<long long>(r.steps), r.seconds, r.loss, r.stepping, r.loader,
              r.waited, mib(double(r.most_device)), mib(double(budget)),
              100.0 * double(r.padded_nodes - r.real_nodes) / double(r.real_nodes), c.compiled(), c.evicted());
}

}  // namespace

int main(int argc, char** argv) try {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    const char* v = argv[i + 1];
    if (a == "--nodes") o.nodes = std::atoll(v);
    else if (a == "--batch") o.batch = std::atoll(v);
    else if (a == "--hidden") o.hidden = std::atoll(v);
    else if (a == "--epochs") o.epochs = std::atoll(v);
    else if (a == "--eval") o.eval = std::atoll(v);
    else if (a == "--threads") o.threads = std::atoll(v);
    else if (a == "--loaders") o.loaders = std::atoll(v);
    else if (a == "--fanouts") o.fanouts = parse_list(v);
    else if (a == "--budget-mib") o.budget_mib = std::atof(v);
    else if (a == "--signal") o.signal = std::atof(v);
    else if (a == "--bucket") o.bucket = std::atof(v);
    else if (a == "--order") o.order = v;
    else if (a == "--seed") o.seed = std::uint64_t(std::atoll(v));
    else {
      std::fprintf(stderr, "sampled_training: unknown option %s\n", a.c_str());
      return 2;
    }
  }
  if (o.fanouts.size() != 2) {
    std::fprintf(stderr, "sampled_training: --fanouts takes two layers, e.g. 10,5\n");
    return 2;
  }
  auto t0 = Clock::now();
  fd::PowerLawOptions po;
  po.nodes = o.nodes;
  po.signal = o.signal;
  po.seed = o.seed;
  fd::NodeClassification d = fd::power_law_graph(po);
  const double gen_s = seconds_since(t0);
  t0 = Clock::now();
  if (o.order != "original") {
    std::vector<std::int64_t> order;
    if (o.order == "halo") order = fd::halo_order(d.adjacency);
    else if (o.order == "rcm") order = fd::rcm_order(d.adjacency);
    else {
      std::fprintf(stderr, "sampled_training: --order is original, halo or rcm\n");
      return 2;
    }
    d = fd::permute_task(d, order);
  }
  const double order_s = seconds_since(t0);
  const std::size_t budget = std::size_t(o.budget_mib * 1048576);
  std::printf("graph: %lld nodes, %lld adjacency entries, %lld features (%.1f MiB f32 on the host), %lld classes, "
              "%zu train / %zu test nodes; generated in %.1f s, order %s (%.1f s)\n",
              static_cast<long long>(d.nodes()), static_cast<long long>(d.adjacency.nnz()),
              static_cast<long long>(d.features.shape()[1]), mib(double(d.features.nbytes())),
              static_cast<long long>(d.classes), d.train.size(), d.test.size(), gen_s, o.order.c_str(), order_s);
  std::printf("GraphSAGE: 2 layers, hidden %lld, batch %lld seeds, fanouts %lld,%lld, AdamW lr 0.01; device budget "
              "%.1f MiB (%.1f%% of the feature matrix); size buckets x%.2f; %lld step thread(s) + %lld loader thread(s)\n\n",
              static_cast<long long>(o.hidden), static_cast<long long>(o.batch), static_cast<long long>(o.fanouts[0]),
              static_cast<long long>(o.fanouts[1]), mib(double(budget)),
              100.0 * double(budget) / double(d.features.nbytes()), o.bucket, static_cast<long long>(o.threads),
              static_cast<long long>(o.loaders));

  std::printf("| run | epoch | steps | epoch s | mean loss | in steps s | loader worked s | loop waited s | "
              "device MiB (measured, all cached steps) | budget MiB | padding | shapes compiled / evicted |\n");
  std::printf("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  nn::manual_seed(o.seed);
  Trainer sage(d, o, o.fanouts);
  for (std::int64_t e = 0; e < o.epochs; ++e) print_epoch("ahead", e, sage.epoch(e, true), budget, sage.cache());
  // One more epoch, the loader inline: what the overlap hides.
  const EpochReport inline_run = sage.epoch(o.epochs, false);
  print_epoch("inline", o.epochs, inline_run, budget, sage.cache());
  // That epoch's batches again, untimed, for the feature pages they read.
  std::int64_t pages = 0;
  const std::int64_t steps = sage.steps_per_epoch();
  for (std::int64_t s = o.epochs * steps; s < (o.epochs + 1) * steps; ++s) pages += sage.make(s, true).pages;
  std::printf("\n%s\n", sage.cache().broker().summary().c_str());
  const double acc = sage.accuracy(o.eval, o.fanouts);

  nn::manual_seed(o.seed);
  Trainer alone(d, o, {0, 0});
  for (std::int64_t e = 0; e < o.epochs; ++e) alone.epoch(e, true);
  const double acc_alone = alone.accuracy(o.eval, {0, 0});

  // The full-graph alternative: one step over all nodes (the same model,
  // the whole mean-aggregation matrix as a square block), planned under
  // the same budget. Planned only: it is the bytes that decide.
  {
    const auto tp = Clock::now();
    const SparseMatrix adj = fd::to_sparse(fd::row_normalize(d.adjacency));
    Tensor ids({std::int64_t(d.train.size())}, DType::i32);
    for (std::size_t i = 0; i < d.train.size(); ++i) ids.data<std::int32_t>()[i] = std::int32_t(d.train[i]);
    nn::manual_seed(o.seed);
    Sage full(d.features.shape()[1], o.hidden, d.classes);
    optim::AdamW opt(full.parameters(), {.lr = 0.01});
    auto fn = [&](Var idx, Var y) {
      const SparseVar a = adj.var();
      return cross_entropy(index_select(full.forward(constant(d.features, "features"), {a, a}), 0, idx), y);
    };
    const std::vector<InputSpec> in{input<std::int32_t>({ids.numel()}, "train_ids"),
                                    input<std::int32_t>({ids.numel()}, "train_labels")};
    const std::size_t free = plan_training(fn, in, opt).plan.total_bytes();
    std::string verdict;
    try {
      plan_training(fn, in, opt, Budget{.device = budget});
      verdict = "fits";
    } catch (const BudgetError& e) {
      char b[160];
      std::snprintf(b, sizeof b, "does not fit: it needs at least %.1f MiB", mib(double(e.smallest_feasible_bytes)));
      verdict = b;
    }
    std::printf("full-graph step (all %lld nodes at once; planned in %.1f s): %.1f MiB unconstrained; under the %.1f MiB "
                "budget it %s\n",
                static_cast<long long>(d.nodes()), seconds_since(tp), mib(double(free)), mib(double(budget)),
                verdict.c_str());
  }
  std::printf("test accuracy on %lld test nodes after %lld epochs: %.2f%% with neighbours, %.2f%% without (fanouts 0,0; "
              "chance %.1f%%)\n",
              static_cast<long long>(std::min<std::size_t>(std::size_t(o.eval), d.test.size())),
              static_cast<long long>(o.epochs), 100 * acc, 100 * acc_alone, 100.0 / double(d.classes));
  std::printf("feature pages read per epoch (order %s): %lld distinct 4 KiB pages summed over %lld batches = %.1f MiB "
              "(the feature matrix is %.1f MiB)\n",
              o.order.c_str(), static_cast<long long>(pages), static_cast<long long>(steps), mib(double(pages) * 4096),
              mib(double(d.features.nbytes())));
  return 0;
} catch (const frugal::Error& e) {
  std::fprintf(stderr, "sampled_training: %s\n", e.what());
  return 1;
}
