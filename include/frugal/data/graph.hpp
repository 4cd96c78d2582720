#pragma once
// Graphs on the host: a CSR sparse matrix and the builders a GNN needs (from
// an edge list, symmetrise, self loops, merge duplicates, transpose, degrees,
// GCN and mean normalisation), and the conversion to a SparseMatrix that
// spmm and the nn graph layers read.
//
// Entries within a row are kept sorted by column; every builder returns a
// matrix that passes validate().
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "../core/error.hpp"
#include "../core/rng.hpp"
#include "../core/tensor.hpp"
#include "../ops/spmm.hpp"

namespace frugal::data {

// A sparse matrix [rows, cols] in compressed sparse row form.
struct Csr {
  std::int64_t rows = 0, cols = 0;
  std::vector<std::int64_t> row_ptr{0};  // [rows + 1]
  std::vector<std::int64_t> col;         // [nnz], sorted within each row
  std::vector<double> values;            // [nnz]

  std::int64_t nnz() const { return std::int64_t(col.size()); }

  // Throws a DataError naming the first inconsistency: sizes, a row pointer
  // that does not start at 0, decreases or does not end at nnz, a column
  // outside [0, cols).
  void validate(const std::string& what = "csr") const {
    if (rows < 0 || cols < 0) fail<DataError>(what, ": negative shape [", rows, ", ", cols, "]");
    if (std::int64_t(row_ptr.size()) != rows + 1)
      fail<DataError>(what, ": row_ptr has ", row_ptr.size(), " entries; a matrix with ", rows, " rows needs ",
                      rows + 1);
    if (values.size() != col.size())
      fail<DataError>(what, ": ", col.size(), " column indices but ", values.size(), " values");
    if (row_ptr[0] != 0) fail<DataError>(what, ": row_ptr[0] is ", row_ptr[0], "; it must be 0");
    for (std::int64_t i = 0; i < rows; ++i)
      if (row_ptr[std::size_t(i + 1)] < row_ptr[std::size_t(i)])
        fail<DataError>(what, ": row_ptr decreases at row ", i, " (", row_ptr[std::size_t(i)], " then ",
                        row_ptr[std::size_t(i + 1)], ")");
    if (row_ptr.back() != nnz())
      fail<DataError>(what, ": row_ptr ends at ", row_ptr.back(), " but there are ", nnz(), " entries");
    for (std::int64_t i = 0; i < rows; ++i)
      for (std::int64_t p = row_ptr[std::size_t(i)]; p < row_ptr[std::size_t(i + 1)]; ++p)
        if (col[std::size_t(p)] < 0 || col[std::size_t(p)] >= cols)
          fail<DataError>(what, ": column index ", col[std::size_t(p)], " at entry ", p, " (row ", i,
                          ") is outside [0, ", cols, ")");
  }

  // The dense matrix, row-major (for tests and small examples).
  std::vector<double> dense() const {
    std::vector<double> d(std::size_t(rows * cols), 0.0);
    for (std::int64_t i = 0; i < rows; ++i)
      for (std::int64_t p = row_ptr[std::size_t(i)]; p < row_ptr[std::size_t(i + 1)]; ++p)
        d[std::size_t(i * cols + col[std::size_t(p)])] += values[std::size_t(p)];
    return d;
  }
};

// A CSR matrix from an edge list (COO): entry (src[k], dst[k]) with value
// values[k] (1 when values is empty). Duplicates are kept as separate entries
// (spmm sums them); merge them with coalesce().
inline Csr from_edges(std::int64_t rows, std::int64_t cols, std::span<const std::int64_t> src,
                      std::span<const std::int64_t> dst, std::span<const double> values = {}) {
  if (rows < 0 || cols < 0) fail<DataError>("from_edges: negative shape [", rows, ", ", cols, "]");
  if (src.size() != dst.size())
    fail<DataError>("from_edges: ", src.size(), " source indices but ", dst.size(), " destination indices");
  if (!values.empty() && values.size() != src.size())
    fail<DataError>("from_edges: ", src.size(), " edges but ", values.size(), " values");
  for (std::size_t k = 0; k < src.size(); ++k) {
    if (src[k] < 0 || src[k] >= rows)
      fail<DataError>("from_edges: source index ", src[k], " of edge ", k, " is outside [0, ", rows, ")");
    if (dst[k] < 0 || dst[k] >= cols)
      fail<DataError>("from_edges: destination index ", dst[k], " of edge ", k, " is outside [0, ", cols, ")");
  }
  Csr a;
  a.rows = rows;
  a.cols = cols;
  a.row_ptr.assign(std::size_t(rows + 1), 0);
  for (auto s : src) ++a.row_ptr[std::size_t(s + 1)];
  for (std::int64_t i = 0; i < rows; ++i) a.row_ptr[std::size_t(i + 1)] += a.row_ptr[std::size_t(i)];
  // Counting sort by row (stable), then sort each row by column (stable, so
  // duplicates keep their edge-list order).
  std::vector<std::int64_t> next(a.row_ptr.begin(), a.row_ptr.end() - 1), order(src.size());
  for (std::size_t k = 0; k < src.size(); ++k) order[std::size_t(next[std::size_t(src[k])]++)] = std::int64_t(k);
  for (std::int64_t i = 0; i < rows; ++i)
    std::stable_sort(order.begin() + a.row_ptr[std::size_t(i)], order.begin() + a.row_ptr[std::size_t(i + 1)],
                     [&](std::int64_t x, std::int64_t y) { return dst[std::size_t(x)] < dst[std::size_t(y)]; });
  a.col.resize(src.size());
  a.values.resize(src.size());
  for (std::size_t p = 0; p < order.size(); ++p) {
    a.col[p] = dst[std::size_t(order[p])];
    a.values[p] = values.empty() ? 1.0 : values[std::size_t(order[p])];
  }
  return a;
}

// How coalesce() merges entries with the same (row, column).
enum class Merge {
  binary,  // one entry of value 1: the 0/1 adjacency of a graph given as an edge list
  sum,     // the sum of their values (what a COO sparse tensor's coalesce does)
  max,     // the largest value
};

// Merges duplicate entries. Rows stay sorted by column.
inline Csr coalesce(const Csr& a, Merge how = Merge::binary) {
  a.validate("coalesce");
  Csr out;
  out.rows = a.rows;
  out.cols = a.cols;
  out.row_ptr.assign(std::size_t(a.rows + 1), 0);
  out.col.reserve(a.col.size());
  out.values.reserve(a.values.size());
  for (std::int64_t i = 0; i < a.rows; ++i) {
    std::int64_t pe = a.row_ptr[std::size_t(i + 1)];
    for (std::int64_t p = a.row_ptr[std::size_t(i)]; p < pe;) {
      std::int64_t j = a.col[std::size_t(p)];
      double v = a.values[std::size_t(p)];
      for (++p; p < pe && a.col[std::size_t(p)] == j; ++p)
        v = how == Merge::sum ? v + a.values[std::size_t(p)] : std::max(v, a.values[std::size_t(p)]);
      out.col.push_back(j);
      out.values.push_back(how == Merge::binary ? 1.0 : v);
    }
    out.row_ptr[std::size_t(i + 1)] = out.nnz();
  }
  return out;
}

// The transpose's structure, in CSR form over the columns of `a`: the entries
// of column j are ptr[j]..ptr[j+1]; idx holds each one's row in `a` (sorted),
// perm its position in a's values. With it, Aᵀ·G is a gather over Aᵀ's rows.
struct CsrTranspose {
  std::vector<std::int64_t> ptr;   // [cols + 1]
  std::vector<std::int64_t> idx;   // [nnz]
  std::vector<std::int64_t> perm;  // [nnz]
};

inline CsrTranspose transpose_structure(const Csr& a) {
  a.validate("transpose");
  CsrTranspose t;
  t.ptr.assign(std::size_t(a.cols + 1), 0);
  for (auto j : a.col) ++t.ptr[std::size_t(j + 1)];
  for (std::int64_t j = 0; j < a.cols; ++j) t.ptr[std::size_t(j + 1)] += t.ptr[std::size_t(j)];
  std::vector<std::int64_t> next(t.ptr.begin(), t.ptr.end() - 1);
  t.idx.resize(a.col.size());
  t.perm.resize(a.col.size());
  for (std::int64_t i = 0; i < a.rows; ++i)  // rows in order: each column's entries come out sorted by row
    for (std::int64_t p = a.row_ptr[std::size_t(i)]; p < a.row_ptr[std::size_t(i + 1)]; ++p) {
      std::int64_t q = next[std::size_t(a.col[std::size_t(p)])]++;
      t.idx[std::size_t(q)] = i;
      t.perm[std::size_t(q)] = p;
    }
  return t;
}

// Aᵀ as a CSR matrix.
inline Csr transpose(const Csr& a) {
  CsrTranspose t = transpose_structure(a);
  Csr out;
  out.rows = a.cols;
  out.cols = a.rows;
  out.row_ptr = std::move(t.ptr);
  out.col = std::move(t.idx);
  out.values.resize(out.col.size());
  for (std::size_t q = 0; q < t.perm.size(); ++q) out.values[q] = a.values[std::size_t(t.perm[q])];
  return out;
}

// The union of A's and Aᵀ's entries, duplicates merged (binary by default:
// the undirected graph of a directed edge list). A must be square.
inline Csr symmetrize(const Csr& a, Merge how = Merge::binary) {
  if (a.rows != a.cols) fail<DataError>("symmetrize: the matrix must be square, got [", a.rows, ", ", a.cols, "]");
  Csr t = transpose(a);
  Csr both;
  both.rows = a.rows;
  both.cols = a.cols;
  both.row_ptr.assign(std::size_t(a.rows + 1), 0);
  for (std::int64_t i = 0; i < a.rows; ++i) {
    // Merge the two sorted rows.
    std::int64_t p = a.row_ptr[std::size_t(i)], pe = a.row_ptr[std::size_t(i + 1)];
    std::int64_t q = t.row_ptr[std::size_t(i)], qe = t.row_ptr[std::size_t(i + 1)];
    while (p < pe || q < qe) {
      bool take_a = q >= qe || (p < pe && a.col[std::size_t(p)] <= t.col[std::size_t(q)]);
      const Csr& s = take_a ? a : t;
      std::int64_t& k = take_a ? p : q;
      both.col.push_back(s.col[std::size_t(k)]);
      both.values.push_back(s.values[std::size_t(k)]);
      ++k;
    }
    both.row_ptr[std::size_t(i + 1)] = both.nnz();
  }
  return coalesce(both, how);
}

// Adds the entry (i, i) = value to every row that has none (existing diagonal
// entries are kept, as PyTorch Geometric's add_remaining_self_loops does).
inline Csr add_self_loops(const Csr& a, double value = 1.0) {
  a.validate("add_self_loops");
  if (a.rows != a.cols)
    fail<DataError>("add_self_loops: the matrix must be square, got [", a.rows, ", ", a.cols, "]");
  Csr out;
  out.rows = a.rows;
  out.cols = a.cols;
  out.row_ptr.assign(std::size_t(a.rows + 1), 0);
  out.col.reserve(a.col.size() + std::size_t(a.rows));
  out.values.reserve(a.col.size() + std::size_t(a.rows));
  for (std::int64_t i = 0; i < a.rows; ++i) {
    std::int64_t p = a.row_ptr[std::size_t(i)], pe = a.row_ptr[std::size_t(i + 1)];
    bool has = false;
    for (std::int64_t k = p; k < pe; ++k) has = has || a.col[std::size_t(k)] == i;
    for (; p < pe && a.col[std::size_t(p)] < i; ++p) {
      out.col.push_back(a.col[std::size_t(p)]);
      out.values.push_back(a.values[std::size_t(p)]);
    }
    if (!has) {
      out.col.push_back(i);
      out.values.push_back(value);
    }
    for (; p < pe; ++p) {
      out.col.push_back(a.col[std::size_t(p)]);
      out.values.push_back(a.values[std::size_t(p)]);
    }
    out.row_ptr[std::size_t(i + 1)] = out.nnz();
  }
  return out;
}

enum class Degree {
  count,   // entries per row (the degree of a 0/1 adjacency)
  weight,  // sum of the row's values
};

// The degree of every row (every node, for an adjacency stored by row).
inline std::vector<double> degrees(const Csr& a, Degree kind = Degree::count) {
  a.validate("degrees");
  std::vector<double> d(std::size_t(a.rows), 0.0);
  for (std::int64_t i = 0; i < a.rows; ++i)
    for (std::int64_t p = a.row_ptr[std::size_t(i)]; p < a.row_ptr[std::size_t(i + 1)]; ++p)
      d[std::size_t(i)] += kind == Degree::count ? 1.0 : a.values[std::size_t(p)];
  return d;
}

// The GCN propagation matrix D^-1/2 (A + I) D^-1/2 (Kipf and Welling), with
// D the row sums of A + I. Self loops are added where missing (value 1) unless
// self_loops is false. A row whose sum is 0 (an isolated node without a self
// loop) contributes nothing: its 1/sqrt(degree) is taken as 0, as in PyTorch
// Geometric's gcn_norm. A should be symmetric for the result to be.
inline Csr gcn_normalize(const Csr& a, bool self_loops = true) {
  if (a.rows != a.cols) fail<DataError>("gcn_normalize: the matrix must be square, got [", a.rows, ", ", a.cols, "]");
  Csr out = self_loops ? add_self_loops(a) : a;
  std::vector<double> deg = degrees(out, Degree::weight), dinv(deg.size());
  for (std::size_t i = 0; i < deg.size(); ++i) dinv[i] = deg[i] > 0 ? 1.0 / std::sqrt(deg[i]) : 0.0;
  for (std::int64_t i = 0; i < out.rows; ++i)
    for (std::int64_t p = out.row_ptr[std::size_t(i)]; p < out.row_ptr[std::size_t(i + 1)]; ++p)
      out.values[std::size_t(p)] *= dinv[std::size_t(i)] * dinv[std::size_t(out.col[std::size_t(p)])];
  return out;
}

// Each row divided by its sum, D^-1 A: for a 0/1 adjacency, the mean over a
// node's neighbours (GraphSAGE's mean aggregation). A row summing to 0 (a
// node without neighbours) stays 0, so its mean is 0.
inline Csr row_normalize(const Csr& a) {
  std::vector<double> deg = degrees(a, Degree::weight);
  Csr out = a;
  for (std::int64_t i = 0; i < out.rows; ++i)
    for (std::int64_t p = out.row_ptr[std::size_t(i)]; p < out.row_ptr[std::size_t(i + 1)]; ++p)
      out.values[std::size_t(p)] = deg[std::size_t(i)] != 0 ? out.values[std::size_t(p)] / deg[std::size_t(i)] : 0.0;
  return out;
}

// A random graph as an edge list: e edges (src, dst) with src uniform over
// the n nodes and dst a different node, uniform (no self loops; duplicates
// possible), like the PyTorch peer's GCN benchmark graph.
struct EdgeList {
  std::vector<std::int64_t> src, dst;
};
inline EdgeList random_edges(std::int64_t n, std::int64_t e, std::uint64_t seed) {
  if (n < 2) fail<DataError>("random_edges: a graph without self loops needs at least 2 nodes, got ", n);
  Rng rng(seed);
  EdgeList l;
  l.src.resize(std::size_t(e));
  l.dst.resize(std::size_t(e));
  for (std::int64_t k = 0; k < e; ++k) {
    std::int64_t s = std::int64_t(rng.below(std::uint64_t(n)));
    l.src[std::size_t(k)] = s;
    l.dst[std::size_t(k)] = (s + 1 + std::int64_t(rng.below(std::uint64_t(n - 1)))) % n;
  }
  return l;
}

// The symmetric GCN adjacency of an undirected edge list, as the PyTorch
// peer builds it: both directions, self loops, duplicates merged (binary),
// then D^-1/2 (A + I) D^-1/2.
inline Csr gcn_adjacency(std::int64_t n, const EdgeList& edges) {
  return gcn_normalize(symmetrize(from_edges(n, n, edges.src, edges.dst)));
}

// The matrix as spmm's operand: structure, values (in value_dtype) and the
// transpose's structure and values, as host tensors; a symmetric matrix
// shares one set of tensors for both. Indices are i32 (half the memory
// traffic of i64) unless index_dtype says i64 or the matrix is too large.
inline SparseMatrix to_sparse(const Csr& a, DType value_dtype = DType::f32, DType index_dtype = DType::i32,
                              std::string name = "adj") {
  a.validate("to_sparse");
  if (value_dtype != DType::f32 && value_dtype != DType::f64)
    fail<DataError>("to_sparse: values must be f32 or f64, got ", dtype_name(value_dtype));
  if (index_dtype != DType::i32 && index_dtype != DType::i64)
    fail<DataError>("to_sparse: indices must be i32 or i64, got ", dtype_name(index_dtype));
  constexpr std::int64_t i32_max = std::numeric_limits<std::int32_t>::max();
  if (index_dtype == DType::i32 && (a.nnz() > i32_max || a.rows > i32_max || a.cols > i32_max))
    fail<DataError>("to_sparse: a matrix [", a.rows, ", ", a.cols, "] with ", a.nnz(),
                    " entries does not fit i32 indices; pass DType::i64");
  CsrTranspose t = transpose_structure(a);
  const std::int64_t nnz = a.nnz();
  auto index_tensor = [&](const std::vector<std::int64_t>& v) {
    Tensor out({std::int64_t(v.size())}, index_dtype);
    if (index_dtype == DType::i32)
      for (std::size_t k = 0; k < v.size(); ++k) out.data<std::int32_t>()[k] = std::int32_t(v[k]);
    else
      std::copy(v.begin(), v.end(), out.data<std::int64_t>());
    return out;
  };
  SparseMatrix s;
  s.rows = a.rows;
  s.cols = a.cols;
  s.name = std::move(name);
  s.row_ptr = Tensor::from(a.row_ptr, {a.rows + 1});
  s.col = index_tensor(a.col);
  s.values = Tensor({nnz}, value_dtype);
  for (std::int64_t p = 0; p < nnz; ++p) {
    if (value_dtype == DType::f32) s.values.data<float>()[p] = float(a.values[std::size_t(p)]);
    else s.values.data<double>()[p] = a.values[std::size_t(p)];
  }
  s.t_perm = index_tensor(t.perm);
  // A symmetric matrix is its own transpose: share the storage.
  bool symmetric = a.rows == a.cols && t.ptr == a.row_ptr && t.idx == a.col;
  for (std::int64_t q = 0; symmetric && q < nnz; ++q)
    symmetric = a.values[std::size_t(t.perm[std::size_t(q)])] == a.values[std::size_t(q)];
  if (symmetric) {
    s.t_ptr = s.row_ptr;
    s.t_idx = s.col;
    s.t_values = s.values;
    return s;
  }
  s.t_ptr = Tensor::from(t.ptr, {a.cols + 1});
  s.t_idx = index_tensor(t.idx);
  s.t_values = Tensor({nnz}, value_dtype);
  for (std::int64_t q = 0; q < nnz; ++q) {
    double v = a.values[std::size_t(t.perm[std::size_t(q)])];
    if (value_dtype == DType::f32) s.t_values.data<float>()[q] = float(v);
    else s.t_values.data<double>()[q] = v;
  }
  return s;
}

}  // namespace frugal::data
