#pragma once
// Graph neural network layers over a sparse adjacency (ops/spmm.hpp):
// GCNConv and SAGEConv with PyTorch Geometric's parameter names and
// initialisation, and the two-layer GCN of the PyTorch benchmark peer.
//
// A layer takes the node features x [nodes, in] and the propagation matrix
// as a SparseVar (or a SparseMatrix, bound on use). The matrix carries the
// normalisation: data::gcn_normalize for GCNConv, data::row_normalize (the
// mean over neighbours) for SAGEConv.
#include <cmath>

#include "../ops/binary.hpp"
#include "../ops/indexing.hpp"
#include "../ops/spmm.hpp"
#include "../ops/unary.hpp"
#include "linear.hpp"

namespace frugal::nn {

namespace gnn_detail {

// Glorot (Xavier) uniform, as PyTorch Geometric's glorot(): U(-b, b) with
// b = sqrt(6 / (fan_in + fan_out)) for a weight [out, in].
inline void glorot_uniform(Tensor& weight) {
  const double fan_out = double(weight.shape()[0]), fan_in = double(weight.shape()[1]);
  const double bound = std::sqrt(6.0 / (fan_in + fan_out));
  uniform_(weight, -bound, bound);
}

// A · (x Wᵀ) or (A · x) Wᵀ, whichever multiplies A by fewer features (they are
// equal: A acts on rows, W on columns). No bias.
inline Var propagate_linear(const SparseVar& adj, Var x, Var weight) {
  if (weight.dim(0) <= weight.dim(1)) return spmm(adj, linear(x, weight));
  return linear(spmm(adj, x), weight);
}

inline Var parameter(const Module& owner, const Tensor& t, const std::string& name) {
  std::string q = owner.qualified_name();
  return persistent_var(t, ValueKind::parameter, q.empty() ? name : q + "." + name);
}

}  // namespace gnn_detail

struct GraphConvOptions {
  bool bias = true;
  DType dtype = DType::f32;
};

// GCNConv (Kipf and Welling): out = Â (x Wᵀ) + b with Â the normalised
// adjacency D^-1/2 (A + I) D^-1/2 (data::gcn_normalize). Parameters
// "lin.weight" [out, in] (Glorot uniform) and "bias" [out] (zeros), as in
// PyTorch Geometric.
class GCNConv : public Module {
 public:
  ~GCNConv() override;
  GCNConv(std::int64_t in_features, std::int64_t out_features, GraphConvOptions o = {})
      : lin(in_features, out_features, {.bias = false, .dtype = o.dtype}) {
    register_module("lin", lin);
    gnn_detail::glorot_uniform(lin.weight);
    if (o.bias) bias = register_parameter("bias", Tensor({out_features}, o.dtype));
  }
  Var forward(Var x, const SparseVar& adj) {
    check(x, adj);
    Var y = gnn_detail::propagate_linear(adj, x, gnn_detail::parameter(lin, lin.weight, "weight"));
    return bias.defined() ? y + var(bias) : y;
  }
  Var forward(Var x, const SparseMatrix& adj) { return forward(x, adj.var()); }
  Var operator()(Var x, const SparseVar& adj) { return forward(x, adj); }
  Var operator()(Var x, const SparseMatrix& adj) { return forward(x, adj.var()); }

  Linear lin;
  Tensor bias;

 private:
  void check(Var x, const SparseVar& adj) const {
    if (x.rank() != 2 || x.dim(1) != lin.in_features() || adj.cols != x.dim(0))
      fail<ShapeError>("GCNConv(", lin.in_features(), ", ", lin.out_features(), "): node features ", x.meta().str(),
                       " must be [nodes, ", lin.in_features(), "] with nodes = the adjacency's ", adj.cols,
                       " columns");
  }
};

// SAGEConv with mean aggregation (Hamilton et al.), PyTorch Geometric's form:
// out = lin_l(mean_{j ∈ N(i)} x_j) + lin_r(x_i), where the mean is the
// row-normalised adjacency (data::row_normalize) applied to x. "lin_l" has a
// bias, "lin_r" none; both start as PyTorch's Linear does.
//
// Bipartite graphs (a sampled minibatch's block, as PyG's NeighborLoader and
// DGL's samplers make): the aggregation matrix is [n_dst, n_src], the
// neighbour features x_src [n_src, in] and the root features x_dst
// [n_dst, in] (PyG's forward((x_src, x_dst), edge_index)):
// out [n_dst, out] = lin_l(A x_src) + lin_r(x_dst). forward(x, adj) with a
// non-square adj takes x_dst = the first n_dst rows of x, the convention of
// those samplers (the destination nodes lead the source nodes).
class SAGEConv : public Module {
 public:
  ~SAGEConv() override;
  SAGEConv(std::int64_t in_features, std::int64_t out_features, GraphConvOptions o = {})
      : lin_l(in_features, out_features, {.bias = o.bias, .dtype = o.dtype}),
        lin_r(in_features, out_features, {.bias = false, .dtype = o.dtype}) {
    register_module("lin_l", lin_l);
    register_module("lin_r", lin_r);
  }
  Var forward(Var x, const SparseVar& mean_adj) {
    check("node features", x, mean_adj.cols, "the aggregation matrix's columns", mean_adj);
    if (mean_adj.rows > mean_adj.cols)
      fail<ShapeError>("SAGEConv(", lin_l.in_features(), ", ", lin_l.out_features(), "): the aggregation matrix [",
                       mean_adj.rows, ", ", mean_adj.cols,
                       "] has more destination rows than source nodes; pass x_dst explicitly");
    return forward(x, mean_adj.rows == mean_adj.cols ? x : slice(x, 0, 0, mean_adj.rows), mean_adj);
  }
  Var forward(Var x_src, Var x_dst, const SparseVar& mean_adj) {
    check("source features x_src", x_src, mean_adj.cols, "the aggregation matrix's columns", mean_adj);
    check("destination features x_dst", x_dst, mean_adj.rows, "the aggregation matrix's rows", mean_adj);
    Var neigh = gnn_detail::propagate_linear(mean_adj, x_src, gnn_detail::parameter(lin_l, lin_l.weight, "weight"));
    if (lin_l.bias.defined()) neigh = neigh + gnn_detail::parameter(lin_l, lin_l.bias, "bias");
    return neigh + lin_r(x_dst);
  }
  Var forward(Var x, const SparseMatrix& mean_adj) { return forward(x, mean_adj.var()); }
  Var forward(Var x_src, Var x_dst, const SparseMatrix& mean_adj) { return forward(x_src, x_dst, mean_adj.var()); }
  Var operator()(Var x, const SparseVar& adj) { return forward(x, adj); }
  Var operator()(Var x, const SparseMatrix& adj) { return forward(x, adj.var()); }
  Var operator()(Var x_src, Var x_dst, const SparseVar& adj) { return forward(x_src, x_dst, adj); }
  Var operator()(Var x_src, Var x_dst, const SparseMatrix& adj) { return forward(x_src, x_dst, adj.var()); }

  Linear lin_l, lin_r;

 private:
  void check(const char* what, Var x, std::int64_t nodes, const char* whose, const SparseVar& adj) const {
    if (x.rank() != 2 || x.dim(1) != lin_l.in_features() || x.dim(0) != nodes)
      fail<ShapeError>("SAGEConv(", lin_l.in_features(), ", ", lin_l.out_features(), "): ", what, " ",
                       x.meta().str(), " must be [", nodes, ", ", lin_l.in_features(), "] (", nodes, " = ", whose,
                       ", of the [", adj.rows, ", ", adj.cols, "] aggregation matrix)");
  }
};

// The two-layer GCN of the PyTorch peer (torch_bench.py):
// out = Â lin2(relu(Â lin1(x))), where lin1 and lin2 are ordinary Linear
// layers (PyTorch's default init, bias inside the Linear, so the bias is
// propagated too). Parameters "lin1.weight", "lin1.bias", "lin2.weight",
// "lin2.bias".
class Gcn : public Module {
 public:
  ~Gcn() override;
  Gcn(std::int64_t in_features, std::int64_t hidden, std::int64_t classes, DType dtype = DType::f32)
      : lin1(in_features, hidden, {.dtype = dtype}), lin2(hidden, classes, {.dtype = dtype}) {
    register_module("lin1", lin1);
    register_module("lin2", lin2);
  }
  Var forward(Var x, const SparseVar& adj) {
    Var h = relu(spmm(adj, lin1(x)));
    return spmm(adj, lin2(h));
  }
  Var forward(Var x, const SparseMatrix& adj) { return forward(x, adj.var()); }
  Var operator()(Var x, const SparseVar& adj) { return forward(x, adj); }
  Var operator()(Var x, const SparseMatrix& adj) { return forward(x, adj.var()); }

  Linear lin1, lin2;
};

}  // namespace frugal::nn
