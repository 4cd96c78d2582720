#pragma once
// A synthetic node-classification graph at any size: a Chung-Lu random graph
// (power-law expected degrees) with planted communities, the degree-corrected
// stochastic block model's simplest form. It makes a 2-million-node graph in
// about 15 s on one core of the project's VM, for measuring what vertex
// orderings (reorder.hpp) and sampling do at a scale no bundled data set
// has, with a task a GNN can learn.
//
// The model, all draws from one seed:
//   - node i gets a community c(i), uniform over `communities`, a block b(i)
//     uniform over its community's blocks (small clusters nested in the
//     community, about block_size nodes each), and a weight
//     w(i) = (1 - u)^(-1 / (exponent - 1)), u uniform in [0, 1) (a Pareto law:
//     P(w >= x) = x^-(exponent - 1) for x >= 1);
//   - nodes * mean_degree / 2 edges are drawn: the first end with probability
//     proportional to w; the second, proportional to w, among the first end's
//     block with probability block_fraction, among all nodes with probability
//     mixing, else among the first end's community. So the expected degree of
//     i is about mean_degree * w(i) / mean(w), and the degrees follow a power
//     law with P(degree = k) ~ k^-exponent. The blocks are the local
//     structure real graphs have (and orderings can find); the communities
//     are the task;
//   - self loops are dropped, duplicates merged, both directions kept: a
//     symmetric 0/1 adjacency without self loops (the mean degree comes out a
//     little under mean_degree, from the merged duplicates among hubs);
//   - features [nodes, features] f32: uniform noise in [-1, 1), plus `signal`
//     in every column k with k % communities == c(i); labels: c(i);
//   - each node is in the train split with probability train_fraction, in
//     validation with val_fraction, else in test.
// Node ids carry no structure (community and weight are drawn per id, in id
// order), as for graphs whose ids are hashes: the generated order is as bad
// for locality as a random one.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <span>
#include <vector>

#include "../core/error.hpp"
#include "../core/rng.hpp"
#include "../core/tensor.hpp"
#include "graph.hpp"
#include "planetoid.hpp"

namespace frugal::data {

struct PowerLawOptions {
  std::int64_t nodes = 2'000'000;
  double mean_degree = 10;        // expected mean degree, before duplicate edges are merged
  double exponent = 2.5;          // degree distribution P(k) ~ k^-exponent; must exceed 2 (finite mean)
  std::int64_t communities = 8;   // planted communities, which are the classes
  std::int64_t block_size = 500;  // nodes per block nested in a community (about; at least 1 block each)
  double block_fraction = 0.5;    // fraction of edges whose second end is in the first end's block
  double mixing = 0.1;            // fraction of edges whose second end is anywhere (ignores the community)
  std::int64_t features = 32;     // feature columns
  double signal = 1.0;            // added to a node's community columns, against noise in [-1, 1)
  double train_fraction = 0.05;   // per node: train with this probability,
  double val_fraction = 0.05;     // validation with this one, else test
  std::uint64_t seed = 0;
};

namespace power_law_detail {

// Vose's alias method: draws i with probability w[i] / sum(w) in O(1), so
// tens of millions of weighted draws take well under a second.
class AliasTable {
 public:
  explicit AliasTable(std::span<const double> w) : prob_(w.size(), 1.0), alias_(w.size()) {
    const std::size_t k = w.size();
    std::iota(alias_.begin(), alias_.end(), std::int64_t(0));
    const double total = std::accumulate(w.begin(), w.end(), 0.0);
    std::vector<double> scaled(k);
    std::vector<std::int64_t> small, large;
    for (std::size_t i = 0; i < k; ++i) {
      scaled[i] = w[i] * double(k) / total;
      (scaled[i] < 1.0 ? small : large).push_back(std::int64_t(i));
    }
    while (!small.empty() && !large.empty()) {
      const std::int64_t s = small.back(), l = large.back();
      small.pop_back();
      prob_[std::size_t(s)] = scaled[std::size_t(s)];
      alias_[std::size_t(s)] = l;
      scaled[std::size_t(l)] -= 1.0 - scaled[std::size_t(s)];
      if (scaled[std::size_t(l)] < 1.0) {
        large.pop_back();
        small.push_back(l);
      }
    }
    // Whatever is left is 1 up to rounding: keeps its own index (prob 1).
  }
  std::int64_t draw(Rng& rng) const {
    const double u = rng.uniform() * double(prob_.size());
    const std::size_t i = std::min(std::size_t(u), prob_.size() - 1);
    return u - double(i) < prob_[i] ? std::int64_t(i) : alias_[i];
  }

 private:
  std::vector<double> prob_;
  std::vector<std::int64_t> alias_;
};

inline void check(const PowerLawOptions& o) {
  auto bad = [](auto... why) { fail<DataError>("power_law_graph: ", why...); };
  if (o.nodes < 1) bad("nodes must be at least 1, got ", o.nodes);
  if (!(o.mean_degree >= 0)) bad("mean_degree must be non-negative, got ", o.mean_degree);
  if (!(o.exponent > 2)) bad("exponent must exceed 2 (else the mean degree is infinite), got ", o.exponent);
  if (o.communities < 1 || o.communities > o.nodes)
    bad("communities must be in [1, nodes = ", o.nodes, "], got ", o.communities);
  if (o.block_size < 1) bad("block_size must be at least 1, got ", o.block_size);
  if (!(o.mixing >= 0 && o.block_fraction >= 0 && o.mixing + o.block_fraction <= 1))
    bad("mixing and block_fraction must be non-negative with a sum of at most 1, got ", o.mixing, " and ",
        o.block_fraction);
  if (o.features < 1) bad("features must be at least 1, got ", o.features);
  if (!(o.train_fraction >= 0 && o.val_fraction >= 0 && o.train_fraction + o.val_fraction <= 1))
    bad("train_fraction and val_fraction must be non-negative with a sum of at most 1, got ", o.train_fraction,
        " and ", o.val_fraction);
}

// Weighted draws among the members of each group (a community, a block).
class GroupDraws {
 public:
  GroupDraws(std::int64_t groups, const std::vector<std::int64_t>& group_of, const std::vector<double>& weight)
      : members_(std::size_t(groups)) {
    for (std::size_t i = 0; i < group_of.size(); ++i) members_[std::size_t(group_of[i])].push_back(std::int64_t(i));
    tables_.reserve(members_.size());
    std::vector<double> w;
    for (const auto& m : members_) {
      w.resize(m.size());
      for (std::size_t k = 0; k < m.size(); ++k) w[k] = weight[std::size_t(m[k])];
      tables_.emplace_back(w);
    }
  }
  // A member of group g (which has at least one: the caller's own node).
  std::int64_t draw(std::int64_t g, Rng& rng) const {
    return members_[std::size_t(g)][std::size_t(tables_[std::size_t(g)].draw(rng))];
  }

 private:
  std::vector<std::vector<std::int64_t>> members_;
  std::vector<AliasTable> tables_;
};

// The symmetric adjacency of the model's edges (see the top of this file).
inline Csr chung_lu_adjacency(const PowerLawOptions& o, const std::vector<std::int64_t>& community,
                              const std::vector<std::int64_t>& block, std::int64_t blocks,
                              const std::vector<double>& weight) {
  const std::int64_t n = o.nodes;
  const AliasTable anywhere(weight);
  const GroupDraws in_community(o.communities, community, weight), in_block(blocks, block, weight);
  const auto edges = std::int64_t(std::llround(double(n) * o.mean_degree / 2));
  std::vector<std::int64_t> src, dst;
  src.reserve(std::size_t(2 * edges));
  dst.reserve(std::size_t(2 * edges));
  Rng rng(o.seed, 0x91c0'0002u);
  for (std::int64_t e = 0; e < edges; ++e) {
    const std::int64_t u = anywhere.draw(rng);
    const double where = rng.uniform();
    const std::int64_t v = where < o.block_fraction            ? in_block.draw(block[std::size_t(u)], rng)
                           : where < o.block_fraction + o.mixing ? anywhere.draw(rng)
                                                                 : in_community.draw(community[std::size_t(u)], rng);
    if (u == v) continue;
    src.push_back(u), dst.push_back(v);
    src.push_back(v), dst.push_back(u);
  }
  return coalesce(from_edges(n, n, src, dst));
}

}  // namespace power_law_detail

inline NodeClassification power_law_graph(const PowerLawOptions& o = {}) {
  power_law_detail::check(o);
  const std::int64_t n = o.nodes, f = o.features;
  // Blocks per community: about block_size nodes each, at least one.
  const std::int64_t per_community = std::max<std::int64_t>(1, n / (o.communities * o.block_size));
  std::vector<std::int64_t> community(static_cast<std::size_t>(n)), block(static_cast<std::size_t>(n));
  std::vector<double> weight(static_cast<std::size_t>(n));
  Rng nodes_rng(o.seed, 0x91c0'0001u);
  for (std::int64_t i = 0; i < n; ++i) {
    const auto c = std::int64_t(nodes_rng.below(std::uint64_t(o.communities)));
    community[std::size_t(i)] = c;
    block[std::size_t(i)] = c * per_community + std::int64_t(nodes_rng.below(std::uint64_t(per_community)));
    weight[std::size_t(i)] = std::pow(1.0 - nodes_rng.uniform(), -1.0 / (o.exponent - 1.0));
  }
  NodeClassification d;
  d.classes = o.communities;
  d.adjacency = power_law_detail::chung_lu_adjacency(o, community, block, o.communities * per_community, weight);
  d.labels = Tensor({n}, DType::i32);
  d.features = Tensor({n, f}, DType::f32);
  Rng feature_rng(o.seed, 0x91c0'0003u), split_rng(o.seed, 0x91c0'0004u);
  float* x = d.features.data<float>();
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t c = community[std::size_t(i)];
    d.labels.data<std::int32_t>()[i] = std::int32_t(c);
    for (std::int64_t k = 0; k < f; ++k)
      x[i * f + k] = float(feature_rng.uniform(-1.0, 1.0) + (k % o.communities == c ? o.signal : 0.0));
    const double u = split_rng.uniform();
    (u < o.train_fraction ? d.train : u < o.train_fraction + o.val_fraction ? d.val : d.test).push_back(i);
  }
  return d;
}

}  // namespace frugal::data
