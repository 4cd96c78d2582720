#pragma once
// Naive float64 references for the graph ops and builders, from the math
// definitions on dense matrices. Nothing here calls frugal.
#include <cmath>
#include <set>
#include <utility>

#include "reference.hpp"

namespace ref::graph {

// A sparse structure as plain vectors: entry p of row i (row_ptr[i] <= p <
// row_ptr[i+1]) sits at column col[p].
struct Structure {
  std::int64_t rows = 0, cols = 0;
  std::vector<std::int64_t> row_ptr, col;
  std::int64_t nnz() const { return std::int64_t(col.size()); }
};

// The dense matrix [rows, cols] with A[i, col[p]] += values[p] (duplicates add).
inline Array dense(const Structure& s, const std::vector<double>& values) {
  require(std::int64_t(values.size()) == s.nnz(), "dense: one value per entry");
  Array a = zeros({s.rows, s.cols});
  for (std::int64_t i = 0; i < s.rows; ++i)
    for (std::int64_t p = s.row_ptr[std::size_t(i)]; p < s.row_ptr[std::size_t(i + 1)]; ++p)
      a.v[std::size_t(i * s.cols + s.col[std::size_t(p)])] += values[std::size_t(p)];
  return a;
}

inline Array transpose2(const Array& a) {
  std::int64_t n = a.shape[0], m = a.shape[1];
  Array t = zeros({m, n});
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t j = 0; j < m; ++j) t.v[std::size_t(j * n + i)] = a.v[std::size_t(i * m + j)];
  return t;
}

// Y = A · X.
inline Array spmm(const Structure& s, const std::vector<double>& values, const Array& x) {
  return ref::matmul(dense(s, values), x);
}

// dL/dvalues[p] = Σ_k G[i, k] X[col[p], k] for entry p in row i.
inline std::vector<double> spmm_values_grad(const Structure& s, const Array& g, const Array& x) {
  std::int64_t f = x.shape[1];
  std::vector<double> dv(std::size_t(s.nnz()), 0.0);
  for (std::int64_t i = 0; i < s.rows; ++i)
    for (std::int64_t p = s.row_ptr[std::size_t(i)]; p < s.row_ptr[std::size_t(i + 1)]; ++p)
      for (std::int64_t k = 0; k < f; ++k)
        dv[std::size_t(p)] += g.v[std::size_t(i * f + k)] * x.v[std::size_t(s.col[std::size_t(p)] * f + k)];
  return dv;
}

// The GCN matrix of an undirected edge list on n nodes, dense: A[i][j] = 1 for
// every edge in either direction (duplicates count once) and on the diagonal,
// D the row sums, result D^-1/2 A D^-1/2 (a zero degree gives a zero row).
inline Array gcn_dense(std::int64_t n, const std::vector<std::pair<std::int64_t, std::int64_t>>& edges,
                       bool self_loops = true) {
  Array a = zeros({n, n});
  for (auto [s, d] : edges) {
    a.v[std::size_t(s * n + d)] = 1;
    a.v[std::size_t(d * n + s)] = 1;
  }
  if (self_loops)
    for (std::int64_t i = 0; i < n; ++i) a.v[std::size_t(i * n + i)] = 1;
  std::vector<double> deg(std::size_t(n), 0.0);
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t j = 0; j < n; ++j) deg[std::size_t(i)] += a.v[std::size_t(i * n + j)];
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      double di = deg[std::size_t(i)] > 0 ? 1 / std::sqrt(deg[std::size_t(i)]) : 0;
      double dj = deg[std::size_t(j)] > 0 ? 1 / std::sqrt(deg[std::size_t(j)]) : 0;
      a.v[std::size_t(i * n + j)] *= di * dj;
    }
  return a;
}

// Mean aggregation as a dense matrix: row i averages its distinct neighbours
// (directed edges src -> dst put dst in src's row); a node without neighbours
// gets a zero row.
inline Array mean_dense(std::int64_t n, const std::vector<std::pair<std::int64_t, std::int64_t>>& edges) {
  std::vector<std::set<std::int64_t>> nb(static_cast<std::size_t>(n));
  for (auto [s, d] : edges) nb[std::size_t(s)].insert(d);
  Array a = zeros({n, n});
  for (std::int64_t i = 0; i < n; ++i)
    for (auto j : nb[std::size_t(i)]) a.v[std::size_t(i * n + j)] = 1.0 / double(nb[std::size_t(i)].size());
  return a;
}

// y = x Wᵀ + b (b may be empty), x [n, in], W [out, in].
inline Array linear(const Array& x, const Array& w, const std::vector<double>& b) {
  std::int64_t n = x.shape[0], in = x.shape[1], out = w.shape[0];
  Array y = zeros({n, out});
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t o = 0; o < out; ++o) {
      double s = b.empty() ? 0.0 : b[std::size_t(o)];
      for (std::int64_t k = 0; k < in; ++k) s += x.v[std::size_t(i * in + k)] * w.v[std::size_t(o * in + k)];
      y.v[std::size_t(i * out + o)] = s;
    }
  return y;
}

}  // namespace ref::graph
