// Convolution, batch normalisation and pooling: every op forward (f32 and
// f64 against the float64 references in reference_conv.hpp) and backward
// (against central finite differences) through op_harness.hpp; the kernels'
// chunked and multi-threaded paths; bf16/f16 storage; the errors; the nn
// layers and ResNets, and a ResNet training step.
#include <omp.h>

#include <cstring>

#include "op_harness.hpp"
#include "reference_conv.hpp"

using namespace optest;
using frugal::DType;
using frugal::Var;
using Catch::Matchers::Contains;

namespace {

// ---- conv2d cases ------------------------------------------------------------

struct ConvCase {
  std::string name;
  ref::Dims x, w;
  frugal::Conv2dOptions o;
  bool bias = false;
  double f32_scale = 1;
};

ref::Conv2dParams ref_params(const frugal::Conv2dOptions& o) {
  return {o.stride.h, o.stride.w, o.padding.h, o.padding.w, o.dilation.h, o.dilation.w, o.groups};
}

Case conv_case(const ConvCase& c) {
  std::vector<In> in{x(c.x), x(c.w)};
  if (c.bias) in.push_back(x({c.w[0]}));
  auto o = c.o;
  bool bias = c.bias;
  return {"conv2d " + c.name, in,
          [o, bias](const Vars& v) {
            return frugal::conv2d(v[0], v[1], bias ? std::optional<Var>(v[2]) : std::nullopt, o);
          },
          [o, bias](const Arrays& a) { return ref::conv2d(a[0], a[1], bias ? &a[2] : nullptr, ref_params(o)); },
          c.f32_scale};
}

}  // namespace

TEST_CASE("conv2d forward and backward against the reference and finite differences", "[conv]") {
  // f32 tolerance: the cases sum at most 36 products of size <= 1, so f32
  // rounding stays below 36 * 6e-8 ~ 2e-6, within the harness's 1e-5.
  const ConvCase cases[] = {
      {"3x3 pad 1 with bias [2,3,5,5]*[4,3,3,3]", {2, 3, 5, 5}, {4, 3, 3, 3}, {.padding = 1}, true},
      {"3x3 no padding [2,2,5,4]*[3,2,3,3]", {2, 2, 5, 4}, {3, 2, 3, 3}, {}, false},
      {"3x3 stride 2 pad 1 [2,2,6,5]*[3,2,3,3]", {2, 2, 6, 5}, {3, 2, 3, 3}, {.stride = 2, .padding = 1}, false},
      {"one image [1,3,5,5]*[2,3,3,3] pad 1", {1, 3, 5, 5}, {2, 3, 3, 3}, {.padding = 1}, true},
      {"1x1 pointwise [2,4,3,3]*[5,4,1,1]", {2, 4, 3, 3}, {5, 4, 1, 1}, {}, true},
      {"1x1 pointwise one image [1,4,3,3]*[3,4,1,1]", {1, 4, 3, 3}, {3, 4, 1, 1}, {}, false},
      {"1x1 stride 2 (projection shortcut) [2,3,5,5]*[4,3,1,1]", {2, 3, 5, 5}, {4, 3, 1, 1}, {.stride = 2}, false},
      {"dilation 2 [1,2,7,7]*[2,2,3,3] pad 2", {1, 2, 7, 7}, {2, 2, 3, 3}, {.padding = 2, .dilation = 2}, false},
      {"groups 2 [2,4,4,4]*[6,2,3,3] pad 1", {2, 4, 4, 4}, {6, 2, 3, 3}, {.padding = 1, .groups = 2}, true},
      {"depthwise groups 3 [2,3,5,5]*[3,1,3,3] pad 1", {2, 3, 5, 5}, {3, 1, 3, 3}, {.padding = 1, .groups = 3}, false},
      {"asymmetric 2x3 stride (2,1) pad (0,1)", {2, 2, 5, 6}, {3, 2, 2, 3}, {.stride = {2, 1}, .padding = {0, 1}}, true},
      {"kernel covers the input: 1x1 output", {2, 2, 3, 3}, {2, 2, 3, 3}, {}, false},
      {"padding wider than the input [1,1,2,2]*[2,1,3,3] pad 2", {1, 1, 2, 2}, {2, 1, 3, 3}, {.padding = 2}, false},
      {"stride larger than the kernel [2,2,7,7]*[2,2,2,2] stride 3", {2, 2, 7, 7}, {2, 2, 2, 2}, {.stride = 3}, false},
      {"several chunks, a shorter last one [3,1,16,16]*[2,1,3,3] pad 1", {3, 1, 16, 16}, {2, 1, 3, 3}, {.padding = 1}, true},
  };
  for (const auto& c : cases) check_op(conv_case(c));
}
