// The transformer ops (layer_norm, embedding, dropout, causal_attention), the
// indexing ops (concat, split, slice, index_select, index_add, gather,
// scatter_add) and the nn layers built on them. Each op: forward in f32 and
// f64 against the float64 references in reference_xfmr.hpp, backward against
// central finite differences (op_harness.hpp), edge shapes, and its errors.
#include <cstring>
#include <span>

#include "op_harness.hpp"
#include "reference_xfmr.hpp"

using namespace optest;
using frugal::DType;
using frugal::Var;
using A = Arrays;
using V = Vars;
using Catch::Matchers::Contains;

namespace {

// The ShapeError a capture of `build` over tensors of these shapes raises.
std::string capture_error(std::vector<ref::Dims> shapes, std::function<Var(const V&)> build,
                          std::vector<DType> dtypes = {}) {
  std::vector<frugal::Tensor> ts;
  for (std::size_t i = 0; i < shapes.size(); ++i)
    ts.emplace_back(frugal::Shape(shapes[i]), i < dtypes.size() ? dtypes[i] : DType::f32);
  return error_message<frugal::ShapeError>([&] {
    auto step = frugal::compile_inference(
        [&] {
          V vs;
          for (auto& t : ts) vs.push_back(frugal::persistent_var(t, frugal::ValueKind::parameter, "t"));
          return build(vs);
        },
        {});
  });
}

}  // namespace

// ---- layer_norm -------------------------------------------------------------

TEST_CASE("layer_norm with weight and bias", "[xfmr][layer_norm]") {
  auto ln = [](std::string name, ref::Dims xs) {
    std::int64_t d = xs.back();
    return Case{std::move(name),
                {wide(xs), x({d}), x({d})},
                [](const V& v) { return frugal::layer_norm(v[0], v[1], v[2]); },
                [](const A& a) { return ref::layer_norm(a[0], &a[1], &a[2]); }};
  };
  check_op(ln("layer_norm [4,6]", {4, 6}));
  check_op(ln("layer_norm [2,3,5]", {2, 3, 5}));
  check_op(ln("layer_norm [7] one row", {7}));
  check_op(ln("layer_norm [3,1] D=1", {3, 1}));
  check_op(ln("layer_norm [1,19] odd D past the lanes", {1, 19}));
  check_op(ln("layer_norm [2,37] more than one column block", {2, 37}));
}

TEST_CASE("layer_norm without affine, or with only one affine part", "[xfmr][layer_norm]") {
  check_op({"layer_norm no affine [3,6]",
            {wide({3, 6})},
            [](const V& v) { return frugal::layer_norm(v[0]); },
            [](const A& a) { return ref::layer_norm(a[0], nullptr, nullptr); }});
  check_op({"layer_norm no affine eps=0.1 [2,2,4]",
            {x({2, 2, 4})},
            [](const V& v) { return frugal::layer_norm(v[0], 0.1); },
            [](const A& a) { return ref::layer_norm(a[0], nullptr, nullptr, 0.1); }});
  check_op({"layer_norm weight only [3,5]",
            {wide({3, 5}), x({5})},
            [](const V& v) { return frugal::layer_norm(v[0], v[1], std::nullopt); },
            [](const A& a) { return ref::layer_norm(a[0], &a[1], nullptr); }});
  check_op({"layer_norm bias only [3,5]",
            {wide({3, 5}), x({5})},
            [](const V& v) { return frugal::layer_norm(v[0], std::nullopt, v[1]); },
            [](const A& a) { return ref::layer_norm(a[0], nullptr, &a[1]); }});
}

TEST_CASE("layer_norm shape errors name the op and the shapes", "[xfmr][layer_norm]") {
  std::string m = capture_error({{3, 4}, {5}, {4}}, [](const V& v) { return frugal::layer_norm(v[0], v[1], v[2]); });
  CHECK_THAT(m, Contains("layer_norm") && Contains("[5]") && Contains("[3, 4]"));
  m = capture_error({{3, 0}}, [](const V& v) { return frugal::layer_norm(v[0]); });
  CHECK_THAT(m, Contains("layer_norm") && Contains("[3, 0]"));
  m = capture_error({{}}, [](const V& v) { return frugal::layer_norm(v[0]); });
  CHECK_THAT(m, Contains("layer_norm") && Contains("scalar"));
}

// ---- embedding --------------------------------------------------------------

namespace {
Case emb(std::string name, ref::Dims ids, std::int64_t rows, std::int64_t d, DType id_dtype) {
  return {std::move(name),
          {labels(std::move(ids), rows, id_dtype), x({rows, d})},
          [](const V& v) { return frugal::embedding(v[0], v[1]); },
          [](const A& a) { return ref::embedding(a[0], a[1]); }};
}
}  // namespace

TEST_CASE("embedding forward and backward, i32 and i64 ids of any shape", "[xfmr][embedding]") {
  check_op(emb("embedding ids[6] i32 table[4,5]", {6}, 4, 5, DType::i32));
  check_op(emb("embedding ids[2,3] i64 table[5,3]", {2, 3}, 5, 3, DType::i64));
  // More positions than rows: ids repeat, so the backward accumulates.
  check_op(emb("embedding ids[3,4] i32 table[2,3] repeats", {3, 4}, 2, 3, DType::i32));
  check_op(emb("embedding scalar id table[3,4]", {}, 3, 4, DType::i64));
  check_op(emb("embedding ids[2,1,2] i64 table[1,1]", {2, 1, 2}, 1, 1, DType::i64));
  // More columns than one column block of the backward (64).
  check_op(emb("embedding ids[3] i32 table[2,70]", {3}, 2, 70, DType::i32));
}

TEST_CASE("an out-of-range embedding id is a DataError naming the op, the id, its position and the range",
          "[xfmr][embedding]") {
  frugal::Tensor table({5, 3}, DType::f32);
  auto run = [&](const frugal::Tensor& ids, bool train) {
    auto fn = [&] {
      Var t = frugal::persistent_var(table, frugal::ValueKind::parameter, "table");
      return frugal::sum(frugal::embedding(frugal::persistent_var(ids, frugal::ValueKind::state, "ids"), t));
    };
    if (train) {
      frugal::Step s = frugal::compile_gradients(fn, {}, {table});
      return error_message<frugal::DataError>([&] { s.run(); });
    }
    frugal::Step s = frugal::compile_inference(fn, {});
    return error_message<frugal::DataError>([&] { s.run(); });
  };
  frugal::Tensor big = frugal::Tensor::from(std::vector<std::int32_t>{1, 0, 4, 2, 5, 3}, {2, 3});
  std::string m = run(big, false);
  CHECK_THAT(m, Contains("embedding") && Contains("id 5") && Contains("position 4") && Contains("[1, 1]") &&
                    Contains("[0, 5)"));
  frugal::Tensor neg = frugal::Tensor::from(std::vector<std::int64_t>{-1, 0}, {2});
  m = run(neg, true);
  CHECK_THAT(m, Contains("embedding") && Contains("id -1") && Contains("position 0") && Contains("[0, 5)"));
}

TEST_CASE("embedding shape errors", "[xfmr][embedding]") {
  std::string m = capture_error({{4}, {5}}, [](const V& v) { return frugal::embedding(v[0], v[1]); },
                                {DType::i32, DType::f32});
  CHECK_THAT(m, Contains("embedding") && Contains("[5]") && Contains("[4]"));
  m = capture_error({{4}, {5, 3}}, [](const V& v) { return frugal::embedding(v[0], v[1]); },
                    {DType::f32, DType::f32});
  CHECK_THAT(m, Contains("embedding") && Contains("i32 or i64") && Contains("[4]"));
}

TEST_CASE("the embedding gradient is the same bits on 1 and 2 threads", "[xfmr][embedding][threads]") {
  // Large enough to take the parallel path: 2000 positions over 7 rows of 300.
  frugal::Rng rng(5);
  frugal::Tensor ids({2000}, DType::i32), table({7, 300}, DType::f32), r({2000, 300}, DType::f32);
  for (auto& e : std::span(ids.data<std::int32_t>(), 2000)) e = std::int32_t(rng.below(7));
  for (auto& e : std::span(r.data<float>(), 600000)) e = float(rng.uniform(-1, 1));
  auto grad_with = [&](int threads) {
    frugal::Step s = frugal::compile_gradients(
        [&] {
          Var e = frugal::embedding(frugal::persistent_var(ids, frugal::ValueKind::state, "ids"),
                                    frugal::persistent_var(table, frugal::ValueKind::parameter, "table"));
          return frugal::sum(e * frugal::persistent_var(r, frugal::ValueKind::state, "r"));
        },
        {}, {table}, {}, {.threads = threads});
    s.run();
    return s.grad(table).to_vector<float>();
  };
  auto g1 = grad_with(1), g2 = grad_with(2);
  CHECK(std::memcmp(g1.data(), g2.data(), g1.size() * 4) == 0);
  // And it is the sum it should be, for one column.
  double want = 0;
  for (int i = 0; i < 2000; ++i)
    if (ids.data<std::int32_t>()[i] == 3) want += r.data<float>()[i * 300 + 17];
  CHECK(std::abs(g1[3 * 300 + 17] - want) < 1e-4);
}
