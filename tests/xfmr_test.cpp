// The transformer ops (layer_norm, embedding, dropout, causal_attention), the
// indexing ops (concat, split, slice, index_select, index_add, gather,
// scatter_add) and the nn layers built on them. Each op: forward in f32 and
// f64 against the float64 references in reference_xfmr.hpp, backward against
// central finite differences (op_harness.hpp), edge shapes, and its errors.
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
