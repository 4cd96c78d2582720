// Convolution, batch normalisation and pooling: every op forward (f32 and
// f64 against the float64 references in reference_conv.hpp) and backward
// (against central finite differences) through op_harness.hpp; the kernels'
// chunked and multi-threaded paths; bf16/f16 storage; the errors; the nn
// layers and ResNets, and a ResNet training step.
#include <omp.h>

#include <cstring>
#include <functional>

#include "cpu_isa_scope.hpp"
#include "op_harness.hpp"
#include <frugal/backend/cpu/conv.hpp>  // the kernels themselves, for chunking and engine checks
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

// Steps the harness (and run_op) compile use this engine while it lives.
struct EngineChoice {
  std::string saved = harness_options().backend_options.conv_engine;
  explicit EngineChoice(frugal::cpu::ConvEngine e) {
    harness_options().backend_options.conv_engine = e == frugal::cpu::ConvEngine::blas ? "blas" : "avx512";
  }
  ~EngineChoice() { harness_options().backend_options.conv_engine = saved; }
};

// The engines this CPU can run: BLAS always, AVX-512 where the CPU has it.
std::vector<frugal::cpu::ConvEngine> engines() {
  std::vector<frugal::cpu::ConvEngine> e{frugal::cpu::ConvEngine::blas};
  if (frugal::cpu::conv_fast::available()) e.push_back(frugal::cpu::ConvEngine::avx512);
  return e;
}
const char* engine_name(frugal::cpu::ConvEngine e) { return e == frugal::cpu::ConvEngine::blas ? "blas" : "avx512"; }

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
      // Stride 1 with padding past the kernel: the data gradient is not a plain convolution.
      {"1x1 pad 1 [2,2,3,3]*[3,2,1,1]", {2, 2, 3, 3}, {3, 2, 1, 1}, {.padding = 1}, true},
      {"3x3 pad (3,0) [1,2,3,4]*[2,2,3,3]", {1, 2, 3, 4}, {2, 2, 3, 3}, {.padding = {3, 0}}, false},
      {"a kernel wider than 16 taps [1,1,2,20]*[2,1,1,17] pad (0,1)", {1, 1, 2, 20}, {2, 1, 1, 17}, {.padding = {0, 1}}, false},
      {"several chunks, a shorter last one [3,1,16,16]*[2,1,3,3] pad 1", {3, 1, 16, 16}, {2, 1, 3, 3}, {.padding = 1}, true},
  };
  for (auto engine : engines()) {
    EngineChoice ec(engine);
    INFO("engine " << engine_name(engine));
    for (const auto& c : cases) check_op(conv_case(c));
  }
}

// ---- conv2d kernels: chunking, threads, determinism ----------------------------

namespace {

std::vector<float> random_floats(std::int64_t n, std::uint64_t seed) {
  frugal::Rng r(seed);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (auto& e : v) e = float(r.uniform(-1, 1));
  return v;
}

ref::Array as_array(const std::vector<float>& v, ref::Dims shape) {
  ref::Array a{std::move(shape), {}};
  a.v.assign(v.begin(), v.end());
  return a;
}

// |got - want| <= 2 k 2^-24 * sum|w||x| + 1e-6: the standard bound for a
// sum of k products rounded in f32 (k 2^-24 relative to the sum of the
// magnitudes), doubled for col2im's and the chunks' extra additions.
void expect_f32_close(const std::string& what, const std::vector<float>& got, const ref::Array& want,
                      const ref::Array& scale, std::int64_t k) {
  REQUIRE(got.size() == want.v.size());
  std::size_t bad = 0, worst = 0;
  double worst_ratio = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    double bound = 2.0 * double(k) * std::ldexp(1.0, -24) * scale.v[i] + 1e-6;
    double r = std::abs(double(got[i]) - want.v[i]) / bound;
    if (!(r <= 1)) ++bad;
    if (!(r <= worst_ratio)) worst_ratio = r, worst = i;
  }
  INFO(what << ": " << bad << " elements out of bound; worst at " << worst << " got " << got[worst] << " want "
            << want.v[worst] << " (" << worst_ratio << " x the bound)");
  CHECK(bad == 0);
}

struct Workspace {
  std::vector<std::byte> bytes;
  frugal::KernelArgs args(const frugal::cpu::ConvScratch& s) {
    bytes.assign(s.bytes() + 256, std::byte{0});
    frugal::KernelArgs a;
    auto p = reinterpret_cast<std::uintptr_t>(bytes.data());
    a.workspace = bytes.data() + ((256 - p % 256) % 256);
    a.workspace_bytes = s.bytes();
    return a;
  }
};


}  // namespace

TEST_CASE("conv2d's backward returns one entry per input, with or without bias and an output gradient", "[conv]") {
  for (bool bias : {false, true}) {
    frugal::Graph g;
    frugal::CaptureScope scope(g);
    Var x{&g, g.add_input({DType::f32, {1, 2, 5, 5}}, "x")}, w{&g, g.add_input({DType::f32, {3, 2, 3, 3}}, "w")};
    Var b{&g, g.add_input({DType::f32, {3}}, "b")};
    Var y = frugal::conv2d(x, w, bias ? std::optional<Var>(b) : std::nullopt);
    std::vector<Var> ins{x, w};
    if (bias) ins.push_back(b);
    std::vector<Var> outs{y};
    auto op = g.node(frugal::NodeId(g.num_nodes()) - 1).op;
    std::vector<std::optional<Var>> absent{std::nullopt}, present{y};
    INFO("bias " << bias);
    auto none = op->backward({ins, outs, absent});
    CHECK(none.size() == ins.size());
    for (auto& gi : none) CHECK_FALSE(gi.has_value());
    auto some = op->backward({ins, outs, present});
    REQUIRE(some.size() == ins.size());
    for (std::size_t k = 0; k < ins.size(); ++k) CHECK(some[k]->shape() == ins[k].shape());
  }
}

TEST_CASE("conv2d kernels give the reference result for every chunk size and thread count", "[conv][threads]") {
  using namespace frugal;
  // Each large enough (> 4 MFLOP) that the kernels take their parallel path.
  struct Shape4 {
    const char* name;
    ref::Dims x, w;
    Conv2dOptions o;
  };
  const Shape4 shapes[] = {
      {"3x3 pad 1 [5,16,16,16]*[16,16,3,3]", {5, 16, 16, 16}, {16, 16, 3, 3}, {.padding = 1}},
      {"3x3 stride 2 groups 2 [5,32,16,16]*[64,16,3,3]", {5, 32, 16, 16}, {64, 16, 3, 3}, {.stride = 2, .padding = 1, .groups = 2}},
      {"1x1 [5,64,16,16]*[32,64,1,1]", {5, 64, 16, 16}, {32, 64, 1, 1}, {}},
  };
  for (const auto& sh : shapes) {
    const Shape xs(sh.x), ws(sh.w);
    const auto g = ops::conv_geometry("test", xs, ws, sh.o);
    auto x = random_floats(xs.numel(), 1), w = random_floats(ws.numel(), 2);
    auto dy = random_floats(g.n * g.cout * g.hw_out(), 3);
    const ref::Array xa = as_array(x, sh.x), wa = as_array(w, sh.w), dya = as_array(dy, {g.n, g.cout, g.ho, g.wo});
    const auto p = ref_params(sh.o);
    const ref::Array want_y = ref::conv2d(xa, wa, nullptr, p), scale_y = ref::conv2d_abs(xa, wa, p);
    ref::Array want_dx, want_dw, scale_dx, scale_dw;
    ref::conv2d_backward(xa, wa, dya, p, want_dx, want_dw);
    {
      ref::Array ax = xa, aw = wa, ady = dya;
      for (auto* arr : {&ax, &aw, &ady})
        for (auto& e : arr->v) e = std::abs(e);
      ref::conv2d_backward(ax, aw, ady, p, scale_dx, scale_dw);
    }
    for (auto engine : engines())
    for (int threads : {1, 2, 3}) {
      EngineChoice ec(engine);
      ThreadCount tc(threads);
      for (std::int64_t images : {std::int64_t(1), std::int64_t(2), std::int64_t(3), std::int64_t(5)}) {
        const std::string what =
            cat(sh.name, ", ", engine_name(engine), ", ", threads, " threads, ", images, " images per chunk");
        Workspace wf, wd, ww;
        // Direct, whatever the shape (Winograd has its own test below).
        const auto direct = cpu::ConvAlgorithm::direct;
        auto sf = cpu::conv_scratch(g, DType::f32, cpu::ConvPass::forward, images, direct);
        auto sd = cpu::conv_scratch(g, DType::f32, cpu::ConvPass::backward_data, images, direct);
        auto sw = cpu::conv_scratch(g, DType::f32, cpu::ConvPass::backward_weight, images, direct);
        auto af = wf.args(sf), ad = wd.args(sd), aw = ww.args(sw);
        std::vector<float> y(want_y.v.size()), dx(x.size()), dw(w.size()), y2(y.size()), dw2(dw.size());
        cpu::conv2d_forward<float>(engine, g, sf, cpu::conv_detail::carve<float>(sf, af, "t"), x.data(), w.data(), nullptr,
                                   y.data());
        cpu::conv2d_backward_data<float>(engine, g, sd, cpu::conv_detail::carve<float>(sd, ad, "t"), dy.data(), w.data(),
                                         dx.data());
        cpu::conv2d_backward_weight<float>(engine, g, sw, cpu::conv_detail::carve<float>(sw, aw, "t"), x.data(), dy.data(),
                                           dw.data(), nullptr);
        expect_f32_close(what + " forward", y, want_y, scale_y, g.k());
        expect_f32_close(what + " data gradient", dx, want_dx, scale_dx, g.cout_g() * g.kh * g.kw);
        expect_f32_close(what + " weight gradient", dw, want_dw, scale_dw, g.n * g.hw_out());
        // Same inputs, same thread count: the same bits.
        cpu::conv2d_forward<float>(engine, g, sf, cpu::conv_detail::carve<float>(sf, af, "t"), x.data(), w.data(), nullptr,
                                   y2.data());
        cpu::conv2d_backward_weight<float>(engine, g, sw, cpu::conv_detail::carve<float>(sw, aw, "t"), x.data(), dy.data(),
                                           dw2.data(), nullptr);
        INFO(what);
        CHECK(std::memcmp(y.data(), y2.data(), y.size() * 4) == 0);
        CHECK(std::memcmp(dw.data(), dw2.data(), dw.size() * 4) == 0);
      }
    }
  }
}

namespace {

// Per-element error bounds of Winograd F(m x m, 3x3)'s forward y =
// conv(x, w) (x [n][I][h][w], w [O][I][3][3], padding ph, pw; y [n][O][ho][wo]).
// Computed as the standard first-order bound of a sum-and-product
// evaluation: |err| <= k 2^-24 (|Aᵀ| [Σ_i (|G| |g| |Gᵀ|) ⊙ (|Bᵀ| |d| |B|)] |A|),
// the same computation on absolute values, where k is the most roundings
// along any path from an input to the output:
// - F(2x2, 3x3): 1 + 1 in the input transform (coefficients 0, ±1), 2 + 2
//   in the weight's (±1/2 are exact), I + 1 in the products over the
//   channels, 2 + 3 in the output transform with the bias: k = I + 12;
// - F(4x4, 3x3): 2 + 2 in the input transform (×4 and ×2 are exact, ×5 is
//   not), 4 + 4 in the weight's (two sums, the factor 1/6 or 1/24 that is
//   itself rounded, and its product), I + 1, and 3 + 4 in the output
//   transform (×2, ×4, ×8 exact): k = I + 20.
// (conv_winograd.hpp's transforms add in the orders these counts assume.)
struct WinogradMatrices {
  int m;
  std::vector<std::vector<double>> bt, g, at;  // |Bᵀ| (m+2)x(m+2), |G| (m+2)x3, |Aᵀ| m x(m+2)
};
WinogradMatrices winograd_matrices(int m) {
  if (m == 2)
    return {2,
            {{1, 0, 1, 0}, {0, 1, 1, 0}, {0, 1, 1, 0}, {0, 1, 0, 1}},
            {{1, 0, 0}, {.5, .5, .5}, {.5, .5, .5}, {0, 0, 1}},
            {{1, 1, 1, 0}, {0, 1, 1, 1}}};
  return {4,
          {{4, 0, 5, 0, 1, 0}, {0, 4, 4, 1, 1, 0}, {0, 4, 4, 1, 1, 0},
           {0, 2, 1, 2, 1, 0}, {0, 2, 1, 2, 1, 0}, {0, 4, 0, 5, 0, 1}},
          {{.25, 0, 0}, {1. / 6, 1. / 6, 1. / 6}, {1. / 6, 1. / 6, 1. / 6},
           {1. / 24, 1. / 12, 1. / 6}, {1. / 24, 1. / 12, 1. / 6}, {0, 0, 1}},
          {{1, 1, 1, 1, 1, 0}, {0, 1, 1, 2, 2, 0}, {0, 1, 1, 4, 4, 0}, {0, 1, 1, 8, 8, 1}}};
}
// A 3x3 convolution's Winograd tiles over an h x wd plane padded by ph, pw:
// the matrices, the transformed tile's side e and positions P, the output
// plane and the tiles across (tw) and down (th).
struct WinogradGrid {
  WinogradMatrices t;
  int e, P;
  std::int64_t ho, wo, th, tw;
};
WinogradGrid winograd_grid(int m, std::int64_t h, std::int64_t wd, std::int64_t ph, std::int64_t pw) {
  const std::int64_t ho = h + 2 * ph - 2, wo = wd + 2 * pw - 2;
  return {winograd_matrices(m), m + 2, (m + 2) * (m + 2), ho, wo, (ho + m - 1) / m, (wo + m - 1) / m};
}
// |Bᵀ| |d| |B| of every input channel's tile: [n][I][th][tw][P].
template <class X>
std::vector<double> abs_input_tiles(const WinogradGrid& grid, int m, const std::vector<X>& x, std::int64_t n,
                                    std::int64_t I, std::int64_t h, std::int64_t wd, std::int64_t ph, std::int64_t pw) {
  const WinogradMatrices& t = grid.t;
  const int e = grid.e, P = grid.P;
  const std::int64_t th = grid.th, tw = grid.tw;
  std::vector<double> V(std::size_t(n * I * th * tw * P));
  for (std::int64_t img = 0; img < n; ++img)
    for (std::int64_t i = 0; i < I; ++i)
      for (std::int64_t ty = 0; ty < th; ++ty)
        for (std::int64_t tx = 0; tx < tw; ++tx) {
          double* v = &V[std::size_t((((img * I + i) * th + ty) * tw + tx) * P)];
          for (int a = 0; a < e; ++a)
            for (int b = 0; b < e; ++b) {
              const std::int64_t iy = m * ty - ph + a, ix = m * tx - pw + b;
              if (iy < 0 || iy >= h || ix < 0 || ix >= wd) continue;
              const double d = std::abs(double(x[std::size_t(((img * I + i) * h + iy) * wd + ix)]));
              for (int r = 0; r < e; ++r)
                for (int c = 0; c < e; ++c) v[r * e + c] += t.bt[r][a] * d * t.bt[c][b];
            }
        }
  return V;
}
template <class X, class W>
std::vector<double> winograd_forward_bounds(int m, const std::vector<X>& x, const std::vector<W>& w, std::int64_t n,
                                            std::int64_t I, std::int64_t h, std::int64_t wd, std::int64_t O,
                                            std::int64_t ph, std::int64_t pw) {
  const WinogradGrid grid = winograd_grid(m, h, wd, ph, pw);
  const WinogradMatrices& t = grid.t;
  const int e = grid.e, P = grid.P;
  const std::int64_t ho = grid.ho, wo = grid.wo, th = grid.th, tw = grid.tw;
  const double k = double(I + (m == 2 ? 12 : 20)) * std::ldexp(1.0, -24);
  // |U| per kernel and |V| per channel's tile.
  std::vector<double> U(std::size_t(O * I * P));
  const std::vector<double> V = abs_input_tiles(grid, m, x, n, I, h, wd, ph, pw);
  for (std::int64_t oi = 0; oi < O * I; ++oi)
    for (int r = 0; r < e; ++r)
      for (int c = 0; c < e; ++c) {
        double sum = 0;
        for (int a = 0; a < 3; ++a)
          for (int b = 0; b < 3; ++b) sum += t.g[r][a] * std::abs(double(w[std::size_t(oi * 9 + a * 3 + b)])) * t.g[c][b];
        U[std::size_t(oi * P + r * e + c)] = sum;
      }
  std::vector<double> out(std::size_t(n * O * ho * wo));
  std::vector<double> S(static_cast<std::size_t>(P));
  for (std::int64_t img = 0; img < n; ++img)
    for (std::int64_t o = 0; o < O; ++o)
      for (std::int64_t ty = 0; ty < th; ++ty)
        for (std::int64_t tx = 0; tx < tw; ++tx) {
          std::fill(S.begin(), S.end(), 0.0);
          for (std::int64_t i = 0; i < I; ++i) {
            const double* u = &U[std::size_t((o * I + i) * P)];
            const double* v = &V[std::size_t((((img * I + i) * th + ty) * tw + tx) * P)];
            for (int q = 0; q < P; ++q) S[std::size_t(q)] += u[q] * v[q];
          }
          for (int a = 0; a < m; ++a)
            for (int b = 0; b < m; ++b) {
              const std::int64_t oy = m * ty + a, ox = m * tx + b;
              if (oy >= ho || ox >= wo) continue;
              double sum = 0;
              for (int r = 0; r < e; ++r)
                for (int c = 0; c < e; ++c) sum += t.at[a][r] * S[std::size_t(r * e + c)] * t.at[b][c];
              out[std::size_t(((img * O + o) * ho + oy) * wo + ox)] = k * sum + 1e-30;
            }
        }
  return out;
}

// Per-element error bounds of Winograd F(m x m, 3x3)'s weight gradient
// dw[o][i] = Gᵀ [Σ_tiles (A dY Aᵀ) ⊙ (Bᵀ d B)] G, the same first-order form:
// k 2^-24 (|Gᵀ| [Σ_tiles (|A| |dY| |Aᵀ|) ⊙ (|Bᵀ| |d| |B|)] |G|), with k the
// transforms' roundings (F(2x2, 3x3): 2 for dY, 2 for d, 4 for the inverse
// transform; F(4x4, 3x3): 4, 4 and 10, its factors 1/6, 1/12 and 1/24
// rounded and multiplied) plus the sum over the T tiles, at most 2T + 4
// roundings (the products' depth, one addition per chunk and per part).
template <class X>
std::vector<double> winograd_weight_bounds(int m, const std::vector<X>& x, const std::vector<X>& dy, std::int64_t n,
                                           std::int64_t I, std::int64_t h, std::int64_t wd, std::int64_t O,
                                           std::int64_t ph, std::int64_t pw) {
  const WinogradGrid grid = winograd_grid(m, h, wd, ph, pw);
  const WinogradMatrices& t = grid.t;
  const int e = grid.e, P = grid.P;
  const std::int64_t ho = grid.ho, wo = grid.wo, th = grid.th, tw = grid.tw;
  const std::int64_t T = n * th * tw;
  const double k = double(2 * T + 4 + (m == 2 ? 8 : 18)) * std::ldexp(1.0, -24);
  // |Bᵀ d B| per input channel's tile, |A dY Aᵀ| per output channel's tile.
  const std::vector<double> V = abs_input_tiles(grid, m, x, n, I, h, wd, ph, pw);
  std::vector<double> D(std::size_t(n * O * th * tw * P));
  for (std::int64_t img = 0; img < n; ++img)
    for (std::int64_t ty = 0; ty < th; ++ty)
      for (std::int64_t tx = 0; tx < tw; ++tx) {
        for (std::int64_t o = 0; o < O; ++o) {
          double* dv = &D[std::size_t((((img * O + o) * th + ty) * tw + tx) * P)];
          for (int a = 0; a < m; ++a)
            for (int b = 0; b < m; ++b) {
              const std::int64_t oy = m * ty + a, ox = m * tx + b;
              if (oy >= ho || ox >= wo) continue;
              const double d = std::abs(double(dy[std::size_t(((img * O + o) * ho + oy) * wo + ox)]));
              for (int r = 0; r < e; ++r)
                for (int c = 0; c < e; ++c) dv[r * e + c] += t.at[a][r] * d * t.at[b][c];
            }
        }
      }
  std::vector<double> out(std::size_t(O * I * 9));
  std::vector<double> S(static_cast<std::size_t>(P));
  for (std::int64_t o = 0; o < O; ++o)
    for (std::int64_t i = 0; i < I; ++i) {
      std::fill(S.begin(), S.end(), 0.0);
      for (std::int64_t img = 0; img < n; ++img)
        for (std::int64_t tile = 0; tile < th * tw; ++tile) {
          const double* dv = &D[std::size_t(((img * O + o) * th * tw + tile) * P)];
          const double* v = &V[std::size_t(((img * I + i) * th * tw + tile) * P)];
          for (int q = 0; q < P; ++q) S[std::size_t(q)] += dv[q] * v[q];
        }
      for (int a = 0; a < 3; ++a)
        for (int b = 0; b < 3; ++b) {
          double sum = 0;
          for (int r = 0; r < e; ++r)
            for (int c = 0; c < e; ++c) sum += t.g[r][a] * S[std::size_t(r * e + c)] * t.g[c][b];
          out[std::size_t((o * I + i) * 9 + a * 3 + b)] = k * sum + 1e-30;
        }
    }
  return out;
}

void expect_within(const std::string& what, const std::vector<float>& got, const ref::Array& want,
                   const std::function<double(std::size_t)>& bound) {
  REQUIRE(got.size() == want.v.size());
  std::size_t bad = 0, worst = 0;
  double worst_ratio = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double r = std::abs(double(got[i]) - want.v[i]) / bound(i);
    if (!(r <= 1)) ++bad;
    if (!(r <= worst_ratio)) worst_ratio = r, worst = i;
  }
  INFO(what << ": " << bad << " elements out of bound; worst at " << worst << " got " << got[worst] << " want "
            << want.v[worst] << " (" << worst_ratio << " x the bound)");
  CHECK(bad == 0);
}

// A Winograd test's convolution: x [n, c, h, w] * w [o, c, 3, 3], padding pad.
struct WinogradShape {
  const char* name;
  ref::Dims x, w;
  std::int64_t pad;
};
// Shapes of both Winograd tests: partial tiles, slivers and panels.
const WinogradShape kOddWinogradShapes[] = {
    {"[2,16,7,9]*[20,16,3,3] pad 1", {2, 16, 7, 9}, {20, 16, 3, 3}, 1},
    {"[3,17,8,8]*[16,17,3,3] pad 0", {3, 17, 8, 8}, {16, 17, 3, 3}, 0},
};

}  // namespace

TEST_CASE("Winograd F(2x2,3x3) and F(4x4,3x3) convolutions meet their error bound against float64, with the same bits at any thread count",
          "[conv][winograd][threads]") {
  using namespace frugal;
  // Odd and even planes (partial tiles), every padding Winograd takes,
  // channel counts off the GEMM tiles, a plane of one tile, a wide row.
  std::vector<WinogradShape> shapes(std::begin(kOddWinogradShapes), std::end(kOddWinogradShapes));
  shapes.insert(shapes.end(), {
      {"[1,16,5,6]*[16,16,3,3] pad 2", {1, 16, 5, 6}, {16, 16, 3, 3}, 2},
      {"[4,32,2,2]*[24,32,3,3] pad 1", {4, 32, 2, 2}, {24, 32, 3, 3}, 1},
      // 66 tiles a row: a transform segment (64 tiles) and a partial one.
      {"[1,16,4,131]*[16,16,3,3] pad 1", {1, 16, 4, 131}, {16, 16, 3, 3}, 1},
      // Rows of at least kGatherBelow tiles (the item transforms, where the
      // planes above gather), with a partial last tile row and column.
      {"[2,16,7,70]*[20,16,3,3] pad 1", {2, 16, 7, 70}, {20, 16, 3, 3}, 1},
  });
  int transforms[2][2] = {};  // [F(2x2), F(4x4)][by items, gathered]: both ways each
  for (const auto& sh : shapes) {
    const Shape xs(sh.x), ws(sh.w);
    const Conv2dOptions opt{.padding = sh.pad};
    const auto g = ops::conv_geometry("test", xs, ws, opt);
    REQUIRE(cpu::winograd_shape(g));
    auto x = random_floats(xs.numel(), 11), w = random_floats(ws.numel(), 12);
    auto dy = random_floats(g.n * g.cout * g.hw_out(), 13);
    const ref::Array xa = as_array(x, sh.x), wa = as_array(w, sh.w), dya = as_array(dy, {g.n, g.cout, g.ho, g.wo});
    const auto p = ref_params(opt);
    const ref::Array want_y = ref::conv2d(xa, wa, nullptr, p);
    ref::Array want_dx, want_dw;
    ref::conv2d_backward(xa, wa, dya, p, want_dx, want_dw);
    // The data gradient is the forward of dy by the flipped kernel (padding
    // 2 - pad), so its bound is that forward's.
    std::vector<float> wf(w.size());
    for (std::int64_t o = 0; o < g.cout; ++o)
      for (std::int64_t i = 0; i < g.cin; ++i)
        for (int t = 0; t < 9; ++t) wf[std::size_t((i * g.cout + o) * 9 + t)] = w[std::size_t((o * g.cin + i) * 9 + 8 - t)];
    std::vector<double> y_bounds[2], dx_bounds[2];  // F(2x2, 3x3), F(4x4, 3x3)
    for (int f = 0; f < 2; ++f) {
      y_bounds[f] = winograd_forward_bounds(2 + 2 * f, x, w, g.n, g.cin, g.h, g.w, g.cout, g.ph, g.pw);
      dx_bounds[f] = winograd_forward_bounds(2 + 2 * f, dy, wf, g.n, g.cout, g.ho, g.wo, g.cin, 2 - g.ph, 2 - g.pw);
    }
    const std::vector<double> dw_bounds[2] = {
        winograd_weight_bounds(2, x, dy, g.n, g.cin, g.h, g.w, g.cout, g.ph, g.pw),
        winograd_weight_bounds(4, x, dy, g.n, g.cin, g.h, g.w, g.cout, g.ph, g.pw)};
    for (int f = 0; f < 2; ++f)
    for (std::int64_t tiles : {std::int64_t(1), std::int64_t(7), std::int64_t(40), std::int64_t(0)}) {
      std::vector<float> first_y, first_dx, first_dw;
      for (int threads : {1, 2, 3}) {
        ThreadCount tc(threads);
        const std::string what = cat(sh.name, ", F(", 2 + 2 * f, "x", 2 + 2 * f, ",3x3), ", threads,
                                     " threads, tile target ", tiles);
        Workspace wfw, wd, ww;
        // Whatever the cost rules say of these small shapes.
        const auto wino = f == 0 ? cpu::ConvAlgorithm::winograd_f2 : cpu::ConvAlgorithm::winograd_f4;
        auto sf = cpu::conv_scratch(g, DType::f32, cpu::ConvPass::forward, tiles, wino);
        auto sd = cpu::conv_scratch(g, DType::f32, cpu::ConvPass::backward_data, tiles, wino);
        auto sw = cpu::conv_scratch(g, DType::f32, cpu::ConvPass::backward_weight, tiles, wino);
        REQUIRE((sf.winograd && sd.winograd && sw.winograd));
        REQUIRE((sf.tiles.m == 2 + 2 * f && sd.tiles.m == 2 + 2 * f && sw.tiles.m == 2 + 2 * f));
        ++transforms[f][cpu::winograd::gathered(sf.tiles)];
        auto af = wfw.args(sf), ad = wd.args(sd), aw = ww.args(sw);
        std::vector<float> y(want_y.v.size()), dx(x.size()), dw(w.size());
        // Either engine: Winograd runs for both (its products on the float GEMM engine).
        const auto engine = engines().back();
        cpu::conv2d_forward<float>(engine, g, sf, cpu::conv_detail::carve<float>(sf, af, "t"), x.data(), w.data(),
                                   nullptr, y.data());
        cpu::conv2d_backward_data<float>(engine, g, sd, cpu::conv_detail::carve<float>(sd, ad, "t"), dy.data(),
                                         w.data(), dx.data());
        cpu::conv2d_backward_weight<float>(engine, g, sw, cpu::conv_detail::carve<float>(sw, aw, "t"), x.data(),
                                           dy.data(), dw.data(), nullptr);
        expect_within(what + " forward", y, want_y, [&](std::size_t e) { return y_bounds[f][e]; });
        expect_within(what + " data gradient", dx, want_dx, [&](std::size_t e) { return dx_bounds[f][e]; });
        expect_within(what + " weight gradient", dw, want_dw, [&](std::size_t e) { return dw_bounds[f][e]; });
        if (threads == 1) {
          first_y = y, first_dx = dx, first_dw = dw;
          continue;
        }
        INFO(what << ": the same bits as with 1 thread");
        CHECK(std::memcmp(y.data(), first_y.data(), y.size() * 4) == 0);
        CHECK(std::memcmp(dx.data(), first_dx.data(), dx.size() * 4) == 0);
        CHECK(std::memcmp(dw.data(), first_dw.data(), dw.size() * 4) == 0);
      }
    }
  }
  for (int f = 0; f < 2; ++f) {
    INFO("F(" << 2 + 2 * f << "x" << 2 + 2 * f << ",3x3): shapes transformed by items, and gathered");
    CHECK(transforms[f][0] > 0);
    CHECK(transforms[f][1] > 0);
  }
}

TEST_CASE("Winograd's forward and data gradient give the same bits on the AVX-512 and AVX2 product tiles, F(2x2,3x3) and F(4x4,3x3)",
          "[conv][winograd][isa]") {
  using namespace frugal;
  namespace wg = cpu::winograd;
  // The widest path's tile, and the one the AVX2 path takes (both depend
  // on the CPU, and FRUGAL_SGEMM=openblas takes neither).
  const auto tile_at = [](int isa, std::int64_t depth) {
    cpu::forced_cpu_isa = isa;
    const auto t = wg::product_tile(depth);
    cpu::forced_cpu_isa = -1;
    return t;
  };
  // Sliver rows 12 + 8 and 12 + 4 (the AVX2 tile's 6-row halves, partial),
  // panels of 32 columns and partial ones.
  std::vector<WinogradShape> shapes(std::begin(kOddWinogradShapes), std::end(kOddWinogradShapes));
  shapes.push_back({"[1,24,6,70]*[30,24,3,3] pad 1", {1, 24, 6, 70}, {30, 24, 3, 3}, 1});
  int compared = 0;
  for (const auto& sh : shapes) {
    const Shape xs(sh.x), ws(sh.w);
    const auto g = ops::conv_geometry("test", xs, ws, {.padding = sh.pad});
    if (tile_at(-1, g.cin) != wg::ProductTile::avx512 || tile_at(int(cpu::CpuIsa::avx2), g.cin) != wg::ProductTile::avx2 ||
        tile_at(int(cpu::CpuIsa::avx2), g.cout) != wg::ProductTile::avx2)
      continue;  // this machine runs one of them on OpenBLAS, or lacks AVX-512
    auto x = random_floats(xs.numel(), 21), w = random_floats(ws.numel(), 22);
    auto dy = random_floats(g.n * g.cout * g.hw_out(), 23);
    for (auto wino : {cpu::ConvAlgorithm::winograd_f2, cpu::ConvAlgorithm::winograd_f4}) {
    auto sf = cpu::conv_scratch(g, DType::f32, cpu::ConvPass::forward, 0, wino);
    auto sd = cpu::conv_scratch(g, DType::f32, cpu::ConvPass::backward_data, 0, wino);
    REQUIRE((sf.winograd && sd.winograd));
    std::vector<float> y[2], dx[2];
    for (int k = 0; k < 2; ++k) {
      cpu::forced_cpu_isa = k == 0 ? -1 : int(cpu::CpuIsa::avx2);
      Workspace wf, wd;
      auto af = wf.args(sf), ad = wd.args(sd);
      y[k].assign(std::size_t(g.n * g.cout * g.hw_out()), 0.f);
      dx[k].assign(x.size(), 0.f);
      const auto engine = engines().front();
      cpu::conv2d_forward<float>(engine, g, sf, cpu::conv_detail::carve<float>(sf, af, "t"), x.data(), w.data(),
                                 nullptr, y[k].data());
      cpu::conv2d_backward_data<float>(engine, g, sd, cpu::conv_detail::carve<float>(sd, ad, "t"), dy.data(),
                                       w.data(), dx[k].data());
      cpu::forced_cpu_isa = -1;
    }
    INFO(sh.name << ", F(" << sf.tiles.m << "x" << sf.tiles.m << ",3x3)");
    CHECK(std::memcmp(y[0].data(), y[1].data(), y[0].size() * 4) == 0);
    CHECK(std::memcmp(dx[0].data(), dx[1].data(), dx[0].size() * 4) == 0);
    ++compared;
    }
  }
  if (compared == 0) WARN("not compared: this machine does not run both product tiles");
}

TEST_CASE("Winograd is chosen by shape alone: 3x3 stride 1, enough channels and tiles, not f64", "[conv][winograd]") {
  using namespace frugal;
  auto geom = [](ref::Dims xd, ref::Dims wd, Conv2dOptions o) {
    return ops::conv_geometry("test", Shape(xd), Shape(wd), o);
  };
  const auto resnet = geom({32, 64, 32, 32}, {64, 64, 3, 3}, {.padding = 1});
  CHECK(cpu::conv_scratch(resnet, DType::f32, cpu::ConvPass::forward).winograd);
  CHECK(cpu::conv_scratch(resnet, DType::bf16, cpu::ConvPass::backward_data).winograd);
  CHECK(cpu::conv_scratch(resnet, DType::f16, cpu::ConvPass::backward_weight).winograd);
  // F(4x4, 3x3) for planes from 8x8, every pass; F(2x2, 3x3) below, or when asked.
  CHECK(cpu::conv_scratch(resnet, DType::f32, cpu::ConvPass::forward).tiles.m == 4);
  CHECK(cpu::conv_scratch(resnet, DType::bf16, cpu::ConvPass::backward_data).tiles.m == 4);
  CHECK(cpu::conv_scratch(resnet, DType::f32, cpu::ConvPass::backward_weight).tiles.m == 4);
  CHECK(cpu::conv_scratch(resnet, DType::f32, cpu::ConvPass::forward, 0, cpu::ConvAlgorithm::winograd_f2).tiles.m == 2);
  CHECK(cpu::conv_scratch(resnet, DType::f32, cpu::ConvPass::backward_weight, 0, cpu::ConvAlgorithm::winograd_f2)
            .tiles.m == 2);
  const auto narrow = geom({256, 64, 6, 6}, {64, 64, 3, 3}, {.padding = 1});
  for (auto pass : {cpu::ConvPass::forward, cpu::ConvPass::backward_data, cpu::ConvPass::backward_weight}) {
    CHECK(cpu::conv_scratch(narrow, DType::f32, pass).winograd);
    CHECK(cpu::conv_scratch(narrow, DType::f32, pass).tiles.m == 2);
  }
  // Small layers' weight gradients sum in parts, large ones' in one.
  CHECK(cpu::conv_scratch(resnet, DType::f32, cpu::ConvPass::backward_weight).tiles.parts == cpu::kWinogradParts);
  const auto wide = geom({32, 256, 8, 8}, {256, 256, 3, 3}, {.padding = 1});
  CHECK(cpu::conv_scratch(wide, DType::f32, cpu::ConvPass::backward_weight).tiles.parts == 1);
  // 4x4 outputs, 32 images: 128 tiles, enough to pay for the weight's
  // transform, by F(2x2, 3x3); 8 images, 32 tiles, not (the weight gradient
  // always).
  const auto late = geom({32, 512, 4, 4}, {512, 512, 3, 3}, {.padding = 1});
  for (auto pass : {cpu::ConvPass::forward, cpu::ConvPass::backward_data, cpu::ConvPass::backward_weight}) {
    CHECK(cpu::conv_scratch(late, DType::f32, pass).winograd);
    CHECK(cpu::conv_scratch(late, DType::f32, pass).tiles.m == 2);
  }
  const auto few = geom({8, 512, 4, 4}, {512, 512, 3, 3}, {.padding = 1});
  CHECK_FALSE(cpu::conv_scratch(few, DType::f32, cpu::ConvPass::forward).winograd);
  CHECK_FALSE(cpu::conv_scratch(few, DType::f32, cpu::ConvPass::backward_data).winograd);
  CHECK(cpu::conv_scratch(few, DType::f32, cpu::ConvPass::backward_weight).winograd);
  CHECK_FALSE(cpu::conv_scratch(resnet, DType::f64, cpu::ConvPass::forward).winograd);
  CHECK_FALSE(cpu::conv_scratch(resnet, DType::f64, cpu::ConvPass::forward, 0, cpu::ConvAlgorithm::winograd).winograd);
  CHECK_FALSE(cpu::conv_scratch(resnet, DType::f32, cpu::ConvPass::forward, 0, cpu::ConvAlgorithm::direct).winograd);
  CHECK_FALSE(cpu::conv_scratch(geom({32, 64, 32, 32}, {128, 64, 3, 3}, {.stride = 2, .padding = 1}), DType::f32,
                                cpu::ConvPass::forward)
                  .winograd);
  CHECK_FALSE(cpu::conv_scratch(geom({32, 3, 32, 32}, {64, 3, 3, 3}, {.padding = 1}), DType::f32,
                                cpu::ConvPass::forward)
                  .winograd);  // the stem: 3 input channels
  CHECK_FALSE(cpu::conv_scratch(geom({2, 64, 8, 8}, {64, 32, 3, 3}, {.padding = 1, .groups = 2}), DType::f32,
                                cpu::ConvPass::forward)
                  .winograd);
  CHECK_FALSE(cpu::conv_scratch(geom({2, 64, 8, 8}, {64, 64, 3, 3}, {.padding = 2, .dilation = 2}), DType::f32,
                                cpu::ConvPass::forward)
                  .winograd);
  // Padding 3: the data gradient is no longer a plain convolution.
  const auto padded = geom({2, 16, 8, 8}, {16, 16, 3, 3}, {.padding = 3});
  CHECK_FALSE(cpu::conv_scratch(padded, DType::f32, cpu::ConvPass::backward_data, 0, cpu::ConvAlgorithm::winograd).winograd);
}

TEST_CASE("conv2d's scratch is planned: the step's audit matches its prediction", "[conv][plan]") {
  using namespace frugal;
  nn::manual_seed(2);
  nn::Conv2d conv(4, 8, 3, {.padding = 1});
  Step s = compile_gradients([&](Var x) { return sum(relu(conv(x))); }, {input<float>({3, 4, 16, 16})},
                             conv.parameters());
  std::vector<std::string> with_scratch;
  for (NodeId n : s.plan().schedule)
    if (s.graph().node(n).has_workspace) with_scratch.push_back(s.graph().node(n).op->name());
  // The input needs no gradient, so the data-gradient op is captured but never planned.
  CHECK(with_scratch == std::vector<std::string>{"conv2d", "conv2d_backward_weight"});
  Tensor x({3, 4, 16, 16});
  auto xv = random_floats(x.numel(), 5);
  std::memcpy(x.data<float>(), xv.data(), xv.size() * 4);
  auto a = s.audit(x);
  CHECK(a.canary_intact);
  CHECK(a.high_water == a.predicted);
  CHECK(s.verify().ok());
}

// ---- bf16 / f16 storage --------------------------------------------------------

namespace {

template <class H>
frugal::Tensor half_tensor(const std::vector<float>& v, const frugal::Shape& s) {
  frugal::Tensor t(s, frugal::dtype_of<H>());
  for (std::size_t i = 0; i < v.size(); ++i) t.data<H>()[i] = H(v[i]);
  return t;
}

template <class H>
std::vector<float> rounded(const std::vector<float>& v) {
  std::vector<float> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = float(H(v[i]));
  return out;
}

template <class H>
std::vector<float> floats_of(const frugal::Tensor& t) {
  std::vector<float> out(static_cast<std::size_t>(t.numel()));
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = float(t.data<H>()[i]);
  return out;
}

std::vector<float> f32_values(const frugal::Tensor& t) { return t.to_vector<float>(); }

frugal::Tensor f32_tensor(const std::vector<float>& v, const frugal::Shape& s) {
  frugal::Tensor t(s, DType::f32);
  std::memcpy(t.data<float>(), v.data(), v.size() * 4);
  return t;
}

// Runs op on the given tensors (bound as parameters) and returns its outputs.
std::vector<frugal::Tensor> run_op(std::function<std::vector<Var>(const Vars&)> build,
                                   const std::vector<frugal::Tensor>& ts) {
  frugal::Step s = frugal::compile_inference(
      [&] {
        Vars vs;
        for (auto& t : ts) vs.push_back(frugal::persistent_var(t, frugal::ValueKind::parameter, "t"));
        return build(vs);
      },
      {}, {}, harness_options());
  s.run();
  std::vector<frugal::Tensor> out;
  for (std::size_t i = 0;; ++i) {
    try {
      out.push_back(s.output(i).clone());
    } catch (const std::out_of_range&) {
      break;
    }
  }
  return out;
}

// The half path widens the same (rounded) inputs to f32, runs the same f32
// GEMMs in the same order as the f32 path, and rounds each result once. So
// against the f32 op on the rounded inputs the only difference is that one
// rounding: |y_half - y_f32| <= u |y_f32| with u the unit roundoff (2^-8 for
// bf16's 8-bit significand, 2^-11 for f16's 11 bits), plus 2^-25 absolute
// for results in f16's subnormal range (spacing 2^-24).
// On a CPU with AVX512-BF16 a bf16 forward (and stride-1 data gradient) of
// even depth k runs the bf16 micro-kernel instead: the same exact products,
// summed in f32 in another order (1, 0, 3, 2, ...). Each f32 sum is within
// k 2^-24 sum|ab| of the exact one, so the two differ by up to
// 2 k 2^-24 sum|ab| more; `abs` (sum|ab| per element, the f32 op on the
// inputs' absolute values) and k add that allowance where given.
void expect_one_rounding(const std::string& what, const std::vector<float>& half, const std::vector<float>& f32,
                         double u, const std::vector<float>* abs = nullptr, std::int64_t k = 0) {
  REQUIRE(half.size() == f32.size());
  if (abs) REQUIRE(abs->size() == f32.size());
  std::size_t bad = 0, worst = 0;
  for (std::size_t i = 0; i < half.size(); ++i) {
    double bound = u * std::abs(double(f32[i])) + std::ldexp(1.0, -25);
    if (abs) bound += 2.0 * double(k) * std::ldexp(1.0, -24) * double((*abs)[i]);
    if (!(std::abs(double(half[i]) - double(f32[i])) <= bound)) {
      if (!bad) worst = i;
      ++bad;
    }
  }
  INFO(what << ": " << bad << " of " << half.size() << " elements differ by more than one rounding; first at " << worst
            << ": " << half[worst] << " vs f32 " << f32[worst]);
  CHECK(bad == 0);
}

template <class H>
void check_half_conv(const char* type, double u) {
  using namespace frugal;
  struct C {
    const char* name;
    Shape x, w;
    Conv2dOptions o;
    bool winograd = false;  // the forward runs as Winograd (conv_scratch's rules)
  };
  const C cases[] = {
      {"3x3 pad 1, one chunk [3,4,6,6]*[5,4,3,3]", {3, 4, 6, 6}, {5, 4, 3, 3}, {.padding = 1}},
      {"one image per chunk [2,2,24,24]*[3,2,3,3]", {2, 2, 24, 24}, {3, 2, 3, 3}, {.padding = 1}},
      {"stride 2 groups 2 [2,4,7,7]*[4,2,3,3]", {2, 4, 7, 7}, {4, 2, 3, 3}, {.stride = 2, .padding = 1, .groups = 2}},
      {"1x1 [2,6,5,5]*[4,6,1,1]", {2, 6, 5, 5}, {4, 6, 1, 1}, {}},
      // Odd depths (3 * 9 forward, 5 * 9 for the data gradient): the bf16
      // micro-kernel reads weight rows as pairs, so these widen instead.
      {"odd depth [2,3,6,6]*[5,3,3,3]", {2, 3, 6, 6}, {5, 3, 3, 3}, {.padding = 1}},
      // 16 channels, 512 tiles: Winograd, here F(4x4, 3x3) (31 columns: a
      // partial last tile), whose transforms widen and round 16-bit rows.
      {"Winograd [2,16,32,31]*[16,16,3,3]", {2, 16, 32, 31}, {16, 16, 3, 3}, {.padding = 1}, true},
      // 8x8 planes, 128 tiles: F(4x4, 3x3) with 2 tiles a row, so the
      // transforms gather a tile a lane (conv_winograd_gathered.hpp).
      {"Winograd, gathered [8,16,8,8]*[20,16,3,3]", {8, 16, 8, 8}, {20, 16, 3, 3}, {.padding = 1}, true},
  };
  for (const auto& c : cases) {
    const auto g = ops::conv_geometry("test", c.x, c.w, c.o);
    const Shape ys{g.n, g.cout, g.ho, g.wo};
    auto x = rounded<H>(random_floats(c.x.numel(), 11)), w = rounded<H>(random_floats(c.w.numel(), 12));
    auto b = rounded<H>(random_floats(g.cout, 13)), dy = rounded<H>(random_floats(ys.numel(), 14));
    const std::string what = cat(type, " conv2d ", c.name);
    CHECK(cpu::conv_scratch(g, dtype_of<H>(), cpu::ConvPass::forward).winograd == c.winograd);
    auto o = c.o;
    auto fwd = [&](const Vars& v) { return std::vector<Var>{conv2d(v[0], v[1], v[2], o)}; };
    auto bwd_data = [&](const Vars& v) {
      return std::vector<Var>{apply1<ops::Conv2dBackwardData>({v[0], v[1]}, o, c.x)};
    };
    auto bwd_weight = [&](const Vars& v) {
      return frugal::apply(std::make_shared<ops::Conv2dBackwardWeight>(o, c.w, true), {v[0], v[1]});
    };
    auto y16 = run_op(fwd, {half_tensor<H>(x, c.x), half_tensor<H>(w, c.w), half_tensor<H>(b, {g.cout})});
    auto y32 = run_op(fwd, {f32_tensor(x, c.x), f32_tensor(w, c.w), f32_tensor(b, {g.cout})});
    REQUIRE(y16[0].dtype() == dtype_of<H>());
    // sum|ab| of each output: the f32 ops on absolute values (zero bias).
    auto absv = [](std::vector<float> v) {
      for (auto& e : v) e = std::abs(e);
      return v;
    };
    const std::vector<float> zero(std::size_t(g.cout), 0.f);
    const bool bf16 = std::is_same_v<H, frugal::BFloat16>;
    const auto ya = f32_values(run_op(fwd, {f32_tensor(absv(x), c.x), f32_tensor(absv(w), c.w), f32_tensor(zero, {g.cout})})[0]);
    const auto dxa = f32_values(run_op(bwd_data, {f32_tensor(absv(dy), ys), f32_tensor(absv(w), c.w)})[0]);
    expect_one_rounding(what + " forward", floats_of<H>(y16[0]), f32_values(y32[0]), u, bf16 ? &ya : nullptr, g.k());
    auto dx16 = run_op(bwd_data, {half_tensor<H>(dy, ys), half_tensor<H>(w, c.w)});
    auto dx32 = run_op(bwd_data, {f32_tensor(dy, ys), f32_tensor(w, c.w)});
    expect_one_rounding(what + " data gradient", floats_of<H>(dx16[0]), f32_values(dx32[0]), u, bf16 ? &dxa : nullptr,
                        g.cout_g() * g.kh * g.kw);
    auto dw16 = run_op(bwd_weight, {half_tensor<H>(x, c.x), half_tensor<H>(dy, ys)});
    auto dw32 = run_op(bwd_weight, {f32_tensor(x, c.x), f32_tensor(dy, ys)});
    expect_one_rounding(what + " weight gradient", floats_of<H>(dw16[0]), f32_values(dw32[0]), u);
    expect_one_rounding(what + " bias gradient", floats_of<H>(dw16[1]), f32_values(dw32[1]), u);
    // And the f32 result itself is right: the reference on the same rounded inputs.
    const auto p = ref_params(c.o);
    ref::Array ba = as_array(b, {g.cout});
    expect_f32_close(what + " f32 forward vs reference", f32_values(y32[0]),
                     ref::conv2d(as_array(x, c.x.dims()), as_array(w, c.w.dims()), &ba, p),
                     ref::conv2d_abs(as_array(x, c.x.dims()), as_array(w, c.w.dims()), p), g.k() + 1);
  }
}

}  // namespace

namespace {

// The float64 loss mean(square(conv(relu(conv(x, w1)), w2))) (3x3
// convolutions, padding 1, no bias), and a bound on the float loss's
// distance from it, for either algorithm. Each convolution's rounding
// error is at most the bound its own test states on the input it is given
// (direct: 2 K u S with S the
// convolution of the magnitudes; Winograd F(m x m, 3x3):
// winograd_forward_bounds), and an
// error e in its input adds at most conv(e, |w|). relu moves no error. Each
// square adds 2|y|e + e^2 and one rounding; the sum of N squares at most
// gamma_(N-1) times their sum, in any order, and the mean 2 roundings more.
struct LossAndBound {
  double loss, bound;
};
LossAndBound two_conv_loss(int winograd_m, const std::vector<float>& x, const ref::Dims& xd,
                           const std::vector<float>& w1, const std::vector<float>& w2, const ref::Dims& wd) {
  const double u = std::ldexp(1.0, -24);
  const auto p = ref_params({.padding = 1});
  const std::int64_t n = xd[0], c = xd[1], h = xd[2], wi = xd[3], k = wd[1] * 9;
  const ref::Array w1a = as_array(w1, wd), w2a = as_array(w2, wd);
  // The error bound of one convolution of `in` (magnitudes) by w.
  auto rounding = [&](const ref::Array& in, const std::vector<float>& w, const ref::Array& w_arr) {
    ref::Array e = ref::conv2d_abs(in, w_arr, p);
    if (winograd_m) {
      e.v = winograd_forward_bounds(winograd_m, in.v, w, n, c, h, wi, wd[0], 1, 1);
    } else {
      for (double& v : e.v) v *= 2.0 * double(k) * u;
    }
    return e;
  };
  const ref::Array xa = as_array(x, xd);
  const ref::Array y1 = ref::conv2d(xa, w1a, nullptr, p), e1 = rounding(xa, w1, w1a);
  ref::Array r1 = y1, r1_hi = y1;  // relu(y1), and a bound on the computed relu's magnitude
  for (std::size_t q = 0; q < y1.v.size(); ++q) {
    r1.v[q] = std::max(0.0, y1.v[q]);
    r1_hi.v[q] = r1.v[q] + e1.v[q];
  }
  const ref::Array y2 = ref::conv2d(r1, w2a, nullptr, p), carried = ref::conv2d_abs(e1, w2a, p);
  const ref::Array e2_own = rounding(r1_hi, w2, w2a);
  double err = 0, squares = 0, exact = 0;
  for (std::size_t q = 0; q < y2.v.size(); ++q) {
    const double e2 = e2_own.v[q] + carried.v[q], big = std::abs(y2.v[q]) + e2;
    err += 2 * std::abs(y2.v[q]) * e2 + e2 * e2 + u * big * big;
    squares += big * big * (1 + u);
    exact += y2.v[q] * y2.v[q];
  }
  const double count = double(y2.v.size()), gamma = (count - 1) * u / (1 - (count - 1) * u);
  return {exact / count, (err + gamma * squares) / count + 2 * u * squares / count};  // 2 u: a division, or a product by fl(1/N)
}

}  // namespace

TEST_CASE("conv_algorithm picks Winograd or direct per backend: either plans its scratch exactly and trains alike",
          "[conv][winograd][plan]") {
  using namespace frugal;
  const ref::Dims xd{2, 16, 12, 12}, wd{16, 16, 3, 3};
  const Shape xs(xd);
  auto xv = random_floats(xs.numel(), 9);
  // Direct, and Winograd with either tile (the rules give this 12x12 plane F(4x4, 3x3)).
  for (int k = 0; k < 4; ++k) {
    const char* algos[] = {"direct", "winograd", "winograd-f2", "winograd-f4"};
    const std::string algo = algos[k];
    INFO("conv_algorithm " << algo);
    nn::manual_seed(3);
    nn::Conv2d c1(16, 16, 3, {.padding = 1, .bias = false}), c2(16, 16, 3, {.padding = 1, .bias = false});
    auto params = c1.parameters();
    for (const Tensor& t : c2.parameters()) params.push_back(t);
    optim::SGD opt(params, {.lr = 0.01});
    CompileOptions o;
    o.backend_options.conv_algorithm = algo;
    Step s = compile([&](Var x) { return mean(square(c2(relu(c1(x))))); }, {input<float>(xs)}, opt, {}, o);
    // Each conv op's planned scratch is the layout of the algorithm asked for.
    const auto g = ops::conv_geometry("test", xs, Shape(wd), {.padding = 1});
    const auto want = cpu::conv_scratch(g, DType::f32, cpu::ConvPass::forward, 0, cpu::conv_algorithm_from(algo));
    CHECK(want.winograd == (k > 0));
    const int m = k == 0 ? 0 : k == 2 ? 2 : 4;
    if (m) CHECK(want.tiles.m == m);
    int forwards = 0;
    for (NodeId n : s.plan().schedule) {
      const Node& node = s.graph().node(n);
      if (node.op->name() != "conv2d") continue;
      REQUIRE(node.has_workspace);
      CHECK(s.graph().value(node.outputs.back()).meta.nbytes() == want.bytes());
      ++forwards;
    }
    CHECK(forwards == 2);
    Tensor x = f32_tensor(xv, xs);
    auto a = s.audit(x);
    CHECK(a.canary_intact);
    CHECK(a.high_water == a.predicted);
    // The next loss (the audit has trained one step) is the float64 one
    // within the bound this algorithm's kernels state; and SGD lowers it.
    const std::vector<float> w1 = c1.weight.to_vector<float>(), w2 = c2.weight.to_vector<float>();
    std::vector<double> losses;
    for (int step = 0; step < 3; ++step) losses.push_back(s.run(x));
    const auto [exact, bound] = two_conv_loss(m, xv, xd, w1, w2, wd);
    INFO("loss " << losses[0] << ", float64 " << exact << ", bound " << bound);
    CHECK(std::abs(losses[0] - exact) <= bound);
    CHECK(losses[1] < losses[0]);
    CHECK(losses[2] < losses[1]);
  }
  CHECK_THROWS_WITH(make_backend("cpu", {.conv_algorithm = "fast"}), Contains("unknown convolution algorithm 'fast'"));
}

TEST_CASE("conv2d with bf16 and f16 storage rounds the f32 result once", "[conv][half]") {
  // Every engine; and on a CPU with AVX512-BF16 both bf16 paths of the
  // AVX-512 engine: the bf16 micro-kernel, and (capped at AVX-512F) the
  // f32 one on widened panels.
  using frugal::cpu::CpuIsa;
  test_support::KeepCpuIsa keep;
  std::vector<CpuIsa> caps{frugal::cpu::widest_cpu_isa()};
  if (caps[0] == CpuIsa::avx512bf16) caps.push_back(CpuIsa::avx512);
  for (CpuIsa cap : caps) {
    frugal::cpu::forced_cpu_isa = int(cap);
    for (auto engine : engines()) {
      EngineChoice ec(engine);
      INFO("engine " << engine_name(engine) << ", instruction set " << frugal::cpu::isa_name(cap));
      check_half_conv<frugal::BFloat16>("bf16", std::ldexp(1.0, -8));
      check_half_conv<frugal::Half>("f16", std::ldexp(1.0, -11));
    }
  }
}

// ---- batch norm -----------------------------------------------------------------

namespace {

Case bn_train_case(std::string name, ref::Dims xs) {
  const std::int64_t c = xs[1];
  return {"batch_norm2d train " + std::move(name),
          {x(xs), x({c}), x({c})},
          [](const Vars& v) { return frugal::batch_norm2d_train(v[0], v[1], v[2]).y; },
          [](const Arrays& a) { return ref::batch_norm_train(a[0], a[1], a[2]); },
          // The backward subtracts means of size ~|dy|: a few f32 roundings more.
          4};
}

}  // namespace

TEST_CASE("batch_norm2d in training mode: forward and backward", "[bn]") {
  check_op(bn_train_case("[2,3,4,4]", {2, 3, 4, 4}));
  check_op(bn_train_case("[4,2,1,1] (one value per plane)", {4, 2, 1, 1}));
  check_op(bn_train_case("[1,2,3,3] (one image)", {1, 2, 3, 3}));
  check_op(bn_train_case("[3,1,2,5] (one channel)", {3, 1, 2, 5}));
  check_op(bn_train_case("[2,2,1,2] (two values per channel)", {1, 2, 1, 2}));
}

TEST_CASE("batch_norm2d in eval mode: forward and backward with running statistics", "[bn]") {
  using namespace frugal;
  Tensor rm = Tensor::from(std::vector<double>{0.25, -0.5, 0.125}, Shape{3});
  Tensor rv = Tensor::from(std::vector<double>{0.5, 1.5, 2.0}, Shape{3});
  Tensor rm32 = Tensor::from(std::vector<float>{0.25f, -0.5f, 0.125f}, Shape{3});
  Tensor rv32 = Tensor::from(std::vector<float>{0.5f, 1.5f, 2.0f}, Shape{3});
  ref::Array rma{{3}, {0.25, -0.5, 0.125}}, rva{{3}, {0.5, 1.5, 2.0}};
  check_op({"batch_norm2d eval [2,3,3,4]",
            {x({2, 3, 3, 4}), x({3}), x({3})},
            [&](const Vars& v) {
              bool f64 = v[0].dtype() == DType::f64;
              Var m = persistent_var(f64 ? rm : rm32, ValueKind::state, "running_mean");
              Var s = persistent_var(f64 ? rv : rv32, ValueKind::state, "running_var");
              return batch_norm2d(v[0], m, s, v[1], v[2], /*training=*/false);
            },
            [&](const Arrays& a) { return ref::batch_norm_eval(a[0], a[1], a[2], rma, rva); }});
}

TEST_CASE("batch norm's running statistics follow PyTorch's rule, once per run", "[bn]") {
  using namespace frugal;
  // momentum 0.1; the running variance takes the unbiased batch variance.
  auto xv = random_floats(2 * 3 * 2 * 2, 21);
  Tensor x = f32_tensor(xv, {2, 3, 2, 2});
  Tensor gamma = Tensor::from(std::vector<float>{1, 2, 3}, Shape{3}), beta({3});
  Tensor rm = Tensor::from(std::vector<float>{0.5f, -1.f, 0.f}, Shape{3});
  Tensor rv = Tensor::from(std::vector<float>{1.f, 2.f, 0.5f}, Shape{3});
  Step s = compile_inference(
      [&] {
        Var xs = persistent_var(x, ValueKind::parameter, "x");
        return batch_norm2d(xs, persistent_var(rm, ValueKind::state, "rm"), persistent_var(rv, ValueKind::state, "rv"),
                            persistent_var(gamma, ValueKind::parameter, "g"),
                            persistent_var(beta, ValueKind::parameter, "b"), true);
      },
      {});
  // Exactly one node writes the statistics, and it is not the normalising op.
  int writers = 0;
  for (NodeId n : s.plan().schedule) {
    const auto& node = s.graph().node(n);
    if (!node.op->mutated_inputs().empty()) {
      ++writers;
      CHECK(node.op->name() == "batch_norm_update_stats");
    }
    if (node.op->name() == "batch_norm2d") CHECK(node.op->mutated_inputs().empty());
  }
  CHECK(writers == 1);
  std::vector<double> mean, var;
  ref::channel_stats(as_array(xv, {2, 3, 2, 2}), mean, var);
  std::vector<double> em{0.5, -1, 0}, ev{1, 2, 0.5};
  for (int run = 0; run < 3; ++run) {
    s.run();
    for (int c = 0; c < 3; ++c) {
      em[std::size_t(c)] = 0.9 * em[std::size_t(c)] + 0.1 * mean[std::size_t(c)];
      ev[std::size_t(c)] = 0.9 * ev[std::size_t(c)] + 0.1 * var[std::size_t(c)] * 8.0 / 7.0;
      INFO("run " << run << " channel " << c);
      CHECK(rm.data<float>()[c] == Approx(em[std::size_t(c)]).margin(1e-6));
      CHECK(rv.data<float>()[c] == Approx(ev[std::size_t(c)]).margin(1e-6));
    }
  }
}

// ---- pooling ------------------------------------------------------------------------

namespace {

Case max_pool_case(std::string name, ref::Dims xs, frugal::Size2 k, std::optional<frugal::Size2> s, frugal::Size2 p) {
  frugal::Size2 st = s.value_or(k);
  ref::Pool2dParams rp{k.h, k.w, st.h, st.w, p.h, p.w};
  return {"max_pool2d " + std::move(name),
          {x(std::move(xs))},
          [=](const Vars& v) { return frugal::max_pool2d(v[0], k, s, p); },
          [=](const Arrays& a) { return ref::max_pool2d(a[0], rp); }};
}

Case avg_pool_case(std::string name, ref::Dims xs, frugal::Size2 k, std::optional<frugal::Size2> s, frugal::Size2 p,
                   bool include_pad) {
  frugal::Size2 st = s.value_or(k);
  ref::Pool2dParams rp{k.h, k.w, st.h, st.w, p.h, p.w};
  return {"avg_pool2d " + std::move(name),
          {x(std::move(xs))},
          [=](const Vars& v) { return frugal::avg_pool2d(v[0], k, s, p, include_pad); },
          [=](const Arrays& a) { return ref::avg_pool2d(a[0], rp, include_pad); }};
}

}  // namespace

TEST_CASE("max_pool2d forward and backward", "[pool]") {
  check_op(max_pool_case("2x2 [2,2,4,4] (stride = kernel)", {2, 2, 4, 4}, 2, std::nullopt, 0));
  check_op(max_pool_case("3x3 stride 2 pad 1 [1,2,5,5]", {1, 2, 5, 5}, 3, 2, 1));
  check_op(max_pool_case("3x3 stride 1 pad 1, overlapping [1,2,4,4]", {1, 2, 4, 4}, 3, 1, 1));
  check_op(max_pool_case("2x3 stride (1,2) [2,1,5,6]", {2, 1, 5, 6}, {2, 3}, frugal::Size2{1, 2}, 0));
  check_op(max_pool_case("2x2 odd size drops the last row [1,2,5,5]", {1, 2, 5, 5}, 2, 2, 0));
  check_op(max_pool_case("1x1 is the identity [1,2,3,3]", {1, 2, 3, 3}, 1, 1, 0));
}

TEST_CASE("max_pool2d pads with -inf, lets the first maximum win ties, and propagates NaN", "[pool]") {
  using namespace frugal;
  // All -5 with padding: the padding never wins.
  Tensor neg({1, 1, 3, 3});
  for (int i = 0; i < 9; ++i) neg.data<float>()[i] = -5;
  auto y = run_op([](const Vars& v) { return std::vector<Var>{max_pool2d(v[0], 3, 1, 1)}; }, {neg});
  for (float v : y[0].to_vector<float>()) CHECK(v == -5);
  // Ties: a constant input sends each window's gradient to its first input
  // position in row-major window order, as PyTorch does.
  Tensor flat({1, 1, 4, 4});
  for (int i = 0; i < 16; ++i) flat.data<float>()[i] = 1;
  Tensor ones({1, 1, 4, 4});
  for (int i = 0; i < 16; ++i) ones.data<float>()[i] = 1;
  auto dx = run_op([](const Vars& v) { return std::vector<Var>{apply1<ops::MaxPool2dBackward>({v[0], v[1]}, Pool2dOptions{3, 1, 1})}; },
                   {flat, ones});
  std::vector<float> want(16, 0);
  for (int oh = 0; oh < 4; ++oh)
    for (int ow = 0; ow < 4; ++ow) want[std::size_t(std::max(oh - 1, 0) * 4 + std::max(ow - 1, 0))] += 1;
  CHECK(dx[0].to_vector<float>() == want);
  // NaN wins its windows.
  Tensor nan({1, 1, 2, 4});
  for (int i = 0; i < 8; ++i) nan.data<float>()[i] = float(i);
  nan.data<float>()[1] = std::nanf("");
  auto yn = run_op([](const Vars& v) { return std::vector<Var>{max_pool2d(v[0], 2)}; }, {nan})[0].to_vector<float>();
  CHECK(std::isnan(yn[0]));
  CHECK(yn[1] == 7);
}

TEST_CASE("avg_pool2d forward and backward, with and without counting the padding", "[pool]") {
  check_op(avg_pool_case("2x2 [2,2,4,4]", {2, 2, 4, 4}, 2, std::nullopt, 0, true));
  check_op(avg_pool_case("3x3 stride 2 pad 1 include_pad [1,2,5,5]", {1, 2, 5, 5}, 3, 2, 1, true));
  check_op(avg_pool_case("3x3 stride 2 pad 1 exclude_pad [1,2,5,5]", {1, 2, 5, 5}, 3, 2, 1, false));
  check_op(avg_pool_case("3x3 stride 1 pad 1 overlapping [2,1,4,3]", {2, 1, 4, 3}, 3, 1, 1, true));
  check_op(avg_pool_case("2x3 stride (2,1) pad (1,1) exclude_pad [1,2,4,5]", {1, 2, 4, 5}, {2, 3}, frugal::Size2{2, 1},
                         frugal::Size2{1, 1}, false));
}

TEST_CASE("global_avg_pool2d forward and backward", "[pool]") {
  for (ref::Dims s : {ref::Dims{2, 3, 4, 4}, ref::Dims{3, 2, 1, 1}, ref::Dims{1, 4, 2, 5}})
    check_op({"global_avg_pool2d " + ref::str(s),
              {x(s)},
              [](const Vars& v) { return frugal::global_avg_pool2d(v[0]); },
              [](const Arrays& a) { return ref::global_avg_pool2d(a[0]); }});
}

// ---- errors ------------------------------------------------------------------------

TEST_CASE("bad shapes raise a ShapeError naming the op and the shapes", "[conv][bn][pool][errors]") {
  using namespace frugal;
  auto conv = [](Conv2dOptions o = {}) {
    return [o](const Vars& v) { return conv2d(v[0], v[1], v.size() > 2 ? std::optional<Var>(v[2]) : std::nullopt, o); };
  };
  CHECK_THAT(shape_error(conv(), {T({2, 3, 5}), T({4, 3, 3, 3})}),
             Contains("conv2d") && Contains("[2, 3, 5]") && Contains("[N, C, H, W]"));
  CHECK_THAT(shape_error(conv(), {T({2, 3, 5, 5}), T({4, 2, 3, 3})}),
             Contains("conv2d") && Contains("[2, 3, 5, 5]") && Contains("[4, 2, 3, 3]") && Contains("in_channels/groups = 3"));
  CHECK_THAT(shape_error(conv({.groups = 2}), {T({2, 3, 5, 5}), T({4, 1, 3, 3})}),
             Contains("in_channels 3 is not divisible by groups 2"));
  CHECK_THAT(shape_error(conv(), {T({1, 1, 2, 2}), T({1, 1, 3, 3})}),
             Contains("conv2d") && Contains("[1, 1, 2, 2]") && Contains("smaller than the dilated kernel (3 x 3)"));
  CHECK_THAT(shape_error(conv(), {T({1, 2, 4, 4}), T({3, 2, 3, 3}), T({2})}),
             Contains("conv2d") && Contains("bias [2]") && Contains("expected [3]"));
  CHECK_THAT(shape_error(conv(), {T({1, 2, 4, 4}), T({3, 2, 3, 3}, DType::f64)}),
             Contains("conv2d") && Contains("dtypes differ"));
  CHECK_THAT(shape_error(conv({.stride = 0}), {T({1, 2, 4, 4}), T({3, 2, 3, 3})}),
             Contains("conv2d") && Contains("stride must be at least 1"));
  CHECK_THAT(shape_error(conv(), {T({1, 2, 4, 4}, DType::i32), T({3, 2, 3, 3}, DType::i32)}),
             Contains("conv2d") && Contains("i32[1, 2, 4, 4]"));

  auto bn = [](const Vars& v) { return batch_norm2d_train(v[0], v[1], v[2]).y; };
  CHECK_THAT(shape_error(bn, {T({2, 3, 4}), T({3}), T({3})}), Contains("batch_norm2d") && Contains("[2, 3, 4]"));
  CHECK_THAT(shape_error(bn, {T({2, 3, 4, 4}), T({4}), T({3})}),
             Contains("batch_norm2d") && Contains("weight [4]") && Contains("[2, 3, 4, 4]") && Contains("expected [3]"));
  CHECK_THAT(shape_error(bn, {T({1, 3, 1, 1}), T({3}), T({3})}),
             Contains("batch_norm2d") && Contains("more than 1 value per channel") && Contains("[1, 3, 1, 1]"));

  CHECK_THAT(shape_error([](const Vars& v) { return max_pool2d(v[0], 2, 2, 2); }, {T({1, 1, 4, 4})}),
             Contains("max_pool2d") && Contains("[1, 1, 4, 4]") && Contains("at most half of the kernel"));
  CHECK_THAT(shape_error([](const Vars& v) { return avg_pool2d(v[0], 5); }, {T({1, 1, 4, 4})}),
             Contains("avg_pool2d") && Contains("[1, 1, 4, 4]") && Contains("smaller than the kernel"));
  CHECK_THAT(shape_error([](const Vars& v) { return global_avg_pool2d(v[0]); }, {T({4, 4})}),
             Contains("global_avg_pool2d") && Contains("[4, 4]"));
}

// ---- nn layers and ResNets --------------------------------------------------------

namespace {

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::size_t b = 0;
  for (std::size_t e; (e = s.find(';', b)) != std::string::npos; b = e + 1) out.push_back(s.substr(b, e - b));
  out.push_back(s.substr(b));
  return out;
}

// The peer's torch_bench.py ResNet18: [n for n, _ in model.named_parameters()]
// and named_buffers(), from PyTorch 1.13.
const char* const kPeerResNet18Params =
    "conv1.weight;bn1.weight;bn1.bias;blocks.0.conv1.weight;blocks.0.bn1.weight;blocks.0.bn1.bias;blocks.0.conv2."
    "weight;blocks.0.bn2.weight;blocks.0.bn2.bias;blocks.1.conv1.weight;blocks.1.bn1.weight;blocks.1.bn1.bias;"
    "blocks.1.conv2.weight;blocks.1.bn2.weight;blocks.1.bn2.bias;blocks.2.conv1.weight;blocks.2.bn1.weight;blocks.2."
    "bn1.bias;blocks.2.conv2.weight;blocks.2.bn2.weight;blocks.2.bn2.bias;blocks.2.shortcut.0.weight;blocks.2."
    "shortcut.1.weight;blocks.2.shortcut.1.bias;blocks.3.conv1.weight;blocks.3.bn1.weight;blocks.3.bn1.bias;blocks.3."
    "conv2.weight;blocks.3.bn2.weight;blocks.3.bn2.bias;blocks.4.conv1.weight;blocks.4.bn1.weight;blocks.4.bn1.bias;"
    "blocks.4.conv2.weight;blocks.4.bn2.weight;blocks.4.bn2.bias;blocks.4.shortcut.0.weight;blocks.4.shortcut.1."
    "weight;blocks.4.shortcut.1.bias;blocks.5.conv1.weight;blocks.5.bn1.weight;blocks.5.bn1.bias;blocks.5.conv2."
    "weight;blocks.5.bn2.weight;blocks.5.bn2.bias;blocks.6.conv1.weight;blocks.6.bn1.weight;blocks.6.bn1.bias;"
    "blocks.6.conv2.weight;blocks.6.bn2.weight;blocks.6.bn2.bias;blocks.6.shortcut.0.weight;blocks.6.shortcut.1."
    "weight;blocks.6.shortcut.1.bias;blocks.7.conv1.weight;blocks.7.bn1.weight;blocks.7.bn1.bias;blocks.7.conv2."
    "weight;blocks.7.bn2.weight;blocks.7.bn2.bias;fc.weight;fc.bias";

std::vector<std::string> peer_buffers() {
  std::vector<std::string> bns{"bn1"};
  for (int b = 0; b < 8; ++b) {
    bns.push_back(frugal::cat("blocks.", b, ".bn1"));
    bns.push_back(frugal::cat("blocks.", b, ".bn2"));
    if (b == 2 || b == 4 || b == 6) bns.push_back(frugal::cat("blocks.", b, ".shortcut.1"));
  }
  std::vector<std::string> out;
  for (auto& m : bns)
    for (const char* s : {".running_mean", ".running_var", ".num_batches_tracked"}) out.push_back(m + s);
  return out;
}

}  // namespace

TEST_CASE("nn::Conv2d and nn::BatchNorm2d initialise and name their tensors as PyTorch does", "[conv][nn]") {
  using namespace frugal;
  nn::manual_seed(4);
  nn::Conv2d c(64, 32, 3, {.padding = 1});
  CHECK(names_of(c.named_parameters()) == std::vector<std::string>{"weight", "bias"});
  CHECK(c.weight.shape() == Shape{32, 64, 3, 3});
  // kaiming_uniform_(a=sqrt(5)): U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in = 64*3*3.
  const double bound = 1 / std::sqrt(576.0);
  double mean = 0, var = 0;
  auto w = c.weight.to_vector<float>();
  for (float v : w) {
    REQUIRE(std::abs(v) <= bound);
    mean += v / double(w.size());
  }
  for (float v : w) var += (v - mean) * (v - mean) / double(w.size());
  CHECK(mean == Approx(0).margin(0.05 * bound));
  CHECK(var == Approx(bound * bound / 3).epsilon(0.05));
  for (float v : c.bias.to_vector<float>()) CHECK(std::abs(v) <= bound);
  nn::Conv2d grouped(8, 4, {3, 1}, {.groups = 2, .bias = false, .dtype = DType::bf16});
  CHECK(grouped.weight.shape() == Shape{4, 4, 3, 1});
  CHECK(names_of(grouped.named_parameters()) == std::vector<std::string>{"weight"});
  for (int i = 0; i < 48; ++i) CHECK(std::abs(float(grouped.weight.data<BFloat16>()[i])) <= 1 / std::sqrt(12.0) * 1.004);

  nn::BatchNorm2d bn(3);
  CHECK(names_of(bn.named_parameters()) == std::vector<std::string>{"weight", "bias"});
  CHECK(names_of(bn.named_buffers()) ==
        std::vector<std::string>{"running_mean", "running_var", "num_batches_tracked"});
  CHECK(bn.weight.to_vector<float>() == std::vector<float>{1, 1, 1});
  CHECK(bn.bias.to_vector<float>() == std::vector<float>{0, 0, 0});
  CHECK(bn.running_mean.to_vector<float>() == std::vector<float>{0, 0, 0});
  CHECK(bn.running_var.to_vector<float>() == std::vector<float>{1, 1, 1});
  CHECK(bn.num_batches_tracked.item<std::int64_t>() == 0);
  CHECK(bn.parameters().size() == 2);  // buffers are not parameters: the optimizer never sees them
  CHECK_THROWS_WITH(bn.register_buffer("running_mean", Tensor({3})), Contains("already has a buffer"));
}

TEST_CASE("ResNet builders match the peer's models: names, shapes, parameter counts", "[conv][nn]") {
  using namespace frugal;
  auto r18 = nn::resnet18_cifar(10);
  CHECK(r18->num_parameters() == 11173962);  // the peer's ResNet18 reports this count
  CHECK(names_of(r18->named_parameters()) == split(kPeerResNet18Params));
  CHECK(names_of(r18->named_buffers()) == peer_buffers());
  CHECK(r18->blocks.size() == 8);
  // Counts from the same structures built in PyTorch 1.13.
  auto r20 = nn::resnet20_cifar(10);
  CHECK(r20->num_parameters() == 272474);
  CHECK(r20->named_parameters().size() == 65);
  CHECK(r20->named_buffers().size() == 63);
  auto r50 = nn::resnet50_cifar(10);
  CHECK(r50->num_parameters() == 23520842);
  CHECK(r50->named_parameters().size() == 161);
  CHECK(r50->named_buffers().size() == 159);
}

TEST_CASE("a ResNet-20 trains: loss falls, running statistics move once per step, the audit matches the plan",
          "[conv][nn][step]") {
  using namespace frugal;
  nn::manual_seed(7);
  auto model = nn::resnet20_cifar(10);
  optim::SGD opt(model->parameters(), {.lr = 0.05, .momentum = 0.9});
  const std::int64_t N = 4, H = 8;
  Step step = compile([&](Var x, Var y) { return cross_entropy((*model)(x), y); },
                      {input<float>({N, 3, H, H}), input<std::int32_t>({N})}, opt);
  CHECK(step.verify().ok());
  // One running-statistics update per BatchNorm: the stem, 2 per block, 2 projection shortcuts.
  int updates = 0;
  for (NodeId n : step.plan().schedule) updates += step.graph().node(n).op->name() == "batch_norm_update_stats";
  CHECK(updates == 1 + 2 * 9 + 2);

  auto xv = random_floats(N * 3 * H * H, 31);
  Tensor x = f32_tensor(xv, {N, 3, H, H});
  Tensor y = Tensor::from(std::vector<std::int32_t>{3, 7, 0, 5}, Shape{N});
  // The hand computation for the stem's BatchNorm: its input is conv1(x)
  // with the weights before the step's update.
  nn::BatchNorm2d& bn = model->bn1;
  const double n = double(N * H * H);
  std::vector<float> losses;
  for (int s = 0; s < 10; ++s) {
    const ref::Array w = as_array(model->conv1.weight.to_vector<float>(), {16, 3, 3, 3});
    const auto rm0 = bn.running_mean.to_vector<float>(), rv0 = bn.running_var.to_vector<float>();
    losses.push_back(step.run(x, y));
    REQUIRE(std::isfinite(losses.back()));
    std::vector<double> mean, var;
    ref::channel_stats(ref::conv2d(as_array(xv, {N, 3, H, H}), w, nullptr, {.ph = 1, .pw = 1}), mean, var);
    for (std::size_t c = 0; c < 16; ++c) {
      INFO("step " << s << " channel " << c);
      CHECK(bn.running_mean.data<float>()[c] == Approx(0.9 * rm0[c] + 0.1 * mean[c]).margin(2e-6));
      CHECK(bn.running_var.data<float>()[c] == Approx(0.9 * rv0[c] + 0.1 * var[c] * n / (n - 1)).margin(2e-6));
    }
    CHECK(bn.num_batches_tracked.item<std::int64_t>() == s + 1);
  }
  INFO("losses: " << losses.front() << " ... " << losses.back());
  CHECK(losses.back() < 0.5f * losses.front());
  auto a = step.audit(x, y);
  CHECK(a.canary_intact);
  CHECK(a.high_water == a.predicted);

  // Eval mode normalises with the running statistics and updates nothing.
  model->eval();
  const auto rm = bn.running_mean.to_vector<float>();
  Step infer = compile_inference([&](Var xi) { return (*model)(xi); }, {input<float>({N, 3, H, H})});
  for (NodeId nd : infer.plan().schedule) {
    CHECK(infer.graph().node(nd).op->name() != "batch_norm_update_stats");
    CHECK(infer.graph().node(nd).op->name() != "batch_norm2d");
  }
  infer.run(x);
  CHECK(bn.running_mean.to_vector<float>() == rm);
}
