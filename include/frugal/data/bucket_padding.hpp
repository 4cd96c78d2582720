#pragma once
// A batch of graphs padded up to a size bucket, so that batches of many
// different sizes run through few compiled steps (runtime/shape_cache.hpp
// compiles one step per input shape): node and edge counts are each rounded
// up to the next of the geometric series base, ceil(base * ratio), ... (64,
// 77, 92, ... for ratio 1.19), and every batch of a bucket has its shape.
// A bucket's step needs at most about `ratio` times the bytes of the
// largest batch in it, per dimension.
//
// The padding, for a batch of N nodes and E edges padded to N' =
// bucket(N + 1) nodes and E' = bucket(E) edges:
//   - nodes N .. N'-1 are padding nodes with zero features; there is at
//     least one (N' > N), since the padded edges need an end that is not a
//     real node;
//   - edges E .. E'-1 all run from padding node N to padding node N, with
//     zero edge features and label -100.
// Why the real rows' outputs, the loss and the gradients do not change
// (for message passing that gathers node rows by src/dst, sums edge rows
// into dst with index_add, and a loss that skips label -100 as nll_loss's
// ignore_index does; nn::EdgeClassifier is such a model):
//   - no padded edge touches a real node, so gathers for real edges read
//     only real rows, and the sum into a real node adds only real edges'
//     messages; padding rows change only padding rows;
//   - the loss's mean skips label -100 and divides by the real edges only,
//     so padded edges add nothing to it, and their logits' gradient is 0;
//     every gradient that flows into padding rows is then 0, and 0 adds
//     nothing to the parameter gradients (up to the order of summation,
//     which a kernel may change with the shape: equal to rounding).
// A model that mixes rows across the batch (batch norm over nodes, a mean
// over all edges, attention over the whole batch) is not covered.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "../core/error.hpp"
#include "../core/tensor.hpp"
#include "../ops/collective.hpp"
#include "graph_batch.hpp"

namespace frugal::data {

// The sizes of the buckets: base, then each the last times ratio, rounded up.
struct BucketRule {
  std::int64_t base = 64;
  double ratio = 1.19;

  // The least bucket size >= n.
  std::int64_t bucket(std::int64_t n) const {
    if (base < 1 || !(ratio > 1))
      fail<DataError>("BucketRule: needs base >= 1 and ratio > 1, got base ", base, ", ratio ", ratio);
    double b = double(base);
    while (b < double(n)) b = std::ceil(b * ratio);
    return std::int64_t(b);
  }
};

// The step inputs of one padded batch: x [N', f], src and dst [E'] (i32),
// edge_attr [E', fe] (when the batch has edge features), edge_label [E']
// i32 (when it has labels; -100 on padded edges).
struct PaddedBatch {
  Tensor x, src, dst, edge_attr, edge_label;
  std::int64_t nodes = 0, edges = 0;  // real ones: rows 0..nodes-1 and 0..edges-1 are the batch's own

  // {x, src, dst, edge_attr, edge_label}, leaving out the ones not defined.
  std::vector<Tensor> inputs() const {
    std::vector<Tensor> v{x, src, dst};
    if (edge_attr.defined()) v.push_back(edge_attr);
    if (edge_label.defined()) v.push_back(edge_label);
    return v;
  }
};

namespace bucket_padding_detail {

// `t`'s rows followed by zero rows, `rows` in all.
inline Tensor pad_rows(const Tensor& t, std::int64_t rows) {
  std::vector<std::int64_t> dims = t.shape().dims();
  dims[0] = rows;
  Tensor out(Shape(dims), t.dtype());
  std::memset(out.raw(), 0, out.nbytes());
  if (t.numel() > 0) std::memcpy(out.raw(), t.raw(), t.nbytes());
  return out;
}

}  // namespace bucket_padding_detail

// `b` padded to `nodes` nodes and `edges` edges (see the header comment):
// at least one padding node (nodes > b.nodes()) and edges >= b.edges().
inline PaddedBatch pad_to_size(const GraphBatch& b, std::int64_t nodes, std::int64_t edges) {
  namespace bp = bucket_padding_detail;
  const std::int64_t N = b.nodes(), E = b.edges();
  if (!b.x.defined() || b.x.shape().rank() != 2 || b.x.shape()[0] != N)
    fail<DataError>("pad_to_size: the batch's node features must be [", N, ", f]");
  if (nodes <= N || edges < E)
    fail<DataError>("pad_to_size: a batch of ", N, " nodes and ", E, " edges cannot be padded to ", nodes, " nodes and ",
                    edges, " edges (it needs more than ", N, " nodes, for a padding node, and at least ", E, " edges)");
  const std::int64_t Np = nodes, Ep = edges;
  if (Np > std::numeric_limits<std::int32_t>::max())
    fail<DataError>("pad_to_size: ", Np, " padded nodes do not fit the i32 node ids");
  PaddedBatch p;
  p.nodes = N;
  p.edges = E;
  p.x = bp::pad_rows(b.x, Np);
  const auto pad = static_cast<std::int32_t>(N);  // the first padding node
  std::vector<std::int32_t> src(static_cast<std::size_t>(Ep), pad), dst(static_cast<std::size_t>(Ep), pad);
  for (std::int64_t k = 0; k < E; ++k) {
    src[std::size_t(k)] = std::int32_t(b.src[std::size_t(k)]);
    dst[std::size_t(k)] = std::int32_t(b.dst[std::size_t(k)]);
  }
  p.src = Tensor::from(src, {Ep});
  p.dst = Tensor::from(dst, {Ep});
  if (b.edge_attr.defined()) p.edge_attr = bp::pad_rows(b.edge_attr, Ep);
  if (b.edge_label.defined()) {
    std::vector<std::int32_t> label(static_cast<std::size_t>(Ep), -100);
    std::memcpy(label.data(), b.edge_label.raw(), std::size_t(E) * sizeof(std::int32_t));
    p.edge_label = Tensor::from(label, {Ep});
  }
  return p;
}

// `b` padded to the bucket of its node and edge counts.
inline PaddedBatch pad_to_bucket(const GraphBatch& b, const BucketRule& rule = {}) {
  return pad_to_size(b, rule.bucket(b.nodes() + 1), rule.bucket(b.edges()));
}

// Data parallelism: every rank pads its batch of the step to the largest of
// the ranks' buckets, node and edge counts each, so that all ranks run one
// compiled step (a ShapeCache with a communicator plans a shape on every
// rank at once, and checks they agree) and their collectives match. A
// collective itself: every rank calls it at every step.
inline PaddedBatch pad_to_common_bucket(const GraphBatch& b, Communicator& comm, const BucketRule& rule = {}) {
  const double mine[2] = {double(rule.bucket(b.nodes() + 1)), double(rule.bucket(b.edges()))};
  std::vector<double> all(2 * std::size_t(comm.size()));
  comm.all_gather(mine, all.data(), 2, DType::f64, "pad_to_common_bucket: the ranks' batch shapes");
  double nodes = 0, edges = 0;
  for (int r = 0; r < comm.size(); ++r) {
    nodes = std::max(nodes, all[2 * std::size_t(r)]);
    edges = std::max(edges, all[2 * std::size_t(r) + 1]);
  }
  return pad_to_size(b, std::int64_t(nodes), std::int64_t(edges));
}

}  // namespace frugal::data
