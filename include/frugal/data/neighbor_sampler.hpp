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
  // Checked as far as the draw reads it: a loader calls this per batch, and
  // validating a graph of millions of edges each time would cost more than
  // the draw (Csr::validate checks it all, once).
  if (graph.rows != graph.cols)
    fail<DataError>("sample_neighbors: the graph must be square, got [", graph.rows, ", ", graph.cols, "]");
  if (std::int64_t(graph.row_ptr.size()) != graph.rows + 1 || graph.row_ptr.back() != graph.nnz())
    fail<DataError>("sample_neighbors: the graph's row_ptr has ", graph.row_ptr.size(), " entries ending at ",
                    graph.row_ptr.empty() ? 0 : graph.row_ptr.back(), "; ", graph.rows, " rows and ", graph.nnz(),
                    " entries need ", graph.rows + 1, " ending at ", graph.nnz());
  SampledSubgraph s;
  std::unordered_map<std::int64_t, std::int64_t> local;  // global id -> position in s.nodes
  {  // room for every node the fanouts can reach, so the map never rehashes while it fills
    double reach = double(seeds.size());
    for (std::int64_t f : fanouts) reach *= f >= 0 ? double(f + 1) : 2.0;
    local.reserve(std::size_t(std::min(reach, double(graph.rows))));
  }
  for (std::int64_t g : seeds) {
    if (g < 0 || g >= graph.rows) fail<DataError>("sample_neighbors: seed ", g, " is outside [0, ", graph.rows, ")");
    if (!local.emplace(g, std::int64_t(s.nodes.size())).second)
      fail<DataError>("sample_neighbors: seed ", g, " appears twice");
    s.nodes.push_back(g);
  }
  Rng rng(seed, 0x5a3e0000u);
  std::vector<Csr> outer_first;
  std::vector<std::int64_t> picked;  // positions within a row, at most fanout of them
  for (std::size_t layer = fanouts.size(); layer-- > 0;) {
    const std::int64_t n_dst = std::int64_t(s.nodes.size());
    std::vector<std::int64_t> rows, cols;
    for (std::int64_t i = 0; i < n_dst; ++i) {
      const std::int64_t g = s.nodes[std::size_t(i)];
      const std::int64_t begin = graph.row_ptr[std::size_t(g)], deg = graph.row_ptr[std::size_t(g + 1)] - begin;
      if (deg < 0 || begin < 0)
        fail<DataError>("sample_neighbors: the graph's row_ptr decreases at row ", g);
      const std::int64_t take = fanouts[layer] >= 0 ? std::min(deg, fanouts[layer]) : deg;
      // take distinct positions of [0, deg): all of them, or Floyd's draw,
      // which costs O(take^2) however large a hub's row is.
      picked.clear();
      if (take == deg) {
        for (std::int64_t k = 0; k < deg; ++k) picked.push_back(k);
      } else {
        for (std::int64_t j = deg - take; j < deg; ++j) {
          const auto t = std::int64_t(rng.below(std::uint64_t(j + 1)));
          picked.push_back(std::find(picked.begin(), picked.end(), t) == picked.end() ? t : j);
        }
      }
      for (std::int64_t k : picked) {
        const std::int64_t nb = graph.col[std::size_t(begin + k)];
        if (nb < 0 || nb >= graph.cols)
          fail<DataError>("sample_neighbors: row ", g, " of the graph names node ", nb, ", outside [0, ", graph.cols, ")");
        auto [it, fresh] = local.emplace(nb, std::int64_t(s.nodes.size()));
        if (fresh) s.nodes.push_back(nb);
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
