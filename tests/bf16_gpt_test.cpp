// Issue 20: a GPT built entirely in bf16 or f16 plans, compiles and trains.
//
// Every op nn::Gpt's step runs, forward and backward, takes 16-bit tensors
// with kernels that compute in f32 (core/precision.hpp). Each newly 16-bit
// op is checked two ways:
//   * against the f32 kernel on the same (16-bit-representable) inputs: the
//     16-bit kernel runs the very same f32 arithmetic and rounds once on
//     store, so its result must be the f32 result rounded once, bitwise;
//   * against the float64 reference (tests/reference_xfmr.hpp, or for the
//     gradients frugal's f64 kernels, which the op tests check against
//     finite differences) within u |y| (the one rounding, u = 2^-8 for
//     bf16, 2^-11 for f16) plus the f32 arithmetic's own error, stated per
//     op; 2^-12 or less of the values' scale, so a second rounding to 16
//     bits anywhere (another u) would not fit.
// Then: module initialisation in 16 bits, the planner's bytes, and a small
// GPT trained in bf16 (and f16 with dynamic loss scaling) against the f32
// GPT from the same seed.
// Issue 17 adds a ResNet wholly in bf16: batch norm checked the same two
// ways (its statistics f32), and a small ResNet trained against the f32
// one, on the widest instruction set and on AVX2.
#include <omp.h>
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <frugal/frugal.hpp>
#include <frugal/backend/cpu/blas.hpp>  // the BLAS thread count, restored after a one-thread step

#include "bytes_of.hpp"
#include "cpu_isa_scope.hpp"
#include "mixed_helpers.hpp"
#include "reference_mixed.hpp"
#include "reference_xfmr.hpp"

using namespace frugal;
using Catch::Matchers::Contains;

namespace bf16gpt {

using namespace mixed;

using BuildAll = std::function<std::vector<Var>(const std::vector<Var>&)>;

// Runs build forward only, its floating inputs bound as parameters (integer
// ones as state), and returns every output.
std::vector<Tensor> run_all(const BuildAll& build, const std::vector<Tensor>& ins) {
  std::size_t outputs = 0;
  Step step = compile_inference(
      [&] {
        std::vector<Var> out = build(bind_inputs(ins));
        outputs = out.size();
        return out;
      },
      {});
  step.run();
  std::vector<Tensor> out;
  for (std::size_t i = 0; i < outputs; ++i) out.push_back(step.output(i).clone());
  return out;
}

// The gradients of L = sum(y * R) with respect to every floating input:
// the op's backward receives R itself as dy (the sum's and the product's
// backward multiply by exact ones), in any dtype.
std::vector<Tensor> grads_of(const Build& op, const std::vector<Tensor>& ins, const Tensor& r) {
  std::vector<Tensor> wrt;
  for (const Tensor& t : ins)
    if (is_floating(t.dtype())) wrt.push_back(t);
  Step step = compile_gradients(
      [&] {
        return cast(sum(op(bind_inputs(ins)) * persistent_var(r, ValueKind::state, "R")), DType::f32);
      },
      {}, wrt);
  step.run();
  std::vector<Tensor> g;
  for (const Tensor& t : wrt) g.push_back(step.grad(t).clone());
  return g;
}

double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::abs(x));
  return m;
}

// u |want| + abs: the one rounding to the 16-bit format plus an absolute
// allowance for the f32 arithmetic (and the subnormal spacing).
std::vector<double> bound_of(const std::vector<double>& want, ref::Format fmt, double abs) {
  std::vector<double> b(want.size());
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = ref::unit_roundoff(fmt) * std::abs(want[i]) + abs + subnormal_half_ulp(fmt);
  return b;
}

// The gradients (dx, dweight, dbias) of a normalisation op for dy = r, in
// h's 16-bit format: the f32 kernel's rounded once, bitwise, and within
// u |g| + rel max |g| of the f64 kernel's (rel: the f32 arithmetic's error,
// stated by the caller).
void check_norm_grads(const std::string& what, const Build& op, const std::function<std::vector<Tensor>(DType)>& ins,
                      const std::vector<double>& r, const Shape& shape, const Format16& h, double rel) {
  std::vector<Tensor> g16 = grads_of(op, ins(h.dtype), tensor_of(r, shape, h.dtype)),
                      g32 = grads_of(op, ins(DType::f32), tensor_of(r, shape, DType::f32)),
                      g64 = grads_of(op, ins(DType::f64), tensor_of(r, shape, DType::f64));
  const char* names[] = {"dx", "dweight", "dbias"};
  for (std::size_t i = 0; i < 3; ++i) {
    INFO(names[i]);
    REQUIRE(g16[i].dtype() == h.dtype);
    expect_rounded_once(what + " " + names[i] + " vs f32", values(g16[i]), values(g32[i]), h.fmt);
    std::vector<double> want64 = values(g64[i]);
    expect_within(what + " " + names[i] + " vs f64", values(g16[i]), want64, bound_of(want64, h.fmt, rel * max_abs(want64)));
  }
}

// The workspaces the planner gave the step's ops, by op name.
std::map<std::string, std::size_t> workspaces(const Step& step) {
  std::map<std::string, std::size_t> ws;
  for (const Node& n : step.graph().nodes())
    if (n.has_workspace) ws[n.op->name()] += step.graph().value(n.outputs.back()).meta.nbytes();
  return ws;
}

}  // namespace bf16gpt

using namespace bf16gpt;

// ---- embedding ---------------------------------------------------------------

TEST_CASE("bf16/f16 embedding moves rows exactly; its backward sums repeated ids in f32", "[bf16gpt][embedding]") {
  const std::int64_t rows = 6, d = 5, n = 3000;
  // Two thirds of the positions hit row 2: its gradient is a sum of 2000
  // terms in [0.5, 1), about 1500. A 16-bit running sum would stall where
  // the spacing of the sum outgrows the terms: bf16 (8 bits) near 256, f16
  // (11 bits) near 2048 with half-terms lost well before. f32 accumulation
  // of k terms errs by at most k 2^-24 sum|terms| (~0.13 here).
  std::vector<double> ids(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) ids[std::size_t(i)] = i % 3 ? 2 : double(i / 3 % rows);
  for (const Format16& h : kFormats) {
    INFO(dtype_name(h.dtype));
    std::vector<double> table = draw(3, rows * d, 0.1, 2, h.fmt), dy = draw(4, n * d, 0.5, 1, h.fmt, true);
    Tensor idt = tensor_of(ids, {n}, DType::i32);
    // Forward: a move, every bit kept.
    Tensor y = run_as([](const std::vector<Var>& v) { return embedding(v[0], v[1]); }, {ids, table},
                      {Shape{n}, Shape{rows, d}}, h.dtype, {DType::i32});
    REQUIRE(y.dtype() == h.dtype);
    std::vector<double> yv = values(y);
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t j = 0; j < d; ++j)
        REQUIRE(yv[std::size_t(i * d + j)] == table[std::size_t(std::int64_t(ids[std::size_t(i)]) * d + j)]);
    // Backward: the f64 sums, term for term.
    std::vector<double> want(std::size_t(rows * d), 0.0), terms(std::size_t(rows * d), 0.0), count(std::size_t(rows), 0.0);
    for (std::int64_t i = 0; i < n; ++i) {
      const auto r = std::size_t(ids[std::size_t(i)]);
      count[r] += 1;
      for (std::int64_t j = 0; j < d; ++j) want[r * std::size_t(d) + std::size_t(j)] += dy[std::size_t(i * d + j)];
    }
    std::vector<double> bound(want.size());
    for (std::size_t k = 0; k < want.size(); ++k)
      bound[k] = ref::unit_roundoff(h.fmt) * std::abs(want[k]) + count[k / std::size_t(d)] * 0x1p-24 * std::abs(want[k]);
    Build grad = [&](const std::vector<Var>& v) { return apply1<ops::EmbeddingGrad>({v[0], v[1]}, rows); };
    Tensor g16 = run_as(grad, {ids, dy}, {Shape{n}, Shape{n, d}}, h.dtype, {DType::i32});
    Tensor g32 = run_as(grad, {ids, dy}, {Shape{n}, Shape{n, d}}, DType::f32, {DType::i32});
    REQUIRE(g16.dtype() == h.dtype);
    expect_within("embedding_grad vs f64", values(g16), want, bound);
    expect_rounded_once("embedding_grad vs f32", values(g16), values(g32), h.fmt);
    CHECK(values(g16)[2 * std::size_t(d)] > 1400);  // the frequent row really is large
  }
}

TEST_CASE("a bf16/f16 embedding backward plans its f32 sums as its workspace; f32 needs none",
          "[bf16gpt][embedding][plan]") {
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    INFO(dtype_name(dt));
    Tensor ids({7}, DType::i64), dy({7, 12}, dt);
    Step step = compile_inference(
        [&] {
          return apply1<ops::EmbeddingGrad>(
              {persistent_var(ids, ValueKind::state, "ids"), persistent_var(dy, ValueKind::parameter, "dy")}, 9);
        },
        {});
    auto ws = workspaces(step);
    if (dt == DType::f32) CHECK(ws.empty());
    else CHECK(ws["embedding_grad"] == 9 * 12 * sizeof(float));
    step.run();  // ids 0, zeros in: zeros out
    for (double v : values(step.output(0))) CHECK(v == 0);
  }
}

// ---- layer norm --------------------------------------------------------------

TEST_CASE("bf16/f16 layer_norm and its backward compute in f32 with f32 statistics, rounded once",
          "[bf16gpt][layer_norm]") {
  const Shape xs{2, 3, 64};
  const std::int64_t D = 64;
  for (const Format16& h : kFormats) {
    INFO(dtype_name(h.dtype));
    std::vector<double> x = draw(11, xs.numel(), 0.1, 2, h.fmt), w = draw(12, D, 0.5, 1.5, h.fmt),
                        b = draw(13, D, 0.1, 1, h.fmt), r = draw(14, xs.numel(), 0.1, 1, h.fmt);
    BuildAll ln = [](const std::vector<Var>& v) {
      return frugal::apply(std::make_shared<ops::LayerNorm>(1e-5, true, true), {v[0], v[1], v[2]});
    };
    auto ins = [&](DType dt) {
      return std::vector<Tensor>{tensor_of(x, xs, dt), tensor_of(w, {D}, dt), tensor_of(b, {D}, dt)};
    };
    std::vector<Tensor> o16 = run_all(ln, ins(h.dtype)), o32 = run_all(ln, ins(DType::f32));
    REQUIRE(o16[0].dtype() == h.dtype);
    REQUIRE(o16[1].dtype() == DType::f32);  // mean and rstd stay f32
    REQUIRE(o16[2].dtype() == DType::f32);
    expect_rounded_once("layer_norm y vs f32", values(o16[0]), values(o32[0]), h.fmt);
    CHECK(bytes_of(o16[1]) == bytes_of(o32[1]));  // the statistics are the f32 kernel's own
    CHECK(bytes_of(o16[2]) == bytes_of(o32[2]));
    // f64: a row of 64 terms of size <= 2 sums in f32 to within 64 2^-24 2
    // of the f64 sum; through the mean, the variance and rstd that moves
    // xhat (|xhat| <~ 3) by well under 2^-14.
    ref::Array wa{{D}, w}, ba{{D}, b};
    std::vector<double> want = ref::layer_norm({xs.dims(), x}, &wa, &ba).v;
    expect_within("layer_norm y vs f64", values(o16[0]), want, bound_of(want, h.fmt, 0x1p-14 * (1 + max_abs(want))));

    // Backward (dx, dweight, dbias) for dy = R. dx = rstd (g - mean(g) -
    // xhat mean(g xhat)) cancels: the f32 error is relative to the largest
    // term, not to dx; dweight and dbias sum 6 rows in f64. 2^-12 of the
    // largest gradient covers both with room.
    Build y = [](const std::vector<Var>& v) { return layer_norm(v[0], v[1], v[2]); };
    check_norm_grads("layer_norm", y, ins, r, xs, h, 0x1p-12);
  }
}

// ---- dropout -----------------------------------------------------------------

TEST_CASE("bf16/f16 dropout and its backward scale in f32 and round once, with the f32 mask",
          "[bf16gpt][dropout]") {
  const std::int64_t n = 1001;  // not a multiple of the 4 elements of a Philox block
  const std::uint64_t key = 0x5eedf00d;
  for (const Format16& h : kFormats) {
    INFO(dtype_name(h.dtype));
    std::vector<double> x = draw(21, n, 0.1, 4, h.fmt);
    for (double p : {0.1, 0.3}) {
      Build fwd = [&](const std::vector<Var>& v) { return dropout_with_key(v[0], p, key); };
      Build bwd = [&](const std::vector<Var>& v) { return apply1<ops::DropoutGrad>({v[0]}, p, key); };
      for (const Build* b : {&fwd, &bwd}) {
        Tensor y16 = run_as(*b, {x}, {Shape{n}}, h.dtype), y32 = run_as(*b, {x}, {Shape{n}}, DType::f32);
        REQUIRE(y16.dtype() == h.dtype);
        expect_rounded_once("dropout vs f32", values(y16), values(y32), h.fmt);
        // The reference's mask (Philox from its paper) at the first step.
        std::vector<double> want = ref::dropout({{n}, x}, p, key, 0).v;
        expect_within("dropout vs f64", values(y16), want, bound_of(want, h.fmt, 0));
      }
    }
  }
}

// ---- causal attention --------------------------------------------------------

TEST_CASE("bf16/f16 causal attention on packed qkv: f32 scores and softmax, f32 logsumexp, rounded once",
          "[bf16gpt][attention]") {
  // T = 40 spans two query tiles of the CPU kernel (32 rows).
  const std::int64_t B = 2, T = 40, heads = 2, hd = 8, d = heads * hd;
  const Shape qs{B, T, 3 * d}, os{B, T, d};
  for (const Format16& h : kFormats) {
    INFO(dtype_name(h.dtype));
    std::vector<double> qkv = draw(31, qs.numel(), 0.05, 1.5, h.fmt), dout = draw(32, os.numel(), 0.1, 1, h.fmt);
    BuildAll fwd = [&](const std::vector<Var>& v) {
      return frugal::apply(std::make_shared<ops::CausalAttentionQkv>(heads), {v[0]});
    };
    std::vector<Tensor> o16 = run_all(fwd, {tensor_of(qkv, qs, h.dtype)}),
                        o32 = run_all(fwd, {tensor_of(qkv, qs, DType::f32)}),
                        o64 = run_all(fwd, {tensor_of(qkv, qs, DType::f64)});
    REQUIRE(o16[0].dtype() == h.dtype);
    REQUIRE(o16[1].dtype() == DType::f32);  // the logsumexp stays f32
    expect_rounded_once("attention o vs f32", values(o16[0]), values(o32[0]), h.fmt);
    CHECK(bytes_of(o16[1]) == bytes_of(o32[1]));
    // o is a convex combination of v's rows (|v| < 1.5): f32 errs by a few
    // 2^-24 per term over <= 40 keys, plus exp_poly's ~2^-23 relative
    // error in each weight: far under 2^-14.
    std::vector<double> want = ref::causal_attention_from_qkv({qs.dims(), qkv}, heads).v;
    expect_within("attention o vs f64", values(o16[0]), want, bound_of(want, h.fmt, 0x1p-14));

    // Backward on the same inputs in every dtype: qkv, the 16-bit forward's
    // own o (representable), its f32 logsumexp (the f64 run takes its own),
    // and do.
    std::vector<double> ov = values(o16[0]);
    Build grad = [&](const std::vector<Var>& v) {
      return apply1<ops::CausalAttentionQkvGrad>({v[0], v[1], v[2], v[3]}, heads, 1.0 / std::sqrt(double(hd)));
    };
    auto grad_in = [&](DType dt, const Tensor& lse) {
      return std::vector<Tensor>{tensor_of(qkv, qs, dt), tensor_of(ov, os, dt), lse, tensor_of(dout, os, dt)};
    };
    auto run_grad = [&](DType dt, const Tensor& lse) {
      return run_all([&](const std::vector<Var>& v) { return std::vector<Var>{grad(v)}; }, grad_in(dt, lse))[0];
    };
    Tensor g16 = run_grad(h.dtype, o16[1]), g32 = run_grad(DType::f32, o16[1]), g64 = run_grad(DType::f64, o64[1]);
    REQUIRE(g16.dtype() == h.dtype);
    expect_rounded_once("attention dqkv vs f32", values(g16), values(g32), h.fmt);
    // dS = P (dP - delta) scale cancels where dP ~ delta: the f32 error is
    // relative to the largest terms; 2^-12 of the largest gradient.
    std::vector<double> want64 = values(g64);
    expect_within("attention dqkv vs f64", values(g16), want64, bound_of(want64, h.fmt, 0x1p-12 * max_abs(want64)));
  }
}

TEST_CASE("bf16/f16 causal attention on separate q, k, v and its backward are the f32 kernels rounded once",
          "[bf16gpt][attention]") {
  const Shape qs{3, 20, 8}, ks{3, 25, 8}, vs{3, 25, 6}, os{3, 20, 6};
  for (const Format16& h : kFormats) {
    INFO(dtype_name(h.dtype));
    std::vector<double> q = draw(41, qs.numel(), 0.05, 1.5, h.fmt), k = draw(42, ks.numel(), 0.05, 1.5, h.fmt),
                        v = draw(43, vs.numel(), 0.05, 1.5, h.fmt), r = draw(44, os.numel(), 0.1, 1, h.fmt);
    Build att = [](const std::vector<Var>& x) { return causal_attention(x[0], x[1], x[2]); };
    auto ins = [&](DType dt) {
      return std::vector<Tensor>{tensor_of(q, qs, dt), tensor_of(k, ks, dt), tensor_of(v, vs, dt)};
    };
    Tensor y16 = run_as(att, {q, k, v}, {qs, ks, vs}, h.dtype), y32 = run_as(att, {q, k, v}, {qs, ks, vs}, DType::f32);
    expect_rounded_once("causal_attention vs f32", values(y16), values(y32), h.fmt);
    std::vector<double> want = ref::causal_attention({qs.dims(), q}, {ks.dims(), k}, {vs.dims(), v}).v;
    expect_within("causal_attention vs f64", values(y16), want, bound_of(want, h.fmt, 0x1p-14));
    // The backward through autograd: the forward's o differs between the
    // runs (rounded in one), so compare with the f64 gradients.
    std::vector<Tensor> g16 = grads_of(att, ins(h.dtype), tensor_of(r, os, h.dtype)),
                        g64 = grads_of(att, ins(DType::f64), tensor_of(r, os, DType::f64));
    for (std::size_t i = 0; i < 3; ++i) {
      INFO("gradient of input " << i);
      REQUIRE(g16[i].dtype() == h.dtype);
      // o rounded (u relative) enters delta = rowsum(do * o): with the
      // cancellation in dS that is up to ~u of the largest term, on top of
      // the final rounding: 4u of the largest gradient.
      std::vector<double> want64 = values(g64[i]);
      expect_within("causal_attention gradient vs f64", values(g16[i]), want64,
                    bound_of(want64, h.fmt, 4 * ref::unit_roundoff(h.fmt) * max_abs(want64)));
    }
  }
}

TEST_CASE("bf16/f16 attention plans f32 images of its 16-bit tensors as its workspace; f32 needs none",
          "[bf16gpt][attention][plan]") {
  for (DType dt : {DType::f32, DType::bf16}) {
    INFO(dtype_name(dt));
    Tensor qkv({2, 10, 24}, dt);
    Step step = compile_gradients(
        [&] { return cast(sum(causal_attention_qkv(persistent_var(qkv, ValueKind::parameter, "qkv"), 2)), DType::f32); },
        {}, {qkv});
    auto ws = workspaces(step);
    if (dt == DType::f32) {
      CHECK(ws.count("causal_attention_qkv") == 0);
      CHECK(ws.count("causal_attention_qkv_grad") == 0);
    } else {
      // Forward: qkv and o. Backward: qkv, o, do and dqkv (lse is f32).
      const std::size_t qkv32 = align_up(2 * 10 * 24 * 4), o32 = align_up(2 * 10 * 8 * 4);
      CHECK(ws["causal_attention_qkv"] == qkv32 + o32);
      CHECK(ws["causal_attention_qkv_grad"] == 2 * qkv32 + 2 * o32);
    }
    step.run();
  }
}

// ---- optimizer updates -------------------------------------------------------

namespace {

// One optimizer step on p (gradient R) from state filled with `m0`/`v0`,
// in dtype dt; returns the parameter and the state after it.
template <class MakeOpt>
std::vector<std::vector<double>> one_update(DType dt, const std::vector<double>& p, const std::vector<double>& r,
                                            MakeOpt make) {
  const Shape s{std::int64_t(p.size())};
  Tensor pt = tensor_of(p, s, dt), rt = tensor_of(r, s, dt);
  auto opt = make(pt);
  Step step = compile(
      [&] {
        Var w = persistent_var(pt, ValueKind::parameter, "p");
        return cast(sum(w * persistent_var(rt, ValueKind::state, "R")), DType::f32);
      },
      std::vector<InputSpec>{}, *opt);
  std::vector<std::vector<double>> out;
  auto states = opt->state();
  // Moments / momentum seeded with values of the right sign and size, and
  // a step count past the first, so the update reads them.
  for (std::size_t i = 0; i < states.size(); ++i) {
    Tensor t = states[i].tensor;
    Tensor init = tensor_of(mixed::draw(60 + i, t.numel(), 0.01, 0.1, ref::kBf16, i == 1), t.shape(), dt);
    std::memcpy(t.raw(), init.raw(), t.nbytes());
  }
  opt->set_steps(4);
  step.run();
  out.push_back(values(pt));
  for (auto& st : opt->state()) out.push_back(values(st.tensor));
  return out;
}

}  // namespace

TEST_CASE("bf16/f16 AdamW and SGD update in f32 and round parameter and state once", "[bf16gpt][optim]") {
  for (const Format16& h : kFormats) {
    INFO(dtype_name(h.dtype));
    std::vector<double> p = draw(51, 37, 0.05, 1, h.fmt), r = draw(52, 37, 0.01, 1, h.fmt);
    auto adamw = [](Tensor& t) {
      return std::make_unique<optim::AdamW>(std::vector<Tensor>{t}, optim::AdamWOptions{.lr = 1e-2});
    };
    auto sgd = [](Tensor& t) {
      return std::make_unique<optim::SGD>(std::vector<Tensor>{t},
                                          optim::SGDOptions{.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-2});
    };
    auto a16 = one_update(h.dtype, p, r, adamw), a32 = one_update(DType::f32, p, r, adamw);
    auto s16 = one_update(h.dtype, p, r, sgd), s32 = one_update(DType::f32, p, r, sgd);
    REQUIRE(a16.size() == 3);  // parameter, exp_avg, exp_avg_sq
    REQUIRE(s16.size() == 2);  // parameter, momentum buffer
    for (std::size_t i = 0; i < a16.size(); ++i) expect_rounded_once("adamw " + std::to_string(i), a16[i], a32[i], h.fmt);
    for (std::size_t i = 0; i < s16.size(); ++i) expect_rounded_once("sgd " + std::to_string(i), s16[i], s32[i], h.fmt);
    CHECK(a16[0] != p);  // the parameter moved
    CHECK(s16[0] != p);
  }
}

// ---- batch norm (the bf16 ResNet) ----------------------------------------------

namespace {

// x [2, 3, 17, 19]: 323 values a plane, more than one conversion block
// (bulk::kBlock = 256) and not a whole number of the kernels' 8 lanes, so
// the blocks, the lanes and the tail are all exercised; N H W = 646 per
// channel.
const Shape kBnX{2, 3, 17, 19};
constexpr std::int64_t kBnC = 3;

// The running statistics of an eval-mode batch norm, in the compute dtype
// of dt (f32 for bf16/f16), as state.
std::vector<Var> bn_running(DType dt) {
  const DType st = compute_dtype(dt);
  return {persistent_var(tensor_of({0.25, -0.5, 0.125}, Shape{kBnC}, st), ValueKind::state, "running_mean"),
          persistent_var(tensor_of({0.5, 1.5, 2.0}, Shape{kBnC}, st), ValueKind::state, "running_var")};
}

// The instruction sets this CPU runs, narrowest first: the kernels'
// run_widest copies must give the bits of the plain x86-64 build.
std::vector<cpu::CpuIsa> isas_here() {
  std::vector<cpu::CpuIsa> out;
  for (cpu::CpuIsa i : {cpu::CpuIsa::base, cpu::CpuIsa::avx2, cpu::CpuIsa::avx512})
    if (i <= cpu::widest_cpu_isa()) out.push_back(i);
  return out;
}

}  // namespace

TEST_CASE("bf16/f16 batch_norm2d and its backward compute in f32 with f32 statistics, rounded once",
          "[bf16gpt][bn]") {
  for (const Format16& h : kFormats) {
    for (bool relu : {false, true}) {
      INFO(dtype_name(h.dtype) << (relu ? " with a ReLU epilogue" : ""));
      std::vector<double> x = draw(61, kBnX.numel(), 0.1, 2, h.fmt), w = draw(62, kBnC, 0.5, 1.5, h.fmt),
                          b = draw(63, kBnC, 0.1, 1, h.fmt), r = draw(64, kBnX.numel(), 0.1, 1, h.fmt);
      auto ins = [&](DType dt) {
        return std::vector<Tensor>{tensor_of(x, kBnX, dt), tensor_of(w, {kBnC}, dt), tensor_of(b, {kBnC}, dt)};
      };
      // Training mode: y and the batch statistics.
      BuildAll train = [relu](const std::vector<Var>& v) {
        return frugal::apply(std::make_shared<ops::BatchNorm2dTrain>(1e-5, relu), {v[0], v[1], v[2]});
      };
      std::vector<Tensor> o16 = run_all(train, ins(h.dtype)), o32 = run_all(train, ins(DType::f32)),
                          o64 = run_all(train, ins(DType::f64));
      REQUIRE(o16[0].dtype() == h.dtype);
      REQUIRE(o16[1].dtype() == DType::f32);  // the batch mean and variance stay f32
      REQUIRE(o16[2].dtype() == DType::f32);
      expect_rounded_once("batch_norm2d y vs f32", values(o16[0]), values(o32[0]), h.fmt);
      CHECK(bytes_of(o16[1]) == bytes_of(o32[1]));  // the statistics are the f32 kernel's own
      CHECK(bytes_of(o16[2]) == bytes_of(o32[2]));
      // f64: a lane sums at most 646 / 8 < 81 values of size <= 2 in f32, so
      // the sums are within 81 * 2^-24 of their magnitude (<= 1292): the
      // mean within 2^-16, the variance (about 1.3) within 2^-16 relative.
      // With sigma >= 1 and |xhat| <= 3 that moves xhat by under 2^-15 and
      // y (gamma <= 1.5) by under 2^-14; the normalisation's own f32
      // roundings add 2^-22 |y|. So u |y| + 2^-14 (1 + max |y|) holds, and a
      // second rounding to 16 bits (another u |y| >= 2^-9 |y|) would not.
      std::vector<double> want = values(o64[0]);
      expect_within("batch_norm2d y vs f64", values(o16[0]), want, bound_of(want, h.fmt, 0x1p-14 * (1 + max_abs(want))));

      // Backward (dx, dweight, dbias) for dy = R. dx = gamma/sigma (dy -
      // mean(dy) - xhat mean(dy xhat)) cancels, so its f32 error is relative
      // to the largest term (|dy| <= 1, the means' sums as above within
      // 2^-16 of it); dweight and dbias are sums of 646 terms in f32 lanes
      // (2^-17 of their magnitude) rounded once from double. 2^-12 of the
      // largest gradient covers both with room; a second 16-bit rounding of
      // the terms would not fit.
      Build y = [relu](const std::vector<Var>& v) {
        return frugal::apply(std::make_shared<ops::BatchNorm2dTrain>(1e-5, relu), {v[0], v[1], v[2]}).at(0);
      };
      check_norm_grads("batch_norm2d", y, ins, r, kBnX, h, 0x1p-12);

      // Eval mode, with f32 running statistics: forward and backward.
      Build eval = [relu](const std::vector<Var>& v) {
        std::vector<Var> rs = bn_running(v[0].dtype());
        return frugal::apply(std::make_shared<ops::BatchNorm2dEval>(1e-5, relu), {v[0], v[1], v[2], rs[0], rs[1]}).at(0);
      };
      const Tensor e16 = run(eval, ins(h.dtype)), e32 = run(eval, ins(DType::f32)), e64 = run(eval, ins(DType::f64));
      expect_rounded_once("batch_norm2d_eval y vs f32", values(e16), values(e32), h.fmt);
      want = values(e64);  // an affine map per channel: two f32 roundings of |y| and one of the mean
      expect_within("batch_norm2d_eval y vs f64", values(e16), want, bound_of(want, h.fmt, 0x1p-20 * (1 + max_abs(want))));
      check_norm_grads("batch_norm2d_eval", eval, ins, r, kBnX, h, 0x1p-12);
    }
  }
}

TEST_CASE("batch norm's 16-bit and f32 kernels give the same bits in every instruction set", "[bf16gpt][bn][isa]") {
  test_support::KeepCpuIsa keep;
  std::vector<double> x = draw(71, kBnX.numel(), 0.1, 2, ref::kBf16), w = draw(72, kBnC, 0.5, 1.5, ref::kBf16),
                      b = draw(73, kBnC, 0.1, 1, ref::kBf16), r = draw(74, kBnX.numel(), 0.1, 1, ref::kBf16);
  Build y = [](const std::vector<Var>& v) { return batch_norm2d_train(v[0], v[1], v[2]).y; };
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    std::vector<Tensor> ins{tensor_of(x, kBnX, dt), tensor_of(w, {kBnC}, dt), tensor_of(b, {kBnC}, dt)};
    std::vector<std::vector<char>> first;
    for (cpu::CpuIsa isa : isas_here()) {
      INFO(dtype_name(dt) << " on " << cpu::isa_name(isa));
      cpu::forced_cpu_isa = int(isa);
      std::vector<std::vector<char>> got{bytes_of(run(y, ins))};
      for (const Tensor& g : grads_of(y, ins, tensor_of(r, kBnX, dt))) got.push_back(bytes_of(g));
      if (first.empty()) first = got;
      else CHECK(got == first);
    }
  }
}

TEST_CASE("batch norm refuses 16-bit running statistics, and nn::BatchNorm2d keeps them in f32", "[bf16gpt][bn][errors]") {
  {
    Graph g;
    CaptureScope scope(g);
    Var x{&g, g.add_input({DType::bf16, Shape{2, 3, 4, 4}}, "x")};
    Var p{&g, g.add_input({DType::bf16, Shape{3}}, "p")};
    const std::string m = shape_error([&] { batch_norm2d_eval(x, p, p, p, p); });
    CHECK_THAT(m, Contains("batch_norm2d_eval") && Contains("running_mean bf16[3]") && Contains("must be f32") &&
                      Contains("statistics in f32"));
    Var w32{&g, g.add_input({DType::f32, Shape{3}}, "w")};
    CHECK_THAT(shape_error([&] { batch_norm2d_train(x, w32, p); }),
               Contains("batch_norm2d") && Contains("weight f32[3]") && Contains("must be bf16"));
  }
  for (const Format16& h : kFormats) {
    INFO(dtype_name(h.dtype));
    for (bool one_d : {false, true}) {
      std::unique_ptr<nn::Layer> bn;
      if (one_d) bn = std::make_unique<nn::BatchNorm1d>(3, nn::BatchNormOptions{.dtype = h.dtype});
      else bn = std::make_unique<nn::BatchNorm2d>(3, nn::BatchNormOptions{.dtype = h.dtype});
      std::map<std::string, Tensor> t;
      for (auto& [name, tensor] : bn->named_parameters()) t[name] = tensor;
      for (auto& [name, tensor] : bn->named_buffers()) t[name] = tensor;
      CHECK(t.at("weight").dtype() == h.dtype);
      CHECK(t.at("bias").dtype() == h.dtype);
      CHECK(values(t.at("weight")) == std::vector<double>{1, 1, 1});
      CHECK(values(t.at("bias")) == std::vector<double>{0, 0, 0});
      CHECK(t.at("running_mean").dtype() == DType::f32);
      CHECK(t.at("running_var").dtype() == DType::f32);
      CHECK(values(t.at("running_var")) == std::vector<double>{1, 1, 1});
      CHECK(t.at("num_batches_tracked").dtype() == DType::i64);
    }
  }
  CHECK_THROWS_WITH(nn::BatchNorm2d(3, {.dtype = DType::i32}), Contains("nn::BatchNorm2d") && Contains("i32"));
}

// ---- ops without 16-bit kernels ----------------------------------------------

TEST_CASE("an op without bf16/f16 kernels still refuses them at capture, naming the op and the dtype",
          "[bf16gpt][errors]") {
  Graph g;
  CaptureScope scope(g);
  Var q{&g, g.add_input({DType::bf16, Shape{1, 2, 4, 8}}, "q")};
  const std::string m = shape_error([&] { scaled_dot_product_attention(q, q, q); });
  CHECK_THAT(m, Contains("scaled_dot_product_attention") && Contains("bf16[1, 2, 4, 8]") && Contains("f32 or f64"));
}

// ---- modules -----------------------------------------------------------------

namespace {

nn::GptConfig small_gpt(DType dt, double dropout = 0) {
  return {.vocab = 32, .context = 32, .layers = 2, .d_model = 64, .heads = 4, .dropout = dropout, .dtype = dt};
}

std::int64_t count_parameters(const nn::Module& m) {
  std::int64_t n = 0;
  for (const Tensor& p : m.parameters()) n += p.numel();
  return n;
}

}  // namespace

TEST_CASE("a bf16/f16 GPT starts from the f32 GPT's weights of the same seed, rounded once", "[bf16gpt][nn]") {
  nn::manual_seed(17);
  nn::Gpt f32(small_gpt(DType::f32));
  for (const Format16& h : kFormats) {
    INFO(dtype_name(h.dtype));
    nn::manual_seed(17);
    nn::Gpt half(small_gpt(h.dtype));
    auto a = f32.named_parameters(), b = half.named_parameters();
    REQUIRE(a.size() == b.size());
    for (std::size_t i = 0; i < a.size(); ++i) {
      INFO(a[i].first);
      REQUIRE(a[i].first == b[i].first);
      REQUIRE(b[i].second.dtype() == h.dtype);
      expect_rounded_once(a[i].first, values(b[i].second), values(a[i].second), h.fmt);
    }
    // LayerNorm's weight is exactly one, its bias zero.
    for (double v : values(half.ln_f.weight)) CHECK(v == 1);
    for (double v : values(half.ln_f.bias)) CHECK(v == 0);
  }
  // Shapes only: a meta bf16 GPT is built without touching any data.
  MetaScope meta;
  nn::Gpt m(small_gpt(DType::bf16));
  for (const Tensor& p : m.parameters()) CHECK(p.is_meta());
}

TEST_CASE("the planner counts a bf16 GPT's parameters, gradients and AdamW moments at 2 bytes an element",
          "[bf16gpt][plan]") {
  for (DType dt : {DType::bf16, DType::f32}) {
    INFO(dtype_name(dt));
    nn::manual_seed(3);
    nn::Gpt model(small_gpt(dt, 0.1));
    optim::AdamW opt(model.parameters(), {.lr = 1e-3});
    const std::size_t n = std::size_t(count_parameters(model)), es = dtype_size(dt);
    PlannedStep ps = plan_training([&](Var idx, Var tgt) { return model.loss(idx, tgt); },
                                   {input<std::int32_t>({4, 32}), input<std::int32_t>({4, 32})}, opt, {});
    CHECK(ps.plan.persistent_by_kind.at("parameters") == es * n);
    CHECK(ps.plan.persistent_by_kind.at("optimizer state") == 2 * es * n);
    std::size_t grads = 0, count = 0;
    for (ValueId v = 0; v < ValueId(ps.graph->num_values()); ++v) {
      const Value& val = ps.graph->value(v);
      if (!val.is_gradient) continue;
      ++count;
      grads += val.meta.nbytes();
      CHECK(val.meta.dtype == dt);
    }
    CHECK(count == model.parameters().size());
    CHECK(grads == es * n);
  }
}

// ---- training ----------------------------------------------------------------

namespace {

// Sequences of a fixed successor map, t' = (5 t + 3) mod 32, from random
// starts: a GPT learns it within a few steps.
void make_sequences(Tensor& idx, Tensor& tgt, std::uint64_t seed) {
  Rng r(seed);
  const std::int64_t B = idx.shape()[0], T = idx.shape()[1];
  for (std::int64_t b = 0; b < B; ++b) {
    std::int32_t t = std::int32_t(r.uniform(0, 32));
    for (std::int64_t i = 0; i < T; ++i) {
      idx.data<std::int32_t>()[b * T + i] = t;
      t = (5 * t + 3) % 32;
      tgt.data<std::int32_t>()[b * T + i] = t;
    }
  }
}

using MakeOptimizer = std::function<std::unique_ptr<Optimizer>(std::vector<Tensor>)>;

// The GPT steps here run on one thread (CompileOptions::threads = 1): their
// bits do not depend on the thread count, and kernels this small gain
// nothing from a second thread on a 2-core machine that CI shares between
// two test processes. (The one-thread choice dates from OpenMP's waiting
// threads, which made such steps up to 100x slower there; the kernels now
// run on their own team, backend/cpu/worker_team.hpp.) A step sets the
// calling thread's thread count; this puts it back for the tests that follow.
struct RestoreThreads {
  int omp = omp_get_max_threads(), blas = openblas_get_num_threads();
  ~RestoreThreads() {
    omp_set_num_threads(omp);
    cpu::set_blas_threads(blas);
  }
};

// Losses of `steps` steps of a GPT built in dt from seed 23, with dropout.
std::vector<float> train_gpt(DType dt, int steps, const MakeOptimizer& make, optim::LossScaler* scaler = nullptr) {
  RestoreThreads restore;
  nn::manual_seed(23);
  nn::Gpt model(small_gpt(dt, 0.1));
  std::unique_ptr<Optimizer> opt = make(model.parameters());
  Step step = compile([&](Var idx, Var tgt) { return model.loss(idx, tgt); },
                      {input<std::int32_t>({4, 32}), input<std::int32_t>({4, 32})}, *opt, {},
                      {.threads = 1, .loss_scaler = scaler});
  Tensor idx({4, 32}, DType::i32), tgt({4, 32}, DType::i32);
  std::vector<float> losses;
  for (int s = 0; s < steps; ++s) {
    make_sequences(idx, tgt, std::uint64_t(s));
    losses.push_back(step.run(idx, tgt));
  }
  return losses;
}

}  // namespace

TEST_CASE("a bf16 GPT trains: its loss falls and tracks the f32 GPT's from the same seed", "[bf16gpt][train]") {
  MakeOptimizer adamw = [](std::vector<Tensor> p) {
    return std::make_unique<optim::AdamW>(std::move(p), optim::AdamWOptions{.lr = 1e-2});
  };
  std::vector<float> f32 = train_gpt(DType::f32, 20, adamw), bf16 = train_gpt(DType::bf16, 20, adamw);
  double worst = 0;
  for (int s = 0; s < 20; ++s) {
    const double a = f32[std::size_t(s)], b = bf16[std::size_t(s)];
    INFO("step " << s << ": f32 loss " << a << ", bf16 " << b);
    worst = std::max(worst, std::abs(a - b));
    CHECK(std::isfinite(b));
  }
  // Both runs start from the same weights (bf16's rounded) and see the same
  // batches and dropout masks; bf16 rounds every weight, activation, moment
  // and update with u = 2^-8, so the runs drift apart by a few u of the loss
  // (observed: at most 0.010, at step 5 where the loss falls fastest).
  // 0.04 leaves 4x room; a bf16 step that lost its updates (a 16-bit sum or
  // a stalled parameter) would trail the f32 curve by far more, since both
  // fall from 3.6 to about 0.01 within 20 steps.
  INFO("largest loss difference " << worst);
  CHECK(worst > 0);  // it really ran in bf16
  CHECK(worst <= 0.04);
  CHECK(f32.back() < 0.05f * f32.front());
  CHECK(bf16.back() < 0.05f * bf16.front());
}

TEST_CASE("a bf16 GPT's training step writes exactly the memory its plan predicts", "[bf16gpt][plan]") {
  RestoreThreads restore;
  nn::manual_seed(29);
  nn::Gpt model(small_gpt(DType::bf16, 0.1));
  optim::AdamW opt(model.parameters(), {.lr = 1e-3});
  Step step = compile([&](Var idx, Var tgt) { return model.loss(idx, tgt); },
                      {input<std::int32_t>({4, 32}), input<std::int32_t>({4, 32})}, opt, {}, {.threads = 1});
  Tensor idx({4, 32}, DType::i32), tgt({4, 32}, DType::i32);
  make_sequences(idx, tgt, 1);
  auto a = step.audit(idx, tgt);
  INFO("high water " << a.high_water << ", predicted " << a.predicted);
  CHECK(a.canary_intact);
  CHECK(a.high_water == a.predicted);
  CHECK(step.verify().ok());
}

TEST_CASE("an f16 GPT trains under dynamic loss scaling: its loss falls and tracks the f32 GPT's",
          "[bf16gpt][train][loss_scaling]") {
  // SGD with momentum: AdamW's second moment g^2 underflows f16 (below
  // 2^-24) for the gradients of most weights, and its update then divides
  // by eps alone; a model kept wholly in f16 wants an optimizer without it.
  MakeOptimizer sgd = [](std::vector<Tensor> p) {
    return std::make_unique<optim::SGD>(std::move(p), optim::SGDOptions{.lr = 0.1, .momentum = 0.9});
  };
  // A start at 2^10 rather than GradScaler's 2^16: the first steps'
  // gradients are the largest, and each overflow skips a step, which the
  // f32 run does not skip.
  optim::LossScaler scaler({.init_scale = 1024});
  std::vector<float> f32 = train_gpt(DType::f32, 20, sgd), f16 = train_gpt(DType::f16, 20, sgd, &scaler);
  double worst = 0;
  for (int s = 0; s < 20; ++s) {
    const double a = f32[std::size_t(s)], b = f16[std::size_t(s)];
    INFO("step " << s << ": f32 loss " << a << ", f16 " << b);
    worst = std::max(worst, std::abs(a - b));
    CHECK(std::isfinite(b));
  }
  // f16 rounds with u = 2^-11, 8 times finer than bf16: the bf16 test's
  // bound shrinks 8-fold (observed: 0.001 with no step skipped at 2^10).
  INFO("largest loss difference " << worst << "; skipped steps " << scaler.skipped_steps());
  CHECK(worst > 0);
  CHECK(worst <= 0.04 / 8);
  CHECK(f32.back() < 0.05f * f32.front());
  CHECK(f16.back() < 0.05f * f16.front());
}

// ---- a ResNet wholly in bf16 ------------------------------------------------------

namespace {

// A small CIFAR-style ResNet (stem 16, one BasicBlock of 16 and one of 32
// with a projection shortcut) on 8 images of 16x16: its first stage's 3x3
// convolutions run as Winograd F(4x4,3x3) (512 2x2 tiles' worth), the
// second's stride-1 one direct forward and Winograd F(4x4,3x3) weight
// gradient (8x8 planes, conv_scratch.hpp's rules); the rest is BatchNorm
// (with fused ReLUs), residual adds, the global average pool and the fc.
std::unique_ptr<nn::ResNet<nn::BasicBlock>> small_resnet(DType dt) {
  return std::make_unique<nn::ResNet<nn::BasicBlock>>(16, std::vector<nn::ResNetStage>{{16, 1, 1}, {32, 1, 2}}, 10, 3,
                                                      dt);
}
constexpr std::int64_t kResN = 8, kResH = 16;


// `steps` SGD steps (lr 0.05, momentum 0.9) of small_resnet(dt) from seed 41
// on one fixed batch (bf16-representable images, so both dtypes see the same
// input), on one thread.
std::vector<float> train_resnet(DType dt, int steps) {
  RestoreThreads restore;
  nn::manual_seed(41);
  auto model = small_resnet(dt);
  model->train();
  optim::SGD opt(model->parameters(), {.lr = 0.05, .momentum = 0.9});
  Step step = compile([&](Var x, Var y) { return cross_entropy((*model)(x), y); },
                      {InputSpec{{dt, Shape{kResN, 3, kResH, kResH}}, "x"}, input<std::int32_t>({kResN})}, opt, {},
                      {.threads = 1});
  const Tensor x = tensor_of(mixed::draw(81, kResN * 3 * kResH * kResH, 0, 2, ref::kBf16), {kResN, 3, kResH, kResH}, dt);
  const Tensor y = tensor_of({3, 7, 0, 5, 1, 9, 4, 2}, {kResN}, DType::i32);
  std::vector<float> losses;
  for (int s = 0; s < steps; ++s) losses.push_back(step.run(x, y));
  return losses;
}

}  // namespace

TEST_CASE("a bf16 ResNet trains: its loss falls and tracks the f32 ResNet's, on every instruction set",
          "[bf16gpt][bf16resnet][train]") {
  test_support::KeepCpuIsa keep;
  constexpr int kSteps = 20;
  // The widest instruction set (AVX512-BF16's dot products where the CPU
  // has them), and AVX2 (the BLAS convolution engine, bf16 products on f32
  // images): the paths of CPUs without AVX-512.
  for (cpu::CpuIsa isa : {cpu::widest_cpu_isa(), std::min(cpu::widest_cpu_isa(), cpu::CpuIsa::avx2)}) {
    INFO("instruction set " << cpu::isa_name(isa));
    cpu::forced_cpu_isa = int(isa);
    const std::vector<float> f32 = train_resnet(DType::f32, kSteps), bf16 = train_resnet(DType::bf16, kSteps);
    double worst = 0;
    for (int s = 0; s < kSteps; ++s) {
      const double a = f32[std::size_t(s)], b = bf16[std::size_t(s)];
      INFO("step " << s << ": f32 loss " << a << ", bf16 " << b);
      worst = std::max(worst, std::abs(a - b));
      CHECK(std::isfinite(b));
    }
    // Both runs start from the same weights (bf16's rounded) and see the
    // same batch. bf16 rounds every weight, activation, gradient and
    // momentum with u = 2^-8, so its forward differs by about u of the loss
    // and each update by about u of what the update moves, so the loss it
    // reaches differs by about u of the loss's fall so far: about
    // u (L0 + (L0 - Ls)) <= 2 u L0 in all. 4 u L0 (0.036 here) allows twice
    // that (observed: 1.5 u L0, where the loss falls fastest). A stalled
    // bf16 run (updates lost below half an ulp, a 16-bit sum) would not
    // fall with the f32 one: the loss falls 20-fold in these 20 steps.
    const double bound = 4 * ref::unit_roundoff(ref::kBf16) * f32.front();
    INFO("largest loss difference " << worst << ", bound " << bound);
    CHECK(worst > 0);  // it really ran in bf16
    CHECK(worst <= bound);
    CHECK(f32.back() < 0.05f * f32.front());
    CHECK(bf16.back() < 0.05f * bf16.front());
  }
}

TEST_CASE("a bf16 ResNet's step counts its tensors at 2 bytes an element, BatchNorm's statistics at 4, "
          "and writes exactly the memory its plan predicts",
          "[bf16gpt][bf16resnet][plan]") {
  RestoreThreads restore;
  for (DType dt : {DType::bf16, DType::f32}) {
    INFO(dtype_name(dt));
    nn::manual_seed(43);
    auto model = small_resnet(dt);
    optim::SGD opt(model->parameters(), {.lr = 0.05, .momentum = 0.9});
    Step step = compile([&](Var x, Var y) { return cross_entropy((*model)(x), y); },
                        {InputSpec{{dt, Shape{kResN, 3, kResH, kResH}}, "x"}, input<std::int32_t>({kResN})}, opt, {},
                        {.threads = 1});
    const std::size_t n = std::size_t(count_parameters(*model)), es = dtype_size(dt);
    std::size_t stats = 0, counters = 0;  // elements of the running statistics, and their i64 counters
    for (auto& [name, t] : model->named_buffers()) {
      if (t.dtype() == DType::i64) ++counters;
      else stats += std::size_t(t.numel());
    }
    const Plan& p = step.plan();
    CHECK(p.persistent_by_kind.at("parameters") == es * n);
    CHECK(p.persistent_by_kind.at("optimizer state") == es * n);  // SGD's momentum
    CHECK(p.persistent_by_kind.at("buffers") == 4 * stats + 8 * counters);
    for (ValueId v = 0; v < ValueId(step.graph().num_values()); ++v)
      if (step.graph().value(v).is_gradient) CHECK(step.graph().value(v).meta.dtype == dt);
    const Tensor x = tensor_of(draw(82, kResN * 3 * kResH * kResH, 0, 2, ref::kBf16), {kResN, 3, kResH, kResH}, dt);
    const Tensor y = tensor_of({1, 2, 3, 4, 5, 6, 7, 8}, {kResN}, DType::i32);
    auto a = step.audit(x, y);
    INFO("high water " << a.high_water << ", predicted " << a.predicted);
    CHECK(a.canary_intact);
    CHECK(a.high_water == a.predicted);
    CHECK(step.verify().ok());
  }
}
