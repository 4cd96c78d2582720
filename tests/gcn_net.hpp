#pragma once
// The two-layer GCN the graph tests compare runs of: samples/gcn's layers
// without dropout (dropout draws its mask by position, so a permuted or
// batched graph would see other masks), in float64.
#include <frugal/frugal.hpp>

struct TwoLayerGcn : frugal::nn::Module {
  frugal::nn::GCNConv conv1, conv2;
  TwoLayerGcn(std::int64_t in, std::int64_t hidden, std::int64_t out)
      : conv1(in, hidden, {.dtype = frugal::DType::f64}), conv2(hidden, out, {.dtype = frugal::DType::f64}) {
    register_module("conv1", conv1);
    register_module("conv2", conv2);
  }
  frugal::Var forward(frugal::Var x, const frugal::SparseMatrix& adj) {
    return conv2(frugal::relu(conv1(x, adj)), adj);
  }
};
