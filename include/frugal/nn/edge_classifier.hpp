#pragma once
// An interaction-network-style edge classifier (as Exa.TrkX's, one round of
// message passing) for graphs whose candidate edges are to be labelled, e.g.
// the particle-track events of data/track_graphs.hpp:
//   h  = relu(W_n x)                       node encoder
//   m  = relu(W_e [h_src, h_dst, e])       edge MLP over the candidate edges
//   h' = relu(W_u (h + Σ_{edges into v} m)) messages summed into destinations
//   logits = W_o [h'_src, h'_dst, m]       two classes per edge
// loss() is the mean negative log-likelihood over the edges whose label is
// not -100 (nll_loss's ignore_index), so a batch padded to a bucket shape
// (data/bucket_padding.hpp) with labels -100 on its padded edges has the
// loss of the batch without them.
#include "../ops/indexing.hpp"
#include "../ops/nll_loss.hpp"
#include "../ops/softmax.hpp"
#include "../ops/unary.hpp"
#include "linear.hpp"

namespace frugal::nn {

struct EdgeClassifier : Module {
  Linear node_in, edge_mlp, node_up, edge_out;
  EdgeClassifier(std::int64_t node_features, std::int64_t edge_features, std::int64_t hidden,
                 DType dtype = DType::f32)
      : node_in(node_features, hidden, {.dtype = dtype}),
        edge_mlp(2 * hidden + edge_features, hidden, {.dtype = dtype}),
        node_up(hidden, hidden, {.dtype = dtype}),
        edge_out(2 * hidden + hidden, 2, {.dtype = dtype}) {
    register_module("node_in", node_in);
    register_module("edge_mlp", edge_mlp);
    register_module("node_up", node_up);
    register_module("edge_out", edge_out);
  }
  // x [N, node_features], src and dst [E] node ids (i32 or i64), e [E,
  // edge_features] -> logits [E, 2].
  Var forward(Var x, Var src, Var dst, Var e) {
    Var h = relu(node_in(x));
    Var m = relu(edge_mlp(concat({index_select(h, 0, src), index_select(h, 0, dst), e}, 1)));
    Var h2 = relu(node_up(index_add(h, 0, dst, m)));
    return edge_out(concat({index_select(h2, 0, src), index_select(h2, 0, dst), m}, 1));
  }
  // The mean cross-entropy over the edges labelled 0 or 1; label -100: left out.
  Var loss(Var x, Var src, Var dst, Var e, Var label) {
    return nll_loss(log_softmax(forward(x, src, dst, e), 1), label, "mean", -100);
  }
};

}  // namespace frugal::nn
