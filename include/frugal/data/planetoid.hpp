#pragma once
// Citation graphs in the Planetoid split (Cora as Kipf and Welling's GCN
// uses it), read from two TSV files:
//   nodes.tsv  node_id <TAB> label <TAB> train|val|test|none <TAB> feature indices (space separated)
//   edges.tsv  src <TAB> dst   (each undirected edge once)
// Features are binary bag-of-words; they come back row-normalised (each row
// sums to 1), as the GCN paper's preprocessing does.
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "../core/error.hpp"
#include "../core/tensor.hpp"
#include "graph.hpp"

namespace frugal::data {

struct NodeClassification {
  Tensor features;  // f32 [nodes, features], rows summing to 1 (or all zero)
  Tensor labels;    // i32 [nodes]
  std::vector<std::int64_t> train, val, test;
  Csr adjacency;  // symmetric 0/1, no self loops
  std::int64_t classes = 0;
  std::int64_t nodes() const { return labels.numel(); }
};

namespace planetoid_detail {
[[noreturn]] inline void bad_line(const std::filesystem::path& p, std::int64_t line, const std::string& why) {
  fail<DataError>(p.string(), ":", line, ": ", why);
}
inline std::int64_t to_int(const std::filesystem::path& p, std::int64_t line, const std::string& s,
                           const char* what) {
  std::size_t pos = 0;
  long long v = 0;
  try {
    v = std::stoll(s, &pos);
  } catch (...) {
    pos = 0;
  }
  if (s.empty() || pos != s.size()) bad_line(p, line, std::string(what) + " '" + s + "' is not an integer");
  return v;
}
}  // namespace planetoid_detail

inline NodeClassification load_planetoid(const std::filesystem::path& dir) {
  using planetoid_detail::bad_line;
  using planetoid_detail::to_int;
  const auto nodes_path = dir / "nodes.tsv", edges_path = dir / "edges.tsv";
  std::ifstream nf(nodes_path);
  if (!nf) fail<DataError>("cannot open ", nodes_path.string());
  struct Row {
    std::int64_t label;
    std::vector<std::int64_t> feats;
  };
  std::vector<Row> rows;
  NodeClassification d;
  std::int64_t max_feature = -1, line_no = 0;
  std::string line;
  while (std::getline(nf, line)) {
    ++line_no;
    if (line.empty()) continue;
    std::vector<std::string> col;
    std::stringstream ss(line);
    for (std::string c; std::getline(ss, c, '\t');) col.push_back(c);
    if (col.size() != 4) bad_line(nodes_path, line_no, "expected 4 tab-separated columns, found " + std::to_string(col.size()));
    std::int64_t id = to_int(nodes_path, line_no, col[0], "node id");
    if (id != std::int64_t(rows.size()))
      bad_line(nodes_path, line_no, "node ids must run 0, 1, 2, ... in order; expected " + std::to_string(rows.size()));
    Row r{to_int(nodes_path, line_no, col[1], "label"), {}};
    if (r.label < 0) bad_line(nodes_path, line_no, "negative label");
    if (col[2] == "train") d.train.push_back(id);
    else if (col[2] == "val") d.val.push_back(id);
    else if (col[2] == "test") d.test.push_back(id);
    else if (col[2] != "none") bad_line(nodes_path, line_no, "split '" + col[2] + "' is not train, val, test or none");
    std::stringstream fs(col[3]);
    for (std::string f; fs >> f;) {
      r.feats.push_back(to_int(nodes_path, line_no, f, "feature index"));
      if (r.feats.back() < 0) bad_line(nodes_path, line_no, "negative feature index");
      max_feature = std::max(max_feature, r.feats.back());
    }
    d.classes = std::max(d.classes, r.label + 1);
    rows.push_back(std::move(r));
  }
  if (rows.empty()) fail<DataError>(nodes_path.string(), ": no nodes");
  if (d.train.empty() || d.test.empty()) fail<DataError>(nodes_path.string(), ": no train or no test nodes");
  const std::int64_t n = std::int64_t(rows.size()), f = max_feature + 1;
  d.features = Tensor({n, std::max<std::int64_t>(f, 1)}, DType::f32);
  d.labels = Tensor({n}, DType::i32);
  float* x = d.features.data<float>();
  for (std::int64_t i = 0; i < n; ++i) {
    d.labels.data<std::int32_t>()[i] = std::int32_t(rows[std::size_t(i)].label);
    const auto& fe = rows[std::size_t(i)].feats;
    for (std::int64_t j : fe) x[i * f + j] = 1.0f / float(fe.size());
  }

  std::ifstream ef(edges_path);
  if (!ef) fail<DataError>("cannot open ", edges_path.string());
  std::vector<std::int64_t> src, dst;
  line_no = 0;
  while (std::getline(ef, line)) {
    ++line_no;
    if (line.empty()) continue;
    auto tab = line.find('\t');
    if (tab == std::string::npos) bad_line(edges_path, line_no, "expected 'src<TAB>dst'");
    std::int64_t a = to_int(edges_path, line_no, line.substr(0, tab), "source node");
    std::int64_t b = to_int(edges_path, line_no, line.substr(tab + 1), "destination node");
    if (a < 0 || a >= n || b < 0 || b >= n)
      bad_line(edges_path, line_no, "node " + std::to_string(a < 0 || a >= n ? a : b) + " is not one of the " +
                                        std::to_string(n) + " nodes in nodes.tsv");
    src.push_back(a);
    dst.push_back(b);
  }
  d.adjacency = symmetrize(from_edges(n, n, src, dst));
  return d;
}

}  // namespace frugal::data
