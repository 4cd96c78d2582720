// Many-graph datasets (issue 19): block-diagonal batching (data/graph_batch.hpp)
// keeps every graph to itself, so a GCN on a batch computes each graph's
// forward; the synthetic track events (data/track_graphs.hpp) are seeded,
// heavy-tailed and labelled as documented; the batch samplers
// (data/balanced_batches.hpp) visit every graph once per epoch, keep packed
// batches within the budget, and depend only on (seed, epoch).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <frugal/data/balanced_batches.hpp>
#include <frugal/data/graph_batch.hpp>
#include <frugal/data/track_graphs.hpp>
#include <frugal/frugal.hpp>
#include <numeric>

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
  struct Net : frugal::nn::Module {
    frugal::nn::GCNConv conv1{4, 8, {.dtype = DType::f64}}, conv2{8, 3, {.dtype = DType::f64}};
    Net() {
      register_module("conv1", conv1);
      register_module("conv2", conv2);
    }
    Var forward(Var x, const frugal::SparseMatrix& adj) { return conv2(frugal::relu(conv1(x, adj)), adj); }
  };
  frugal::nn::manual_seed(5);
  Net net;
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

TEST_CASE("batch samplers: every graph once per epoch, packed batches within the budget, over R ranks",
          "[graph_batch][sampler]") {
  const Sizes s(300);
  const fd::BatchBytes bytes = s.bytes();
  const std::int64_t G = 300;
  const std::size_t budget = 2 * s.largest_alone();
  for (std::int64_t ranks : {1, 4, 7}) {
    for (fd::BatchStrategy strategy : {fd::BatchStrategy::random, fd::BatchStrategy::sorted, fd::BatchStrategy::packed}) {
      INFO(fd::strategy_name(strategy) << " over " << ranks << " ranks");
      fd::BatchOptions o{.strategy = strategy, .graphs_per_batch = 16, .budget = budget, .ranks = ranks, .seed = 3};
      for (std::int64_t epoch = 0; epoch < 3; ++epoch) {
        const fd::EpochBatches e = fd::epoch_batches(G, bytes, o, epoch);
        check_exactly_once(e, G);
        for (std::size_t b = 0; b < e.batches.size(); ++b)
          if (!e.batches[b].empty()) CHECK(e.bytes[b] == bytes(e.batches[b]));
        if (strategy == fd::BatchStrategy::packed)
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
  for (fd::BatchStrategy strategy : {fd::BatchStrategy::random, fd::BatchStrategy::sorted, fd::BatchStrategy::packed}) {
    INFO(fd::strategy_name(strategy));
    fd::BatchOptions o{.strategy = strategy, .graphs_per_batch = 12, .budget = budget, .ranks = 4, .seed = 11};
    const fd::EpochBatches e1 = fd::epoch_batches(200, bytes, o, 1);
    CHECK(fd::epoch_batches(200, bytes, o, 1).batches == e1.batches);
    CHECK(fd::epoch_batches(200, bytes, o, 2).batches != e1.batches);
    o.seed = 12;
    CHECK(fd::epoch_batches(200, bytes, o, 1).batches != e1.batches);
  }
}

}  // namespace graph_batch_test
