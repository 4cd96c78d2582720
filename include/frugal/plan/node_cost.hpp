#pragma once
// The arithmetic and memory traffic of one node of a graph, from its op and
// the shapes of its values: what every price of a node starts from (the
// cost model's roofline, the simulator's, the host update's).
#include <vector>

#include "../graph/graph.hpp"

namespace frugal::plan {

inline Cost node_cost(const Graph& g, NodeId n) {
  const Node& node = g.node(n);
  std::vector<TensorMeta> in, out;
  in.reserve(node.inputs.size());
  for (ValueId v : node.inputs) in.push_back(g.value(v).meta);
  for (ValueId v : node.results()) out.push_back(g.value(v).meta);
  return node.op->cost(in, out);
}

}  // namespace frugal::plan
