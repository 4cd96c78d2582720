// gcn: the two-layer graph convolutional network of Kipf and Welling on the
// Cora citation graph (the standard Planetoid split: 140 labelled nodes for
// training, 500 for validation, 1000 for test), full-batch, within a device
// memory budget. --runs N repeats with N seeds and reports the mean and the
// spread of the test accuracy.
//
//   gcn --runs 5
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <frugal/frugal.hpp>

#include "../common/session.hpp"

using namespace frugal;
namespace fs = std::filesystem;

namespace {

struct Options {
  samples::CommonArgs common;
  std::int64_t hidden = 16, runs = 1, eval_every = 10, stop_after = 0;
  double lr = 0.01, weight_decay = 5e-4, dropout = 0.5;
};

// Kipf and Welling's model: dropout, GCNConv, ReLU, dropout, GCNConv.
struct Net : nn::Module {
  nn::GCNConv conv1, conv2;
  double p;
  Net(std::int64_t in, std::int64_t hidden, std::int64_t classes, double p_)
      : conv1(in, hidden), conv2(hidden, classes), p(p_) {
    register_module("conv1", conv1);
    register_module("conv2", conv2);
  }
  Var forward(Var x, const SparseMatrix& adj) {
    Var h = relu(conv1(dropout(x, p, is_training()), adj));
    return conv2(dropout(h, p, is_training()), adj);
  }
};

// With no Cora files: a planted-partition graph (7 communities, most edges
// inside one) whose sparse binary features hint at the community.
data::NodeClassification generated_graph(std::uint64_t seed) {
  const std::int64_t n = 2000, f = 500, classes = 7;
  Rng r(seed, 31);
  data::NodeClassification d;
  d.classes = classes;
  d.features = Tensor({n, f});
  d.labels = Tensor({n}, DType::i32);
  std::vector<std::vector<std::int64_t>> members(classes);
  for (std::int64_t i = 0; i < n; ++i) {
    auto c = std::int64_t(r.below(classes));
    d.labels.data<std::int32_t>()[i] = std::int32_t(c);
    members[std::size_t(c)].push_back(i);
    std::vector<std::int64_t> on;
    for (int k = 0; k < 12; ++k)
      on.push_back(r.uniform() < 0.3 ? c * (f / classes) + std::int64_t(r.below(std::uint64_t(f / classes)))
                                     : std::int64_t(r.below(std::uint64_t(f))));
    for (std::int64_t j : on) d.features.data<float>()[i * f + j] = 1.0f / float(on.size());
  }
  std::vector<std::int64_t> src, dst;
  for (std::int64_t i = 0; i < n; ++i)
    for (int k = 0; k < 2; ++k) {
      auto c = std::size_t(d.labels.data<std::int32_t>()[i]);
      std::int64_t j = r.uniform() < 0.8 ? members[c][r.below(members[c].size())] : std::int64_t(r.below(std::uint64_t(n)));
      if (j != i) src.push_back(i), dst.push_back(j);
    }
  d.adjacency = data::symmetrize(data::from_edges(n, n, src, dst));
  for (std::int64_t c = 0; c < classes; ++c)
    for (std::size_t k = 0; k < members[std::size_t(c)].size() && k < 20; ++k) d.train.push_back(members[std::size_t(c)][k]);
  std::sort(d.train.begin(), d.train.end());
  for (std::int64_t i = 0, v = 0, t = 0; i < n; ++i) {
    if (std::binary_search(d.train.begin(), d.train.end(), i)) continue;
    if (v < 500) d.val.push_back(i), ++v;
    else if (t < 1000) d.test.push_back(i), ++t;
  }
  return d;
}

Tensor ids_tensor(const std::vector<std::int64_t>& ids) {
  Tensor t({std::int64_t(ids.size())}, DType::i32);
  for (std::size_t i = 0; i < ids.size(); ++i) t.data<std::int32_t>()[i] = std::int32_t(ids[i]);
  return t;
}

struct RunResult {
  double accuracy = 0, val_accuracy = 0;
  std::string json;
};

RunResult run_one(Options& o, const data::NodeClassification& d, const SparseMatrix& adj, bool real,
                  std::int64_t seed, bool first_run, bool last_run) {
  samples::CommonArgs& a = o.common;
  samples::Session session("gcn", a);
  const std::int64_t N = d.nodes(), F = d.features.shape()[1];
  nn::manual_seed(std::uint64_t(seed));
  Net model(F, o.hidden, d.classes, o.dropout);
  // Adam, with the paper's L2 penalty on the first layer's weight in the loss
  // (weight_decay / 2 * ||W1||^2), not AdamW's decoupled decay.
  optim::AdamW opt(model.parameters(), {.lr = o.lr, .weight_decay = 0});
  const std::int64_t n_train = std::int64_t(d.train.size());
  Tensor train_ids = ids_tensor(d.train), train_labels({n_train}, DType::i32);
  for (std::int64_t i = 0; i < n_train; ++i)
    train_labels.data<std::int32_t>()[i] = d.labels.data<std::int32_t>()[d.train[std::size_t(i)]];
  CompileOptions copts{.backend = a.device, .threads = int(a.threads), .replan = !session.brokered_steps()};
  // The feature matrix is the same every step: a constant, bound once (not
  // a step input copied in each run), which a tight budget can keep on the
  // host between its reads.
  auto train_fn = [&](Var ids, Var y) {
    Var x = constant(d.features, "features");
    Var loss = cross_entropy(index_select(model.forward(x, adj), 0, ids), y);
    if (o.weight_decay == 0) return loss;
    Var w1 = persistent_var(model.conv1.lin.weight, ValueKind::parameter, "conv1.lin.weight");
    return loss + sum(w1 * w1) * (o.weight_decay / 2);
  };
  auto eval_fn = [&]() { return model.forward(constant(d.features, "features"), adj); };
  std::vector<InputSpec> train_in{input<std::int32_t>({n_train}, "train_ids"),
                                  input<std::int32_t>({n_train}, "train_labels")};
  std::vector<InputSpec> eval_in;

  PlannedStep free_train = plan_training(train_fn, train_in, opt, {}, copts);
  model.eval();
  PlannedStep free_eval = plan_inference(eval_fn, eval_in, {}, copts);
  model.train();
  samples::SampleSteps steps;
  session.compile_steps(steps, free_train, free_eval, train_fn, train_in, opt, copts, eval_fn, eval_in, copts);
  Step& step = *steps.train;
  Step& eval = *steps.eval;
  const std::size_t budget_total = steps.budget_total;

  const std::int64_t total = a.steps > 0 ? a.steps : a.epochs > 0 ? a.epochs : 200;
  char config[200];
  std::snprintf(config, sizeof config, "data=%s hidden=%lld dropout=%g lr=%g wd=%g steps=%lld seed=%lld",
                real ? "cora" : "generated", static_cast<long long>(o.hidden), o.dropout, o.lr, o.weight_decay,
                static_cast<long long>(total), static_cast<long long>(seed));
  if (first_run) {
    std::fprintf(session.out(), "gcn: %s, %lld nodes, %lld edges, %lld features, %lld classes; %lld parameters\n",
                 real ? "Cora" : "a generated graph", static_cast<long long>(N),
                 static_cast<long long>(d.adjacency.nnz() / 2), static_cast<long long>(F),
                 static_cast<long long>(d.classes), static_cast<long long>(model.num_parameters()));
    session.print_plan(step, eval, budget_total, free_train.plan.total_bytes());
  }
  const std::int64_t first = session.resume(model, opt, {&step, &eval}, config);
  if (first > total) fail("the checkpoint is at step ", first, ", past --steps ", total);

  // Accuracy and loss on a node set, from the full-graph forward pass.
  auto measure = [&](const std::vector<std::int64_t>& nodes) {
    const float* z = eval.output().data<float>();
    const std::int64_t C = d.classes;
    std::int64_t correct = 0;
    double loss = 0;
    for (std::int64_t i : nodes) {
      const float* row = z + i * C;
      const int label = d.labels.data<std::int32_t>()[i];
      loss += samples::row_nll(row, C, label);
      correct += samples::row_correct(row, C, label);
    }
    return std::make_pair(loss / double(nodes.size()), double(correct) / double(nodes.size()));
  };

  session.start(first, total, "graph", 1, budget_total);
  std::int64_t s = first;
  const std::int64_t last = o.stop_after > 0 ? std::min(total, first + o.stop_after) : total;
  for (; s < last; ++s) {
    auto t0 = std::chrono::steady_clock::now();
    float loss = step.run(train_ids, train_labels);
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    session.step_done(s, loss, ms, steps.measured_device_bytes(), model, opt);
    if ((s + 1) % o.eval_every == 0 && s + 1 < total) {
      eval.run();
      auto [vl, va] = measure(d.val);
      char line[128];
      std::snprintf(line, sizeof line, "step %lld: validation loss %.4f, accuracy %.2f%%", static_cast<long long>(s + 1),
                    vl, 100 * va);
      session.validation(s + 1, vl, line);
    }
  }
  session.save(model, opt, s);
  eval.run();
  auto [val_loss, val_acc] = measure(d.val);
  auto [test_loss, test_acc] = measure(d.test);
  const std::size_t peak = steps.measured_device_bytes();
  char line[200];
  std::snprintf(line, sizeof line, "seed %lld: test accuracy %.2f%% (validation %.2f%%) after %lld steps; median step %.2f ms",
                static_cast<long long>(seed), 100 * test_acc, 100 * val_acc, static_cast<long long>(s),
                session.step_ms_median());
  session.note(line);
  if (last_run)
    session.write_plot("gcn on " + std::string(real ? "Cora" : "a generated graph"), step.plan(), free_train.plan,
                       budget_total, step.measured_device_bytes(), "validation loss", std::make_pair(s, val_loss));
  samples::JsonLine j = session.summary_json(s, peak, budget_total, step, free_train.plan.total_bytes() + free_eval.plan.total_bytes());
  j.add("data", real ? "cora" : "generated").add("val_accuracy", val_acc).add("test_loss", test_loss);
  return {test_acc, val_acc, j.str()};
}

}  // namespace

int main(int argc, char** argv) try {
  Options o;
  samples::Cli cli("gcn", "Trains a two-layer GCN on the Cora citation graph within a device memory budget.");
  o.common.declare(cli, "../shared/data/cora");
  cli.option("--hidden", o.hidden, "hidden units (default 16)");
  cli.option("--lr", o.lr, "learning rate (AdamW; default 0.01)");
  cli.option("--weight-decay", o.weight_decay, "L2 penalty on the first layer's weight, as the GCN paper (default 5e-4)");
  cli.option("--dropout", o.dropout, "dropout on the input and hidden features (default 0.5)");
  cli.option("--runs", o.runs, "train this many times with seeds seed, seed+1, ... and report mean and spread");
  cli.option("--eval-every", o.eval_every, "steps between validation losses (default 10)");
  cli.option("--stop-after", o.stop_after, "stop after this many steps of this run, as if interrupted");
  cli.parse(argc, argv);
  o.common.check(cli);
  if (o.hidden <= 0 || o.runs <= 0 || o.eval_every <= 0) cli.usage_error("--hidden, --runs and --eval-every must be positive");
  if (o.runs > 1 && (!o.common.checkpoint.empty() || !o.common.resume.empty()))
    cli.usage_error("--checkpoint and --resume take one run; drop --runs");

  const bool real = fs::exists(fs::path(o.common.data) / "nodes.tsv");
  data::NodeClassification d;
  if (real) {
    d = data::load_planetoid(o.common.data);
  } else {
    std::fprintf(stderr, "gcn: no Cora files in '%s' (expected nodes.tsv and edges.tsv); training on a generated graph instead\n",
                 o.common.data.c_str());
    d = generated_graph(std::uint64_t(o.common.seed));
  }
  SparseMatrix adj = data::to_sparse(data::gcn_normalize(d.adjacency));

  std::vector<double> acc;
  std::string last_json;
  const std::int64_t seed0 = o.common.seed;
  for (std::int64_t k = 0; k < o.runs; ++k) {
    o.common.seed = seed0 + k;
    RunResult r = run_one(o, d, adj, real, seed0 + k, k == 0, k + 1 == o.runs);
    acc.push_back(r.accuracy);
    last_json = r.json;
  }
  o.common.seed = seed0;
  double mean = 0, var = 0;
  for (double v : acc) mean += v / double(acc.size());
  for (double v : acc) var += (v - mean) * (v - mean) / double(std::max<std::size_t>(acc.size() - 1, 1));
  const double sd = std::sqrt(var);
  if (!o.common.json) {
    std::printf("test accuracy %.2f%%", 100 * mean);
    if (acc.size() > 1) std::printf(" ± %.2f (mean ± standard deviation over %zu seeds)", 100 * sd, acc.size());
    std::printf("\n");
  } else {
    std::string accs = "[";
    for (std::size_t i = 0; i < acc.size(); ++i) {
      char b[32];
      std::snprintf(b, sizeof b, "%s%.4f", i ? "," : "", acc[i]);
      accs += b;
    }
    accs += "]";
    samples::JsonLine extra;
    extra.add("metric", "accuracy").add("accuracy", mean).add("accuracy_std", sd).add("runs", std::int64_t(acc.size()))
        .raw("accuracies", accs);
    std::string e = extra.str();
    last_json.pop_back();  // merge the two objects
    std::printf("%s,%s\n", last_json.c_str(), e.substr(1).c_str());
  }
  return 0;
} catch (const frugal::Error& e) {
  std::fprintf(stderr, "gcn: %s\n", e.what());
  return 1;
}
