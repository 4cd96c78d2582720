// Many-graph datasets (issue 19): block-diagonal batching (data/graph_batch.hpp)
// keeps every graph to itself, so a GCN on a batch computes each graph's
// forward; the synthetic track events (data/track_graphs.hpp) are seeded,
// heavy-tailed and labelled as documented; the batch samplers
// (data/balanced_batches.hpp) visit every graph once per epoch, keep packed
// batches within the budget, and depend only on (seed, epoch); a batch
// padded to its size bucket (data/bucket_padding.hpp) trains as the batch
// itself, and packed batches through a ShapeCache learn the track edges.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <frugal/data/balanced_batches.hpp>
#include <frugal/data/bucket_padding.hpp>
#include <frugal/data/graph_batch.hpp>
#include <frugal/data/track_graphs.hpp>
#include <frugal/frugal.hpp>
#include <frugal/nn/edge_classifier.hpp>
#include <map>
#include <memory>
#include <numeric>

#include "gcn_net.hpp"

namespace graph_batch_test {  // named: unity builds share anonymous namespaces

namespace fd = frugal::data;
using frugal::DType;
using frugal::Tensor;
using frugal::Var;

// A random graph of n nodes, e undirected edges (both directions listed) and
// f64 features of width f, with edge labels and a graph label.
fd::GraphSample random_graph(std::int64_t n, std::int64_t e, std::int64_t f, std::uint64_t seed) {
  frugal::Rng r(seed);
  fd::GraphSample g;
  g.x = Tensor({n, f}, DType::f64);
  for (std::int64_t i = 0; i < n * f; ++i) g.x.data<double>()[i] = r.uniform(-1, 1);
  fd::EdgeList l = fd::random_edges(n, e, seed + 1);
  std::vector<std::int32_t> label;
  for (std::size_t k = 0; k < l.src.size(); ++k) {
    g.src.insert(g.src.end(), {l.src[k], l.dst[k]});
    g.dst.insert(g.dst.end(), {l.dst[k], l.src[k]});
    label.insert(label.end(), 2, std::int32_t(k % 2));
  }
  g.edge_label = Tensor::from(label, {g.edges()});
  g.graph_label = std::int32_t(seed % 3);
  return g;
}

std::vector<fd::GraphSample> few_graphs() {
  return {random_graph(7, 9, 4, 1), random_graph(12, 20, 4, 2), random_graph(3, 2, 4, 3), random_graph(20, 35, 4, 4)};
}

TEST_CASE("batch_graphs makes one block-diagonal graph: offset ids, stacked rows, no edge across graphs",
          "[graph_batch]") {
  const std::vector<fd::GraphSample> gs = few_graphs();
  const std::vector<std::int64_t> pick{3, 0, 2};
  const fd::GraphBatch b = fd::batch_graphs(gs, pick);
  REQUIRE(b.graphs == pick);
  REQUIRE(b.node_ptr == std::vector<std::int64_t>{0, 20, 27, 30});
  REQUIRE(b.nodes() == 30);
  REQUIRE(b.edges() == gs[3].edges() + gs[0].edges() + gs[2].edges());
  b.adjacency.validate("batch");
  CHECK(b.adjacency.nnz() == b.edges());
  CHECK(b.x.shape() == frugal::Shape{30, 4});
  for (std::int64_t g = 0; g < 3; ++g) {
    const fd::GraphSample& s = gs[std::size_t(pick[std::size_t(g)])];
    const std::int64_t n0 = b.node_ptr[std::size_t(g)], e0 = b.edge_ptr[std::size_t(g)];
    for (std::int64_t i = 0; i < s.nodes(); ++i) CHECK(b.node_graph[std::size_t(n0 + i)] == g);
    for (std::int64_t i = 0; i < s.nodes() * 4; ++i) CHECK(b.x.data<double>()[n0 * 4 + i] == s.x.data<double>()[i]);
    for (std::int64_t k = 0; k < s.edges(); ++k) {
      CHECK(b.src[std::size_t(e0 + k)] == s.src[std::size_t(k)] + n0);
      CHECK(b.dst[std::size_t(e0 + k)] == s.dst[std::size_t(k)] + n0);
      CHECK(b.edge_label.data<std::int32_t>()[e0 + k] == s.edge_label.data<std::int32_t>()[k]);
    }
    CHECK(b.graph_label.data<std::int32_t>()[g] == s.graph_label);
  }
  // No entry of the adjacency joins nodes of two graphs.
  for (std::int64_t i = 0; i < b.nodes(); ++i)
    for (std::int64_t p = b.adjacency.row_ptr[std::size_t(i)]; p < b.adjacency.row_ptr[std::size_t(i + 1)]; ++p)
      CHECK(b.node_graph[std::size_t(b.adjacency.col[std::size_t(p)])] == b.node_graph[std::size_t(i)]);
}

TEST_CASE("a GCN on a batch of graphs computes, row for row, each graph's forward alone (float64)",
          "[graph_batch]") {
  const std::vector<fd::GraphSample> gs = few_graphs();
  frugal::nn::manual_seed(5);
  TwoLayerGcn net(4, 8, 3);
  auto forward = [&](const Tensor& x, const fd::Csr& a) {
    frugal::SparseMatrix adj = fd::to_sparse(fd::gcn_normalize(fd::symmetrize(a)), DType::f64);
    frugal::Step eval = frugal::compile_inference([&]() { return net.forward(frugal::constant(x, "x"), adj); }, {});
    eval.run();
    return eval.output().clone();
  };
  const std::vector<std::int64_t> pick{1, 3, 0, 2};
  const fd::GraphBatch b = fd::batch_graphs(gs, pick);
  const Tensor together = forward(b.x, b.adjacency);
  double worst = 0;
  for (std::size_t g = 0; g < pick.size(); ++g) {
    const fd::GraphSample& s = gs[std::size_t(pick[g])];
    const Tensor alone = forward(s.x, fd::from_edges(s.nodes(), s.nodes(), s.src, s.dst));
    for (std::int64_t i = 0; i < s.nodes() * 3; ++i)
      worst = std::max(worst, std::abs(together.data<double>()[b.node_ptr[g] * 3 + i] - alone.data<double>()[i]));
  }
  CHECK(worst < 1e-12);
}

TEST_CASE("batch_graphs names the graph that does not fit the others", "[graph_batch]") {
  std::vector<fd::GraphSample> gs = few_graphs();
  using Catch::Matchers::Contains;
  CHECK_THROWS_AS(fd::batch_graphs(gs, std::vector<std::int64_t>{}), frugal::DataError);
  CHECK_THROWS_WITH(fd::batch_graphs(gs, std::vector<std::int64_t>{0, 4}), Contains("index 4"));
  gs.push_back(random_graph(5, 4, 6, 9));  // graph 4: features 6 wide, the others 4
  CHECK_THROWS_WITH(fd::batch_graphs(gs, std::vector<std::int64_t>{0, 4}),
                    Contains("graph 4") && Contains("same width"));
  gs[4] = random_graph(5, 4, 4, 9);
  gs[4].edge_attr = Tensor({gs[4].edges(), 2}, DType::f64);  // edge features on one graph only
  CHECK_THROWS_WITH(fd::batch_graphs(gs, std::vector<std::int64_t>{0, 4}), Contains("graph 4") && Contains("edge features"));
  gs[4].edge_attr = Tensor();
  gs[4].edge_label = Tensor();
  CHECK_THROWS_WITH(fd::batch_graphs(gs, std::vector<std::int64_t>{0, 4}), Contains("graph 4") && Contains("edge labels"));
  gs[4] = random_graph(5, 4, 4, 9);
  gs[4].src[0] = 5;  // outside its 5 nodes
  CHECK_THROWS_WITH(fd::batch_graphs(gs, std::vector<std::int64_t>{0, 4}), Contains("graph 4") && Contains("edge 0"));
}

TEST_CASE("track_graphs: seeded, heavy-tailed sizes, 0/1 edge labels with both present", "[graph_batch][tracks]") {
  fd::TrackGraphOptions o;
  o.events = 150;
  const std::vector<fd::GraphSample> a = fd::track_graphs(o), b = fd::track_graphs(o);
  o.seed = 20;
  const std::vector<fd::GraphSample> c = fd::track_graphs(o);
  REQUIRE(a.size() == 150);
  bool all_same = true, any_differs = false;
  std::vector<std::int64_t> nodes;
  std::int64_t ones = 0, zeros = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    a[i].validate("event");
    REQUIRE(a[i].edge_attr.defined());
    all_same = all_same && a[i].src == b[i].src && a[i].dst == b[i].dst &&
               a[i].x.to_vector<float>() == b[i].x.to_vector<float>() &&
               a[i].edge_attr.to_vector<float>() == b[i].edge_attr.to_vector<float>() &&
               a[i].edge_label.to_vector<std::int32_t>() == b[i].edge_label.to_vector<std::int32_t>();
    any_differs = any_differs || a[i].nodes() != c[i].nodes() || a[i].src != c[i].src;
    nodes.push_back(a[i].nodes());
    for (std::int32_t l : a[i].edge_label.to_vector<std::int32_t>()) {
      CHECK((l == 0 || l == 1));
      (l == 1 ? ones : zeros) += 1;
    }
  }
  CHECK(all_same);
  CHECK(any_differs);
  CHECK(ones > 0);
  CHECK(zeros > 0);
  std::sort(nodes.begin(), nodes.end());
  const std::int64_t median = nodes[nodes.size() / 2], largest = nodes.back();
  INFO("median " << median << " hits, largest " << largest);
  CHECK(largest >= 5 * median);
  CHECK(median >= 10);
  CHECK(largest >= 1000);
  // Event i does not depend on the event count.
  o.seed = 19;
  o.events = 5;
  CHECK(fd::track_graphs(o)[4].src == a[4].src);
}

// Sizes of a track dataset and a stand-in for the planner's prediction: a
// fixed part and a part per node and per edge of the whole batch.
struct Sizes {
  std::vector<std::int64_t> nodes, edges;
  explicit Sizes(std::int64_t events) {
    fd::TrackGraphOptions o;
    o.events = events;
    for (const fd::GraphSample& g : fd::track_graphs(o)) nodes.push_back(g.nodes()), edges.push_back(g.edges());
  }
  fd::BatchBytes bytes() const {
    return [this](std::span<const std::int64_t> graphs) {
      std::size_t n = 0, e = 0;
      for (std::int64_t g : graphs) n += std::size_t(nodes[std::size_t(g)]), e += std::size_t(edges[std::size_t(g)]);
      return std::size_t(65536) + 48 * n + 96 * e;
    };
  }
  std::size_t largest_alone() const {
    std::size_t most = 0;
    for (std::int64_t g = 0; g < std::int64_t(nodes.size()); ++g) most = std::max(most, bytes()(std::vector<std::int64_t>{g}));
    return most;
  }
};

void check_exactly_once(const fd::EpochBatches& e, std::int64_t graphs) {
  std::vector<int> seen(std::size_t(graphs), 0);
  for (const auto& batch : e.batches)
    for (std::int64_t g : batch) seen[std::size_t(g)] += 1;
  CHECK(std::all_of(seen.begin(), seen.end(), [](int s) { return s == 1; }));
  CHECK(e.batches.size() % std::size_t(e.ranks) == 0);
}

TEST_CASE("batch samplers: every graph once per epoch, packed and mixed batches within the budget, over R ranks",
          "[graph_batch][sampler]") {
  const Sizes s(300);
  const fd::BatchBytes bytes = s.bytes();
  const std::int64_t G = 300;
  const std::size_t budget = 2 * s.largest_alone();
  for (std::int64_t ranks : {1, 4, 7}) {
    for (fd::BatchStrategy strategy : {fd::BatchStrategy::random, fd::BatchStrategy::sorted, fd::BatchStrategy::packed,
                                       fd::BatchStrategy::mixed}) {
      INFO(fd::strategy_name(strategy) << " over " << ranks << " ranks");
      fd::BatchOptions o{.strategy = strategy, .graphs_per_batch = 16, .budget = budget, .ranks = ranks, .seed = 3};
      for (std::int64_t epoch = 0; epoch < 3; ++epoch) {
        const fd::EpochBatches e = fd::epoch_batches(G, bytes, o, epoch);
        check_exactly_once(e, G);
        for (std::size_t b = 0; b < e.batches.size(); ++b)
          if (!e.batches[b].empty()) CHECK(e.bytes[b] == bytes(e.batches[b]));
        if (strategy == fd::BatchStrategy::packed || strategy == fd::BatchStrategy::mixed)
          for (std::size_t b = 0; b < e.batches.size(); ++b) CHECK(e.bytes[b] <= budget);
        if (strategy == fd::BatchStrategy::random) {  // what the packing avoids: this budget is exceeded
          CHECK(*std::max_element(e.bytes.begin(), e.bytes.end()) > budget);
        }
      }
    }
  }
  // A graph over the budget alone is named.
  std::vector<std::int64_t> by_size(static_cast<std::size_t>(G));
  std::iota(by_size.begin(), by_size.end(), 0);
  const auto largest = *std::max_element(by_size.begin(), by_size.end(), [&](std::int64_t a, std::int64_t b) {
    return bytes(std::vector<std::int64_t>{a}) < bytes(std::vector<std::int64_t>{b});
  });
  fd::BatchOptions tight{.strategy = fd::BatchStrategy::packed,
                         .budget = bytes(std::vector<std::int64_t>{largest}) - 1};
  CHECK_THROWS_WITH(fd::epoch_batches(G, bytes, tight, 0),
                    Catch::Matchers::Contains("graph " + std::to_string(largest) + " alone"));
}

TEST_CASE("batch samplers are deterministic per (seed, epoch) and differ across epochs", "[graph_batch][sampler]") {
  const Sizes s(200);
  const fd::BatchBytes bytes = s.bytes();
  const std::size_t budget = 2 * s.largest_alone();
  for (fd::BatchStrategy strategy : {fd::BatchStrategy::random, fd::BatchStrategy::sorted, fd::BatchStrategy::packed,
                                     fd::BatchStrategy::mixed}) {
    INFO(fd::strategy_name(strategy));
    fd::BatchOptions o{.strategy = strategy, .graphs_per_batch = 12, .budget = budget, .ranks = 4, .seed = 11};
    const fd::EpochBatches e1 = fd::epoch_batches(200, bytes, o, 1);
    CHECK(fd::epoch_batches(200, bytes, o, 1).batches == e1.batches);
    CHECK(fd::epoch_batches(200, bytes, o, 2).batches != e1.batches);
    o.seed = 12;
    CHECK(fd::epoch_batches(200, bytes, o, 1).batches != e1.batches);
  }
}

TEST_CASE("mixed batches hold graphs of all sizes where packed ones sort them, under the same budget",
          "[graph_batch][sampler]") {
  // What mixed is for: first-fit decreasing gives the largest graphs
  // batches of their own and packs the smallest together, so a batch's
  // typical graph size swings from batch to batch; first-fit in random order
  // fills each batch with graphs of all sizes. Measured as the spread
  // (coefficient of variation) over batches of each batch's median graph
  // bytes: it must be clearly smaller for mixed.
  const Sizes s(400);
  const fd::BatchBytes bytes = s.bytes();
  const std::size_t budget = 2 * s.largest_alone();
  auto spread = [&](fd::BatchStrategy strategy) {
    const fd::EpochBatches e = fd::epoch_batches(400, bytes, {.strategy = strategy, .budget = budget, .seed = 5}, 0);
    std::vector<double> medians;
    for (const auto& batch : e.batches) {
      std::vector<double> own;
      for (std::int64_t g : batch) own.push_back(double(bytes(std::vector<std::int64_t>{g})));
      std::sort(own.begin(), own.end());
      medians.push_back(own[own.size() / 2]);
    }
    double mean = 0, var = 0;
    for (double m : medians) mean += m / double(medians.size());
    for (double m : medians) var += (m - mean) * (m - mean) / double(medians.size());
    return std::sqrt(var) / mean;
  };
  const double packed = spread(fd::BatchStrategy::packed), mixed = spread(fd::BatchStrategy::mixed);
  INFO("spread of batch medians: packed " << packed << ", mixed " << mixed);
  CHECK(mixed < packed / 2);
}

// ---- padding to size buckets -----------------------------------------------

// A track event in float64 (the generator makes f32).
fd::GraphSample to_f64(const fd::GraphSample& g) {
  fd::GraphSample d = g;
  auto widen = [](const Tensor& t) {
    const std::vector<float> f = t.to_vector<float>();
    return Tensor::from(std::vector<double>(f.begin(), f.end()), t.shape());
  };
  d.x = widen(g.x);
  d.edge_attr = widen(g.edge_attr);
  return d;
}

// The step inputs of a batch as it is, unpadded.
std::vector<Tensor> unpadded_inputs(const fd::GraphBatch& b) {
  std::vector<std::int32_t> src(b.src.begin(), b.src.end()), dst(b.dst.begin(), b.dst.end());
  return {b.x, Tensor::from(src, {b.edges()}), Tensor::from(dst, {b.edges()}), b.edge_attr, b.edge_label};
}

std::vector<frugal::InputSpec> edge_specs(const std::vector<Tensor>& in) {
  return {{{in[0].dtype(), in[0].shape()}, "x"},
          {{DType::i32, in[1].shape()}, "src"},
          {{DType::i32, in[2].shape()}, "dst"},
          {{in[3].dtype(), in[3].shape()}, "edge_attr"},
          {{DType::i32, in[4].shape()}, "edge_label"}};
}

TEST_CASE("bucket padding: zero rows, padded edges between padding nodes labelled -100, shapes from the rule",
          "[graph_batch][bucket]") {
  fd::TrackGraphOptions o;
  o.events = 6;
  const std::vector<fd::GraphSample> gs = fd::track_graphs(o);
  const fd::GraphBatch b = fd::batch_graphs(gs, std::vector<std::int64_t>{0, 1, 2, 3, 4, 5});
  const fd::BucketRule rule{.base = 64, .ratio = 1.19};
  CHECK(rule.bucket(1) == 64);
  CHECK(rule.bucket(64) == 64);
  CHECK(rule.bucket(65) == 77);  // ceil(64 * 1.19)
  CHECK(rule.bucket(77) == 77);
  const fd::PaddedBatch p = fd::pad_to_bucket(b, rule);
  const std::int64_t N = b.nodes(), E = b.edges(), Np = p.x.shape()[0], Ep = p.src.shape()[0];
  CHECK(Np == rule.bucket(N + 1));
  CHECK(Np > N);  // at least one padding node, even when N is a bucket size itself
  CHECK(Ep == rule.bucket(E));
  CHECK(p.nodes == N);
  CHECK(p.edges == E);
  REQUIRE(p.inputs().size() == 5);
  const std::vector<float> x = p.x.to_vector<float>(), bx = b.x.to_vector<float>();
  CHECK(std::equal(bx.begin(), bx.end(), x.begin()));
  CHECK(std::all_of(x.begin() + std::ptrdiff_t(bx.size()), x.end(), [](float v) { return v == 0; }));
  const std::vector<std::int32_t> src = p.src.to_vector<std::int32_t>(), dst = p.dst.to_vector<std::int32_t>(),
                                  label = p.edge_label.to_vector<std::int32_t>();
  const std::vector<float> attr = p.edge_attr.to_vector<float>();
  for (std::int64_t k = 0; k < Ep; ++k) {
    const auto i = std::size_t(k);
    if (k < E) {
      CHECK(src[i] == b.src[i]);
      CHECK(dst[i] == b.dst[i]);
      CHECK(label[i] == b.edge_label.data<std::int32_t>()[k]);
    } else {  // no padded edge touches a real node
      CHECK(src[i] >= N);
      CHECK(dst[i] >= N);
      CHECK(label[i] == -100);
      for (int c = 0; c < 3; ++c) CHECK(attr[i * 3 + std::size_t(c)] == 0);
    }
  }
  // An edge count that is a bucket size exactly needs no padded edge.
  fd::BucketRule tight{.base = E, .ratio = 2};
  CHECK(fd::pad_to_bucket(b, tight).src.shape()[0] == E);
}

TEST_CASE("a batch padded to its bucket has the unpadded batch's loss and parameter gradients (float64)",
          "[graph_batch][bucket]") {
  fd::TrackGraphOptions o;
  o.events = 4;
  std::vector<fd::GraphSample> gs;
  for (const fd::GraphSample& g : fd::track_graphs(o)) gs.push_back(to_f64(g));
  const fd::GraphBatch b = fd::batch_graphs(gs, std::vector<std::int64_t>{0, 1, 2, 3});
  const fd::PaddedBatch p = fd::pad_to_bucket(b);
  REQUIRE(p.x.shape()[0] > b.nodes());
  REQUIRE(p.src.shape()[0] > b.edges());  // this batch has padded edges to ignore
  frugal::nn::manual_seed(7);
  frugal::nn::EdgeClassifier model(3, 3, 8, DType::f64);
  const std::vector<Tensor> params = model.parameters();
  struct Result {
    double loss;
    std::vector<std::vector<double>> grads;
  };
  auto run = [&](const std::vector<Tensor>& in) {
    frugal::Step step = frugal::compile_gradients(
        [&](Var x, Var s, Var d, Var e, Var y) { return model.loss(x, s, d, e, y); }, edge_specs(in), params);
    std::vector<const Tensor*> ptrs;
    for (const Tensor& t : in) ptrs.push_back(&t);
    step.run_inputs(ptrs);
    Result r{step.last_loss_f64(), {}};
    for (const Tensor& w : params) r.grads.push_back(step.grad(w).to_vector<double>());
    return r;
  };
  // The largest difference of loss and gradients, relative to the largest magnitude of each.
  auto differ = [](const Result& a, const Result& c) {
    double worst = std::abs(a.loss - c.loss) / std::abs(a.loss);
    for (std::size_t i = 0; i < a.grads.size(); ++i) {
      double scale = 0, d = 0;
      for (std::size_t k = 0; k < a.grads[i].size(); ++k) {
        scale = std::max(scale, std::abs(a.grads[i][k]));
        d = std::max(d, std::abs(a.grads[i][k] - c.grads[i][k]));
      }
      worst = std::max(worst, scale > 0 ? d / scale : d);
    }
    return worst;
  };
  const Result plain = run(unpadded_inputs(b)), padded = run(p.inputs());
  CHECK(std::isfinite(plain.loss));
  CHECK(differ(plain, padded) < 1e-12);  // equal to float64 rounding (kernels may sum in another order)

  // The test can tell: padded edges that send into a real node, or that are
  // not ignored by the loss, change the result.
  fd::PaddedBatch into_real = p;
  into_real.dst = p.dst.clone();
  for (std::int64_t k = b.edges(); k < p.dst.shape()[0]; ++k) into_real.dst.data<std::int32_t>()[k] = 0;
  CHECK(differ(plain, run(into_real.inputs())) > 1e-6);
  fd::PaddedBatch counted = p;
  counted.edge_label = p.edge_label.clone();
  for (std::int64_t k = b.edges(); k < p.dst.shape()[0]; ++k) counted.edge_label.data<std::int32_t>()[k] = 0;
  CHECK(differ(plain, run(counted.inputs())) > 1e-6);
}

TEST_CASE("packed track batches trained through a ShapeCache under a budget beat the majority class on test edges",
          "[graph_batch][bucket][training]") {
  fd::TrackGraphOptions o;
  o.events = 60;
  const std::vector<fd::GraphSample> gs = fd::track_graphs(o);
  const std::int64_t train = 48;  // events 0..47 train, 48..59 test
  const fd::BucketRule rule;
  frugal::nn::manual_seed(19);
  frugal::nn::EdgeClassifier model(3, 3, 16);
  frugal::optim::AdamW opt(model.parameters(), {.lr = 0.01});
  auto loss = [&](Var x, Var s, Var d, Var e, Var y) { return model.loss(x, s, d, e, y); };
  auto specs = [](std::int64_t N, std::int64_t E) {
    return std::vector<frugal::InputSpec>{frugal::input<float>({N, 3}, "x"), frugal::input<std::int32_t>({E}, "src"),
                                          frugal::input<std::int32_t>({E}, "dst"),
                                          frugal::input<float>({E, 3}, "edge_attr"),
                                          frugal::input<std::int32_t>({E}, "edge_label")};
  };
  // A batch's bytes: its bucket's unconstrained plan, cached per bucket.
  std::map<std::pair<std::int64_t, std::int64_t>, std::size_t> planned;
  const fd::BatchBytes bytes = [&](std::span<const std::int64_t> ids) {
    std::int64_t n = 0, e = 0;
    for (std::int64_t g : ids) n += gs[std::size_t(g)].nodes(), e += gs[std::size_t(g)].edges();
    const auto key = std::make_pair(rule.bucket(n + 1), rule.bucket(e));
    auto [it, fresh] = planned.try_emplace(key, 0);
    if (fresh) it->second = frugal::plan_training(loss, specs(key.first, key.second), opt).plan.total_bytes();
    return it->second;
  };
  std::size_t budget = 0;  // per batch: the largest training event alone
  for (std::int64_t g = 0; g < train; ++g) budget = std::max(budget, bytes(std::span<const std::int64_t>(&g, 1)));
  // The cache's steps share 3 batches' worth: they are re-planned, or leave, to fit.
  const frugal::Budget total{.device = 3 * budget};
  auto cache = frugal::cache_shapes(loss, specs(1, 1), opt, total, {.threads = 1});

  std::vector<std::int64_t> test_ids;
  for (std::int64_t g = train; g < o.events; ++g) test_ids.push_back(g);
  const fd::PaddedBatch test = fd::pad_to_bucket(fd::batch_graphs(gs, test_ids), rule);
  std::vector<frugal::InputSpec> eval_specs = specs(test.x.shape()[0], test.src.shape()[0]);
  eval_specs.pop_back();
  frugal::Step eval = frugal::compile_inference([&](Var x, Var s, Var d, Var e) { return model.forward(x, s, d, e); },
                                                eval_specs, {}, {.threads = 1});
  auto accuracy = [&] {  // on the test events' real edges
    eval.run(test.x, test.src, test.dst, test.edge_attr);
    const float* logit = eval.output().data<float>();
    std::int64_t right = 0;
    for (std::int64_t k = 0; k < test.edges; ++k)
      right += (logit[2 * k + 1] > logit[2 * k]) == (test.edge_label.data<std::int32_t>()[k] == 1);
    return double(right) / double(test.edges);
  };
  std::int64_t ones = 0;
  for (std::int64_t k = 0; k < test.edges; ++k) ones += test.edge_label.data<std::int32_t>()[k];
  const double majority = double(std::max(ones, test.edges - ones)) / double(test.edges);
  // Three standard errors of an accuracy at the majority's rate over these
  // edges: a classifier no better than the majority would rarely land above.
  const double margin = 3 * std::sqrt(majority * (1 - majority) / double(test.edges));
  const double before = accuracy();

  fd::BatchOptions bo{.strategy = fd::BatchStrategy::packed, .budget = budget, .seed = 19};
  std::size_t batches = 0;
  for (std::int64_t epoch = 0; epoch < 12; ++epoch) {
    const fd::EpochBatches e = fd::epoch_batches(train, bytes, bo, epoch);
    for (const std::vector<std::int64_t>& ids : e.batches) {
      const float l = cache->run(fd::pad_to_bucket(fd::batch_graphs(gs, ids), rule).inputs());
      REQUIRE(std::isfinite(l));
      CHECK(cache->broker().measured_device_bytes() <= total.device);
      ++batches;
    }
  }
  const double after = accuracy();
  INFO("test edges " << test.edges << ", majority " << majority << ", margin " << margin << ", accuracy before "
                     << before << ", after " << after << "; " << batches << " batches, " << cache->compiled()
                     << " steps compiled, " << cache->cached() << " cached");
  CHECK(after > majority + margin);
  CHECK(after > before);
  CHECK(cache->compiled() * 4 <= batches);  // a few bucket shapes serve many batches
}

}  // namespace graph_batch_test
