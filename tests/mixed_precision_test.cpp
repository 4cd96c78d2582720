// Mixed precision: the cast op, every bf16/f16 kernel against the f32 kernel
// or the float64 reference with a stated error bound, a bf16 MLP with f32
// master weights against the f32 run, and f16 training with dynamic loss
// scaling inside the static graph.
//
// Notation for the bounds: u is the unit roundoff of the 16-bit format,
// 2^-8 for bf16 (8 significant bits) and 2^-11 for f16 (11 bits). Rounding
// to nearest moves a value in the normal range by at most u |x|.
#include <omp.h>
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <sstream>

#include <frugal/frugal.hpp>
// Kernel-level checks call the CPU kernels' helpers directly.
#include <frugal/backend/cpu/blas.hpp>
#include <frugal/backend/cpu/convert.hpp>
#include <frugal/backend/cpu/matmul.hpp>

#include "cpu_isa_scope.hpp"
#include "mixed_helpers.hpp"
#include "reference_mixed.hpp"
#include "toy_task.hpp"
#include "bytes_of.hpp"

using namespace frugal;
using Catch::Matchers::Contains;

using namespace mixed;

// ---- conversions -----------------------------------------------------------

TEST_CASE("bf16 and f16 conversions round to nearest even, as the IEEE reference does", "[mixed][cast]") {
  // Every 16-bit pattern widens exactly and narrows back to itself.
  for (std::uint32_t bits = 0; bits < 65536; ++bits) {
    BFloat16 b;
    b.bits = std::uint16_t(bits);
    Half h;
    h.bits = std::uint16_t(bits);
    float fb = float(b), fh = float(h);
    if (!std::isnan(fb)) REQUIRE(BFloat16(fb).bits == b.bits);
    if (!std::isnan(fh)) REQUIRE(Half(fh).bits == h.bits);
    if (!std::isnan(fh)) REQUIRE(double(fh) == ref::round_to(double(fh), ref::kF16));  // representable
  }
  // Floats across the whole range, ties and boundaries included, narrow as
  // the reference rounds them.
  Rng r(7);
  std::vector<double> probes = {0.0, -0.0, 1.0, 1.0 + 0x1p-8, 1.0 + 3 * 0x1p-8, 1.0 + 0x1p-11, 1.0 + 3 * 0x1p-11,
                                65504.0, 65519.0, 65520.0, 0x1p-24, 0x1p-25, 0x1.8p-25, 0x1p-14, 0x1.ff8p-15,
                                0x1.fep127, 0x1.ff0p127, 0x1p-126, 0x1p-133, 0x1p-149, 3.14159265f, -2.5e-6f};
  for (int i = 0; i < 200000; ++i) {
    double m = r.uniform(1.0, 2.0);
    int e = int(r.uniform(-150, 130));
    probes.push_back(double(float(std::ldexp(r.uniform() < 0.5 ? -m : m, e))));
  }
  for (double p : probes) {
    float f = float(p);
    INFO("value " << p);
    REQUIRE(double(float(BFloat16(f))) == ref::round_to(double(f), ref::kBf16));
    REQUIRE(double(float(Half(f))) == ref::round_to(double(f), ref::kF16));
  }
  CHECK(std::isnan(float(BFloat16(std::numeric_limits<float>::quiet_NaN()))));
  CHECK(std::isnan(float(Half(std::numeric_limits<float>::quiet_NaN()))));
}

TEST_CASE("f64 rounds to bf16/f16 once, not twice through f32", "[mixed][cast]") {
  // 1 + 2^-8 is the tie between bf16 neighbours 1 and 1 + 2^-7; a double
  // just above it must round up. Through f32 it first rounds to the tie and
  // then to even: down. The same for f16 at 1 + 2^-11.
  const double above_bf16_tie = 1.0 + 0x1p-8 + 0x1p-30, above_f16_tie = 1.0 + 0x1p-11 + 0x1p-30;
  REQUIRE(float(BFloat16(float(above_bf16_tie))) == 1.0f);  // the double rounding this test guards against
  CHECK(double(float(math::convert<BFloat16>(above_bf16_tie))) == 1.0 + 0x1p-7);
  CHECK(double(float(math::convert<Half>(above_f16_tie))) == 1.0 + 0x1p-10);
  CHECK(double(float(math::convert<BFloat16>(-above_bf16_tie))) == -(1.0 + 0x1p-7));
  Rng r(8);
  for (int i = 0; i < 200000; ++i) {
    // Near-ties of both formats, and random doubles over the whole range.
    double m = 1.0 + std::floor(r.uniform(0, 256)) * 0x1p-8 + 0x1p-9 + (r.uniform() - 0.5) * 0x1p-40;
    double x = std::ldexp(r.uniform() < 0.5 ? -m : m, int(r.uniform(-140, 128)));
    if (i % 2) x = std::ldexp(r.uniform(1, 2), int(r.uniform(-160, 130)));
    INFO("value " << x);
    REQUIRE(double(float(math::convert<BFloat16>(x))) == ref::round_to(x, ref::kBf16));
    REQUIRE(double(float(math::convert<Half>(x))) == ref::round_to(x, ref::kF16));
  }
  CHECK(std::isinf(float(math::convert<BFloat16>(1e300))));
  CHECK(std::isinf(float(math::convert<Half>(-1e10))));
  CHECK(std::isnan(float(math::convert<Half>(std::nan("")))));
}

TEST_CASE("the CPU backend's vectorised bulk conversions equal the scalar ones bit for bit, in every instruction set",
          "[mixed][cast][isa]") {
  test_support::KeepCpuIsa keep;
  for (cpu::CpuIsa isa : {cpu::CpuIsa::base, cpu::CpuIsa::avx2, cpu::CpuIsa::avx512}) {
    if (isa > cpu::widest_cpu_isa()) continue;
    INFO("instruction set " << cpu::isa_name(isa));
    cpu::forced_cpu_isa = int(isa);
    // Every 16-bit pattern, widened.
    std::vector<BFloat16> b(65536);
    std::vector<Half> h(65536);
    for (std::uint32_t i = 0; i < 65536; ++i) b[i].bits = h[i].bits = std::uint16_t(i);
    std::vector<float> fb(65536), fh(65536);
    cpu::convert_into(b.data(), fb.data(), 65536);
    cpu::convert_into(h.data(), fh.data(), 65536);
    std::size_t bad = 0;
    for (std::uint32_t i = 0; i < 65536; ++i) {
      float wb = float(b[i]), wh = float(h[i]);
      bad += std::memcmp(&fb[i], &wb, 4) != 0;
      bad += std::memcmp(&fh[i], &wh, 4) != 0;
    }
    CHECK(bad == 0);
    // Narrowing: every sign/exponent/top-mantissa combination (the high 16
    // bits) with low bits at and around both formats' rounding points (bit 15
    // for bf16; bits 12-13 for f16 normals, higher for its subnormals), plus
    // random patterns; one element more than whole blocks, so the loops'
    // tails are covered too.
    const std::uint32_t lows[] = {0x0000, 0x0001, 0x0fff, 0x1000, 0x1001, 0x1fff, 0x2000, 0x2001, 0x3000,
                                  0x7fff, 0x8000, 0x8001, 0xa000, 0xc000, 0xefff, 0xf000, 0xffff};
    std::vector<float> f;
    for (std::uint32_t hi = 0; hi < 65536; ++hi)
      for (std::uint32_t lo : lows) f.push_back(std::bit_cast<float>((hi << 16) | lo));
    Rng r(3);
    for (int i = 0; i < (1 << 20) + 1; ++i) f.push_back(std::bit_cast<float>(std::uint32_t(r.uniform() * 4294967296.0)));
    std::vector<BFloat16> nb(f.size());
    std::vector<Half> nh(f.size());
    cpu::convert_into(f.data(), nb.data(), std::int64_t(f.size()));
    cpu::convert_into(f.data(), nh.data(), std::int64_t(f.size()));
    bad = 0;
    std::size_t first = 0;
    for (std::size_t i = 0; i < f.size(); ++i)
      if (nb[i].bits != BFloat16(f[i]).bits || nh[i].bits != Half(f[i]).bits) {
        if (!bad) first = i;
        ++bad;
      }
    INFO(bad << " of " << f.size() << " differ; first: f32 bits " << std::hex << std::bit_cast<std::uint32_t>(f[first]));
    CHECK(bad == 0);
    // Rounding in place (the fused kernel's store-and-reload of each step):
    // the same patterns, block by block, with a partial block at the end.
    std::vector<float> rb = f, rh = f;
    for (std::size_t i = 0; i < f.size(); i += cpu::bulk::kBlock) {
      const int n = int(std::min<std::size_t>(cpu::bulk::kBlock, f.size() - i));
      cpu::round_block<BFloat16>(rb.data() + i, n);
      cpu::round_block<Half>(rh.data() + i, n);
    }
    bad = 0;
    for (std::size_t i = 0; i < f.size(); ++i) {
      float wb = float(BFloat16(f[i])), wh = float(Half(f[i]));
      bad += std::memcmp(&rb[i], &wb, 4) != 0;
      bad += std::memcmp(&rh[i], &wh, 4) != 0;
    }
    CHECK(bad == 0);
  }
}

TEST_CASE("the cast op converts between f32, f64, bf16 and f16 in both directions", "[mixed][cast]") {
  const DType all[] = {DType::f32, DType::f64, DType::bf16, DType::f16};
  auto format_of = [](DType t) {
    return t == DType::bf16 ? ref::kBf16 : t == DType::f16 ? ref::kF16 : t == DType::f32 ? ref::kF32 : ref::Format{53, -1022, std::numeric_limits<double>::max()};
  };
  // Values exact in f64 only, with ties and f16-overflowing ones.
  std::vector<double> v = {0.1, -1.0 / 3, 1.0 + 0x1p-8 + 0x1p-30, 65520.0, -7e4, 1e-6, 2.5, -0.0, 0x1p-20};
  for (DType from : all)
    for (DType to : all) {
      Tensor x = tensor_of(v, {std::int64_t(v.size())}, from);
      std::vector<double> in = values(x);  // what x holds after rounding to `from`
      Tensor y = run([&](const std::vector<Var>& vs) { return cast(vs[0], to); }, {x});
      INFO("cast " << dtype_name(from) << " -> " << dtype_name(to));
      REQUIRE(y.dtype() == to);
      std::vector<double> want;
      for (double e : in) want.push_back(ref::round_to(e, format_of(to)));
      CHECK(values(y) == want);
    }
}

TEST_CASE("cast's backward casts the gradient back to the input's dtype", "[mixed][cast]") {
  // L = sum(cast(w, bf16) * R): dL/dw = R (bf16) cast to f32.
  std::vector<double> wv = draw(1, 12, 0.1, 1, ref::kF32), rv = draw(2, 12, 0.1, 1, ref::kBf16);
  Tensor w = tensor_of(wv, {3, 4}, DType::f32), rt = tensor_of(rv, {3, 4}, DType::bf16);
  Step step = compile_gradients(
      [&] {
        Var wb = cast(persistent_var(w, ValueKind::parameter, "w"), DType::bf16);
        return cast(sum(wb * persistent_var(rt, ValueKind::state, "R")), DType::f32);
      },
      {}, {w});
  step.run();
  Tensor g = step.grad(w);
  CHECK(g.dtype() == DType::f32);
  CHECK(values(g) == rv);
  // cast to the same dtype adds nothing to the graph.
  Graph gr;
  CaptureScope scope(gr);
  Var a{&gr, gr.add_input({DType::f32, Shape{2}}, "a")};
  CHECK(cast(a, DType::f32).id == a.id);
}

TEST_CASE("cast rejects non-floating dtypes with a ShapeError", "[mixed][cast][errors]") {
  Graph g;
  CaptureScope scope(g);
  Var x{&g, g.add_input({DType::f32, Shape{2, 3}}, "x")};
  Var l{&g, g.add_input({DType::i32, Shape{4}}, "l")};
  std::string m = shape_error([&] { cast(x, DType::i32); });
  CHECK_THAT(m, Contains("cast") && Contains("f32[2, 3]") && Contains("i32"));
  m = shape_error([&] { cast(l, DType::f32); });
  CHECK_THAT(m, Contains("cast") && Contains("i32[4]"));
}

// ---- elementwise -----------------------------------------------------------
// A bf16/f16 elementwise kernel reads its inputs into f32, runs the f32
// arithmetic of the shared functor and rounds once. On inputs representable
// in the 16-bit format, the f32 kernel runs the very same f32 operations, so
// the 16-bit result must be the f32 result rounded once: bitwise, with no
// tolerance. (That implies |y16 - y32| <= u |y32| in the normal range.)

namespace {

template <class F>
void check_unary(F f, double lo, double hi, bool positive = false) {
  for (const Format16& h : kFormats) {
    const std::string what = std::string(F::name) + " " + dtype_name(h.dtype);
    std::vector<double> xv = draw(ops::Unary<F>{}.name().size() * 31 + 5, 40, lo, hi, h.fmt, positive);
    Build fwd = [&](const std::vector<Var>& v) { return apply1<ops::Unary<F>>({v[0]}, f); };
    Tensor y32 = run_as(fwd, {xv}, {Shape{5, 8}}, DType::f32);
    Tensor y16 = run_as(fwd, {xv}, {Shape{5, 8}}, h.dtype);
    REQUIRE(y16.dtype() == h.dtype);
    expect_rounded_once(what + " forward", values(y16), values(y32), h.fmt);
    // The gradient kernel on (x, y, dy), all representable: y is the 16-bit
    // forward's own output.
    std::vector<double> yv = values(y16), dyv = draw(77, 40, 0.1, 1, h.fmt);
    Build bwd = [&](const std::vector<Var>& v) { return apply1<ops::UnaryGrad<F>>({v[0], v[1], v[2]}, f); };
    Tensor g32 = run_as(bwd, {xv, yv, dyv}, {Shape{5, 8}, Shape{5, 8}, Shape{5, 8}}, DType::f32);
    Tensor g16 = run_as(bwd, {xv, yv, dyv}, {Shape{5, 8}, Shape{5, 8}, Shape{5, 8}}, h.dtype);
    expect_rounded_once(what + " gradient", values(g16), values(g32), h.fmt);
  }
}

}  // namespace

TEST_CASE("bf16/f16 unary ops and their gradients are the f32 kernel rounded once", "[mixed][elementwise]") {
  check_unary(math::Relu{}, 0.1, 2);
  check_unary(math::GeluTanh{}, 0.1, 4);
  check_unary(math::GeluErf{}, 0.1, 4);
  check_unary(math::Tanh{}, 0.1, 3);
  check_unary(math::Sigmoid{}, 0.1, 6);
  check_unary(math::Exp{}, 0.1, 5);
  check_unary(math::Log{}, 0.05, 20, true);
  check_unary(math::Rsqrt{}, 0.05, 20, true);
  check_unary(math::Affine{0.3, -1.25}, 0.1, 3);
}

TEST_CASE("bf16/f16 add, sub, mul, div with broadcasting are the f32 kernel rounded once", "[mixed][elementwise]") {
  struct Shapes {
    Shape a, b;
  };
  const Shapes cases[] = {{{3, 5}, {3, 5}}, {{3, 5}, {5}}, {{3, 1}, {1, 4}}, {{2, 1, 4}, {3, 1}}, {{4}, {2, 3, 4}}};
  const std::function<Var(Var, Var)> fns[] = {[](Var a, Var b) { return a + b; }, [](Var a, Var b) { return a - b; },
                                              [](Var a, Var b) { return a * b; }, [](Var a, Var b) { return a / b; }};
  const char* names[] = {"add", "sub", "mul", "div"};
  for (const Format16& h : kFormats)
    for (std::size_t k = 0; k < 4; ++k)
      for (const Shapes& s : cases) {
        std::vector<double> av = draw(k + 1, s.a.numel(), 0.1, 3, h.fmt), bv = draw(k + 9, s.b.numel(), 0.5, 2, h.fmt);
        Build b = [&](const std::vector<Var>& v) { return fns[k](v[0], v[1]); };
        Tensor y32 = run_as(b, {av, bv}, {s.a, s.b}, DType::f32), y16 = run_as(b, {av, bv}, {s.a, s.b}, h.dtype);
        REQUIRE(y16.shape() == y32.shape());
        expect_rounded_once(cat(names[k], " ", s.a.str(), " ", s.b.str(), " ", dtype_name(h.dtype)), values(y16),
                            values(y32), h.fmt);
      }
}

TEST_CASE("bf16/f16 ops accept only matching dtypes", "[mixed][errors]") {
  Graph g;
  CaptureScope scope(g);
  Var a{&g, g.add_input({DType::bf16, Shape{2, 3}}, "a")};
  Var b{&g, g.add_input({DType::f32, Shape{2, 3}}, "b")};
  Var w{&g, g.add_input({DType::f16, Shape{4, 3}}, "w")};
  CHECK_THAT(shape_error([&] { a + b; }), Contains("add") && Contains("bf16[2, 3]") && Contains("f32[2, 3]"));
  CHECK_THAT(shape_error([&] { matmul(a, w, false, true); }),
             Contains("matmul") && Contains("bf16[2, 3]") && Contains("f16[4, 3]"));
  CHECK_THAT(shape_error([&] { linear(a, w); }), Contains("linear") && Contains("bf16[2, 3]") && Contains("f16[4, 3]"));
}

// ---- reductions --------------------------------------------------------------

TEST_CASE("bf16/f16 sum accumulates in f64 and rounds once; mean adds one rounding", "[mixed][reduce]") {
  struct Case {
    Shape s;
    std::vector<int> axes;
  };
  const Case cases[] = {{{6, 7}, {}}, {{6, 7}, {0}}, {{6, 7}, {1}}, {{3, 4, 5}, {0, 2}}, {{2, 300}, {1}}, {{300, 3}, {0}}};
  for (const Format16& h : kFormats)
    for (const Case& c : cases) {
      std::vector<double> xv = draw(c.s.numel(), c.s.numel(), 0.1, 3, h.fmt);
      ref::Array xa{c.s.dims(), xv};
      const std::string what = cat("sum ", c.s.str(), " axes ", c.axes.size(), " ", dtype_name(h.dtype));
      // Inputs >= 0.1 in these formats are multiples of 2^-14 below 3, so
      // sums of up to 2^12 of them need < 30 bits: f64 holds them exactly,
      // and the one rounding on store makes the result the exact sum
      // rounded, bit for bit.
      ref::Array want = ref::sum(xa, c.axes);
      Tensor y = run_as([&](const std::vector<Var>& v) { return sum(v[0], c.axes); }, {xv}, {c.s}, h.dtype);
      REQUIRE(y.dtype() == h.dtype);
      REQUIRE(y.shape().dims() == want.shape);
      CHECK(values(y) == ref::round_to(want, h.fmt).v);
      // mean = sum * (1/n): the rounded sum, times 1/n rounded to f32
      // (relative error 2^-24), computed in f32 and rounded again:
      // |mean16 - mean| <= (2u + u^2 + 2^-23) |mean|.
      ref::Array mw = ref::mean(xa, c.axes);
      Tensor m = run_as([&](const std::vector<Var>& v) { return mean(v[0], c.axes); }, {xv}, {c.s}, h.dtype);
      double u = ref::unit_roundoff(h.fmt);
      expect_within("mean" + what.substr(3), values(m), mw.v, relative_bound(mw.v, 2 * u + u * u + 0x1p-23, h.fmt));
    }
}

TEST_CASE("a long bf16/f16 sum does not stall as 16-bit accumulation would", "[mixed][reduce]") {
  // 4096 ones: an f16 accumulator stops growing at 2048 (2048 + 1 rounds
  // back to 2048), a bf16 one at 256. frugal's sum accumulates in f64.
  for (const Format16& h : kFormats) {
    std::vector<double> ones(4096, 1.0);
    Tensor y = run_as([](const std::vector<Var>& v) { return sum(v[0]); }, {ones}, {Shape{4096}}, h.dtype);
    CHECK(values(y)[0] == 4096.0);
    Tensor m = run_as([](const std::vector<Var>& v) { return mean(v[0]); }, {ones}, {Shape{64, 64}}, h.dtype);
    CHECK(values(m)[0] == 1.0);
  }
}

TEST_CASE("bf16/f16 broadcast_to copies exactly", "[mixed][reduce]") {
  for (const Format16& h : kFormats) {
    std::vector<double> xv = draw(3, 4, 0.1, 3, h.fmt);
    Tensor y = run_as([](const std::vector<Var>& v) { return broadcast_to(v[0], Shape{3, 4}); }, {xv}, {Shape{4}},
                      h.dtype);
    REQUIRE(y.dtype() == h.dtype);
    CHECK(values(y) == ref::broadcast_to(ref::Array{{4}, xv}, {3, 4}).v);
  }
}

// ---- softmax and cross-entropy -------------------------------------------------
// Computed in f32 from the same inputs, rounded once on store: bitwise the
// f32 kernel's result rounded, as for the elementwise ops.

TEST_CASE("bf16/f16 softmax and log_softmax, and their gradients, are the f32 kernel rounded once",
          "[mixed][softmax]") {
  for (const Format16& h : kFormats)
    for (int axis : {-1, 0, 1})
      for (bool log_form : {false, true}) {
        const std::string what = cat(log_form ? "log_softmax" : "softmax", " axis ", axis, " ", dtype_name(h.dtype));
        Shape s{4, 6, 5};
        std::vector<double> xv = draw(std::uint64_t(axis + 10), s.numel(), 0.1, 4, h.fmt);
        Build fwd = [&](const std::vector<Var>& v) { return log_form ? log_softmax(v[0], axis) : softmax(v[0], axis); };
        Tensor y32 = run_as(fwd, {xv}, {s}, DType::f32), y16 = run_as(fwd, {xv}, {s}, h.dtype);
        expect_rounded_once(what + " forward", values(y16), values(y32), h.fmt);
        std::vector<double> yv = values(y16), dyv = draw(5, s.numel(), 0.1, 1, h.fmt);
        Build bwd = [&](const std::vector<Var>& v) {
          return log_form ? apply1<ops::LogSoftmaxGrad>({v[0], v[1]}, axis) : apply1<ops::SoftmaxGrad>({v[0], v[1]}, axis);
        };
        Tensor g32 = run_as(bwd, {yv, dyv}, {s, s}, DType::f32), g16 = run_as(bwd, {yv, dyv}, {s, s}, h.dtype);
        expect_rounded_once(what + " gradient", values(g16), values(g32), h.fmt);
      }
}

TEST_CASE("cross_entropy of bf16/f16 logits is an f32 loss, equal to the f32 kernel's", "[mixed][loss]") {
  for (const Format16& h : kFormats) {
    Shape s{2, 3, 7};
    std::vector<double> xv = draw(21, s.numel(), 0.1, 5, h.fmt);
    std::vector<double> lab = {0, 6, 3, 2, 5, 1};
    Build fwd = [](const std::vector<Var>& v) { return cross_entropy(v[0], v[1]); };
    Tensor l32 = run_as(fwd, {xv, lab}, {s, Shape{2, 3}}, DType::f32, {DType::u8, DType::i32});
    Tensor l16 = run_as(fwd, {xv, lab}, {s, Shape{2, 3}}, h.dtype, {DType::u8, DType::i32});
    REQUIRE(l16.dtype() == DType::f32);  // the documented choice: an f32 loss for 16-bit logits
    CHECK(l16.item<float>() == l32.item<float>());
    // ... and the f32 loss is as close to the f64 reference on these logits
    // as an f32 computation of 7-term sums is (a few f32 ulp of |loss| ~ 2).
    double want = ref::cross_entropy({s.dims(), xv}, {{2, 3}, lab}).v[0];
    CHECK(std::abs(double(l16.item<float>()) - want) <= 1e-6 * (1 + std::abs(want)));
    // The gradient kernel, with the f32 loss gradient as its seed.
    std::vector<double> seed = {0.75};
    Build bwd = [](const std::vector<Var>& v) { return apply1<ops::CrossEntropyGrad>({v[0], v[1], v[2]}); };
    Tensor g32 = run_as(bwd, {xv, lab, seed}, {s, Shape{2, 3}, Shape{}}, DType::f32, {DType::u8, DType::i32, DType::f32});
    Tensor g16 = run_as(bwd, {xv, lab, seed}, {s, Shape{2, 3}, Shape{}}, h.dtype, {DType::u8, DType::i32, DType::f32});
    REQUIRE(g16.dtype() == h.dtype);
    expect_rounded_once(cat("cross_entropy gradient ", dtype_name(h.dtype)), values(g16), values(g32), h.fmt);
  }
  // A 16-bit loss gradient seed is a shape error: the loss is f32.
  Graph g;
  CaptureScope scope(g);
  Var x{&g, g.add_input({DType::bf16, Shape{4, 3}}, "x")}, l{&g, g.add_input({DType::i32, Shape{4}}, "l")};
  Var d{&g, g.add_input({DType::bf16, Shape{}}, "d")};
  CHECK_THAT(shape_error([&] { apply1<ops::CrossEntropyGrad>({x, l, d}); }),
             Contains("cross_entropy_grad") && Contains("bf16[]") && Contains("f32"));
}

// ---- matrix products ----------------------------------------------------------

namespace {

// A bf16/f16 product of f32 data: inputs rounded to the format (relative
// error u each), multiplied in f32 (K-term accumulation: error <= K 2^-24
// (1 + small) of sum|a b|, bounded by K 2^-23), rounded on store (u |y|).
// With a' = a(1+α), b' = b(1+β), |α|, |β| <= u:
//   |y16 - y| <= u |y| + ((1 + u)(2u + u^2) + u (2u + u^2) + 2 K 2^-24 (1 + u)^3) sum|a b|
//             <= u |y| + (2u + 4u^2 + K 2^-22) sum|a b|,
// where y and sum|a b| are the f64 reference on the unrounded f32 inputs.
std::vector<double> product_bound(const ref::Array& y, const ref::Array& abs_terms, std::int64_t K, ref::Format f) {
  double u = ref::unit_roundoff(f);
  std::vector<double> b(y.v.size());
  for (std::size_t i = 0; i < b.size(); ++i)
    b[i] = u * std::abs(y.v[i]) + (2 * u + 4 * u * u + double(K) * 0x1p-22) * abs_terms.v[i] + subnormal_half_ulp(f);
  return b;
}

void check_product(const std::string& name, Shape as, Shape bs, const Build& build,
                   const std::function<ref::Array(const ref::Array&, const ref::Array&)>& reference, std::int64_t K,
                   std::vector<Shape> extra = {}) {
  for (const Format16& h : kFormats) {
    const std::string what = name + " " + dtype_name(h.dtype);
    std::vector<std::vector<double>> in32 = {draw(as.numel() + 1, as.numel(), 0.1, 1, ref::kF32),
                                             draw(bs.numel() + 2, bs.numel(), 0.1, 1, ref::kF32)};
    std::vector<Shape> shapes = {as, bs};
    for (auto& s : extra) in32.push_back(draw(s.numel() + 3, s.numel(), 0.1, 1, ref::kF32)), shapes.push_back(s);
    std::vector<std::vector<double>> in16;
    for (auto& v : in32) {
      in16.push_back(v);
      for (auto& e : in16.back()) e = ref::round_to(e, h.fmt);
    }
    Tensor y16 = run_as(build, in16, shapes, h.dtype);
    REQUIRE(y16.dtype() == h.dtype);
    // Against the f64 reference on the unrounded inputs, within product_bound.
    ref::Array a{as.dims(), in32[0]}, b{bs.dims(), in32[1]};
    ref::Array y = reference(a, b), terms = reference(ref::abs(a), ref::abs(b));
    if (!extra.empty())  // the bias: one more term of the sum, rounded like the rest
      for (std::size_t i = 0; i < y.v.size(); ++i) {
        double bias = in32[2][i % in32[2].size()];
        y.v[i] += bias;
        terms.v[i] += std::abs(bias);
      }
    REQUIRE(y16.shape().dims() == y.shape);
    expect_within(what + " vs f64", values(y16), y.v, product_bound(y, terms, K, h.fmt));
    // And exactly the f32 kernel's product of the same (rounded) values,
    // rounded once, where the 16-bit path is the f32 GEMM on converted
    // operands: everywhere for f16, and for bf16 unless the CPU has
    // AVX512-BF16 (its bf16 kernel sums the same exact products in another
    // order, within the bound above; tests/gemm_test.cpp checks it), so on
    // such a CPU the instruction set is capped at AVX-512 for this part.
    test_support::KeepCpuIsa keep;
    cpu::forced_cpu_isa = std::min(int(cpu::widest_cpu_isa()), int(cpu::CpuIsa::avx512));
    Tensor y16_images = run_as(build, in16, shapes, h.dtype);
    Tensor y32 = run_as(build, in16, shapes, DType::f32);
    expect_rounded_once(what + " vs f32 GEMM", values(y16_images), values(y32), h.fmt);
  }
}

void check_mm(Shape as, Shape bs, bool ta, bool tb) {
  std::int64_t K = ta ? as.dim(-2) : as.dim(-1);
  check_product(cat("matmul ", as.str(), ta ? "^T" : "", " x ", bs.str(), tb ? "^T" : ""), as, bs,
                [=](const std::vector<Var>& v) { return matmul(v[0], v[1], ta, tb); },
                [=](const ref::Array& a, const ref::Array& b) { return ref::matmul(a, b, ta, tb); }, K);
}

}  // namespace

TEST_CASE("bf16/f16 matmul multiplies in f32 and rounds on store, every transpose and batch layout",
          "[mixed][matmul]") {
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      check_mm(ta ? Shape{7, 5} : Shape{5, 7}, tb ? Shape{3, 7} : Shape{7, 3}, ta, tb);
      check_mm(ta ? Shape{4, 6, 5} : Shape{4, 5, 6}, tb ? Shape{4, 3, 6} : Shape{4, 6, 3}, ta, tb);  // batched
      check_mm(ta ? Shape{3, 6, 5} : Shape{3, 5, 6}, tb ? Shape{4, 6} : Shape{6, 4}, ta, tb);        // shared B
      check_mm(ta ? Shape{6, 5} : Shape{5, 6}, tb ? Shape{3, 4, 6} : Shape{3, 6, 4}, ta, tb);        // shared A
    }
  check_mm({8, 256}, {256, 8}, false, false);  // a long accumulation
  check_mm({2, 3, 0}, {2, 0, 4}, false, false);  // K = 0: zeros
}

TEST_CASE("bf16/f16 linear multiplies in f32, adds the bias in f32, rounds on store", "[mixed][matmul]") {
  auto lin = [](const std::vector<Var>& v) { return v.size() == 3 ? linear(v[0], v[1], v[2]) : linear(v[0], v[1]); };
  auto ref_lin = [](const ref::Array& x, const ref::Array& w) { return ref::linear(x, w); };
  check_product("linear [2,3,16] w[5,16] b[5]", {2, 3, 16}, {5, 16}, lin, ref_lin, 16, {Shape{5}});
  check_product("linear [4,9] w[6,9]", {4, 9}, {6, 9}, lin, ref_lin, 9);
  check_product("linear [9] w[2,9] b[2]", {9}, {2, 9}, lin, ref_lin, 9, {Shape{2}});
}

TEST_CASE("bf16/f16 products plan their f32 workspace; f32 ones, and bf16 ones on the bf16 kernel, need none",
          "[mixed][matmul][plan]") {
  test_support::KeepCpuIsa keep;
  // Capped at AVX-512 (no AVX512-BF16), and then as the CPU is.
  for (const int isa : {std::min(int(cpu::widest_cpu_isa()), int(cpu::CpuIsa::avx512)), -1})
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    cpu::forced_cpu_isa = isa;
    Tensor a({4, 5, 6}, dt), b({4, 6, 3}, dt), x({7, 6}, dt), w({3, 6}, dt), bias({3}, dt);
    Step step = compile_inference(
        [&] {
          Var p = matmul(persistent_var(a, ValueKind::parameter, "a"), persistent_var(b, ValueKind::parameter, "b"));
          Var q = linear(persistent_var(x, ValueKind::parameter, "x"), persistent_var(w, ValueKind::parameter, "w"),
                         persistent_var(bias, ValueKind::parameter, "bias"));
          return std::vector<Var>{p, q};
        },
        {});
    std::vector<std::size_t> ws;
    for (const Node& n : step.graph().nodes())
      if (n.has_workspace) ws.push_back(step.graph().value(n.outputs.back()).meta.nbytes());
    INFO(dtype_name(dt) << ", instruction set " << cpu::isa_name(cpu::cpu_isa()));
    // The bf16 kernel reads and writes bf16 itself: no images (depth 6 in both products).
    const bool bf16_direct = dt == DType::bf16 && cpu::bf16_gemm_direct(6);
    if (isa < 0 && dt == DType::bf16)
      CHECK(bf16_direct == (cpu::bf16gemm512::available() && !cpu::gemm_detail::openblas_forced()));
    if (dt == DType::f32 || bf16_direct) {
      CHECK(ws.empty());
    } else {
      REQUIRE(ws.size() == 2);
      CHECK(ws[0] == cpu::f32_images(4 * 5 * 6, 4 * 6 * 3, 4 * 5 * 3).bytes);
      CHECK(ws[1] == cpu::f32_images(7 * 6, 3 * 6, 7 * 3).bytes);
      // [A | B | C] at aligned offsets: 480 B -> 512, 288 B -> 512, then 240 B.
      CHECK(ws[0] == 512 + 512 + 240);
    }
    step.run();  // zeros in, zeros out, in any dtype
  }
}

// ---- training in bf16 with f32 master weights -------------------------------------

namespace {

// Parameters in f32; the input is cast to `act` and linear() casts the f32
// weights to it, so every activation is `act` and the loss is f32.
struct MixedMlp : nn::Module {
  nn::Linear fc1, fc2, fc3;
  DType act;
  MixedMlp(int in, int hidden, int out, DType a) : fc1(in, hidden), fc2(hidden, hidden), fc3(hidden, out), act(a) {
    register_module("fc1", fc1);
    register_module("fc2", fc2);
    register_module("fc3", fc3);
  }
  Var forward(Var x) { return fc3(frugal::tanh(fc2(gelu(fc1(cast(x, act)))))); }
};

using toy::make_batch;

struct Run {
  std::vector<float> losses;
  std::vector<Tensor> initial, params;
};

Run train_mlp(DType act, int steps, CompileOptions o = {}, double lr = 3e-3) {
  nn::manual_seed(5);
  MixedMlp model(16, 64, 4, act);
  optim::AdamW opt(model.parameters(), {.lr = lr});
  Step step = compile([&](Var x, Var y) { return cross_entropy(model.forward(x), y); },
                      {input<float>({64, 16}), input<std::int32_t>({64})}, opt, {}, o);
  Tensor x({64, 16}), y({64}, DType::i32);
  Run r;
  for (auto& p : model.parameters()) r.initial.push_back(p.clone());
  for (int s = 0; s < steps; ++s) {
    make_batch(x, y, std::uint64_t(s));
    r.losses.push_back(step.run(x, y));
  }
  for (auto& p : model.parameters()) r.params.push_back(p.clone());
  return r;
}

}  // namespace

TEST_CASE("an MLP trained 20 steps in bf16 with f32 master weights tracks the f32 run", "[mixed][train]") {
  Run f32 = train_mlp(DType::f32, 20), bf16 = train_mlp(DType::bf16, 20);
  // The bf16 forward rounds the input, each layer's weights and each
  // activation (relative error <= 2^-8 each): over three layers a logit
  // (|z| <~ 2) carries an error of a few times 2^-8 |z|, and the
  // cross-entropy moves by at most 2 max|Δz| per position -- ~0.03 in the
  // worst case. The roundings are independent and of either sign, and the
  // loss averages 64 positions, so the typical difference is ~1/8 of that:
  // 0.005 (observed: ~5e-4 over 20 steps, as the trajectories separate
  // slowly). A bf16 path that computed in 16 bits, rounded twice, or lost a
  // gradient term would exceed it.
  double worst = 0;
  for (int s = 0; s < 20; ++s) {
    double d = std::abs(double(bf16.losses[std::size_t(s)]) - double(f32.losses[std::size_t(s)]));
    worst = std::max(worst, d);
    INFO("step " << s << ": f32 loss " << f32.losses[std::size_t(s)] << ", bf16 " << bf16.losses[std::size_t(s)]);
    CHECK(d <= 0.005);
  }
  INFO("largest loss difference " << worst);
  CHECK(worst > 0);  // it really ran in bf16
  CHECK(f32.losses.back() < 0.8f * f32.losses.front());  // and both trained
  CHECK(bf16.losses.back() < 0.8f * bf16.losses.front());
  // The master weights stay f32 and take nearly the f32 run's steps. AdamW
  // normalises each step, so a weight whose gradient is ~0 may step either
  // way in either run: compare in aggregate, the difference between the runs
  // against how far the f32 run moved the weights (observed: <= 0.5%).
  for (std::size_t i = 0; i < f32.params.size(); ++i) {
    REQUIRE(bf16.params[i].dtype() == DType::f32);
    std::vector<double> a = values(f32.params[i]), b = values(bf16.params[i]), a0 = values(f32.initial[i]),
                        b0 = values(bf16.initial[i]);
    REQUIRE(a0 == b0);  // the same initial weights
    double apart = 0, moved = 0;
    for (std::size_t j = 0; j < a.size(); ++j) apart += std::abs(a[j] - b[j]), moved += std::abs(a[j] - a0[j]);
    INFO("parameter " << i << ": sum |f32 - bf16| " << apart << ", sum |f32 step| " << moved);
    CHECK(apart <= 0.05 * moved);
  }
}

TEST_CASE("the gradients of f32 master weights read through a cast are f32", "[mixed][train]") {
  nn::manual_seed(2);
  MixedMlp model(6, 8, 3, DType::bf16);
  Step step = compile_gradients([&](Var x, Var y) { return cross_entropy(model.forward(x), y); },
                                {input<float>({5, 6}), input<std::int32_t>({5})}, model.parameters());
  Tensor x({5, 6}), y({5}, DType::i32);
  make_batch(x, y, 1, 3);
  float loss = step.run(x, y);
  CHECK(std::isfinite(loss));
  for (auto& p : model.parameters()) {
    Tensor g = step.grad(p);
    CHECK(g.dtype() == DType::f32);
    CHECK(g.shape() == p.shape());
  }
  // The activations between the casts are bf16.
  int bf16_products = 0;
  for (const Node& n : step.graph().nodes())
    if (n.op->name() == "linear" && step.graph().value(n.outputs[0]).meta.dtype == DType::bf16) ++bf16_products;
  CHECK(bf16_products == 3);
}

// ---- f16 with dynamic loss scaling -------------------------------------------------

namespace {


// Everything an AdamW step may write: parameters, both moments, the count
// of steps taken.
std::vector<std::vector<char>> adamw_state(const nn::Module& m, const optim::AdamW& opt) {
  std::vector<std::vector<char>> s;
  auto ps = m.parameters();
  for (std::size_t i = 0; i < ps.size(); ++i) {
    s.push_back(bytes_of(ps[i]));
    s.push_back(bytes_of(opt.exp_avg(i)));
    s.push_back(bytes_of(opt.exp_avg_sq(i)));
  }
  std::int64_t taken = opt.steps_taken();
  s.push_back({reinterpret_cast<char*>(&taken), reinterpret_cast<char*>(&taken) + 8});
  return s;
}

// A batch whose features are `gain` times larger than make_batch's: the
// first layer's weight gradient (dy^T x) grows with them.
void make_loud_batch(Tensor& x, Tensor& y, std::uint64_t seed, float gain) {
  make_batch(x, y, seed);
  for (std::int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] *= gain;
}

// Logits straight from the (cast) input: nothing saturates between the loss
// and the weight, so loud inputs make loud weight gradients.
struct LinearProbe : nn::Module {
  nn::Linear fc{16, 4};
  LinearProbe() { register_module("fc", fc); }
  Var forward(Var x) { return fc(cast(x, DType::f16)); }
};

bool has_non_finite(const Tensor& t) {
  for (double v : values(t))
    if (!std::isfinite(v)) return true;
  return false;
}

}  // namespace

TEST_CASE("an f16 step whose scaled gradients overflow is skipped: nothing changes and the scale halves",
          "[mixed][loss_scaling]") {
  nn::manual_seed(5);
  LinearProbe model;
  optim::AdamW opt(model.parameters(), {.lr = 3e-3});
  optim::LossScaler scaler;  // GradScaler's defaults: 2^16, x2 every 2000 good steps, x0.5 on overflow
  REQUIRE(scaler.scale() == 65536.0f);
  Step step = compile([&](Var x, Var y) { return cross_entropy(model.forward(x), y); },
                      {input<float>({64, 16}), input<std::int32_t>({64})}, opt, {},
                      {.keep_grads = true, .loss_scaler = &scaler});
  Tensor x({64, 16}), y({64}, DType::i32);
  // dW = dlogits^T x / 64 with |x| up to ~600 and |dlogits| <= 1: ~100
  // unscaled, so the f16 gradient overflows (> 65504) at scales above ~2^9.
  make_loud_batch(x, y, 0, 200.0f);  // the same batch every step: a skipped step must change nothing
  const Tensor w = model.fc.weight;

  int skipped = 0;
  std::vector<std::vector<char>> before;
  for (;; ++skipped) {
    REQUIRE(skipped < 20);
    before = adamw_state(model, opt);
    float scale_before = scaler.scale();
    float loss = step.run(x, y);
    CHECK(std::isfinite(loss));  // the forward is fine; the scaled gradients are not
    if (!scaler.last_step_skipped()) break;
    INFO("skipped step " << skipped << " at scale " << scale_before);
    CHECK(has_non_finite(step.grad(w)));       // the kept (scaled) gradient really overflowed f16
    CHECK(adamw_state(model, opt) == before);  // bitwise: parameters, moments, step count
    CHECK(scaler.scale() == scale_before * 0.5f);
    CHECK(scaler.growth_tracker() == 0);
    CHECK(scaler.skipped_steps() == skipped + 1);
  }
  INFO("first step taken after " << skipped << " skipped, at scale " << scaler.scale());
  CHECK(skipped >= 5);  // 2^16 overflowed, and so did the next scales
  CHECK(!has_non_finite(step.grad(w)));
  CHECK(adamw_state(model, opt) != before);  // this one was taken
  CHECK(opt.steps() == skipped + 1);         // steps run
  CHECK(opt.steps_taken() == 1);             // steps applied: the bias correction of step 1
  CHECK(scaler.growth_tracker() == 1);
  CHECK(scaler.skipped_steps() == skipped);
}

TEST_CASE("after growth_interval overflow-free steps the loss scale doubles", "[mixed][loss_scaling]") {
  nn::manual_seed(5);
  MixedMlp model(16, 64, 4, DType::f16);
  optim::AdamW opt(model.parameters(), {.lr = 3e-3});
  optim::LossScaler scaler({.init_scale = 1024, .growth_interval = 4});
  Step step = compile([&](Var x, Var y) { return cross_entropy(model.forward(x), y); },
                      {input<float>({64, 16}), input<std::int32_t>({64})}, opt, {}, {.loss_scaler = &scaler});
  Tensor x({64, 16}), y({64}, DType::i32);
  const float scales[] = {1024, 1024, 1024, 2048, 2048, 2048, 2048, 4096, 4096};
  const int trackers[] = {1, 2, 3, 0, 1, 2, 3, 0, 1};
  for (int s = 0; s < 9; ++s) {
    make_batch(x, y, std::uint64_t(s));
    step.run(x, y);
    INFO("after step " << s);
    REQUIRE(!scaler.last_step_skipped());
    CHECK(scaler.scale() == scales[s]);
    CHECK(scaler.growth_tracker() == trackers[s]);
  }
  CHECK(opt.steps_taken() == 9);
  CHECK(scaler.skipped_steps() == 0);
}

TEST_CASE("without overflow, loss scaling changes nothing in f32 and tracks the f32 run in f16",
          "[mixed][loss_scaling]") {
  // f32: multiplying the loss by 2^16 and the gradients by 2^-16 is exact
  // (no value comes near f32's range limits), so the run is bitwise the
  // unscaled one -- for AdamW and for SGD with momentum.
  {
    optim::LossScaler scaler;
    Run plain = train_mlp(DType::f32, 10), scaled = train_mlp(DType::f32, 10, {.loss_scaler = &scaler});
    CHECK(scaler.skipped_steps() == 0);
    CHECK(plain.losses == scaled.losses);
    for (std::size_t i = 0; i < plain.params.size(); ++i) CHECK(bytes_of(plain.params[i]) == bytes_of(scaled.params[i]));
  }
  // f16 with f32 master weights and the default scale 2^16, against the
  // f32 run. f16 rounds with u = 2^-11, 8 times finer than bf16, so the bf16
  // test's bounds shrink 8-fold: 0.005 / 8 on the loss (observed: 6e-5),
  // 5% / 8 of the weights' movement (observed: 0.1%). Without the scale the
  // f16 gradients of the small weights would flush to zero or lose bits as
  // subnormals; with it they do not.
  optim::LossScaler scaler;
  Run f32 = train_mlp(DType::f32, 20), f16 = train_mlp(DType::f16, 20, {.loss_scaler = &scaler});
  REQUIRE(scaler.skipped_steps() == 0);
  for (int s = 0; s < 20; ++s) {
    INFO("step " << s << ": f32 loss " << f32.losses[std::size_t(s)] << ", f16 " << f16.losses[std::size_t(s)]);
    CHECK(std::abs(double(f16.losses[std::size_t(s)]) - double(f32.losses[std::size_t(s)])) <= 0.005 / 8);
  }
  for (std::size_t i = 0; i < f32.params.size(); ++i) {
    std::vector<double> a = values(f32.params[i]), b = values(f16.params[i]), a0 = values(f32.initial[i]);
    double apart = 0, moved = 0;
    for (std::size_t j = 0; j < a.size(); ++j) apart += std::abs(a[j] - b[j]), moved += std::abs(a[j] - a0[j]);
    INFO("parameter " << i << ": sum |f32 - f16| " << apart << ", sum |f32 step| " << moved);
    CHECK(apart <= 0.05 / 8 * moved);
  }
}

TEST_CASE("guarded SGD skips overflowed steps and seeds its momentum on the first step taken",
          "[mixed][loss_scaling]") {
  auto make = [](optim::LossScaler* scaler, int steps, std::vector<float>& buf, int& skipped) {
    nn::manual_seed(9);
    LinearProbe model;
    // dampening 0.5 tells a seeded buffer (= d) from a continued one (= 0.5 d).
    optim::SGD opt(model.parameters(), {.lr = 0.01, .momentum = 0.9, .dampening = 0.5});
    Step step = compile([&](Var x, Var y) { return cross_entropy(model.forward(x), y); },
                        {input<float>({64, 16}), input<std::int32_t>({64})}, opt, {}, {.loss_scaler = scaler});
    Tensor x({64, 16}), y({64}, DType::i32);
    make_loud_batch(x, y, 3, 200.0f);
    skipped = 0;
    for (int s = 0; s < steps; ++s) {
      step.run(x, y);
      if (scaler && scaler->last_step_skipped()) ++skipped, --s;
      REQUIRE(skipped < 20);
    }
    if (scaler) CHECK(opt.steps_taken() == steps);
    buf = opt.momentum_buffer(0).to_vector<float>();
  };
  optim::LossScaler scaler;
  std::vector<float> guarded, plain;
  int skipped = 0, none = 0;
  make(&scaler, 1, guarded, skipped);
  make(nullptr, 1, plain, none);
  CHECK(skipped >= 1);
  // The same parameters and batch on the first step taken: the buffers are
  // the first-layer gradient of the same f16 computation, scaled by a power
  // of two in one run and not in the other. Power-of-two scaling commutes
  // with rounding, so they agree but for gradients the unscaled run lost to
  // f16's subnormal range (|g| < 2^-14, absolute error <= 2^-25 each).
  double worst = 0, largest = 0;
  for (std::size_t i = 0; i < plain.size(); ++i) {
    worst = std::max(worst, double(std::abs(guarded[i] - plain[i])));
    largest = std::max(largest, double(std::abs(plain[i])));
  }
  INFO("largest |buffer| " << largest << ", largest difference " << worst);
  CHECK(largest > 0.1);
  CHECK(worst <= 1e-3 * largest);
}

TEST_CASE("loss scaling rejects what it cannot guard, and bad options", "[mixed][loss_scaling][errors]") {
  struct Plain final : Optimizer {
    std::vector<Tensor> p;
    const std::vector<Tensor>& params() const override { return p; }
    void append_update(Var, Var, std::size_t) override {}
    void begin_step() override {}
    std::string kind() const override { return "plain"; }
    std::int64_t steps() const override { return 0; }
    void set_steps(std::int64_t) override {}
  };
  nn::manual_seed(1);
  MixedMlp model(4, 4, 2, DType::f16);
  Plain opt;
  opt.p = model.parameters();
  optim::LossScaler scaler;
  auto fn = [&](Var x, Var y) { return cross_entropy(model.forward(x), y); };
  std::vector<InputSpec> specs{input<float>({2, 4}), input<std::int32_t>({2})};
  try {
    compile(fn, specs, opt, {}, {.loss_scaler = &scaler});
    FAIL("compile accepted an optimizer that cannot skip a step");
  } catch (const Error& e) {
    CHECK_THAT(e.what(), Contains("loss_scaler") && Contains("SkippableOptimizer"));
  }
  CHECK_THROWS_WITH(compile_inference([&](Var x) { return model.forward(x); }, {input<float>({2, 4})}, {},
                                      {.loss_scaler = &scaler}),
                    Contains("compile_inference") && Contains("loss_scaler"));
  CHECK_THROWS_WITH(optim::LossScaler({.backoff_factor = 1.5}), Contains("backoff_factor"));
  CHECK_THROWS_WITH(optim::LossScaler({.growth_factor = 1.0}), Contains("growth_factor"));
  CHECK_THROWS_WITH(optim::LossScaler({.init_scale = 0}), Contains("init_scale"));
  CHECK_THROWS_WITH(optim::LossScaler({.growth_interval = 0}), Contains("growth_interval"));
}

// ---- batched matmul: the batch split ----------------------------------------------

TEST_CASE("batched matmul splits small items over threads and keeps large uneven batches whole",
          "[mixed][matmul][threads]") {
  CHECK(cpu::split_batch(32, 128, 128, 64, 2));   // attention scores: 2 MFLOP items
  CHECK(cpu::split_batch(3, 128, 128, 64, 2));    // small items: split even when uneven
  CHECK(cpu::split_batch(4, 512, 512, 512, 2));   // large, but the threads share evenly
  CHECK(!cpu::split_batch(3, 512, 512, 512, 2));  // large and uneven: one multi-threaded GEMM each
  CHECK(cpu::split_batch(9, 512, 512, 512, 2));   // uneven by one item in ten: split
  CHECK(!cpu::split_batch(32, 128, 128, 64, 1));  // one thread: nothing to split
  CHECK(!cpu::split_batch(1, 128, 128, 64, 2));
}

TEST_CASE("the batch split gives the bits of one thread, and the f64 reference's values", "[mixed][matmul][threads]") {
  // Split or not, each item is one single-threaded GEMM call on the same
  // data: 2 threads (split) and 1 thread (serial) must agree bitwise.
  const int omp_before = omp_get_max_threads(), blas_before = openblas_get_num_threads();
  Shape as{6, 24, 40}, bs{6, 40, 16};
  std::vector<double> av = draw(1, as.numel(), 0.1, 1, ref::kF32), bv = draw(2, bs.numel(), 0.1, 1, ref::kF32);
  Tensor a = tensor_of(av, as, DType::f32), b = tensor_of(bv, bs, DType::f32);
  REQUIRE(cpu::split_batch(6, 24, 16, 40, 2));
  auto product = [&](int threads) {
    Step step = compile_inference(
        [&] {
          return matmul(persistent_var(a, ValueKind::parameter, "a"), persistent_var(b, ValueKind::parameter, "b"));
        },
        {}, {}, {.threads = threads});
    step.run();
    return step.output(0).clone();
  };
  Tensor two = product(2), one = product(1);
  CHECK(bytes_of(two) == bytes_of(one));
  // f32 accumulation of 40 terms of size < 1: within 40 * 2^-23 of sum|ab|.
  ref::Array want = ref::matmul({as.dims(), av}, {bs.dims(), bv}), terms = ref::matmul(ref::abs({as.dims(), av}), ref::abs({bs.dims(), bv}));
  std::vector<double> bound(want.v.size());
  for (std::size_t i = 0; i < bound.size(); ++i) bound[i] = 40 * 0x1p-23 * terms.v[i];
  expect_within("split batched matmul vs f64", values(two), want.v, bound);
  omp_set_num_threads(omp_before);  // the steps set the process's thread counts
  cpu::set_blas_threads(blas_before);
}

TEST_CASE("bf16 and loss-scaled f16 training steps write exactly the memory their plans predict",
          "[mixed][plan]") {
  for (DType dt : {DType::bf16, DType::f16}) {
    nn::manual_seed(4);
    MixedMlp model(16, 32, 4, dt);
    optim::AdamW opt(model.parameters(), {.lr = 1e-3});
    optim::LossScaler scaler;
    CompileOptions o;
    if (dt == DType::f16) o.loss_scaler = &scaler;
    Step step = compile([&](Var x, Var y) { return cross_entropy(model.forward(x), y); },
                        {input<float>({64, 16}), input<std::int32_t>({64})}, opt, {}, o);
    Tensor x({64, 16}), y({64}, DType::i32);
    make_batch(x, y, 1);
    auto a = step.audit(x, y);
    INFO(dtype_name(dt) << ": high water " << a.high_water << ", predicted " << a.predicted);
    CHECK(a.canary_intact);
    CHECK(a.high_water == a.predicted);
    CHECK(step.verify().ok());
  }
}
