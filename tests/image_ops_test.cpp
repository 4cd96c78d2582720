// Image ops and layers of issue 14: conv_transpose2d, nearest and bilinear
// upsampling, group_norm and 1-D batch norm. Every op forward (f32 and f64
// against the float64 references in reference_image.hpp) and backward
// (against central finite differences) through op_harness.hpp, on both CPU
// convolution engines where the CPU has them; the errors; the nn layers'
// names and initialisation; and a small model of all of them trained under
// a tight budget, bit for bit as unconstrained.
#include <omp.h>

#include <cstring>

#include "op_harness.hpp"
#include <frugal/backend/cpu/conv.hpp>  // the engines this CPU has
#include "reference_image.hpp"

using namespace optest;
using frugal::DType;
using frugal::Var;
using Catch::Matchers::Contains;

namespace {

// Steps the harness compiles use this convolution engine (by name) while it lives.
struct EngineByName {
  std::string saved = harness_options().backend_options.conv_engine;
  explicit EngineByName(const std::string& e) { harness_options().backend_options.conv_engine = e; }
  ~EngineByName() { harness_options().backend_options.conv_engine = saved; }
};

std::vector<std::string> engine_names() {
  std::vector<std::string> e{"blas"};
  if (frugal::cpu::conv_fast::available()) e.push_back("avx512");
  return e;
}

// ---- conv_transpose2d ---------------------------------------------------------------

struct ConvTCase {
  std::string name;
  ref::Dims x, w;
  frugal::ConvTranspose2dOptions o;
  bool bias = false;
};

Case conv_transpose_case(const ConvTCase& c) {
  std::vector<In> in{x(c.x), x(c.w)};
  if (c.bias) in.push_back(x({c.w[1] * c.o.groups}));
  const auto o = c.o;
  const bool bias = c.bias;
  const ref::ConvTranspose2dParams p{o.stride.h, o.stride.w, o.padding.h, o.padding.w, o.output_padding.h,
                                     o.output_padding.w, o.dilation.h, o.dilation.w, o.groups};
  return {"conv_transpose2d " + c.name, in,
          [o, bias](const Vars& v) {
            return frugal::conv_transpose2d(v[0], v[1], bias ? std::optional<Var>(v[2]) : std::nullopt, o);
          },
          [p, bias](const Arrays& a) { return ref::conv_transpose2d(a[0], a[1], bias ? &a[2] : nullptr, p); }};
}

// f32 tolerance: each output sums at most Cin/groups * kH * kW = 27 products
// of size <= 1 (plus a bias), so f32 rounding stays below 27 * 6e-8 ~ 2e-6,
// within the harness's 1e-5.
const ConvTCase kConvTCases[] = {
    {"3x3 with bias [2,3,4,4]*[3,2,3,3]", {2, 3, 4, 4}, {3, 2, 3, 3}, {}, true},
    {"stride 2 pad 1 output_padding 1 [2,2,3,3]*[2,3,3,3]", {2, 2, 3, 3}, {2, 3, 3, 3},
     {.stride = 2, .padding = 1, .output_padding = 1}, true},
    {"stride 2 kernel 2 (exact doubling) [2,3,3,4]*[3,2,2,2]", {2, 3, 3, 4}, {3, 2, 2, 2}, {.stride = 2}, false},
    {"groups 2 [2,4,3,3]*[4,3,3,3]", {2, 4, 3, 3}, {4, 3, 3, 3}, {.padding = 1, .groups = 2}, true},
    {"depthwise groups 3 [1,3,4,4]*[3,1,3,3] stride 2", {1, 3, 4, 4}, {3, 1, 3, 3}, {.stride = 2, .groups = 3}, false},
    {"dilation 2 [1,2,4,4]*[2,2,3,3] pad 1", {1, 2, 4, 4}, {2, 2, 3, 3}, {.padding = 1, .dilation = 2}, false},
    // stride <= output_padding < dilation: rows no input reaches (bias only).
    {"stride 1 dilation 2 output_padding 1 [2,2,3,3]*[2,2,3,3]", {2, 2, 3, 3}, {2, 2, 3, 3},
     {.output_padding = 1, .dilation = 2}, true},
    {"asymmetric 2x3 stride (2,1) pad (1,0) output_padding (1,0)", {2, 2, 3, 4}, {2, 3, 2, 3},
     {.stride = {2, 1}, .padding = {1, 0}, .output_padding = {1, 0}}, true},
    {"1x1 pointwise [2,3,3,3]*[3,4,1,1]", {2, 3, 3, 3}, {3, 4, 1, 1}, {}, true},
    {"1x1 pointwise one image [1,3,3,3]*[3,2,1,1]", {1, 3, 3, 3}, {3, 2, 1, 1}, {}, false},
    {"1x1 stride 2 output_padding 1 [2,3,3,3]*[3,2,1,1]", {2, 3, 3, 3}, {3, 2, 1, 1},
     {.stride = 2, .output_padding = 1}, false},
    {"padding past the kernel [1,2,5,5]*[2,2,3,3] pad 2", {1, 2, 5, 5}, {2, 2, 3, 3}, {.padding = 2}, false},
    {"several chunks, a shorter last one [3,1,16,16]*[1,2,3,3] pad 1", {3, 1, 16, 16}, {1, 2, 3, 3},
     {.padding = 1}, true},
};

}  // namespace

TEST_CASE("conv_transpose2d forward and backward against the reference and finite differences", "[image14]") {
  for (const auto& engine : engine_names()) {
    EngineByName ec(engine);
    INFO("engine " << engine);
    for (const auto& c : kConvTCases) check_op(conv_transpose_case(c));
  }
}

TEST_CASE("conv_transpose2d's parallel paths match the reference, on both engines", "[image14][threads]") {
  ThreadCount two(2);
  // Each above the kernels' 4 MFLOP parallel threshold.
  const ConvTCase large[] = {
      {"[4,16,12,12]*[16,16,3,3] stride 2 pad 1 op 1", {4, 16, 12, 12}, {16, 16, 3, 3},
       {.stride = 2, .padding = 1, .output_padding = 1}, true},
      {"[4,32,10,10]*[32,8,3,3] groups 2 pad 1", {4, 32, 10, 10}, {32, 8, 3, 3}, {.padding = 1, .groups = 2}, false},
  };
  for (const auto& engine : engine_names()) {
    EngineByName ec(engine);
    INFO("engine " << engine);
    // Sums of up to 16 * 9 = 144 products of size <= 1: f32 rounding below 144 * 6e-8 ~ 1e-5.
    for (const auto& c : large) {
      Case k = conv_transpose_case(c);
      k.f32_scale = 4;
      check_forward_large(k);
    }
  }
}

// ---- upsampling ------------------------------------------------------------------------

namespace {

Case upsample_case(std::string name, ref::Dims xs, frugal::UpsampleMode mode, frugal::Upsample2dOptions o) {
  const bool nearest = mode == frugal::UpsampleMode::nearest;
  const std::int64_t ho = o.size ? o.size->h : 0, wo = o.size ? o.size->w : 0;
  const double sh = o.scale_factor ? o.scale_factor->h : 0, sw = o.scale_factor ? o.scale_factor->w : 0;
  return {std::string(nearest ? "upsample_nearest2d " : "upsample_bilinear2d ") + std::move(name),
          {x(std::move(xs))},
          [=](const Vars& v) { return nearest ? frugal::upsample_nearest2d(v[0], o) : frugal::upsample_bilinear2d(v[0], o); },
          [=](const Arrays& a) {
            const ref::UpsampleParams p = ref::upsample_size(a[0], ho, wo, sh, sw, o.align_corners);
            return nearest ? ref::upsample_nearest2d(a[0], p) : ref::upsample_bilinear2d(a[0], p);
          }};
}

}  // namespace

TEST_CASE("upsample_nearest2d forward and backward, by size and by scale factor", "[image14]") {
  using frugal::UpsampleMode;
  const auto nearest = UpsampleMode::nearest;
  check_op(upsample_case("scale 2 [2,2,3,3]", {2, 2, 3, 3}, nearest, {.scale_factor = 2.0}));
  check_op(upsample_case("size (5,7) from [2,3,3,4]", {2, 3, 3, 4}, nearest, {.size = frugal::Size2{5, 7}}));
  check_op(upsample_case("scale 1.5 from [1,2,4,5]", {1, 2, 4, 5}, nearest, {.scale_factor = 1.5}));
  check_op(upsample_case("scale (3, 0.5) from [1,1,2,6]", {1, 1, 2, 6}, nearest, {.scale_factor = frugal::Scale2{3, 0.5}}));
  check_op(upsample_case("downsample to (2,3) from [1,2,5,7]", {1, 2, 5, 7}, nearest, {.size = frugal::Size2{2, 3}}));
  check_op(upsample_case("same size [1,2,3,3]", {1, 2, 3, 3}, nearest, {.size = frugal::Size2{3, 3}}));
}

TEST_CASE("upsample_bilinear2d forward and backward, with and without align_corners", "[image14]") {
  using frugal::UpsampleMode;
  const auto bilinear = UpsampleMode::bilinear;
  for (bool align : {false, true}) {
    INFO("align_corners " << align);
    const std::string a = align ? " align_corners" : "";
    check_op(upsample_case("scale 2 [2,2,3,3]" + a, {2, 2, 3, 3}, bilinear, {.scale_factor = 2.0, .align_corners = align}));
    check_op(upsample_case("size (5,7) from [2,2,3,4]" + a, {2, 2, 3, 4}, bilinear,
                           {.size = frugal::Size2{5, 7}, .align_corners = align}));
    check_op(upsample_case("scale (2, 1.5) from [1,2,3,4]" + a, {1, 2, 3, 4}, bilinear,
                           {.scale_factor = frugal::Scale2{2, 1.5}, .align_corners = align}));
    check_op(upsample_case("downsample to (3,2) from [1,1,7,5]" + a, {1, 1, 7, 5}, bilinear,
                           {.size = frugal::Size2{3, 2}, .align_corners = align}));
    check_op(upsample_case("to one row and column from [1,2,4,3]" + a, {1, 2, 4, 3}, bilinear,
                           {.size = frugal::Size2{1, 1}, .align_corners = align}));
    check_op(upsample_case("from one pixel [2,1,1,1] to (3,4)" + a, {2, 1, 1, 1}, bilinear,
                           {.size = frugal::Size2{3, 4}, .align_corners = align}));
  }
}

TEST_CASE("upsampling follows PyTorch's index conventions on known values", "[image14]") {
  using namespace frugal;
  // Values from PyTorch (F.interpolate on x = [[0, 1, 2]] of shape [1, 1, 1, 3]).
  Tensor x = Tensor::from(std::vector<double>{0, 1, 2}, Shape{1, 1, 1, 3});
  auto run = [&](auto fn) {
    Step s = compile_inference([&] { return fn(persistent_var(x, ValueKind::parameter, "x")); }, {});
    s.run();
    return s.output(0).to_vector<double>();
  };
  // size 5, nearest: floor(o * 3/5) -> 0 0 1 1 2
  CHECK(run([](Var v) { return upsample_nearest2d(v, {.size = Size2{1, 5}}); }) ==
        std::vector<double>{0, 0, 1, 1, 2});
  // size 4, bilinear, align_corners=False: src = 0.75 (o + 0.5) - 0.5 clamped at 0 -> 0, 0.625, 1.375, 2
  CHECK(run([](Var v) { return upsample_bilinear2d(v, {.size = Size2{1, 4}}); }) ==
        std::vector<double>{0, 0.625, 1.375, 2});
  // size 5, bilinear, align_corners=True: src = o / 2 -> 0, 0.5, 1, 1.5, 2
  CHECK(run([](Var v) { return upsample_bilinear2d(v, {.size = Size2{1, 5}, .align_corners = true}); }) ==
        std::vector<double>{0, 0.5, 1, 1.5, 2});
  // scale_factor 1.7 gives floor(3 * 1.7) = 5 columns, but the scale is 1/1.7, not 3/5:
  // nearest reads floor(o / 1.7) -> 0 0 1 1 2, bilinear src = (o + 0.5) / 1.7 - 0.5.
  auto by_scale = run([](Var v) { return upsample_bilinear2d(v, {.scale_factor = Scale2{1, 1.7}}); });
  REQUIRE(by_scale.size() == 5);
  for (int o = 0; o < 5; ++o) {
    const double src = std::max(0.0, (o + 0.5) / 1.7 - 0.5);
    CHECK(by_scale[std::size_t(o)] == Approx(std::min(src, 2.0)).margin(1e-12));
  }
}

// ---- group_norm ------------------------------------------------------------------------

namespace {

Case group_norm_case(std::string name, ref::Dims xs, std::int64_t groups, bool affine) {
  std::vector<In> in{x(xs)};
  if (affine) {
    in.push_back(x({xs[1]}));
    in.push_back(x({xs[1]}));
  }
  return {"group_norm " + std::move(name), in,
          [=](const Vars& v) {
            if (affine) return frugal::group_norm(v[0], groups, v[1], v[2]);
            return frugal::group_norm(v[0], groups);
          },
          [=](const Arrays& a) {
            return ref::group_norm(a[0], groups, affine ? &a[1] : nullptr, affine ? &a[2] : nullptr);
          },
          // The backward subtracts means of size ~|dy|: a few f32 roundings more (as batch norm's).
          4};
}

}  // namespace

TEST_CASE("group_norm forward and backward", "[image14]") {
  check_op(group_norm_case("[2,6,3,3] 3 groups affine", {2, 6, 3, 3}, 3, true));
  check_op(group_norm_case("[2,4,5] 2 groups affine", {2, 4, 5}, 2, true));
  check_op(group_norm_case("[3,4] 1 group (layer norm over C)", {3, 4}, 1, true));
  check_op(group_norm_case("[2,3,2,2] 3 groups (instance norm) no affine", {2, 3, 2, 2}, 3, false));
  check_op(group_norm_case("[1,4,2,3] 2 groups no affine", {1, 4, 2, 3}, 2, false));
}

TEST_CASE("group_norm and upsampling split over threads: the reference forward, the same gradient bits", "[image14][threads]") {
  // Large enough that every kernel takes its parallel path; the gradients on
  // 2 threads must be the 1-thread bits (each block or plane is summed by one
  // thread in a fixed order), and the forward the f64 reference.
  const Case cases[] = {
      group_norm_case("large [8,32,16,16] 8 groups", {8, 32, 16, 16}, 8, true),
      upsample_case("large bilinear [4,8,16,16] to 40x40", {4, 8, 16, 16}, frugal::UpsampleMode::bilinear,
                    {.size = frugal::Size2{40, 40}}),
      upsample_case("large nearest [4,8,16,16] scale 3", {4, 8, 16, 16}, frugal::UpsampleMode::nearest,
                    {.scale_factor = 3.0}),
  };
  for (const Case& c : cases) {
    INFO(c.name);
    frugal::Rng rng(seed_of(c.name));
    Arrays vals;
    for (auto& in : c.inputs) vals.push_back(draw_array(rng, in));
    const ref::Array want = c.reference(vals);
    const ref::Array r = draw_array(rng, x(want.shape));
    GradRun one, two;
    {
      ThreadCount t(1);
      one = run_backward(c, vals, r, DType::f32, false);
    }
    {
      ThreadCount t(2);
      check_forward_large(c);
      two = run_backward(c, vals, r, DType::f32, false);
    }
    CHECK(one.loss == two.loss);
    REQUIRE(one.grads.size() == two.grads.size());
    for (std::size_t k = 0; k < one.grads.size(); ++k) CHECK(one.grads[k] == two.grads[k]);
  }
}

// ---- batch_norm1d ----------------------------------------------------------------------

TEST_CASE("batch_norm1d on [N, C] and [N, C, L]: train and eval, forward and backward", "[image14]") {
  using namespace frugal;
  for (ref::Dims xs : {ref::Dims{4, 3}, ref::Dims{3, 2, 5}, ref::Dims{2, 3, 1}}) {
    check_op({"batch_norm1d train " + ref::str(xs),
              {x(xs), x({xs[1]}), x({xs[1]})},
              [](const Vars& v) { return batch_norm1d_train(v[0], v[1], v[2]).y; },
              [](const Arrays& a) { return ref::batch_norm1d(a[0], a[1], a[2], nullptr, nullptr); },
              4});
  }
  Tensor rm = Tensor::from(std::vector<double>{0.25, -0.5, 0.125}, Shape{3});
  Tensor rv = Tensor::from(std::vector<double>{0.5, 1.5, 2.0}, Shape{3});
  Tensor rm32 = Tensor::from(std::vector<float>{0.25f, -0.5f, 0.125f}, Shape{3});
  Tensor rv32 = Tensor::from(std::vector<float>{0.5f, 1.5f, 2.0f}, Shape{3});
  ref::Array rma{{3}, {0.25, -0.5, 0.125}}, rva{{3}, {0.5, 1.5, 2.0}};
  for (ref::Dims xs : {ref::Dims{4, 3}, ref::Dims{2, 3, 4}}) {
    check_op({"batch_norm1d eval " + ref::str(xs),
              {x(xs), x({3}), x({3})},
              [&](const Vars& v) {
                bool f64 = v[0].dtype() == DType::f64;
                Var m = persistent_var(f64 ? rm : rm32, ValueKind::state, "running_mean");
                Var s = persistent_var(f64 ? rv : rv32, ValueKind::state, "running_var");
                return batch_norm1d(v[0], m, s, v[1], v[2], /*training=*/false);
              },
              [&](const Arrays& a) { return ref::batch_norm1d(a[0], a[1], a[2], &rma, &rva); }});
  }
}

TEST_CASE("nn::BatchNorm1d updates its running statistics once per step over N * L values", "[image14]") {
  using namespace frugal;
  nn::BatchNorm1d bn(2);
  std::vector<float> xv{0.5f, -1.f, 2.f, 0.25f, 1.5f, -0.75f, 3.f, 0.f, -2.f, 1.f, 0.5f, 0.125f};  // [2, 2, 3]
  Tensor x = Tensor::from(xv, Shape{2, 2, 3});
  // An inference step runs modules in eval mode unless told to train, as here.
  Step s = compile_inference([&] { return bn(persistent_var(x, ValueKind::parameter, "x")); }, {}, {},
                             {.training = true});
  int writers = 0;
  for (NodeId n : s.plan().schedule)
    if (!s.graph().node(n).op->mutated_inputs().empty()) ++writers;
  CHECK(writers == 1);
  std::vector<double> em{0, 0}, ev{1, 1};
  for (int run = 0; run < 2; ++run) {
    s.run();
    for (int c = 0; c < 2; ++c) {
      double m = 0, ss = 0;
      for (int n = 0; n < 2; ++n)
        for (int l = 0; l < 3; ++l) m += xv[std::size_t((n * 2 + c) * 3 + l)] / 6.0;
      for (int n = 0; n < 2; ++n)
        for (int l = 0; l < 3; ++l) ss += std::pow(xv[std::size_t((n * 2 + c) * 3 + l)] - m, 2);
      em[std::size_t(c)] = 0.9 * em[std::size_t(c)] + 0.1 * m;
      ev[std::size_t(c)] = 0.9 * ev[std::size_t(c)] + 0.1 * ss / 5.0;  // unbiased: n - 1 = 5
      INFO("run " << run << " channel " << c);
      CHECK(bn.running_mean.to_vector<float>()[std::size_t(c)] == Approx(em[std::size_t(c)]).margin(1e-6));
      CHECK(bn.running_var.to_vector<float>()[std::size_t(c)] == Approx(ev[std::size_t(c)]).margin(1e-6));
    }
    CHECK(bn.num_batches_tracked.item<std::int64_t>() == run + 1);
  }
}

// ---- errors --------------------------------------------------------------------------

TEST_CASE("bad shapes and parameters of the image ops raise a ShapeError naming what is wrong", "[image14][errors]") {
  using namespace frugal;
  auto convt = [](ConvTranspose2dOptions o = {}) {
    return [o](const Vars& v) {
      return conv_transpose2d(v[0], v[1], v.size() > 2 ? std::optional<Var>(v[2]) : std::nullopt, o);
    };
  };
  CHECK_THAT(shape_error(convt(), {T({2, 3, 5}), T({3, 2, 3, 3})}),
             Contains("conv_transpose2d") && Contains("[2, 3, 5]") && Contains("[N, C, H, W]"));
  CHECK_THAT(shape_error(convt(), {T({2, 3, 5, 5}), T({4, 2, 3, 3})}),
             Contains("conv_transpose2d") && Contains("[4, 2, 3, 3]") && Contains("in_channels = 3, got 4"));
  CHECK_THAT(shape_error(convt({.groups = 2}), {T({2, 3, 5, 5}), T({3, 1, 3, 3})}),
             Contains("in_channels 3 is not divisible by groups 2"));
  CHECK_THAT(shape_error(convt({.stride = 2, .output_padding = 2}), {T({1, 2, 4, 4}), T({2, 2, 3, 3})}),
             Contains("conv_transpose2d") && Contains("output_padding must be smaller than either stride or dilation"));
  CHECK_THAT(shape_error(convt({.padding = 3}), {T({1, 2, 2, 2}), T({2, 2, 3, 3})}),
             Contains("conv_transpose2d") && Contains("the padding is too large"));
  CHECK_THAT(shape_error(convt(), {T({1, 2, 4, 4}), T({2, 3, 3, 3}), T({2})}),
             Contains("conv_transpose2d") && Contains("bias [2]") && Contains("expected [3]"));
  CHECK_THAT(shape_error(convt({.stride = 0}), {T({1, 2, 4, 4}), T({2, 2, 3, 3})}),
             Contains("stride must be at least 1"));
  CHECK_THAT(shape_error(convt(), {T({1, 2, 4, 4}, DType::bf16), T({2, 2, 3, 3}, DType::bf16)}),
             Contains("conv_transpose2d") && Contains("f32 or f64"));

  auto up = [](UpsampleMode m, Upsample2dOptions o) {
    return [m, o](const Vars& v) {
      return m == UpsampleMode::nearest ? upsample_nearest2d(v[0], o) : upsample_bilinear2d(v[0], o);
    };
  };
  CHECK_THAT(shape_error(up(UpsampleMode::nearest, {}), {T({1, 2, 3, 3})}),
             Contains("upsample_nearest2d") && Contains("exactly one of size and scale_factor"));
  CHECK_THAT(shape_error(up(UpsampleMode::bilinear, {.size = Size2{4, 4}, .scale_factor = 2.0}), {T({1, 2, 3, 3})}),
             Contains("upsample_bilinear2d") && Contains("exactly one of size and scale_factor"));
  CHECK_THAT(shape_error(up(UpsampleMode::nearest, {.scale_factor = 2.0, .align_corners = true}), {T({1, 2, 3, 3})}),
             Contains("align_corners only applies to bilinear"));
  CHECK_THAT(shape_error(up(UpsampleMode::nearest, {.scale_factor = 0.1}), {T({1, 2, 3, 3})}),
             Contains("upsample_nearest2d") && Contains("[1, 2, 3, 3]") && Contains("empty output"));
  CHECK_THAT(shape_error(up(UpsampleMode::bilinear, {.scale_factor = -2.0}), {T({1, 2, 3, 3})}),
             Contains("must be positive and finite"));
  CHECK_THAT(shape_error(up(UpsampleMode::bilinear, {.size = Size2{0, 4}}), {T({1, 2, 3, 3})}),
             Contains("output size (0, 4) must be positive"));
  CHECK_THAT(shape_error(up(UpsampleMode::bilinear, {.scale_factor = 2.0}), {T({2, 3, 3})}),
             Contains("upsample_bilinear2d") && Contains("[2, 3, 3]") && Contains("[N, C, H, W]"));

  CHECK_THAT(shape_error([](const Vars& v) { return group_norm(v[0], 4, v[1], v[2]); }, {T({2, 6, 3}), T({6}), T({6})}),
             Contains("group_norm") && Contains("num_channels 6") && Contains("not divisible by num_groups 4"));
  CHECK_THAT(shape_error([](const Vars& v) { return group_norm(v[0], 2, v[1], v[2]); }, {T({2, 6, 3}), T({4}), T({6})}),
             Contains("group_norm") && Contains("weight [4]") && Contains("expected [6]"));
  CHECK_THAT(shape_error([](const Vars& v) { return group_norm(v[0], 2); }, {T({6})}),
             Contains("group_norm") && Contains("[N, C, *]"));
  CHECK_THAT(shape_error([](const Vars& v) { return group_norm(v[0], 2, v[1]); }, {T({2, 6, 3}), T({6})}),
             Contains("give both weight and bias"));

  CHECK_THAT(shape_error([](const Vars& v) { return batch_norm1d_train(v[0], v[1], v[2]).y; },
                         {T({2, 3, 4, 5}), T({3}), T({3})}),
             Contains("batch_norm1d") && Contains("[N, C] or [N, C, L]") && Contains("[2, 3, 4, 5]"));
  CHECK_THAT(shape_error([](const Vars& v) { return batch_norm1d_train(v[0], v[1], v[2]).y; },
                         {T({1, 3}), T({3}), T({3})}),
             Contains("batch_norm1d") && Contains("more than 1 value per channel"));

  CHECK_THROWS_WITH(nn::ConvTranspose2d(4, 6, 3, {.groups = 4}), Contains("divisible by groups 4"));
  CHECK_THROWS_WITH(nn::GroupNorm(4, 6), Contains("num_channels 6 must be divisible by num_groups 4"));
  CHECK_THROWS_WITH(nn::Upsample({}), Contains("exactly one of size and scale_factor"));
  CHECK_THROWS_WITH(nn::BatchNorm1d(0), Contains("num_features must be positive"));
}

// ---- layers -------------------------------------------------------------------------------

TEST_CASE("the image layers initialise and name their tensors as PyTorch does", "[image14][nn]") {
  using namespace frugal;
  nn::manual_seed(7);
  nn::ConvTranspose2d ct(16, 32, 3, {.stride = 2});
  CHECK(names_of(ct.named_parameters()) == std::vector<std::string>{"weight", "bias"});
  CHECK(ct.weight.shape() == Shape{16, 32, 3, 3});
  CHECK(ct.bias.shape() == Shape{32});
  // PyTorch's fan_in for a transposed convolution's weight is weight.size(1) * kH * kW = 32 * 9.
  const double bound = 1 / std::sqrt(288.0);
  auto w = ct.weight.to_vector<float>();
  double mean = 0, var = 0, top = 0;
  for (float v : w) {
    REQUIRE(std::abs(v) <= bound);
    mean += v / double(w.size());
    top = std::max(top, double(std::abs(v)));
  }
  for (float v : w) var += (v - mean) * (v - mean) / double(w.size());
  CHECK(top > 0.9 * bound);  // the bound is the right one, not a smaller one
  CHECK(mean == Approx(0).margin(0.05 * bound));
  CHECK(var == Approx(bound * bound / 3).epsilon(0.05));
  for (float v : ct.bias.to_vector<float>()) CHECK(std::abs(v) <= bound);
  nn::ConvTranspose2d grouped(4, 6, {2, 1}, {.groups = 2, .bias = false});
  CHECK(grouped.weight.shape() == Shape{4, 3, 2, 1});
  CHECK(names_of(grouped.named_parameters()) == std::vector<std::string>{"weight"});

  nn::GroupNorm gn(2, 4);
  CHECK(names_of(gn.named_parameters()) == std::vector<std::string>{"weight", "bias"});
  CHECK(gn.weight.to_vector<float>() == std::vector<float>{1, 1, 1, 1});
  CHECK(gn.bias.to_vector<float>() == std::vector<float>{0, 0, 0, 0});
  CHECK(nn::GroupNorm(2, 4, {.affine = false}).parameters().empty());

  nn::BatchNorm1d bn(3);
  CHECK(names_of(bn.named_parameters()) == std::vector<std::string>{"weight", "bias"});
  CHECK(names_of(bn.named_buffers()) == std::vector<std::string>{"running_mean", "running_var", "num_batches_tracked"});
  CHECK(bn.running_var.to_vector<float>() == std::vector<float>{1, 1, 1});

  nn::Upsample up({.scale_factor = 2.0}, UpsampleMode::bilinear);
  CHECK(up.parameters().empty());
  // Shapes through the layers: (4 - 1) * 2 + 3 = 9, then twice that.
  Step s = compile_inference(
      [&](Var x) {
        Var h = ct(x);
        CHECK(h.shape() == Shape{2, 32, 9, 9});
        Var u = up(h);
        CHECK(u.shape() == Shape{2, 32, 18, 18});
        return u;
      },
      {input<float>({2, 16, 4, 4})});
  CHECK(s.plan().schedule.size() > 0);
}

// ---- a model of them all, under a budget ----------------------------------------------------

namespace {

// Conv2d -> GroupNorm -> ConvTranspose2d -> BatchNorm1d (over [N, C, H*W])
// -> nearest and bilinear upsampling -> Conv2d: every new op in one training step.
struct TinyAutoencoder : frugal::nn::Module {
  frugal::nn::Conv2d enc{1, 8, 3, {.stride = 2, .padding = 1}};            // 16 -> 8
  frugal::nn::GroupNorm gn{4, 8};
  frugal::nn::ConvTranspose2d dec{8, 8, 3, {.stride = 2, .padding = 1, .output_padding = 1}};  // 8 -> 16
  frugal::nn::BatchNorm1d bn{8};
  frugal::nn::Upsample up_nearest{{.scale_factor = 2.0}};                   // 16 -> 32
  frugal::nn::Upsample up_bilinear{{.size = frugal::Size2{16, 16}}, frugal::UpsampleMode::bilinear};  // 32 -> 16
  frugal::nn::Conv2d out{8, 1, 3, {.padding = 1}};
  TinyAutoencoder() {
    register_module("enc", enc);
    register_module("gn", gn);
    register_module("dec", dec);
    register_module("bn", bn);
    register_module("up_nearest", up_nearest);
    register_module("up_bilinear", up_bilinear);
    register_module("out", out);
  }
  Var forward(Var x) {
    using namespace frugal;
    const std::int64_t n = x.dim(0);
    Var h = relu(gn(enc(x)));
    h = dec(h);
    h = ops::reshape(relu(bn(ops::reshape(h, {n, 8, 256}))), {n, 8, 16, 16});
    return out(up_bilinear(up_nearest(h)));
  }
};

struct AeRun {
  std::vector<float> losses;
  std::vector<std::vector<char>> tensors;  // parameters and buffers, in order
  frugal::Plan plan;
};

// With `audit`, fills the arena and a canary beyond it, runs one step and
// checks that the highest byte written is the plan's prediction (the
// transposed convolutions' scratch is planned, not allocated), then stops.
AeRun train_autoencoder(frugal::Budget budget, int steps, bool audit = false) {
  using namespace frugal;
  nn::manual_seed(11);
  TinyAutoencoder m;
  optim::AdamW opt(m.parameters(), {.lr = 1e-2});
  Step step = compile(
      [&](Var x) {
        Var d = m.forward(x) - x;
        return mean(d * d);  // TODO(mse_loss)
      },
      {input<float>({4, 1, 16, 16})}, opt, budget);
  AeRun r;
  r.plan = step.plan();
  if (audit) {
    Tensor x({4, 1, 16, 16});
    for (std::int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = float(i % 7) / 7.f;
    auto a = step.audit(x);
    CHECK(a.canary_intact);
    CHECK(a.high_water == a.predicted);
    CHECK(step.verify().ok());
    return r;
  }
  for (int s = 0; s < steps; ++s) {
    Rng rng(100 + std::uint64_t(s));
    Tensor x({4, 1, 16, 16});
    for (std::int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = float(rng.uniform());
    r.losses.push_back(step.run(x));
  }
  auto keep = [&](const Tensor& t) {
    std::vector<char> b(t.nbytes());
    std::memcpy(b.data(), t.raw(), t.nbytes());
    r.tensors.push_back(std::move(b));
  };
  for (auto& [name, t] : m.named_parameters()) keep(t);
  for (auto& [name, t] : m.named_buffers()) keep(t);
  return r;
}

}  // namespace

TEST_CASE("a model of the image ops trains under a tight budget bit for bit as unconstrained", "[image14][budget]") {
  using namespace frugal;
  AeRun free = train_autoencoder({}, 3);
  REQUIRE(free.losses.size() == 3);
  CHECK(free.losses[2] < free.losses[0]);  // it learns
  const std::size_t unconstrained = free.plan.total_bytes();
  const std::size_t least = train_autoencoder(Budget{.device = unconstrained - 1}, 0).plan.min_feasible_bytes;
  REQUIRE(least < unconstrained);
  for (std::size_t budget : {least, (least + unconstrained) / 2}) {
    INFO("budget " << budget << " of " << unconstrained << " (least " << least << ")");
    AeRun tight = train_autoencoder(Budget{.device = budget}, 3);
    CHECK(tight.plan.total_bytes() <= budget);
    CHECK_FALSE(tight.plan.decisions.empty());
    CHECK(tight.losses == free.losses);
    CHECK(tight.tensors == free.tensors);
  }
  train_autoencoder(Budget{.device = least}, 0, true);
  train_autoencoder({}, 0, true);
}
