// Graph ops, builders and layers: spmm forward and backward (structure bound
// as index tensors, values and the dense operand through the op harness:
// float64 reference and finite differences), the host CSR builders against
// dense references, GCNConv / SAGEConv / Gcn, and a GCN that trains with an
// audited plan.
#include "op_harness.hpp"
#include <frugal/backend/cpu/parallel.hpp>  // the kernels' parallel grain
#include "reference_graph.hpp"

using namespace optest;
using frugal::DType;
using frugal::Tensor;
using frugal::Var;
using A = Arrays;
using V = Vars;
using Structure = ref::graph::Structure;

namespace {

// ---- structures ------------------------------------------------------------

// A structure from explicit rows of column lists.
Structure rows_of(std::int64_t cols, const std::vector<std::vector<std::int64_t>>& rows) {
  Structure s;
  s.rows = std::int64_t(rows.size());
  s.cols = cols;
  s.row_ptr = {0};
  for (auto& r : rows) {
    for (auto j : r) s.col.push_back(j);
    s.row_ptr.push_back(s.nnz());
  }
  return s;
}

// A random structure: row i has a pseudo-random number of entries in
// [0, max_per_row], at distinct sorted columns.
Structure random_structure(std::int64_t rows, std::int64_t cols, std::int64_t max_per_row, std::uint64_t seed) {
  frugal::Rng rng(seed);
  std::vector<std::vector<std::int64_t>> r(static_cast<std::size_t>(rows));
  for (auto& row : r) {
    std::int64_t k = std::int64_t(rng.below(std::uint64_t(std::min(max_per_row, cols) + 1)));
    std::set<std::int64_t> c;
    while (std::int64_t(c.size()) < k) c.insert(std::int64_t(rng.below(std::uint64_t(cols))));
    row.assign(c.begin(), c.end());
  }
  return rows_of(cols, r);
}

// The structure as index tensors, with its transpose built here by brute
// force (independent of data::transpose_structure).
struct Bound {
  std::int64_t rows, cols;
  Tensor row_ptr, col, t_ptr, t_idx, t_perm;
};

Tensor index_tensor(const std::vector<std::int64_t>& v, DType dt) {
  Tensor t({std::int64_t(v.size())}, dt);
  for (std::size_t k = 0; k < v.size(); ++k) {
    if (dt == DType::i32) t.data<std::int32_t>()[k] = std::int32_t(v[k]);
    else t.data<std::int64_t>()[k] = v[k];
  }
  return t;
}

Bound make_bound(const Structure& s, DType idx = DType::i32) {
  std::vector<std::int64_t> t_ptr{0}, t_idx, t_perm;
  for (std::int64_t j = 0; j < s.cols; ++j) {
    for (std::int64_t i = 0; i < s.rows; ++i)
      for (std::int64_t p = s.row_ptr[std::size_t(i)]; p < s.row_ptr[std::size_t(i + 1)]; ++p)
        if (s.col[std::size_t(p)] == j) {
          t_idx.push_back(i);
          t_perm.push_back(p);
        }
    t_ptr.push_back(std::int64_t(t_idx.size()));
  }
  return {s.rows, s.cols, index_tensor(s.row_ptr, DType::i64), index_tensor(s.col, idx),
          index_tensor(t_ptr, DType::i64), index_tensor(t_idx, idx), index_tensor(t_perm, idx)};
}

frugal::SparseVar bind(const Bound& b, Var values, bool with_transpose = true) {
  frugal::SparseVar s;
  s.rows = b.rows;
  s.cols = b.cols;
  s.row_ptr = frugal::persistent_var(b.row_ptr, frugal::ValueKind::state, "row_ptr");
  s.col = frugal::persistent_var(b.col, frugal::ValueKind::state, "col");
  s.values = values;
  if (with_transpose) {
    s.t_ptr = frugal::persistent_var(b.t_ptr, frugal::ValueKind::state, "t_ptr");
    s.t_idx = frugal::persistent_var(b.t_idx, frugal::ValueKind::state, "t_idx");
    s.t_perm = frugal::persistent_var(b.t_perm, frugal::ValueKind::state, "t_perm");
  }
  return s;
}

// One spmm case for the harness: inputs (values [nnz], x [cols, f]).
Case spmm_case(std::string name, const Structure& s, std::int64_t f, DType idx = DType::i32) {
  auto b = std::make_shared<Bound>(make_bound(s, idx));
  return {std::move(name),
          {x({s.nnz()}), x({s.cols, f})},
          [b](const V& v) { return frugal::spmm(bind(*b, v[0]), v[1]); },
          [s](const A& a) { return ref::graph::spmm(s, a[0].v, a[1]); }};
}

std::vector<double> doubles(const Tensor& t) { return to_doubles(t); }

template <class T>
Tensor filled(ref::Dims shape, std::uint64_t seed) {
  Tensor t(frugal::Shape(shape), frugal::dtype_of<T>());
  frugal::Rng rng(seed);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data<T>()[i] = T(rng.uniform(-1, 1));
  return t;
}

ref::Array array_of(const Tensor& t) {
  return {t.shape().dims(), to_doubles(t)};
}

}  // namespace

// ---- spmm through the harness ---------------------------------------------

TEST_CASE("spmm forward and backward", "[ops][graph]") {
  check_op(spmm_case("spmm 4x5 f3", random_structure(4, 5, 4, 1), 3));
  check_op(spmm_case("spmm 6x6 f7 (groups of four and a tail)", random_structure(6, 6, 6, 2), 7));
  check_op(spmm_case("spmm 6x6 f5 i64 indices", random_structure(6, 6, 6, 3), 5, DType::i64));
}

TEST_CASE("spmm edge shapes: empty rows, a full row, 1x1, rectangular, duplicates", "[ops][graph]") {
  check_op(spmm_case("spmm empty rows", rows_of(4, {{}, {0, 3}, {}, {1, 2, 3}, {}}), 3));
  check_op(spmm_case("spmm a full row", rows_of(6, {{2}, {0, 1, 2, 3, 4, 5}, {5}}), 4));
  check_op(spmm_case("spmm 1x1", rows_of(1, {{0}}), 1));
  check_op(spmm_case("spmm 1x1 empty", rows_of(1, {{}}), 2));
  check_op(spmm_case("spmm tall 7x3", random_structure(7, 3, 3, 4), 3));
  check_op(spmm_case("spmm wide 2x9", rows_of(9, {{0, 4, 8}, {1, 2, 3, 5, 6, 7}}), 3));
  // Repeated (row, column) entries add, like an uncoalesced COO matrix.
  check_op(spmm_case("spmm duplicate entries", rows_of(4, {{1, 1, 3}, {0, 0, 0, 2, 2}, {3}}), 3));
  // A dense operand with no columns: an empty product.
  check_op(spmm_case("spmm f0", rows_of(3, {{0, 2}, {1}}), 0));
}

namespace {

// A data::Csr with the structure and the given values.
frugal::data::Csr csr_of(const Structure& s, const std::vector<double>& values) {
  frugal::data::Csr a;
  a.rows = s.rows;
  a.cols = s.cols;
  a.row_ptr = s.row_ptr;
  a.col = s.col;
  a.values = values;
  return a;
}

std::vector<double> some_values(std::int64_t nnz, std::uint64_t seed) {
  frugal::Rng rng(seed);
  std::vector<double> v(static_cast<std::size_t>(nnz));
  for (auto& e : v) e = double(float(rng.uniform(-1, 1)));
  return v;
}

// spmm with constant values (a SparseMatrix from data::to_sparse, so dX uses
// the values in transposed order); the harness input is x alone.
Case spmm_const_case(std::string name, const Structure& s, const std::vector<double>& values, std::int64_t f) {
  auto a64 = std::make_shared<frugal::SparseMatrix>(frugal::data::to_sparse(csr_of(s, values), DType::f64));
  auto a32 = std::make_shared<frugal::SparseMatrix>(frugal::data::to_sparse(csr_of(s, values), DType::f32));
  return {std::move(name),
          {x({s.cols, f})},
          [a64, a32](const V& v) {
            const frugal::SparseMatrix& a = v[0].dtype() == DType::f64 ? *a64 : *a32;
            frugal::SparseVar sv = a.var();
            REQUIRE(sv.t_values.has_value());
            return frugal::spmm(sv, v[0]);
          },
          [s, values](const A& a) { return ref::graph::spmm(s, values, a[0]); }};
}

}  // namespace

TEST_CASE("spmm with constant values: dX from the values in transposed order", "[ops][graph]") {
  Structure s = random_structure(5, 7, 5, 41);
  check_op(spmm_const_case("spmm const 5x7 f3", s, some_values(s.nnz(), 42), 3));
  Structure e = rows_of(3, {{}, {0, 2}, {}, {1}});
  check_op(spmm_const_case("spmm const empty rows", e, some_values(e.nnz(), 43), 4));
  // A symmetric matrix is its own transpose: one set of tensors.
  std::vector<std::pair<std::int64_t, std::int64_t>> edges{{0, 1}, {1, 2}, {2, 4}, {4, 0}};
  std::vector<std::int64_t> src, dst;
  for (auto [a, b] : edges) {
    src.push_back(a);
    dst.push_back(b);
  }
  frugal::data::Csr g = frugal::data::gcn_adjacency(6, {src, dst});
  frugal::SparseMatrix sm = frugal::data::to_sparse(g, DType::f64);
  CHECK(sm.t_values.raw() == sm.values.raw());
  CHECK(sm.t_idx.raw() == sm.col.raw());
  CHECK(sm.t_ptr.raw() == sm.row_ptr.raw());
  Structure gs;
  gs.rows = gs.cols = 6;
  gs.row_ptr = g.row_ptr;
  gs.col = g.col;
  check_op(spmm_const_case("spmm const symmetric gcn 6x6", gs, g.values, 3));
}

TEST_CASE("learnable edge weights: with_values, or values bound as a parameter, take the permuted path",
          "[ops][graph]") {
  Structure s = random_structure(4, 4, 3, 51);
  frugal::SparseMatrix sm = frugal::data::to_sparse(csr_of(s, some_values(s.nnz(), 52)), DType::f64);
  Tensor w = filled<double>({s.nnz()}, 53), xt = filled<double>({4, 2}, 54);
  for (int variant = 0; variant < 2; ++variant) {
    INFO("variant " << variant);
    Tensor& trained = variant == 0 ? w : sm.values;
    std::size_t spmm_inputs = 0;
    frugal::Step step = frugal::compile_gradients(
        [&] {
          Var wv = frugal::persistent_var(trained, frugal::ValueKind::parameter, "w");
          frugal::SparseVar a = sm.var();
          if (variant == 0) a = a.with_values(wv);
          CHECK_FALSE(a.t_values.has_value());
          Var y = frugal::spmm(a, frugal::persistent_var(xt, frugal::ValueKind::parameter, "x"));
          spmm_inputs = y.graph->node(y.graph->value(y.id).producer).inputs.size();
          return frugal::sum(y * y);
        },
        {}, {trained, xt});
    CHECK(spmm_inputs == 7);
    step.run();
    std::vector<double> vals = doubles(trained);
    ref::Array xa = array_of(xt), ya = ref::graph::spmm(s, vals, xa), g2 = ya;
    for (auto& e : g2.v) e *= 2;  // d(sum y^2)/dy
    ref::Array want_dx = ref::matmul(ref::graph::dense(s, vals), g2, true);
    expect_close("edge weights dx", doubles(step.grad(xt)), want_dx.v, want_dx.shape, 1e-12);
    expect_close("edge weights dw", doubles(step.grad(trained)), ref::graph::spmm_values_grad(s, g2, xa),
                 {s.nnz()}, 1e-12);
  }
}

TEST_CASE("spmm with one cache line of features (the register-accumulator path)", "[ops][graph]") {
  // 16 floats (f32 narrow path) and 8 doubles (f64 narrow path).
  check_op(spmm_case("spmm 5x6 f16", random_structure(5, 6, 6, 5), 16));
  check_op(spmm_case("spmm 6x5 f8", random_structure(6, 5, 5, 6), 8));
}

// ---- spmm at a size that runs on both threads ------------------------------

namespace {

struct LargeRun {
  std::vector<double> y, dvalues, dx;
};

// Y = A X, loss sum(Y * R); returns Y and the gradients of values and X.
template <class T>
LargeRun run_large(const Structure& s, const Tensor& values, const Tensor& xt, const Tensor& r, int threads) {
  Bound b = make_bound(s);
  LargeRun out;
  {
    frugal::Step fwd = frugal::compile_inference(
        [&] {
          auto vv = frugal::persistent_var(values, frugal::ValueKind::parameter, "values");
          auto xv = frugal::persistent_var(xt, frugal::ValueKind::parameter, "x");
          return frugal::spmm(bind(b, vv), xv);
        },
        {}, {}, {.threads = threads});
    fwd.run();
    out.y = doubles(fwd.output());
  }
  frugal::Step step = frugal::compile_gradients(
      [&] {
        auto vv = frugal::persistent_var(values, frugal::ValueKind::parameter, "values");
        auto xv = frugal::persistent_var(xt, frugal::ValueKind::parameter, "x");
        return frugal::sum(frugal::spmm(bind(b, vv), xv) * frugal::persistent_var(r, frugal::ValueKind::state, "R"));
      },
      {}, {values, xt}, {}, {.threads = threads});
  step.run();
  out.dvalues = doubles(step.grad(values));
  out.dx = doubles(step.grad(xt));
  return out;
}

}  // namespace

TEST_CASE("spmm on a graph large enough to split over threads matches the reference, bit for bit across "
          "thread counts",
          "[ops][graph]") {
  for (std::int64_t f : {24, 16, 8}) {
    INFO("features " << f);
    // A skewed degree distribution: a few rows with many entries.
    Structure s = random_structure(500, 400, 12, 7 + std::uint64_t(f));
    for (std::int64_t extra : {3, 250}) {
      std::vector<std::vector<std::int64_t>> rows;
      for (std::int64_t i = 0; i < s.rows; ++i)
        rows.emplace_back(s.col.begin() + s.row_ptr[std::size_t(i)], s.col.begin() + s.row_ptr[std::size_t(i + 1)]);
      rows[std::size_t(extra)].clear();
      for (std::int64_t j = 0; j < s.cols; ++j) rows[std::size_t(extra)].push_back(j);
      s = rows_of(s.cols, rows);
    }
    REQUIRE((s.nnz() + s.rows) * f >= frugal::cpu::kParallelGrain);
    Tensor values = filled<double>({s.nnz()}, 11), xt = filled<double>({s.cols, f}, 12), r = filled<double>({s.rows, f}, 13);
    LargeRun two = run_large<double>(s, values, xt, r, 2), one = run_large<double>(s, values, xt, r, 1);

    ref::Array xa = array_of(xt), ra = array_of(r);
    std::vector<double> vals = doubles(values);
    ref::Array want = ref::graph::spmm(s, vals, xa);
    ref::Array want_dx = ref::matmul(ref::graph::transpose2(ref::graph::dense(s, vals)), ra);
    std::vector<double> want_dv = ref::graph::spmm_values_grad(s, ra, xa);
    expect_close("large spmm forward", two.y, want.v, want.shape, 1e-12);
    expect_close("large spmm dx", two.dx, want_dx.v, want_dx.shape, 1e-12);
    expect_close("large spmm dvalues", two.dvalues, want_dv, {s.nnz()}, 1e-12);
    CHECK(two.y == one.y);
    CHECK(two.dx == one.dx);
    CHECK(two.dvalues == one.dvalues);

    // Constant values: dX from the values in transposed order.
    frugal::SparseMatrix sm = frugal::data::to_sparse(csr_of(s, vals), DType::f64);
    for (int threads : {1, 2}) {
      frugal::Step step = frugal::compile_gradients(
          [&] {
            auto xv = frugal::persistent_var(xt, frugal::ValueKind::parameter, "x");
            return frugal::sum(frugal::spmm(sm, xv) * frugal::persistent_var(r, frugal::ValueKind::state, "R"));
          },
          {}, {xt}, {}, {.threads = threads});
      step.run();
      std::vector<double> dx = doubles(step.grad(xt));
      expect_close("large spmm dx, constant values", dx, want_dx.v, want_dx.shape, 1e-12);
      CHECK(dx == two.dx);  // the same sums in the same order as the permuted reads
    }
  }
}

// ---- spmm errors -----------------------------------------------------------

TEST_CASE("spmm rejects bad shapes at capture", "[ops][graph][errors]") {
  Bound b = make_bound(rows_of(4, {{0, 1}, {3}, {2}}));  // [3, 4], 4 entries
  Tensor values({4}), x({4, 2}), x_bad({5, 2}), values_bad({3}), x64({4, 2}, DType::f64);
  auto capture = [&](const Tensor& v, const Tensor& xx) {
    frugal::compile_inference(
        [&] {
          return frugal::spmm(bind(b, frugal::persistent_var(v, frugal::ValueKind::parameter, "values")),
                              frugal::persistent_var(xx, frugal::ValueKind::parameter, "x"));
        },
        {});
  };
  std::string msg = error_message<frugal::ShapeError>([&] { capture(values, x_bad); });
  CHECK_THAT(msg, Catch::Contains("spmm") && Catch::Contains("[3, 4]") && Catch::Contains("[5, 2]"));
  msg = error_message<frugal::ShapeError>([&] { capture(values_bad, x); });
  CHECK_THAT(msg, Catch::Contains("spmm") && Catch::Contains("values f32[3]") && Catch::Contains("i32[4]"));
  msg = error_message<frugal::ShapeError>([&] { capture(values, x64); });
  CHECK_THAT(msg, Catch::Contains("spmm") && Catch::Contains("dtypes differ"));

  // Column indices must be an integer vector.
  Bound fb = b;
  fb.col = Tensor({4});
  msg = error_message<frugal::ShapeError>([&] {
    frugal::compile_inference(
        [&] {
          return frugal::spmm(bind(fb, frugal::persistent_var(values, frugal::ValueKind::parameter, "values")),
                              frugal::persistent_var(x, frugal::ValueKind::parameter, "x"));
        },
        {});
  });
  CHECK_THAT(msg, Catch::Contains("spmm: col must be a 1-D i32 or i64 tensor, got f32[4]"));
}

TEST_CASE("spmm stops on an out-of-range column index or a broken row pointer with a clear error",
          "[ops][graph][errors]") {
  auto run_with = [](std::vector<std::int64_t> row_ptr, std::vector<std::int64_t> col, std::int64_t f) {
    frugal::SparseMatrix a;
    a.rows = std::int64_t(row_ptr.size()) - 1;
    a.cols = 4;
    a.row_ptr = index_tensor(row_ptr, DType::i64);
    a.col = index_tensor(col, DType::i32);
    a.values = Tensor({std::int64_t(col.size())});
    Tensor x({4, f});
    frugal::Step s = frugal::compile_inference(
        [&] { return frugal::spmm(a, frugal::persistent_var(x, frugal::ValueKind::parameter, "x")); }, {});
    s.run();
  };
  run_with({0, 2, 3}, {0, 3, 1}, 3);  // fine
  std::string msg = error_message<frugal::DataError>([&] { run_with({0, 2, 3}, {0, 7, 1}, 3); });
  CHECK_THAT(msg, Catch::Contains("spmm: column index 7 at entry 1 (row 0) is outside [0, 4)"));
  msg = error_message<frugal::DataError>([&] { run_with({0, 2, 3}, {0, 1, -1}, 16); });
  CHECK_THAT(msg, Catch::Contains("column index -1 at entry 2 (row 1) is outside [0, 4)"));
  msg = error_message<frugal::DataError>([&] { run_with({0, 3, 2}, {0, 1, 2}, 3); });
  CHECK_THAT(msg, Catch::Contains("spmm: row_ptr decreases at row 1"));
  msg = error_message<frugal::DataError>([&] { run_with({0, 2, 2}, {0, 1, 2}, 3); });
  CHECK_THAT(msg, Catch::Contains("row_ptr[2] is 2 but there are 3 entries"));
}

TEST_CASE("spmm without the transpose structure runs forward but cannot be differentiated", "[ops][graph][errors]") {
  Bound b = make_bound(rows_of(3, {{0, 2}, {1}}));
  Tensor values({3}), x({3, 2});
  auto fn = [&] {
    return frugal::sum(frugal::spmm(bind(b, frugal::persistent_var(values, frugal::ValueKind::parameter, "values"),
                                         false),
                                    frugal::persistent_var(x, frugal::ValueKind::parameter, "x")));
  };
  frugal::compile_inference(fn, {}).run();
  std::string msg = frugal::cat(error_message<frugal::Error>([&] { frugal::compile_gradients(fn, {}, {x}); }));
  CHECK_THAT(msg, Catch::Contains("spmm") && Catch::Contains("transpose"));
}

// ---- host builders ---------------------------------------------------------

namespace fd = frugal::data;

TEST_CASE("from_edges sorts entries by row and column and keeps duplicates; coalesce merges them",
          "[graph][data]") {
  std::vector<std::int64_t> src{2, 0, 2, 1, 2, 0}, dst{1, 3, 0, 1, 1, 0};
  std::vector<double> w{1, 2, 3, 4, 5, 6};
  fd::Csr a = fd::from_edges(3, 4, src, dst, w);
  a.validate();
  CHECK(a.row_ptr == std::vector<std::int64_t>{0, 2, 3, 6});
  CHECK(a.col == std::vector<std::int64_t>{0, 3, 1, 0, 1, 1});
  CHECK(a.values == std::vector<double>{6, 2, 4, 3, 1, 5});
  fd::Csr bin = fd::coalesce(a), sum = fd::coalesce(a, fd::Merge::sum), mx = fd::coalesce(a, fd::Merge::max);
  CHECK(bin.col == std::vector<std::int64_t>{0, 3, 1, 0, 1});
  CHECK(bin.row_ptr == std::vector<std::int64_t>{0, 2, 3, 5});
  CHECK(bin.values == std::vector<double>{1, 1, 1, 1, 1});
  CHECK(sum.values == std::vector<double>{6, 2, 4, 3, 6});
  CHECK(mx.values == std::vector<double>{6, 2, 4, 3, 5});
  CHECK(sum.dense() == a.dense());
}

TEST_CASE("graph builders reject bad input with clear errors", "[graph][data][errors]") {
  std::vector<std::int64_t> src{0, 1}, dst{1, 5};
  std::string msg = error_message<frugal::DataError>([&] { fd::from_edges(3, 3, src, dst); });
  CHECK_THAT(msg, Catch::Contains("destination index 5 of edge 1 is outside [0, 3)"));
  std::vector<std::int64_t> neg{0, -2};
  msg = error_message<frugal::DataError>([&] { fd::from_edges(3, 3, neg, src); });
  CHECK_THAT(msg, Catch::Contains("source index -2 of edge 1 is outside [0, 3)"));
  fd::Csr a = fd::from_edges(3, 3, src, src);
  fd::Csr bad = a;
  bad.col[1] = 3;
  msg = error_message<frugal::DataError>([&] { bad.validate("adj"); });
  CHECK_THAT(msg, Catch::Contains("adj: column index 3 at entry 1 (row 1) is outside [0, 3)"));
  bad = a;
  bad.row_ptr = {0, 2, 1, 2};
  msg = error_message<frugal::DataError>([&] { fd::to_sparse(bad); });
  CHECK_THAT(msg, Catch::Contains("to_sparse: row_ptr decreases at row 1"));
  msg = error_message<frugal::DataError>([&] { fd::symmetrize(fd::from_edges(2, 3, src, src)); });
  CHECK_THAT(msg, Catch::Contains("square"));
}

TEST_CASE("transpose_structure maps every transposed entry to its value", "[graph][data]") {
  Structure s = random_structure(7, 5, 4, 21);
  fd::Csr a;
  a.rows = s.rows;
  a.cols = s.cols;
  a.row_ptr = s.row_ptr;
  a.col = s.col;
  for (std::int64_t p = 0; p < s.nnz(); ++p) a.values.push_back(double(p) + 0.5);
  fd::CsrTranspose t = fd::transpose_structure(a);
  Bound b = make_bound(s, DType::i64);  // the brute-force transpose
  CHECK(t.ptr == b.t_ptr.to_vector<std::int64_t>());
  CHECK(t.idx == b.t_idx.to_vector<std::int64_t>());
  CHECK(t.perm == b.t_perm.to_vector<std::int64_t>());
  fd::Csr at = fd::transpose(a);
  at.validate();
  ref::Array dense_t = ref::graph::transpose2(ref::graph::dense(s, a.values));
  CHECK(at.dense() == dense_t.v);
  CHECK(fd::transpose(at).dense() == a.dense());
}

TEST_CASE("symmetrize, self loops and degrees", "[graph][data]") {
  std::vector<std::int64_t> src{0, 1, 1, 3}, dst{1, 0, 2, 1};
  fd::Csr a = fd::symmetrize(fd::from_edges(5, 5, src, dst));
  CHECK(a.dense() == fd::transpose(a).dense());
  CHECK(fd::degrees(a) == std::vector<double>{1, 3, 1, 1, 0});  // node 4 is isolated
  fd::Csr l = fd::add_self_loops(a, 2.0);
  CHECK(fd::degrees(l) == std::vector<double>{2, 4, 2, 2, 1});
  CHECK(fd::degrees(l, fd::Degree::weight) == std::vector<double>{3, 5, 3, 3, 2});
  // An existing diagonal entry is kept, not doubled.
  CHECK(fd::add_self_loops(l, 7.0).values == l.values);
  l.validate();
}

TEST_CASE("gcn_normalize and row_normalize match dense references, isolated nodes included", "[graph][data]") {
  // Node 5 has no edges; (1, 2) appears twice and in both directions.
  std::vector<std::pair<std::int64_t, std::int64_t>> edges{{0, 1}, {1, 2}, {2, 1}, {1, 2}, {3, 4}, {4, 0}};
  std::vector<std::int64_t> src, dst;
  for (auto [s, d] : edges) {
    src.push_back(s);
    dst.push_back(d);
  }
  const std::int64_t n = 6;
  fd::Csr sym = fd::symmetrize(fd::from_edges(n, n, src, dst));
  expect_close("gcn_normalize with self loops", fd::gcn_normalize(sym).dense(), ref::graph::gcn_dense(n, edges).v,
               {n, n}, 1e-15);
  fd::Csr plain = fd::gcn_normalize(sym, false);
  expect_close("gcn_normalize without self loops", plain.dense(), ref::graph::gcn_dense(n, edges, false).v, {n, n},
               1e-15);
  CHECK(plain.row_ptr[5] == plain.row_ptr[6]);  // the isolated node's row is empty
  expect_close("gcn_adjacency", fd::gcn_adjacency(n, {src, dst}).dense(), ref::graph::gcn_dense(n, edges).v, {n, n},
               1e-15);
  fd::Csr directed = fd::coalesce(fd::from_edges(n, n, src, dst));
  expect_close("row_normalize", fd::row_normalize(directed).dense(), ref::graph::mean_dense(n, edges).v, {n, n},
               1e-15);
}

TEST_CASE("the peer's random graph: no self loops, symmetric GCN matrix, the expected size", "[graph][data]") {
  fd::EdgeList e = fd::random_edges(2000, 20000, 5);
  for (std::size_t k = 0; k < e.src.size(); ++k) {
    REQUIRE(e.src[k] != e.dst[k]);
    REQUIRE((e.dst[k] >= 0 && e.dst[k] < 2000));
  }
  CHECK(fd::random_edges(2000, 20000, 5).dst == e.dst);
  fd::Csr a = fd::gcn_adjacency(2000, e);
  // 2 * 20000 directed entries, a few merged duplicates, plus 2000 self loops.
  CHECK(a.nnz() > 41000);
  CHECK(a.nnz() <= 42000);
  fd::Csr t = fd::transpose(a);
  CHECK(t.col == a.col);
  CHECK(t.values == a.values);
}

TEST_CASE("to_sparse converts dtypes and carries the transpose", "[graph][data]") {
  std::vector<std::int64_t> src{0, 2, 2}, dst{1, 0, 3};
  fd::Csr a = fd::from_edges(3, 4, src, dst, std::vector<double>{0.5, 1.5, 2.5});
  frugal::SparseMatrix s = fd::to_sparse(a);
  CHECK(s.rows == 3);
  CHECK(s.cols == 4);
  CHECK(s.row_ptr.dtype() == DType::i64);
  CHECK(s.col.dtype() == DType::i32);
  CHECK(s.values.to_vector<float>() == std::vector<float>{0.5f, 1.5f, 2.5f});
  CHECK(s.t_ptr.to_vector<std::int64_t>() == std::vector<std::int64_t>{0, 1, 2, 2, 3});
  CHECK(s.t_perm.to_vector<std::int32_t>() == std::vector<std::int32_t>{1, 0, 2});
  frugal::SparseMatrix d = fd::to_sparse(a, DType::f64, DType::i64);
  CHECK(d.col.dtype() == DType::i64);
  CHECK(d.values.to_vector<double>() == std::vector<double>{0.5, 1.5, 2.5});
}

// ---- layers ----------------------------------------------------------------

namespace {

// A small undirected graph with an isolated node (node n - 1).
std::vector<std::pair<std::int64_t, std::int64_t>> small_edges(std::int64_t n) {
  std::vector<std::pair<std::int64_t, std::int64_t>> e;
  for (std::int64_t i = 0; i + 2 < n; ++i) {
    e.push_back({i, (i + 1) % (n - 1)});
    e.push_back({i, (i * 3 + 2) % (n - 1)});
  }
  return e;
}

fd::EdgeList edge_list(const std::vector<std::pair<std::int64_t, std::int64_t>>& e) {
  fd::EdgeList l;
  for (auto [s, d] : e) {
    if (s == d) continue;
    l.src.push_back(s);
    l.dst.push_back(d);
  }
  return l;
}

ref::Array param_of(const Tensor& t) { return array_of(t); }

}  // namespace

TEST_CASE("GCNConv: PyG names and init, forward matches A (x W^T) + b", "[nn][graph]") {
  for (auto [in, out] : {std::pair<std::int64_t, std::int64_t>{6, 4}, {3, 5}}) {
    INFO("in " << in << " out " << out);
    const std::int64_t n = 9;
    auto edges = small_edges(n);
    auto el = edge_list(edges);
    fd::Csr adj = fd::gcn_adjacency(n, el);
    frugal::SparseMatrix sm = fd::to_sparse(adj, DType::f64);
    frugal::nn::GCNConv conv(in, out, {.dtype = DType::f64});
    auto names = conv.named_parameters();
    REQUIRE(names.size() == 2);
    // Own parameters first, then submodules', as in a PyTorch state_dict.
    CHECK(names[0].first == "bias");
    CHECK(names[1].first == "lin.weight");
    const double bound = std::sqrt(6.0 / double(in + out));
    double largest = 0;
    for (double w : conv.lin.weight.to_vector<double>()) largest = std::max(largest, std::abs(w));
    CHECK(largest <= bound);
    CHECK(largest > 0.5 * bound);  // Glorot's bound, not Linear's 1/sqrt(in)
    for (double bv : conv.bias.to_vector<double>()) CHECK(bv == 0);
    conv.bias.copy_from(filled<double>({out}, 3));

    Tensor xt = filled<double>({n, in}, 4);
    frugal::Step s = frugal::compile_inference([&](Var xv) { return conv(xv, sm); }, {frugal::input<double>({n, in})});
    s.run(xt);
    ref::Array want = ref::matmul(ref::graph::gcn_dense(n, edges),
                                         ref::graph::linear(array_of(xt), param_of(conv.lin.weight), {}));
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t o = 0; o < out; ++o) want.v[std::size_t(i * out + o)] += conv.bias.data<double>()[o];
    expect_close("GCNConv forward", doubles(s.output()), want.v, want.shape, 1e-12);
  }
}

TEST_CASE("SAGEConv: PyG names, forward matches lin_l(mean of neighbours) + lin_r(x)", "[nn][graph]") {
  for (auto [in, out] : {std::pair<std::int64_t, std::int64_t>{6, 4}, {3, 5}}) {
    INFO("in " << in << " out " << out);
    const std::int64_t n = 8;
    auto edges = small_edges(n);  // node 7 has no neighbours: its mean is 0
    auto el = edge_list(edges);
    fd::Csr mean_adj = fd::row_normalize(fd::coalesce(fd::from_edges(n, n, el.src, el.dst)));
    frugal::SparseMatrix sm = fd::to_sparse(mean_adj, DType::f64);
    frugal::nn::SAGEConv conv(in, out, {.dtype = DType::f64});
    auto names = conv.named_parameters();
    REQUIRE(names.size() == 3);
    CHECK(names[0].first == "lin_l.weight");
    CHECK(names[1].first == "lin_l.bias");
    CHECK(names[2].first == "lin_r.weight");

    Tensor xt = filled<double>({n, in}, 5);
    frugal::Step s = frugal::compile_inference([&](Var xv) { return conv(xv, sm); }, {frugal::input<double>({n, in})});
    s.run(xt);
    ref::Array xa = array_of(xt);
    ref::Array neigh = ref::graph::linear(ref::matmul(ref::graph::mean_dense(n, edges), xa),
                                          param_of(conv.lin_l.weight), doubles(conv.lin_l.bias));
    ref::Array root = ref::graph::linear(xa, param_of(conv.lin_r.weight), {});
    for (std::size_t k = 0; k < neigh.v.size(); ++k) neigh.v[k] += root.v[k];
    expect_close("SAGEConv forward", doubles(s.output()), neigh.v, neigh.shape, 1e-12);
    // The isolated node: lin_l's bias plus lin_r of its own features.
    for (std::int64_t o = 0; o < out; ++o)
      CHECK(std::abs(neigh.v[std::size_t((n - 1) * out + o)] - root.v[std::size_t((n - 1) * out + o)] -
                     conv.lin_l.bias.data<double>()[o]) < 1e-12);
  }
}

TEST_CASE("Gcn (the peer's model): gradients of every parameter match finite differences", "[nn][graph]") {
  const std::int64_t n = 7, in = 3, hidden = 4, classes = 3;
  auto edges = small_edges(n);
  frugal::SparseMatrix sm = fd::to_sparse(fd::gcn_adjacency(n, edge_list(edges)), DType::f64);
  frugal::nn::Gcn model(in, hidden, classes, DType::f64);
  auto names = model.named_parameters();
  REQUIRE(names.size() == 4);
  CHECK(names[0].first == "lin1.weight");
  CHECK(names[3].first == "lin2.bias");
  Tensor xt = filled<double>({n, in}, 8), yt({n}, DType::i32);
  for (std::int64_t i = 0; i < n; ++i) yt.data<std::int32_t>()[i] = std::int32_t(i % classes);
  auto loss = [&](Var xv, Var yv) { return frugal::cross_entropy(model(xv, sm), yv); };
  frugal::Step step = frugal::compile_gradients(
      loss, {frugal::input<double>({n, in}), frugal::input<std::int32_t>({n})}, model.parameters());
  step.run(xt, yt);
  for (auto& [name, p] : names) {
    std::vector<double> g = doubles(step.grad(p)), fdv(g.size());
    double* w = p.data<double>();
    for (std::size_t j = 0; j < g.size(); ++j) {
      const double orig = w[j];
      w[j] = orig + kFdStep;
      step.run(xt, yt);
      const double lp = step.last_loss_f64();
      w[j] = orig - kFdStep;
      step.run(xt, yt);
      const double lm = step.last_loss_f64();
      w[j] = orig;
      fdv[j] = (lp - lm) / (2 * kFdStep);
    }
    expect_close("Gcn d/d" + name, g, fdv, p.shape().dims(), kF64GradTol);
  }
}

// ---- training --------------------------------------------------------------

TEST_CASE("a 2-layer GCN trains on a small graph, and the audit matches the plan", "[nn][graph][train]") {
  // Two communities of 60 nodes: dense inside, sparse across. Labels are the
  // community (plus a second bit from the node's own features); features are
  // noisy, so the graph helps.
  const std::int64_t n = 120, f = 8, classes = 4;
  frugal::Rng rng(99);
  fd::EdgeList el;
  for (std::int64_t k = 0; k < 600; ++k) {
    std::int64_t s = std::int64_t(rng.below(n)), d = std::int64_t(rng.below(n));
    bool same = (s < n / 2) == (d < n / 2);
    if (s == d || (!same && rng.uniform() < 0.9)) continue;
    el.src.push_back(s);
    el.dst.push_back(d);
  }
  frugal::SparseMatrix adj = fd::to_sparse(fd::gcn_adjacency(n, el));
  Tensor xt({n, f}), yt({n}, DType::i32);
  for (std::int64_t i = 0; i < n; ++i) {
    std::int32_t label = std::int32_t((i < n / 2 ? 0 : 2) + (i % 2));
    yt.data<std::int32_t>()[i] = label;
    for (std::int64_t k = 0; k < f; ++k)
      xt.data<float>()[i * f + k] = float(rng.normal() + (k == label ? 1.0 : 0.0) + (k == 4 + i % 2 ? 2.0 : 0.0));
  }
  frugal::nn::manual_seed(3);
  frugal::nn::Gcn model(f, 16, classes);
  frugal::optim::AdamW opt(model.parameters(), {.lr = 0.02, .weight_decay = 0});
  frugal::Step step = frugal::compile([&](Var xv, Var yv) { return frugal::cross_entropy(model(xv, adj), yv); },
                                      {frugal::input<float>({n, f}), frugal::input<std::int32_t>({n})}, opt);
  // The adjacency sits outside the arena, with the persistent state.
  CHECK(step.plan().persistent_bytes >= std::size_t(adj.values.nbytes() + adj.col.nbytes() + adj.t_perm.nbytes()));
  auto audit = step.audit(xt, yt);
  CHECK(audit.high_water == audit.predicted);
  CHECK(audit.canary_intact);
  float first = step.run(xt, yt), last = first;
  for (int s = 0; s < 80; ++s) last = step.run(xt, yt);
  INFO("loss " << first << " -> " << last);
  CHECK(last < 0.5f * first);
  CHECK(last < 0.6f);
}

TEST_CASE("SAGEConv and GCNConv stacks train with SGD", "[nn][graph][train]") {
  const std::int64_t n = 40, f = 5, classes = 3;
  fd::EdgeList el = fd::random_edges(n, 120, 17);
  frugal::SparseMatrix gcn_adj = fd::to_sparse(fd::gcn_adjacency(n, el), DType::f32, DType::i32, "gcn_adj");
  frugal::SparseMatrix mean_adj =
      fd::to_sparse(fd::row_normalize(fd::symmetrize(fd::from_edges(n, n, el.src, el.dst))), DType::f32,
                    DType::i64, "mean_adj");
  Tensor xt = filled<float>({n, f}, 31), yt({n}, DType::i32);
  for (std::int64_t i = 0; i < n; ++i) yt.data<std::int32_t>()[i] = std::int32_t((i * 7) % classes);
  struct Net : frugal::nn::Module {
    frugal::nn::GCNConv c1{5, 16};
    frugal::nn::SAGEConv c2{16, 3};
    Net() {
      register_module("conv1", c1);
      register_module("conv2", c2);
    }
  } net;
  frugal::optim::SGD opt(net.parameters(), {.lr = 0.2, .momentum = 0.9});
  frugal::Step step = frugal::compile(
      [&](Var xv, Var yv) {
        return frugal::cross_entropy(net.c2(frugal::relu(net.c1(xv, gcn_adj)), mean_adj), yv);
      },
      {frugal::input<float>({n, f}), frugal::input<std::int32_t>({n})}, opt);
  float first = step.run(xt, yt), last = first;
  for (int s = 0; s < 60; ++s) last = step.run(xt, yt);
  INFO("loss " << first << " -> " << last);
  CHECK(last < 0.7f * first);
  auto audit = step.audit(xt, yt);
  CHECK(audit.high_water == audit.predicted);
}
