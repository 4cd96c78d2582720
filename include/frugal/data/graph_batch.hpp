#pragma once
// Datasets of many small graphs (molecules, particle-track events) and their
// batching into one block-diagonal graph, as PyTorch Geometric's
// Batch.from_data_list: the graphs' nodes are stacked, each edge's node ids
// are offset by the nodes of the graphs before it, and a per-node graph index
// says which graph a row came from. No edge crosses graphs, so a GNN over the
// batch computes, row for row, what it computes on each graph alone.
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "../core/error.hpp"
#include "../core/tensor.hpp"
#include "graph.hpp"

namespace frugal::data {

// One graph: node features, a directed edge list (an undirected graph lists
// both directions), and what the task needs of edge features and labels.
struct GraphSample {
  Tensor x;                           // [nodes, f], f32 or f64
  std::vector<std::int64_t> src, dst; // [edges], node ids in [0, nodes)
  Tensor edge_attr;                   // [edges, fe], x's dtype (optional)
  Tensor edge_label;                  // [edges], i32 (optional: edge classification)
  std::int32_t graph_label = -1;      // the class of the whole graph (optional: -1 for none)

  std::int64_t nodes() const { return x.defined() ? x.shape()[0] : 0; }
  std::int64_t edges() const { return std::int64_t(src.size()); }

  // Throws a DataError naming the first inconsistency.
  void validate(const std::string& what = "graph") const {
    if (!x.defined() || x.shape().rank() != 2)
      fail<DataError>(what, ": node features must be a matrix [nodes, features], got ",
                      x.defined() ? x.shape().str() : std::string("none"));
    if (x.dtype() != DType::f32 && x.dtype() != DType::f64)
      fail<DataError>(what, ": node features must be f32 or f64, got ", dtype_name(x.dtype()));
    if (src.size() != dst.size())
      fail<DataError>(what, ": ", src.size(), " source ids but ", dst.size(), " destination ids");
    for (std::size_t k = 0; k < src.size(); ++k)
      if (src[k] < 0 || src[k] >= nodes() || dst[k] < 0 || dst[k] >= nodes())
        fail<DataError>(what, ": edge ", k, " (", src[k], " -> ", dst[k], ") has a node id outside [0, ", nodes(),
                        ")");
    if (edge_attr.defined() &&
        (edge_attr.shape().rank() != 2 || edge_attr.shape()[0] != edges() || edge_attr.dtype() != x.dtype()))
      fail<DataError>(what, ": edge features ", edge_attr.shape().str(), " ", dtype_name(edge_attr.dtype()),
                      " must be [", edges(), ", fe] of the node features' dtype ", dtype_name(x.dtype()));
    if (edge_label.defined() && (edge_label.shape() != Shape{edges()} || edge_label.dtype() != DType::i32))
      fail<DataError>(what, ": edge labels ", edge_label.shape().str(), " ", dtype_name(edge_label.dtype()),
                      " must be i32 [", edges(), "], one per edge");
  }
};

// Graphs batched into one: a block-diagonal graph of nodes() nodes.
struct GraphBatch {
  std::vector<std::int64_t> graphs;      // [G] the dataset index of each graph, in batch order
  Tensor x;                              // [N, f] the graphs' node features, stacked
  std::vector<std::int64_t> src, dst;    // [E] edges with node ids offset into the batch
  Csr adjacency;                         // [N, N] entry (src, dst) = 1 for every edge (duplicates kept)
  Tensor edge_attr;                      // [E, fe] (when the graphs have edge features)
  Tensor edge_label;                     // [E] i32 (when the graphs have edge labels)
  Tensor graph_label;                    // [G] i32 (when the graphs have graph labels)
  std::vector<std::int64_t> node_graph;  // [N] which graph (0..G-1) each node belongs to (PyG's `batch`)
  std::vector<std::int64_t> node_ptr;    // [G + 1] graph g's nodes are node_ptr[g]..node_ptr[g+1]
  std::vector<std::int64_t> edge_ptr;    // [G + 1] graph g's edges are edge_ptr[g]..edge_ptr[g+1]

  std::int64_t nodes() const { return node_ptr.back(); }
  std::int64_t edges() const { return edge_ptr.back(); }
};

namespace graph_batch_detail {

// Rows of `part` copied into `whole` from row `at` on (both of one dtype and
// row width, checked by the caller).
inline void copy_rows(Tensor& whole, std::int64_t at, const Tensor& part) {
  if (part.numel() == 0) return;
  const std::size_t row = part.nbytes() / std::size_t(part.shape()[0]);
  std::memcpy(static_cast<char*>(whole.raw()) + std::size_t(at) * row, part.raw(), part.nbytes());
}

}  // namespace graph_batch_detail

// The graphs samples[indices[0]], samples[indices[1]], ... as one batch. Every
// graph must have the same feature widths and dtype and the same optional
// parts (all with edge features or none, ...); a DataError names the first
// graph that differs from the first one and what differs.
inline GraphBatch batch_graphs(std::span<const GraphSample> samples, std::span<const std::int64_t> indices) {
  if (indices.empty()) fail<DataError>("batch_graphs: no graphs to batch (indices is empty)");
  for (std::size_t i = 0; i < indices.size(); ++i)
    if (indices[i] < 0 || indices[i] >= std::int64_t(samples.size()))
      fail<DataError>("batch_graphs: index ", indices[i], " (position ", i, ") is outside the ", samples.size(),
                      " graphs");
  auto name = [&](std::size_t i) { return cat("batch_graphs: graph ", indices[i]); };
  const GraphSample& first = samples[std::size_t(indices[0])];
  first.validate(name(0));
  const bool has_attr = first.edge_attr.defined(), has_elabel = first.edge_label.defined(),
             has_glabel = first.graph_label >= 0;
  GraphBatch b;
  b.node_ptr = {0};
  b.edge_ptr = {0};
  for (std::size_t i = 0; i < indices.size(); ++i) {
    const GraphSample& g = samples[std::size_t(indices[i])];
    if (i > 0) g.validate(name(i));
    if (g.x.shape()[1] != first.x.shape()[1] || g.x.dtype() != first.x.dtype())
      fail<DataError>(name(i), ": node features are [", g.nodes(), ", ", g.x.shape()[1], "] ",
                      dtype_name(g.x.dtype()), " but graph ", indices[0], "'s are [", first.nodes(), ", ",
                      first.x.shape()[1], "] ", dtype_name(first.x.dtype()), "; every graph of a batch needs the same width and dtype");
    if (g.edge_attr.defined() != has_attr || (has_attr && g.edge_attr.shape()[1] != first.edge_attr.shape()[1]))
      fail<DataError>(name(i), ": edge features ", g.edge_attr.defined() ? g.edge_attr.shape().str() : "none",
                      " differ from graph ", indices[0], "'s ",
                      has_attr ? first.edge_attr.shape().str() : "none", " (all graphs have them, of one width, or none)");
    if (g.edge_label.defined() != has_elabel)
      fail<DataError>(name(i), ": has ", g.edge_label.defined() ? "" : "no ", "edge labels but graph ", indices[0],
                      has_elabel ? " has" : " has none", " (all graphs have them or none)");
    if ((g.graph_label >= 0) != has_glabel)
      fail<DataError>(name(i), ": graph label ", g.graph_label, " but graph ", indices[0], "'s is ",
                      first.graph_label, " (all graphs have one, >= 0, or none has)");
    b.node_ptr.push_back(b.node_ptr.back() + g.nodes());
    b.edge_ptr.push_back(b.edge_ptr.back() + g.edges());
  }
  const std::int64_t N = b.nodes(), E = b.edges(), G = std::int64_t(indices.size());
  b.graphs.assign(indices.begin(), indices.end());
  b.x = Tensor({N, first.x.shape()[1]}, first.x.dtype());
  if (has_attr) b.edge_attr = Tensor({E, first.edge_attr.shape()[1]}, first.x.dtype());
  if (has_elabel) b.edge_label = Tensor({E}, DType::i32);
  if (has_glabel) b.graph_label = Tensor({G}, DType::i32);
  b.src.reserve(std::size_t(E));
  b.dst.reserve(std::size_t(E));
  b.node_graph.reserve(std::size_t(N));
  for (std::int64_t i = 0; i < G; ++i) {
    const GraphSample& g = samples[std::size_t(indices[std::size_t(i)])];
    const std::int64_t offset = b.node_ptr[std::size_t(i)];
    graph_batch_detail::copy_rows(b.x, offset, g.x);
    if (has_attr) graph_batch_detail::copy_rows(b.edge_attr, b.edge_ptr[std::size_t(i)], g.edge_attr);
    if (has_elabel) graph_batch_detail::copy_rows(b.edge_label, b.edge_ptr[std::size_t(i)], g.edge_label);
    if (has_glabel) b.graph_label.data<std::int32_t>()[i] = g.graph_label;
    for (std::int64_t k = 0; k < g.edges(); ++k) {
      b.src.push_back(g.src[std::size_t(k)] + offset);
      b.dst.push_back(g.dst[std::size_t(k)] + offset);
    }
    b.node_graph.insert(b.node_graph.end(), std::size_t(g.nodes()), i);
  }
  b.adjacency = from_edges(N, N, b.src, b.dst);
  return b;
}

inline GraphBatch batch_graphs(const std::vector<GraphSample>& samples, const std::vector<std::int64_t>& indices) {
  return batch_graphs(std::span<const GraphSample>(samples), std::span<const std::int64_t>(indices));
}

}  // namespace frugal::data
