#pragma once
// Sparse (CSR) × dense products, for graph neural networks.
//
// A sparse matrix A [n, m] is three graph values: row_ptr (i64 [n+1]), col
// (i32 or i64 [nnz], the column of each entry, row by row) and values
// (floating [nnz]). The structure is integer data the kernels read but never
// differentiate; the values are an ordinary floating value, so learnable edge
// weights get a gradient like any other parameter.
//
// The backward of Y = A·X needs dX = Aᵀ·dY. Computing it by scattering into dX
// would need atomics (or per-thread copies of dX); instead A carries its
// transpose's structure, built once on the host: t_ptr (i64 [m+1]), t_idx
// (the row in A of each transposed entry) and t_perm (its position in A's
// values). dX is then a gather-only CSR product over Aᵀ, deterministic and
// parallel over the rows of Aᵀ, reading A's values through t_perm. When the
// values are constants (a normalised adjacency), the host also stores them in
// transposed order (t_values), and dX is the plain product over Aᵀ; for a
// symmetric matrix that is the matrix itself, sharing its storage.
#include <optional>

#include "../graph/capture.hpp"
#include "checks.hpp"

namespace frugal::ops {

inline void expect_index_vector(const std::string& op, const char* what, const TensorMeta& m, bool i64_only) {
  bool ok = m.shape.rank() == 1 && (m.dtype == DType::i64 || (!i64_only && m.dtype == DType::i32));
  if (!ok)
    fail<ShapeError>(op, ": ", what, " must be a 1-D ", i64_only ? "i64" : "i32 or i64", " tensor, got ", m.str());
}

// Checks one CSR structure (ptr, idx) with values of length values_len; the
// matrix has ptr.numel() - 1 rows. Returns nnz.
inline std::int64_t check_csr(const std::string& op, const char* ptr_name, const TensorMeta& ptr, const char* idx_name,
                              const TensorMeta& idx) {
  expect_index_vector(op, ptr_name, ptr, true);
  expect_index_vector(op, idx_name, idx, false);
  if (ptr.shape[0] < 1)
    fail<ShapeError>(op, ": ", ptr_name, " ", ptr.str(), " must have rows + 1 >= 1 entries");
  return idx.shape[0];
}

class SpmmPermuted;

// Y [n, f] = A [n, m] · X [m, f].
// Inputs: (row_ptr, col, values, x) or, with the transpose for the backward,
// (row_ptr, col, values, x, t_ptr, t_idx, t_perm), optionally followed by
// t_values (the values in transposed order, when they are constants). The
// kernel reads only the first four; the others are for the backward.
class Spmm final : public Op {
 public:
  ~Spmm() override;
  std::string name() const override { return "spmm"; }
  std::vector<TensorMeta> infer(std::span<const TensorMeta> in) const override {
    if (in.size() != 4 && in.size() != 7 && in.size() != 8)
      fail<ShapeError>(name(), ": expects 4 inputs (row_ptr, col, values, x), 7 (with t_ptr, t_idx, t_perm) or 8 ",
                       "(with t_values), got ", in.size());
    std::int64_t nnz = check_csr(name(), "row_ptr", in[0], "col", in[1]);
    const TensorMeta &values = in[2], &x = in[3];
    expect_floating(name(), values);
    if (values.shape != Shape{nnz})
      fail<ShapeError>(name(), ": values ", values.str(), " must have one entry per column index: col is ", in[1].str());
    if (x.shape.rank() != 2)
      fail<ShapeError>(name(), ": the dense operand must be a matrix [m, f], got ", x.str());
    expect_same_dtype(name(), values, x);
    if (in.size() >= 7) {
      std::int64_t tnnz = check_csr(name(), "t_ptr", in[4], "t_idx", in[5]);
      expect_index_vector(name(), "t_perm", in[6], false);
      if (in[4].shape[0] != x.shape[0] + 1)
        fail<ShapeError>(name(), ": the transpose's t_ptr ", in[4].str(), " must have m + 1 = ", x.shape[0] + 1,
                         " entries for a dense operand ", x.str());
      if (tnnz != nnz || in[6].shape != in[5].shape || in[5].dtype != in[1].dtype || in[6].dtype != in[1].dtype)
        fail<ShapeError>(name(), ": the transpose's t_idx ", in[5].str(), " and t_perm ", in[6].str(),
                         " must match col ", in[1].str(), " in length and dtype");
    }
    if (in.size() == 8 && (in[7].dtype != values.dtype || in[7].shape != values.shape))
      fail<ShapeError>(name(), ": t_values ", in[7].str(), " must match values ", values.str());
    return {{x.dtype, Shape{in[0].shape[0] - 1, x.shape[1]}}};
  }
  inline std::vector<std::optional<Var>> backward(const BackwardArgs& args) const override;
  Cost cost(std::span<const TensorMeta> in, std::span<const TensorMeta> out) const override {
    double nnz = double(in[1].shape[0]), f = double(in[3].shape[1]);
    double bytes = double(in[0].nbytes() + in[1].nbytes() + in[2].nbytes() + out[0].nbytes()) +
                   nnz * f * double(dtype_size(in[3].dtype));
    return {2 * nnz * f, bytes};
  }
};

// Y = B · X where B's values are read through a permutation: B has structure
// (ptr, idx) and B.values[p] = values[perm[p]]. With B = Aᵀ (t_ptr, t_idx,
// t_perm) this is spmm's backward dX = Aᵀ · dY.
// Inputs: (ptr, idx, values, x, perm).
class SpmmPermuted final : public Op {
 public:
  ~SpmmPermuted() override;
  std::string name() const override { return "spmm_transposed"; }
  std::vector<TensorMeta> infer(std::span<const TensorMeta> in) const override {
    expect_arity(name(), in, 5);
    std::int64_t nnz = check_csr(name(), "ptr", in[0], "idx", in[1]);
    expect_index_vector(name(), "perm", in[4], false);
    if (in[4].shape != Shape{nnz} || in[4].dtype != in[1].dtype)
      fail<ShapeError>(name(), ": perm ", in[4].str(), " must match idx ", in[1].str(), " in length and dtype");
    expect_floating(name(), in[2]);
    if (in[2].shape != Shape{nnz})
      fail<ShapeError>(name(), ": values ", in[2].str(), " must have one entry per index: idx is ", in[1].str());
    if (in[3].shape.rank() != 2)
      fail<ShapeError>(name(), ": the dense operand must be a matrix [m, f], got ", in[3].str());
    expect_same_dtype(name(), in[2], in[3]);
    return {{in[3].dtype, Shape{in[0].shape[0] - 1, in[3].shape[1]}}};
  }
  std::vector<std::optional<Var>> backward(const BackwardArgs&) const override {
    fail("op ", name(), " (the backward of spmm) has no backward: spmm cannot be differentiated twice");
  }
  Cost cost(std::span<const TensorMeta> in, std::span<const TensorMeta> out) const override {
    double nnz = double(in[1].shape[0]), f = double(in[3].shape[1]);
    double bytes = double(in[0].nbytes() + in[1].nbytes() + in[2].nbytes() + in[4].nbytes() + out[0].nbytes()) +
                   nnz * f * double(dtype_size(in[3].dtype));
    return {2 * nnz * f, bytes};
  }
};

// The gradient of spmm with respect to A's values: for each entry p = (i, j),
// dvalues[p] = Σ_k dY[i, k] · X[j, k]. Inputs: (row_ptr, col, dy, x).
class SpmmValuesGrad final : public Op {
 public:
  ~SpmmValuesGrad() override;
  std::string name() const override { return "spmm_values_grad"; }
  std::vector<TensorMeta> infer(std::span<const TensorMeta> in) const override {
    expect_arity(name(), in, 4);
    std::int64_t nnz = check_csr(name(), "row_ptr", in[0], "col", in[1]);
    const TensorMeta &dy = in[2], &x = in[3];
    expect_floating(name(), dy);
    expect_same_dtype(name(), dy, x);
    if (dy.shape.rank() != 2 || x.shape.rank() != 2 || dy.shape[0] != in[0].shape[0] - 1 || dy.shape[1] != x.shape[1])
      fail<ShapeError>(name(), ": dy ", dy.str(), " and x ", x.str(), " must be [n, f] and [m, f] for row_ptr ",
                       in[0].str());
    return {{dy.dtype, Shape{nnz}}};
  }
  Cost cost(std::span<const TensorMeta> in, std::span<const TensorMeta> out) const override {
    double nnz = double(in[1].shape[0]), f = double(in[3].shape[1]);
    return {2 * nnz * f, double(in[0].nbytes() + in[1].nbytes() + in[2].nbytes() + out[0].nbytes()) +
                             nnz * f * double(dtype_size(in[3].dtype))};
  }
};

}  // namespace frugal::ops

namespace frugal {

// A sparse matrix during capture: the Vars of its CSR structure, its values
// and (for the backward) its transpose's structure.
struct SparseVar {
  std::int64_t rows = 0, cols = 0;
  Var row_ptr, col, values;
  std::optional<Var> t_ptr, t_idx, t_perm;
  // The values in transposed order, when they are constants: then dX needs
  // no permuted reads.
  std::optional<Var> t_values;

  std::int64_t nnz() const { return col.dim(0); }
  bool has_transpose() const { return t_ptr.has_value(); }
  // The same structure with other values (learnable or computed edge weights):
  // a floating Var of shape [nnz].
  SparseVar with_values(Var v) const {
    SparseVar s = *this;
    s.values = v;
    s.t_values.reset();
    return s;
  }
};

// A sparse matrix the user holds: host tensors of the CSR structure, its
// values and its transpose's structure (see data/graph.hpp for builders from
// edge lists). Bound into a capture as persistent (non-trained) state, so it
// sits outside the arena and is not copied per step. The values are
// constants; for learnable edge weights use var().with_values(w). Whoever
// fills the tensors by hand keeps them consistent: t_perm must be a
// permutation (kernels check its range, not that it is one-to-one), and
// t_values, when set, must equal values read through t_perm (change both, or
// rebuild with data::to_sparse).
struct SparseMatrix {
  std::int64_t rows = 0, cols = 0;
  Tensor row_ptr;  // i64 [rows + 1]
  Tensor col;      // i32 | i64 [nnz]
  Tensor values;   // f32 | f64 [nnz]
  Tensor t_ptr;    // i64 [cols + 1]       (optional: needed for dX)
  Tensor t_idx;    // col's dtype [nnz]
  Tensor t_perm;   // col's dtype [nnz]
  Tensor t_values; // values' dtype [nnz], values in transposed order (optional)
  std::string name = "adj";

  std::int64_t nnz() const { return col.defined() ? col.numel() : 0; }

  // The Vars of this matrix in the current capture. Binding twice gives the
  // same Vars.
  SparseVar var() const {
    if (!row_ptr.defined() || !col.defined() || !values.defined())
      fail("SparseMatrix '", name, "': row_ptr, col and values must all be set");
    if (row_ptr.numel() != rows + 1)
      fail<ShapeError>("SparseMatrix '", name, "': row_ptr ", row_ptr.shape().str(), " must have rows + 1 = ", rows + 1,
                       " entries");
    SparseVar s;
    s.rows = rows;
    s.cols = cols;
    s.row_ptr = persistent_var(row_ptr, ValueKind::constant, name + ".row_ptr");
    s.col = persistent_var(col, ValueKind::constant, name + ".col");
    s.values = persistent_var(values, ValueKind::constant, name + ".values");
    if (t_ptr.defined()) {
      if (t_ptr.numel() != cols + 1)
        fail<ShapeError>("SparseMatrix '", name, "': t_ptr ", t_ptr.shape().str(), " must have cols + 1 = ", cols + 1,
                         " entries");
      s.t_ptr = persistent_var(t_ptr, ValueKind::constant, name + ".t_ptr");
      s.t_idx = persistent_var(t_idx, ValueKind::constant, name + ".t_idx");
      s.t_perm = persistent_var(t_perm, ValueKind::constant, name + ".t_perm");
      // Constant values only: if the values were bound as a trained
      // parameter, a transposed copy would go stale.
      if (t_values.defined() && s.values.graph->value(s.values.id).kind != ValueKind::parameter)
        s.t_values = persistent_var(t_values, ValueKind::constant, name + ".t_values");
    }
    return s;
  }
};

// Y [rows, f] = A · X, X [cols, f]. The gradient with respect to X needs A's
// transpose structure; the gradient with respect to A's values is computed
// only when something trainable depends on them.
inline Var spmm(const SparseVar& a, Var x) {
  if (x.rank() != 2 || x.dim(0) != a.cols)
    fail<ShapeError>("spmm: a sparse matrix [", a.rows, ", ", a.cols, "] cannot multiply a dense ", x.meta().str(),
                     " (it must be [", a.cols, ", f])");
  std::vector<Var> in{a.row_ptr, a.col, a.values, x};
  if (a.has_transpose()) in.insert(in.end(), {*a.t_ptr, *a.t_idx, *a.t_perm});
  if (a.has_transpose() && a.t_values) in.push_back(*a.t_values);
  return frugal::apply(std::make_shared<ops::Spmm>(), std::move(in)).at(0);
}
inline Var spmm(const SparseMatrix& a, Var x) { return spmm(a.var(), x); }

inline std::vector<std::optional<Var>> ops::Spmm::backward(const BackwardArgs& args) const {
  auto in = args.inputs;
  if (in.size() < 7)
    fail("spmm: this product has no transpose structure (t_ptr, t_idx, t_perm): it was captured without one, or it "
         "is itself spmm's backward, so it cannot be differentiated; build the matrix with data::to_sparse(csr), "
         "which includes the transpose, or set SparseMatrix::t_ptr, t_idx and t_perm from "
         "data::transpose_structure(csr)");
  std::vector<std::optional<Var>> g(in.size());
  if (!args.grad_outputs[0]) return g;
  Var dy = *args.grad_outputs[0];
  // dX = Aᵀ dY, a gather over the rows of Aᵀ: with A's values in transposed
  // order when they are given, else reading them through t_perm.
  g[3] = in.size() == 8 ? apply1<Spmm>({in[4], in[5], in[7], dy})
                        : apply1<SpmmPermuted>({in[4], in[5], in[2], dy, in[6]});
  // dValues. When nothing trained depends on the values, autograd drops this
  // gradient and the planner never runs the node.
  g[2] = apply1<SpmmValuesGrad>({in[0], in[1], dy, in[3]});
  return g;
}

}  // namespace frugal
