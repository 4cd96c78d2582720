#pragma once
// Neighbour sampling for minibatch GNN training (GraphSAGE; PyG's
// NeighborLoader, DGL's MultiLayerNeighborSampler): from a batch of seed
// nodes, each layer's destination nodes draw up to `fanout` of their
// neighbours without replacement, and the union becomes the next layer's
// source nodes. The destination nodes always lead the source nodes, so a
// layer's x_dst is the first n_dst rows of its x_src (nn::SAGEConv's
// bipartite forward).
//
// Reproducible: the draw depends only on (graph, seeds, fanouts, seed).
#include <algorithm>
#include <span>
#include <unordered_map>
#include <vector>

#include "../core/rng.hpp"
#include "graph.hpp"

namespace frugal::data {

struct SampledSubgraph {
  // Global ids of the first layer's source nodes; the seeds first, then
  // each layer's newly reached nodes.
  std::vector<std::int64_t> nodes;
  // One block per layer, the input layer first: blocks[l] is the mean
  // aggregation matrix [n_dst, n_src] (row-normalised over the sampled
  // edges) of layer l, whose sources are nodes[0 : n_src] and destinations
  // nodes[0 : n_dst]; the last block's destinations are the seeds.
  std::vector<Csr> blocks;
};

// graph: row i lists the nodes i aggregates from. fanouts: one per layer,
// the input layer first (as PyG's num_neighbors); a negative fanout takes
// every neighbour.
inline SampledSubgraph sample_neighbors(const Csr& graph, std::span<const std::int64_t> seeds,
                                        std::span<const std::int64_t> fanouts, std::uint64_t seed) {
  graph.validate("sample_neighbors");
  if (graph.rows != graph.cols)
    fail<DataError>("sample_neighbors: the graph must be square, got [", graph.rows, ", ", graph.cols, "]");
  SampledSubgraph s;
  std::unordered_map<std::int64_t, std::int64_t> local;  // global id -> position in s.nodes
  for (std::int64_t g : seeds) {
    if (g < 0 || g >= graph.rows) fail<DataError>("sample_neighbors: seed ", g, " is outside [0, ", graph.rows, ")");
    if (!local.emplace(g, std::int64_t(s.nodes.size())).second)
      fail<DataError>("sample_neighbors: seed ", g, " appears twice");
    s.nodes.push_back(g);
  }
  Rng rng(seed, 0x5a3e0000u);
  std::vector<Csr> outer_first;
  std::vector<std::int64_t> pool;
  for (std::size_t layer = fanouts.size(); layer-- > 0;) {
    const std::int64_t n_dst = std::int64_t(s.nodes.size());
    std::vector<std::int64_t> rows, cols;
    for (std::int64_t i = 0; i < n_dst; ++i) {
      const std::int64_t g = s.nodes[std::size_t(i)];
      pool.assign(graph.col.begin() + graph.row_ptr[std::size_t(g)], graph.col.begin() + graph.row_ptr[std::size_t(g + 1)]);
      std::int64_t take = std::int64_t(pool.size());
      if (fanouts[layer] >= 0) take = std::min(take, fanouts[layer]);
      for (std::int64_t k = 0; k < take; ++k) {  // a partial Fisher-Yates shuffle
        std::swap(pool[std::size_t(k)], pool[std::size_t(k) + rng.below(pool.size() - std::size_t(k))]);
        auto [it, fresh] = local.emplace(pool[std::size_t(k)], std::int64_t(s.nodes.size()));
        if (fresh) s.nodes.push_back(pool[std::size_t(k)]);
        rows.push_back(i);
        cols.push_back(it->second);
      }
    }
    outer_first.push_back(row_normalize(from_edges(n_dst, std::int64_t(s.nodes.size()), rows, cols)));
  }
  s.blocks.assign(outer_first.rbegin(), outer_first.rend());
  return s;
}

}  // namespace frugal::data
