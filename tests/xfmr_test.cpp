// The transformer ops (layer_norm, embedding, dropout, causal_attention), the
// indexing ops (concat, split, slice, index_select, index_add, gather,
// scatter_add) and the nn layers built on them. Each op: forward in f32 and
// f64 against the float64 references in reference_xfmr.hpp, backward against
// central finite differences (op_harness.hpp), edge shapes, and its errors.
#include <omp.h>
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
  std::string m =
      capture_error({{4}, {5}}, [](const V& v) { return frugal::embedding(v[0], v[1]); }, {DType::i32, DType::f32});
  CHECK_THAT(m, Contains("embedding") && Contains("[5]") && Contains("[4]"));
  m = capture_error({{4}, {5, 3}}, [](const V& v) { return frugal::embedding(v[0], v[1]); }, {DType::f32, DType::f32});
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

// ---- dropout ----------------------------------------------------------------

namespace {

// An f32 or f64 tensor of `shape` with entries in [0.1, 1) * sign.
frugal::Tensor random_tensor(const ref::Dims& shape, DType dt, std::uint64_t seed) {
  frugal::Rng rng(seed);
  return to_tensor(draw_array(rng, x(shape)), dt);
}

ref::Array as_array(const frugal::Tensor& t) {
  if (t.dtype() == DType::i32 || t.dtype() == DType::i64) {
    ref::Array a{t.shape().dims(), std::vector<double>(std::size_t(t.numel()))};
    for (std::size_t i = 0; i < a.v.size(); ++i)
      a.v[i] = t.dtype() == DType::i32 ? double(t.data<std::int32_t>()[i]) : double(t.data<std::int64_t>()[i]);
    return a;
  }
  return {t.shape().dims(), to_doubles(t)};
}

// y = dropout(x) through frugal, at a given step counter.
struct DropoutRun {
  frugal::Tensor x;
  frugal::Step step;
  DropoutRun(frugal::Tensor input, double p, std::uint64_t key)
      : x(std::move(input)),
        step(frugal::compile_inference(
            [this, p, key] {
              return frugal::dropout_with_key(frugal::persistent_var(x, frugal::ValueKind::parameter, "x"), p, key);
            },
            {})) {}
  std::vector<double> at(std::int64_t counter) {
    step.set_steps_run(counter);
    step.run();
    return to_doubles(step.output(0));
  }
};

}  // namespace

TEST_CASE("the reference Philox matches the Random123 known-answer vectors, and frugal's Philox matches it",
          "[xfmr][dropout]") {
  // From Random123's kat_vectors (philox4x32_10).
  auto a = ref::philox4x32_10({{0, 0, 0, 0}}, 0, 0);
  CHECK(a.v[0] == 0x6627e8d5u);
  CHECK(a.v[1] == 0xe169c58du);
  CHECK(a.v[2] == 0xbc57ac4cu);
  CHECK(a.v[3] == 0x9b00dbd8u);
  auto b = ref::philox4x32_10({{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}}, 0xffffffffu, 0xffffffffu);
  CHECK(b.v[0] == 0x408f276du);
  CHECK(b.v[1] == 0x41c83b0eu);
  CHECK(b.v[2] == 0xa20bc7c6u);
  CHECK(b.v[3] == 0x6d5451fdu);
  auto c = ref::philox4x32_10({{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}}, 0xa4093822u, 0x299f31d0u);
  CHECK(c.v[0] == 0xd16cfe09u);
  CHECK(c.v[1] == 0x94fdccebu);
  CHECK(c.v[2] == 0x5001e420u);
  CHECK(c.v[3] == 0x24126ea1u);
  // frugal's generator, with its (hi, lo) counter and 64-bit key layout.
  frugal::Philox f(0x299f31d0a4093822ull);
  auto fb = f(0x0370734413198a2eull, 0x85a308d3243f6a88ull);
  CHECK(fb.v[0] == 0xd16cfe09u);
  CHECK(fb.v[3] == 0x24126ea1u);
}

TEST_CASE("dropout forward matches the reference mask at several steps, f32 and f64", "[xfmr][dropout]") {
  for (DType dt : {DType::f64, DType::f32}) {
    for (double p : {0.1, 0.5, 0.9}) {
      const std::uint64_t key = 0x1234abcd5678ull + std::uint64_t(p * 100);
      DropoutRun run(random_tensor({7, 13}, dt, 3), p, key);  // 91 elements: a partial Philox block at the end
      const ref::Array xa = as_array(run.x);
      for (std::int64_t s : {0, 1, 7, 1000003}) {
        INFO("p " << p << " step " << s << " " << frugal::dtype_name(dt));
        ref::Array want = ref::dropout(xa, p, key, std::uint64_t(s));
        expect_close("dropout forward", run.at(s), want.v, want.shape,
                     dt == DType::f64 ? kF64ForwardTol : kF32ForwardTol);
      }
    }
  }
}

TEST_CASE("dropout: the same step draws the same mask, another step another mask", "[xfmr][dropout]") {
  DropoutRun run(random_tensor({64, 64}, DType::f32, 4), 0.5, 99);
  auto s3 = run.at(3), s4 = run.at(4), s3again = run.at(3);
  CHECK(s3 == s3again);
  std::size_t differ = 0;
  for (std::size_t i = 0; i < s3.size(); ++i) differ += (s3[i] == 0) != (s4[i] == 0);
  // Independent masks at p = 0.5 disagree on half the elements: 2048 of 4096.
  CHECK(differ > 1500);
}

TEST_CASE("a recomputed dropout (the same op applied again in the step) reproduces the mask", "[xfmr][dropout]") {
  frugal::Tensor xt = random_tensor({40, 30}, DType::f32, 6);
  frugal::Step step = frugal::compile_inference(
      [&] {
        Var xv = frugal::persistent_var(xt, frugal::ValueKind::parameter, "x");
        auto op = std::make_shared<frugal::ops::Dropout>(0.3, 1234);
        Var first = frugal::apply(op, {xv}).at(0);
        Var again = frugal::apply(op, {xv}).at(0);  // what a recomputation runs
        return std::vector<Var>{first, again};
      },
      {});
  for (std::int64_t s : {0, 5}) {
    step.set_steps_run(s);
    step.run();
    CHECK(to_doubles(step.output(0)) == to_doubles(step.output(1)));
  }
}

TEST_CASE("dropout drops a fraction p of the elements, within a binomial bound", "[xfmr][dropout]") {
  const std::int64_t n = 200000;
  for (double p : {0.1, 0.3, 0.5, 0.8}) {
    DropoutRun run(frugal::Tensor::from(std::vector<float>(std::size_t(n), 1.0f), {n}), p, 777);
    for (std::int64_t s : {0, 1}) {
      auto y = run.at(s);
      std::int64_t dropped = 0, badly_scaled = 0;
      for (double v : y) {
        if (v == 0)
          ++dropped;
        else if (v != double(float(1.0 / (1.0 - p))))
          ++badly_scaled;  // the kept ones are scaled by 1/(1-p)
      }
      CHECK(badly_scaled == 0);
      // Binomial(n, p): mean n p, sd sqrt(n p (1 - p)) <= 224 here. Six sd:
      // a correct mask fails this with probability ~2e-9; a mask off by 1% of
      // n (2000 elements) cannot pass it.
      const double sd = std::sqrt(double(n) * p * (1 - p));
      INFO("p " << p << " step " << s << ": dropped " << dropped << " of " << n << ", expected " << double(n) * p
                << " +- " << 6 * sd);
      CHECK(std::abs(double(dropped) - double(n) * p) <= 6 * sd);
    }
  }
}

TEST_CASE("dropout with p = 0, in evaluation, is the identity; p = 1 drops everything", "[xfmr][dropout]") {
  frugal::Tensor xt = random_tensor({5, 6}, DType::f32, 8);
  // `training`: CompileOptions::training (an inference step runs modules in
  // eval mode unless told otherwise).
  auto run = [&](std::function<Var(Var)> f, std::optional<bool> training = {}) {
    frugal::Step s = frugal::compile_inference(
        [&] { return f(frugal::persistent_var(xt, frugal::ValueKind::parameter, "x")) * 1.0; }, {}, {},
        {.training = training});
    s.run();
    return s.output(0).to_vector<float>();
  };
  const std::vector<float> xv = xt.to_vector<float>();
  CHECK(run([](Var v) { return frugal::dropout(v, 0.0); }) == xv);
  CHECK(run([](Var v) { return frugal::dropout(v, 0.7, false); }) == xv);
  frugal::nn::Dropout layer(0.7);
  layer.eval();
  CHECK(run([&](Var v) { return layer(v); }) == xv);
  layer.train();
  CHECK(run([&](Var v) { return layer(v); }) == xv);  // inference runs modules in eval mode
  CHECK(run([&](Var v) { return layer(v); }, true) != xv);
  CHECK(run([](Var v) { return frugal::dropout(v, 1.0); }) == std::vector<float>(30, 0.0f));
  std::string m = error_message<frugal::Error>([&] { run([](Var v) { return frugal::dropout(v, 1.5); }); });
  CHECK_THAT(m, Contains("dropout") && Contains("1.5"));
}

TEST_CASE("dropout gradient: finite differences at a fixed step counter, and the forward's own mask",
          "[xfmr][dropout]") {
  // The harness's finite differences run the step many times, and each run
  // advances the step counter (a new mask). So this test pins the counter
  // with set_steps_run before every run.
  const double p = 0.4;
  const std::uint64_t key = 4242, at = 17;
  for (DType dt : {DType::f64, DType::f32}) {
    frugal::Tensor xt = random_tensor({6, 7}, dt, 10), rt = random_tensor({6, 7}, dt, 11);
    frugal::Step step = frugal::compile_gradients(
        [&] {
          Var y = frugal::dropout_with_key(frugal::persistent_var(xt, frugal::ValueKind::parameter, "x"), p, key);
          return frugal::sum(frugal::exp(y) * frugal::persistent_var(rt, frugal::ValueKind::state, "r"));
        },
        {}, {xt});
    step.set_steps_run(std::int64_t(at));
    step.run();
    std::vector<double> g = to_doubles(step.grad(xt));
    // d/dx sum(exp(y) r) = r exp(y) keep / (1 - p), with the reference mask.
    ref::Array xa = as_array(xt), ra = as_array(rt), y = ref::dropout(xa, p, key, at);
    std::vector<double> want(g.size());
    for (std::size_t i = 0; i < g.size(); ++i)
      want[i] = ref::dropout_keep(key, at, i, p) ? ra.v[i] * std::exp(y.v[i]) / (1 - p) : 0.0;
    expect_close(std::string("dropout grad vs mask ") + frugal::dtype_name(dt), g, want, xa.shape,
                 dt == DType::f64 ? 1e-12 : 1e-5);
    if (dt != DType::f64) continue;
    std::vector<double> fd(g.size());
    double* px = xt.data<double>();
    for (std::size_t j = 0; j < fd.size(); ++j) {
      const double orig = px[j];
      px[j] = orig + kFdStep;
      step.set_steps_run(std::int64_t(at));
      step.run();
      const double lp = step.last_loss_f64();
      px[j] = orig - kFdStep;
      step.set_steps_run(std::int64_t(at));
      step.run();
      const double lm = step.last_loss_f64();
      px[j] = orig;
      fd[j] = (lp - lm) / (2 * kFdStep);
    }
    expect_close("dropout grad f64 vs finite differences", g, fd, xa.shape, kF64GradTol);
  }
}

TEST_CASE("dropout keys: two dropouts of a capture differ; the same seed gives the same keys", "[xfmr][dropout]") {
  frugal::Tensor xt = random_tensor({32, 32}, DType::f32, 12);
  auto keys_after_seed = [&](std::uint64_t seed) {
    frugal::nn::manual_seed(seed);
    frugal::Step s = frugal::compile_inference(
        [&] {
          Var v = frugal::persistent_var(xt, frugal::ValueKind::parameter, "x");
          return std::vector<Var>{frugal::dropout(v, 0.5), frugal::dropout(v, 0.5)};
        },
        {});
    s.run();
    std::vector<std::uint64_t> keys;
    for (const auto& n : s.graph().nodes())
      if (auto* d = dynamic_cast<const frugal::ops::Dropout*>(n.op.get())) keys.push_back(d->key());
    CHECK(to_doubles(s.output(0)) != to_doubles(s.output(1)));
    return keys;
  };
  auto k1 = keys_after_seed(1), k1again = keys_after_seed(1), k2 = keys_after_seed(2);
  REQUIRE(k1.size() == 2);
  CHECK(k1[0] != k1[1]);
  CHECK(k1 == k1again);
  CHECK(k1 != k2);
  // Choosing a key does not move the initialisation stream.
  frugal::nn::manual_seed(5);
  frugal::nn::Linear a(3, 3);
  frugal::nn::manual_seed(5);
  keys_after_seed(5);
  frugal::nn::manual_seed(5);
  frugal::nn::Linear b(3, 3);
  CHECK(a.weight.to_vector<float>() == b.weight.to_vector<float>());
}

// ---- causal attention -------------------------------------------------------

namespace {
Case attn(std::string name, ref::Dims q, ref::Dims kv, std::int64_t hdv = -1, double f32_scale = 1) {
  ref::Dims v = kv;
  if (hdv > 0) v.back() = hdv;
  Case c{std::move(name),
         {wide(std::move(q)), wide(std::move(kv)), x(std::move(v))},
         [](const V& t) { return frugal::causal_attention(t[0], t[1], t[2]); },
         [](const A& a) { return ref::causal_attention(a[0], a[1], a[2]); }};
  c.f32_scale = f32_scale;
  return c;
}

// The same attention composed from existing frugal ops, as the peer writes
// it: matmul, scale, an additive mask, softmax, matmul.
Var composed_attention(Var q, Var k, Var v, Var mask) {
  double scale = 1.0 / std::sqrt(double(q.dim(-1)));
  return frugal::matmul(frugal::softmax(frugal::matmul(q, k, false, true) * scale + mask), v);
}

// [Tq, Tk]: 0 where query i may see key j (j <= i + Tk - Tq), a large
// negative number elsewhere.
frugal::Tensor causal_mask(std::int64_t tq, std::int64_t tk, DType dt) {
  frugal::Tensor m({tq, tk}, dt);
  for (std::int64_t i = 0; i < tq; ++i)
    for (std::int64_t j = 0; j < tk; ++j) {
      double val = j <= i + tk - tq ? 0.0 : -1e30;
      if (dt == DType::f64)
        m.data<double>()[i * tk + j] = val;
      else
        m.data<float>()[i * tk + j] = float(val);
    }
  return m;
}
}  // namespace

TEST_CASE("causal_attention forward and backward against the reference and finite differences", "[xfmr][attention]") {
  check_op(attn("attention [1,1,4,3]", {1, 1, 4, 3}, {1, 1, 4, 3}));
  check_op(attn("attention [2,3,5,4] odd T", {2, 3, 5, 4}, {2, 3, 5, 4}));
  check_op(attn("attention [2,2,1,3] T=1", {2, 2, 1, 3}, {2, 2, 1, 3}));
  check_op(attn("attention [1,2,6,5] odd hd", {1, 2, 6, 5}, {1, 2, 6, 5}));
  check_op(attn("attention [3,7,1] rank 3, hd 1", {3, 7, 1}, {3, 7, 1}));
  check_op(attn("attention [4,2] rank 2", {4, 2}, {4, 2}));
  check_op(attn("attention [1,1,4,3] v head dim 5", {1, 1, 4, 3}, {1, 1, 4, 3}, 5));
}

TEST_CASE("causal_attention with fewer queries than keys aligns the mask to the end", "[xfmr][attention]") {
  check_op(attn("attention q[1,2,3,4] kv[1,2,5,4]", {1, 2, 3, 4}, {1, 2, 5, 4}));
  check_op(attn("attention q[2,1,1,3] kv[2,1,6,3] one query sees all", {2, 1, 1, 3}, {2, 1, 6, 3}));
}

TEST_CASE("causal_attention across several tiles (T > 64) against the reference and finite differences",
          "[xfmr][attention]") {
  // hd = 1 keeps the finite differences affordable at T = 70 and 130:
  // 2, and 3, query and key tiles of 64, the last one partial.
  check_op(attn("attention [1,1,70,1] two tiles", {1, 1, 70, 1}, {1, 1, 70, 1}));
  check_op(attn("attention [1,130,1] three tiles", {1, 130, 1}, {1, 130, 1}));
  check_op(attn("attention q[1,40,2] kv[1,100,2] tiles offset", {1, 40, 2}, {1, 100, 2}));
}

TEST_CASE("fused causal_attention equals the composed matmul-mask-softmax-matmul, forward and backward",
          "[xfmr][attention]") {
  struct Sizes {
    std::int64_t b, h, tq, tk, hd;
  };
  for (Sizes z : {Sizes{2, 3, 150, 150, 16}, Sizes{1, 2, 65, 65, 7}, Sizes{2, 1, 33, 129, 8}, Sizes{1, 1, 1, 1, 3}}) {
    for (DType dt : {DType::f64, DType::f32}) {
      INFO("B " << z.b << " H " << z.h << " Tq " << z.tq << " Tk " << z.tk << " hd " << z.hd << " "
                << frugal::dtype_name(dt));
      frugal::Tensor q = random_tensor({z.b, z.h, z.tq, z.hd}, dt, 21),
                     k = random_tensor({z.b, z.h, z.tk, z.hd}, dt, 22),
                     v = random_tensor({z.b, z.h, z.tk, z.hd}, dt, 23),
                     r = random_tensor({z.b, z.h, z.tq, z.hd}, dt, 24);
      frugal::Tensor mask = causal_mask(z.tq, z.tk, dt);
      auto run = [&](bool fused) {
        frugal::Step s = frugal::compile_gradients(
            [&] {
              Var qv = frugal::persistent_var(q, frugal::ValueKind::parameter, "q");
              Var kv = frugal::persistent_var(k, frugal::ValueKind::parameter, "k");
              Var vv = frugal::persistent_var(v, frugal::ValueKind::parameter, "v");
              Var o = fused
                          ? frugal::causal_attention(qv, kv, vv)
                          : composed_attention(qv, kv, vv, frugal::persistent_var(mask, frugal::ValueKind::state, "m"));
              return frugal::sum(o * frugal::persistent_var(r, frugal::ValueKind::state, "r"));
            },
            {}, {q, k, v}, {}, {.threads = 2});
        s.run();
        return std::vector<std::vector<double>>{
            {s.last_loss_f64()}, to_doubles(s.grad(q)), to_doubles(s.grad(k)), to_doubles(s.grad(v))};
      };
      auto fused = run(true), composed = run(false);
      const double tol = dt == DType::f64 ? 1e-12 : 2e-5;
      const char* what[] = {"loss", "dq", "dk", "dv"};
      for (int i = 0; i < 4; ++i)
        expect_close(std::string("fused vs composed ") + what[i], fused[std::size_t(i)], composed[std::size_t(i)],
                     {std::int64_t(fused[std::size_t(i)].size())}, i == 0 ? tol * 10 : tol);
    }
  }
}

TEST_CASE("causal_attention shape errors", "[xfmr][attention]") {
  auto att = [](const V& v) { return frugal::causal_attention(v[0], v[1], v[2]); };
  std::string m = capture_error({{1, 2, 5, 4}, {1, 2, 3, 4}, {1, 2, 3, 4}}, att);
  CHECK_THAT(m, Contains("causal_attention") && Contains("[1, 2, 5, 4]") && Contains("[1, 2, 3, 4]") &&
                    Contains("more queries (5) than keys (3)"));
  m = capture_error({{1, 2, 3, 4}, {1, 2, 3, 5}, {1, 2, 3, 4}}, att);
  CHECK_THAT(m, Contains("causal_attention") && Contains("head dimensions differ"));
  m = capture_error({{1, 2, 3, 4}, {1, 3, 3, 4}, {1, 3, 3, 4}}, att);
  CHECK_THAT(m, Contains("causal_attention") && Contains("leading"));
  m = capture_error({{2, 3, 4}, {2, 3, 4}, {2, 4, 4}}, att);
  CHECK_THAT(m, Contains("causal_attention") && Contains("[2, 4, 4]"));
  m = capture_error({{4}, {4}, {4}}, att);
  CHECK_THAT(m, Contains("causal_attention") && Contains("rank"));
  m = capture_error({{2, 5, 12}}, [](const V& v) { return frugal::causal_attention_qkv(v[0], 3); });
  CHECK_THAT(m, Contains("causal_attention_qkv") && Contains("[2, 5, 12]") && Contains("3 heads"));
}

// ---- indexing: concat and split ------------------------------------------------

TEST_CASE("concat along any axis, forward and backward", "[xfmr][indexing]") {
  check_op({"concat [2,3]+[4,3] axis 0",
            {x({2, 3}), x({4, 3})},
            [](const V& v) {
              return frugal::concat({v[0], v[1]}, 0);
            },
            [](const A& a) {
              return ref::concat({a[0], a[1]}, 0);
            }});
  check_op({"concat [2,1,3]+[2,4,3]+[2,2,3] axis 1",
            {x({2, 1, 3}), x({2, 4, 3}), x({2, 2, 3})},
            [](const V& v) {
              return frugal::concat({v[0], v[1], v[2]}, 1);
            },
            [](const A& a) {
              return ref::concat({a[0], a[1], a[2]}, 1);
            }});
  check_op({"concat [2,3]+[2,1] axis -1",
            {x({2, 3}), x({2, 1})},
            [](const V& v) {
              return frugal::concat({v[0], v[1]}, -1);
            },
            [](const A& a) {
              return ref::concat({a[0], a[1]}, -1);
            }});
  // One tensor twice: both gradients reach it.
  check_op({"concat x with itself [3]",
            {x({3})},
            [](const V& v) {
              return frugal::concat({v[0], v[0]}, 0);
            },
            [](const A& a) {
              return ref::concat({a[0], a[0]}, 0);
            }});
  check_op({"concat with an empty piece [2,0]+[2,3]",
            {x({2, 0}), x({2, 3})},
            [](const V& v) {
              return frugal::concat({v[0], v[1]}, 1);
            },
            [](const A& a) {
              return ref::concat({a[0], a[1]}, 1);
            }});
}

TEST_CASE("split into pieces, forward and backward, also with unused pieces", "[xfmr][indexing]") {
  // Reordered so each piece's gradient lands somewhere else.
  check_op({"split [7,2] sizes (3,1,3) axis 0, reordered",
            {x({7, 2})},
            [](const V& v) {
              auto p = frugal::split(v[0], {3, 1, 3}, 0);
              return frugal::concat({p[2], p[0] * 2.0, p[1]}, 0);
            },
            [](const A& a) {
              auto p = ref::split(a[0], {3, 1, 3}, 0);
              return ref::concat({p[2], ref::affine(p[0], 2, 0), p[1]}, 0);
            }});
  check_op({"split [2,5,3] sizes (2,3) axis 1",
            {x({2, 5, 3})},
            [](const V& v) {
              auto p = frugal::split(v[0], {2, 3}, 1);
              return frugal::concat({frugal::exp(p[1]), p[0]}, 1);
            },
            [](const A& a) {
              auto p = ref::split(a[0], {2, 3}, 1);
              return ref::concat({ref::exp(p[1]), p[0]}, 1);
            }});
  // Only the middle piece is used: the backward fills the others with zeros.
  check_op({"split [3,6] sizes (2,3,1) axis -1, middle piece only",
            {x({3, 6})},
            [](const V& v) {
              return frugal::split(v[0], {2, 3, 1}, -1)[1] * 3.0;
            },
            [](const A& a) {
              return ref::affine(ref::split(a[0], {2, 3, 1}, -1)[1], 3, 0);
            }});
  check_op({"split [4] sizes (0,4)",
            {x({4})},
            [](const V& v) {
              return frugal::split(v[0], {0, 4}, 0)[1];
            },
            [](const A& a) {
              return ref::split(a[0], {0, 4}, 0)[1];
            }});
}

// ---- indexing: slice -------------------------------------------------------------

TEST_CASE("slice with Python's rules, forward and backward", "[xfmr][indexing]") {
  struct S {
    ref::Dims shape;
    int axis;
    std::int64_t start, end, step;
  };
  for (const S& c : {S{{6, 3}, 0, 1, 4, 1}, S{{6, 3}, 0, 0, 6, 2}, S{{2, 7, 2}, 1, -5, -1, 1},
                     S{{2, 7, 2}, 1, 1, 100, 3}, S{{5}, 0, -100, 3, 1}, S{{3, 4}, -1, 3, 4, 1}, S{{3, 4}, 1, 2, 2, 1},
                     S{{2, 3, 4}, 2, 0, 4, 3}, S{{4, 2}, 0, 3, 1, 1}}) {
    const std::string name = "slice " + ref::str(c.shape) + " axis " + std::to_string(c.axis) + " [" +
                             std::to_string(c.start) + ":" + std::to_string(c.end) + ":" + std::to_string(c.step) + "]";
    check_op({name,
              {x(c.shape)},
              [c](const V& v) { return frugal::slice(v[0], c.axis, c.start, c.end, c.step) * 1.5; },
              [c](const A& a) { return ref::affine(ref::slice(a[0], c.axis, c.start, c.end, c.step), 1.5, 0); }});
  }
}

// ---- indexing: index_select and index_add ------------------------------------------

TEST_CASE("index_select and index_add, forward and backward", "[xfmr][indexing]") {
  check_op({"index_select [5,3] axis 0 ids[4] i64 with repeats",
            {x({5, 3}), labels({4}, 2, DType::i64)},
            [](const V& v) { return frugal::index_select(v[0], 0, v[1]); },
            [](const A& a) { return ref::index_select(a[0], 0, a[1]); }});
  check_op({"index_select [2,4,3] axis 1 ids[6] i32",
            {x({2, 4, 3}), labels({6}, 4, DType::i32)},
            [](const V& v) { return frugal::index_select(v[0], 1, v[1]); },
            [](const A& a) { return ref::index_select(a[0], 1, a[1]); }});
  check_op({"index_select [3,5] axis -1 ids[2]",
            {x({3, 5}), labels({2}, 5, DType::i64)},
            [](const V& v) { return frugal::index_select(v[0], -1, v[1]); },
            [](const A& a) { return ref::index_select(a[0], -1, a[1]); }});
  check_op({"index_add [4,3] axis 0 ids[5] src[5,3]",
            {x({4, 3}), labels({5}, 4, DType::i64), x({5, 3})},
            [](const V& v) { return frugal::index_add(v[0], 0, v[1], v[2]); },
            [](const A& a) { return ref::index_add(a[0], 0, a[1], a[2]); }});
  check_op({"index_add [2,3,2] axis 1 ids[4] i32 src[2,4,2]",
            {x({2, 3, 2}), labels({4}, 3, DType::i32), x({2, 4, 2})},
            [](const V& v) { return frugal::index_add(v[0], 1, v[1], v[2]); },
            [](const A& a) { return ref::index_add(a[0], 1, a[1], a[2]); }});
}

// ---- indexing: gather and scatter_add ------------------------------------------------

TEST_CASE("gather and scatter_add with torch semantics, forward and backward", "[xfmr][indexing]") {
  check_op({"gather [3,4] axis 1 ids[3,2]",
            {x({3, 4}), labels({3, 2}, 4, DType::i64)},
            [](const V& v) { return frugal::gather(v[0], 1, v[1]); },
            [](const A& a) { return ref::gather(a[0], 1, a[1]); }});
  check_op({"gather [3,4] axis 0 ids[5,4] i32, repeats",
            {x({3, 4}), labels({5, 4}, 3, DType::i32)},
            [](const V& v) { return frugal::gather(v[0], 0, v[1]); },
            [](const A& a) { return ref::gather(a[0], 0, a[1]); }});
  // ids smaller than x off the axis: only a corner of x is read.
  check_op({"gather [3,4,5] axis 1 ids[2,6,3]",
            {x({3, 4, 5}), labels({2, 6, 3}, 4, DType::i64)},
            [](const V& v) { return frugal::gather(v[0], 1, v[1]); },
            [](const A& a) { return ref::gather(a[0], 1, a[1]); }});
  check_op({"scatter_add [3,4] axis 1 ids[3,5]",
            {x({3, 4}), labels({3, 5}, 4, DType::i64), x({3, 5})},
            [](const V& v) { return frugal::scatter_add(v[0], 1, v[1], v[2]); },
            [](const A& a) { return ref::scatter_add(a[0], 1, a[1], a[2]); }});
  check_op({"scatter_add [4,3] axis 0 ids[6,2] i32",
            {x({4, 3}), labels({6, 2}, 4, DType::i32), x({6, 2})},
            [](const V& v) { return frugal::scatter_add(v[0], 0, v[1], v[2]); },
            [](const A& a) { return ref::scatter_add(a[0], 0, a[1], a[2]); }});
  check_op({"scatter_add [2,3,4] axis -1 ids[2,2,3]",
            {x({2, 3, 4}), labels({2, 2, 3}, 4, DType::i64), x({2, 2, 3})},
            [](const V& v) { return frugal::scatter_add(v[0], -1, v[1], v[2]); },
            [](const A& a) { return ref::scatter_add(a[0], -1, a[1], a[2]); }});
}

TEST_CASE("indexing ops move integer tensors too", "[xfmr][indexing]") {
  frugal::Tensor ids = frugal::Tensor::from(std::vector<std::int32_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, {3, 4});
  frugal::Tensor pick = frugal::Tensor::from(std::vector<std::int64_t>{2, 0}, {2});
  frugal::Step s = frugal::compile_inference(
      [&] {
        Var t = frugal::persistent_var(ids, frugal::ValueKind::state, "ids");
        Var p = frugal::persistent_var(pick, frugal::ValueKind::state, "pick");
        auto parts = frugal::split(t, {1, 3}, 1);
        return std::vector<Var>{frugal::slice(t, 1, 1, 4, 2), frugal::concat({parts[1], parts[0]}, 1),
                                frugal::index_select(t, 0, p)};
      },
      {});
  s.run();
  CHECK(s.output(0).to_vector<std::int32_t>() == std::vector<std::int32_t>{1, 3, 5, 7, 9, 11});
  CHECK(s.output(1).to_vector<std::int32_t>() == std::vector<std::int32_t>{1, 2, 3, 0, 5, 6, 7, 4, 9, 10, 11, 8});
  CHECK(s.output(2).to_vector<std::int32_t>() == std::vector<std::int32_t>{8, 9, 10, 11, 0, 1, 2, 3});
}

TEST_CASE("out-of-range indices are DataErrors naming the op, the id, its position and the range", "[xfmr][indexing]") {
  frugal::Tensor xt({3, 4}, DType::f32);
  auto run = [&](const frugal::Tensor& ids, std::function<Var(Var, Var)> f) {
    frugal::Step s = frugal::compile_gradients(
        [&] {
          return frugal::sum(f(frugal::persistent_var(xt, frugal::ValueKind::parameter, "x"),
                               frugal::persistent_var(ids, frugal::ValueKind::state, "ids")));
        },
        {}, {xt});
    return error_message<frugal::DataError>([&] { s.run(); });
  };
  frugal::Tensor v = frugal::Tensor::from(std::vector<std::int64_t>{0, 3, 1}, {3});
  CHECK_THAT(run(v, [](Var a, Var i) { return frugal::index_select(a, 0, i); }),
             Contains("index_select") && Contains("id 3") && Contains("position 1") && Contains("[0, 3)"));
  frugal::Tensor neg = frugal::Tensor::from(std::vector<std::int32_t>{0, 1, -2, 1, 0, 0}, {3, 2});
  CHECK_THAT(
      run(neg, [](Var a, Var i) { return frugal::gather(a, 1, i); }),
      Contains("gather") && Contains("id -2") && Contains("position 2") && Contains("[1, 0]") && Contains("[0, 4)"));
  frugal::Tensor big = frugal::Tensor::from(std::vector<std::int32_t>{0, 1, 2, 3, 4, 0}, {2, 3});
  CHECK_THAT(
      run(big,
          [](Var a, Var i) { return frugal::scatter_add(a, 0, i, frugal::slice(frugal::slice(a, 0, 0, 2), 1, 0, 3)); }),
      Contains("scatter_add") && Contains("id 3") && Contains("position 3") && Contains("[0, 3)"));
  frugal::Tensor v2 = frugal::Tensor::from(std::vector<std::int64_t>{0, 9}, {2});
  CHECK_THAT(run(v2, [](Var a, Var i) { return frugal::index_add(a, 1, i, frugal::slice(a, 1, 0, 2)); }),
             Contains("index_add") && Contains("id 9") && Contains("position 1") && Contains("[0, 4)"));
}

TEST_CASE("indexing shape errors name the op and the shapes", "[xfmr][indexing]") {
  std::string m = capture_error({{2, 3}, {3, 3}}, [](const V& v) { return frugal::concat({v[0], v[1]}, 1); });
  CHECK_THAT(m, Contains("concat") && Contains("[3, 3]") && Contains("[2, 3]"));
  m = capture_error({{5, 2}}, [](const V& v) { return frugal::split(v[0], {2, 2}, 0)[0]; });
  CHECK_THAT(m, Contains("split") && Contains("[5, 2]") && Contains("(2, 2)"));
  m = capture_error({{5, 2}}, [](const V& v) { return frugal::slice(v[0], 2, 0, 1); });
  CHECK_THAT(m, Contains("slice") && Contains("[5, 2]"));
  m = capture_error({{5, 2}}, [](const V& v) { return frugal::slice(v[0], 0, 0, 4, 0); });
  CHECK_THAT(m, Contains("slice") && Contains("step"));
  m = capture_error({{3, 4}, {4, 2}}, [](const V& v) { return frugal::gather(v[0], 1, v[1]); },
                    {DType::f32, DType::i64});
  CHECK_THAT(m, Contains("gather") && Contains("[4, 2]") && Contains("[3, 4]"));
  m = capture_error({{3, 4}, {2, 2}}, [](const V& v) { return frugal::index_select(v[0], 0, v[1]); },
                    {DType::f32, DType::i64});
  CHECK_THAT(m, Contains("index_select") && Contains("vector"));
  m = capture_error({{3, 4}, {3, 2}, {3, 3}}, [](const V& v) { return frugal::scatter_add(v[0], 1, v[1], v[2]); },
                    {DType::f32, DType::i64, DType::f32});
  CHECK_THAT(m, Contains("scatter_add") && Contains("[3, 3]") && Contains("[3, 2]"));
}

// ---- large cases: the multi-threaded kernel paths ---------------------------------

namespace {
// The gradients of sum(f(x...) * r) for the floating inputs, on `threads`.
std::vector<std::vector<float>> grads_on(int threads, const Case& c) {
  frugal::Rng rng(seed_of(c.name));
  Arrays vals;
  for (auto& in : c.inputs) vals.push_back(draw_array(rng, in));
  std::vector<frugal::Tensor> ts = make_inputs(c, vals, DType::f32), wrt;
  for (std::size_t i = 0; i < ts.size(); ++i)
    if (!c.inputs[i].is_labels()) wrt.push_back(ts[i]);
  frugal::Tensor r;
  frugal::Step s = frugal::compile_gradients(
      [&] {
        Var y = c.build(bind_inputs(c, ts));
        r = random_tensor(y.shape().dims(), DType::f32, 77);
        return frugal::sum(y * frugal::persistent_var(r, frugal::ValueKind::state, "r"));
      },
      {}, wrt, {}, {.threads = threads});
  s.run();
  std::vector<std::vector<float>> out;
  for (auto& w : wrt) out.push_back(s.grad(w).to_vector<float>());
  return out;
}
}  // namespace

TEST_CASE("large inputs take the multi-threaded paths and still match the references", "[xfmr][threads]") {
  omp_set_num_threads(2);  // this thread's count: the multi-threaded paths
  check_forward_large({"layer_norm [300,200]",
                       {wide({300, 200}), x({200}), x({200})},
                       [](const V& v) { return frugal::layer_norm(v[0], v[1], v[2]); },
                       [](const A& a) { return ref::layer_norm(a[0], &a[1], &a[2]); }});
  check_forward_large({"embedding ids[40,30] table[50,100]",
                       {labels({40, 30}, 50, DType::i64), x({50, 100})},
                       [](const V& v) { return frugal::embedding(v[0], v[1]); },
                       [](const A& a) { return ref::embedding(a[0], a[1]); }});
  check_forward_large({"concat [100,150]+[100,170] axis 1",
                       {x({100, 150}), x({100, 170})},
                       [](const V& v) {
                         return frugal::concat({v[0], v[1]}, 1);
                       },
                       [](const A& a) {
                         return ref::concat({a[0], a[1]}, 1);
                       }});
  check_forward_large({"slice [300,200] 1:299:2",
                       {x({300, 200})},
                       [](const V& v) { return frugal::slice(v[0], 0, 1, 299, 2); },
                       [](const A& a) { return ref::slice(a[0], 0, 1, 299, 2); }});
  check_forward_large({"index_add [50,300] ids[400] src[400,300]",
                       {x({50, 300}), labels({400}, 50, DType::i32), x({400, 300})},
                       [](const V& v) { return frugal::index_add(v[0], 0, v[1], v[2]); },
                       [](const A& a) { return ref::index_add(a[0], 0, a[1], a[2]); }});
  check_forward_large({"gather [200,300] axis 1 ids[200,250]",
                       {x({200, 300}), labels({200, 250}, 300, DType::i64)},
                       [](const V& v) { return frugal::gather(v[0], 1, v[1]); },
                       [](const A& a) { return ref::gather(a[0], 1, a[1]); }});
  check_forward_large({"scatter_add [300,40] axis 0 ids[500,40]",
                       {x({300, 40}), labels({500, 40}, 300, DType::i64), x({500, 40})},
                       [](const V& v) { return frugal::scatter_add(v[0], 0, v[1], v[2]); },
                       [](const A& a) { return ref::scatter_add(a[0], 0, a[1], a[2]); }});
  Case at{"causal_attention [2,3,100,16]",
          {wide({2, 3, 100, 16}), wide({2, 3, 100, 16}), x({2, 3, 100, 16})},
          [](const V& t) { return frugal::causal_attention(t[0], t[1], t[2]); },
          [](const A& a) { return ref::causal_attention(a[0], a[1], a[2]); }};
  check_forward_large(at);
}

TEST_CASE("gradients are the same bits on 1 and 2 threads", "[xfmr][threads]") {
  std::vector<Case> cases{
      {"layer_norm [400,96]",
       {wide({400, 96}), x({96}), x({96})},
       [](const V& v) { return frugal::layer_norm(v[0], v[1], v[2]); },
       nullptr},
      {"causal_attention [2,4,130,32]",
       {wide({2, 4, 130, 32}), wide({2, 4, 130, 32}), x({2, 4, 130, 32})},
       [](const V& t) { return frugal::causal_attention(t[0], t[1], t[2]); },
       nullptr},
      {"index_select [300,200] axis 0 ids[500]",
       {x({300, 200}), labels({500}, 300, DType::i64)},
       [](const V& v) { return frugal::index_select(v[0], 0, v[1]); },
       nullptr},
      {"gather [200,300] axis 1 ids[200,250]",
       {x({200, 300}), labels({200, 250}, 300, DType::i64)},
       [](const V& v) { return frugal::gather(v[0], 1, v[1]); },
       nullptr},
  };
  for (const Case& c : cases) {
    INFO(c.name);
    auto g1 = grads_on(1, c), g2 = grads_on(2, c);
    REQUIRE(g1.size() == g2.size());
    for (std::size_t i = 0; i < g1.size(); ++i) {
      REQUIRE(g1[i].size() == g2[i].size());
      CHECK(std::memcmp(g1[i].data(), g2[i].data(), g1[i].size() * 4) == 0);
    }
  }
}

// ---- nn layers -----------------------------------------------------------------------

namespace {

ref::Array param(const frugal::Tensor& t) { return as_array(t); }

// The reference of an nn::Linear / nn::LayerNorm with the module's own weights.
ref::Array lin(const ref::Array& x, const frugal::nn::Linear& l) {
  const ref::Array w = param(l.weight);
  if (!l.bias.defined()) return ref::linear(x, w);
  const ref::Array b = param(l.bias);
  return ref::linear(x, w, &b);
}
ref::Array lnorm(const ref::Array& x, const frugal::nn::LayerNorm& l) {
  const ref::Array w = param(l.weight), b = param(l.bias);
  return ref::layer_norm(x, &w, &b);
}

// Central differences of a module's loss for a few elements of each
// parameter, against the analytic gradients. The module must be f64.
void check_module_gradients(const std::string& what, frugal::nn::Module& m, frugal::Step& step,
                            std::int64_t per_param = 6) {
  step.run();
  for (auto& [name, t] : m.named_parameters()) {
    INFO(what << ": parameter " << name << " " << t.shape().str());
    std::vector<double> g = to_doubles(step.grad(t));
    double* p = t.data<double>();
    std::vector<double> got, fd;
    frugal::Rng pick(seed_of(name));
    for (std::int64_t k = 0; k < std::min(per_param, t.numel()); ++k) {
      const std::size_t j = k == 0 ? 0 : std::size_t(pick.below(std::uint64_t(t.numel())));
      const double orig = p[j];
      p[j] = orig + kFdStep;
      step.run();
      const double lp = step.last_loss_f64();
      p[j] = orig - kFdStep;
      step.run();
      const double lm = step.last_loss_f64();
      p[j] = orig;
      got.push_back(g[j]);
      fd.push_back((lp - lm) / (2 * kFdStep));
    }
    expect_close(what + " d/d" + name, got, fd, {std::int64_t(got.size())}, kF64GradTol);
  }
}

}  // namespace

TEST_CASE("causal_attention_qkv on a packed projection, forward and backward", "[xfmr][attention]") {
  check_op({"attention qkv [2,5,12] 2 heads",
            {wide({2, 5, 12})},
            [](const V& v) { return frugal::causal_attention_qkv(v[0], 2); },
            [](const A& a) { return ref::causal_attention_from_qkv(a[0], 2); }});
  check_op({"attention qkv [1,1,6] T=1, 1 head",
            {wide({1, 1, 6})},
            [](const V& v) { return frugal::causal_attention_qkv(v[0], 1); },
            [](const A& a) { return ref::causal_attention_from_qkv(a[0], 1); }});
  check_op({"attention qkv [1,67,6] two tiles, 2 heads of 1",
            {wide({1, 67, 6})},
            [](const V& v) { return frugal::causal_attention_qkv(v[0], 2); },
            [](const A& a) { return ref::causal_attention_from_qkv(a[0], 2); }});
  check_op({"attention qkv [2,7,15] odd T, head dim 5",
            {wide({2, 7, 15})},
            [](const V& v) { return frugal::causal_attention_qkv(v[0], 1); },
            [](const A& a) { return ref::causal_attention_from_qkv(a[0], 1); }});
}

TEST_CASE("causal_attention_qkv equals permute + split + causal_attention, forward and backward, at size",
          "[xfmr][attention]") {
  for (DType dt : {DType::f64, DType::f32}) {
    const std::int64_t B = 2, T = 150, H = 3, hd = 8;
    frugal::Tensor qkv = random_tensor({B, T, 3 * H * hd}, dt, 51), r = random_tensor({B, T, H * hd}, dt, 52);
    auto run = [&](bool fused) {
      frugal::Step s = frugal::compile_gradients(
          [&] {
            Var x = frugal::persistent_var(qkv, frugal::ValueKind::parameter, "qkv");
            Var y;
            if (fused) {
              y = frugal::causal_attention_qkv(x, H);
            } else {
              Var t = frugal::permute(frugal::reshape(x, {B, T, 3, H, hd}), {2, 0, 3, 1, 4});
              auto p = frugal::split(t, {1, 1, 1}, 0);
              auto heads = [&](Var v) { return frugal::reshape(v, {B, H, T, hd}); };
              y = frugal::reshape(
                  frugal::permute(frugal::causal_attention(heads(p[0]), heads(p[1]), heads(p[2])), {0, 2, 1, 3}),
                  {B, T, H * hd});
            }
            return frugal::sum(y * frugal::persistent_var(r, frugal::ValueKind::state, "r"));
          },
          {}, {qkv}, {}, {.threads = 2});
      s.run();
      return std::pair{s.last_loss_f64(), to_doubles(s.grad(qkv))};
    };
    auto [lf, gf] = run(true);
    auto [lc, gc] = run(false);
    INFO(frugal::dtype_name(dt));
    // The same arithmetic in the same order: equal bits.
    CHECK(lf == lc);
    CHECK(gf == gc);
  }
}

TEST_CASE("causal_attention_from_qkv (the GPT head split) forward and backward", "[xfmr][nn]") {
  check_op({"attention from qkv [2,5,12] 2 heads",
            {wide({2, 5, 12})},
            [](const V& v) { return frugal::nn::causal_attention_from_qkv(v[0], 2); },
            [](const A& a) { return ref::causal_attention_from_qkv(a[0], 2); }});
  check_op({"attention from qkv [1,3,9] 3 heads of 1",
            {wide({1, 3, 9})},
            [](const V& v) { return frugal::nn::causal_attention_from_qkv(v[0], 3); },
            [](const A& a) { return ref::causal_attention_from_qkv(a[0], 3); }});
}

TEST_CASE("nn::LayerNorm, nn::Embedding, nn::MultiHeadAttention and nn::Mlp against references", "[xfmr][nn]") {
  using namespace frugal::nn;
  manual_seed(3);
  LayerNorm ln(6, {.dtype = DType::f64});
  Embedding emb(7, 6, {DType::f64});
  MultiHeadAttention mha(6, 2, {.dtype = DType::f64});
  Mlp mlp(6, 10, {.dtype = DType::f64});
  // PyTorch's defaults: LayerNorm weight 1 and bias 0; Embedding ~ N(0, 1).
  CHECK(ln.weight.to_vector<double>() == std::vector<double>(6, 1.0));
  CHECK(ln.bias.to_vector<double>() == std::vector<double>(6, 0.0));
  {
    double mean = 0, sq = 0;
    Embedding big(200, 50);
    for (float v : big.weight.to_vector<float>()) mean += v, sq += double(v) * v;
    mean /= 10000, sq /= 10000;
    CHECK(std::abs(mean) < 0.05);  // sd of the mean of 10000 N(0,1): 0.01
    CHECK(std::abs(sq - 1) < 0.06);
  }
  frugal::Tensor ids = frugal::Tensor::from(std::vector<std::int64_t>{1, 6, 0, 3, 3, 2, 5, 4}, {2, 4});
  frugal::Tensor r = random_tensor({2, 4, 6}, DType::f64, 31);
  frugal::Step step = frugal::compile_gradients(
      [&] {
        Var h = emb(frugal::persistent_var(ids, frugal::ValueKind::state, "ids"));
        Var y = mlp(mha(ln(h)));
        return frugal::sum(y * frugal::persistent_var(r, frugal::ValueKind::state, "r"));
      },
      {},
      [&] {
        std::vector<frugal::Tensor> all;
        for (frugal::nn::Module* m : std::initializer_list<frugal::nn::Module*>{&ln, &emb, &mha, &mlp})
          for (auto& t : m->parameters()) all.push_back(t);
        return all;
      }());
  step.run();
  ref::Array h = ref::embedding(param(ids), param(emb.weight));
  h = lnorm(h, ln);
  ref::Array qkv = lin(h, mha.qkv);
  h = lin(ref::causal_attention_from_qkv(qkv, 2), mha.proj);
  h = lin(ref::gelu_erf(lin(h, mlp.fc)), mlp.fc_proj);
  double want = 0;
  for (std::size_t i = 0; i < h.v.size(); ++i) want += h.v[i] * param(r).v[i];
  CHECK(std::abs(step.last_loss_f64() - want) < 1e-12 * (1 + std::abs(want)));
  struct All : frugal::nn::Module {
  } all;
  all.register_module("ln", ln);
  all.register_module("emb", emb);
  all.register_module("mha", mha);
  all.register_module("mlp", mlp);
  check_module_gradients("layers", all, step);
}

TEST_CASE("nn::TransformerBlock is pre-norm attention and MLP with residuals", "[xfmr][nn]") {
  using namespace frugal::nn;
  manual_seed(4);
  TransformerBlock block(8, 2, {.mlp_hidden = 12, .dtype = DType::f64});
  frugal::Tensor xt = random_tensor({2, 5, 8}, DType::f64, 41), r = random_tensor({2, 5, 8}, DType::f64, 42);
  frugal::Step step = frugal::compile_gradients(
      [&] {
        Var y = block(frugal::persistent_var(xt, frugal::ValueKind::state, "x"));
        return frugal::sum(y * frugal::persistent_var(r, frugal::ValueKind::state, "r"));
      },
      {}, block.parameters());
  step.run();
  ref::Array xa = param(xt);
  ref::Array qkv = lin(lnorm(xa, block.ln1), block.attn.qkv);
  xa = ref::add(xa, lin(ref::causal_attention_from_qkv(qkv, 2), block.attn.proj));
  ref::Array m = lin(lnorm(xa, block.ln2), block.fc);
  xa = ref::add(xa, lin(ref::gelu_erf(m), block.fc_proj));
  double want = 0;
  for (std::size_t i = 0; i < xa.v.size(); ++i) want += xa.v[i] * param(r).v[i];
  CHECK(std::abs(step.last_loss_f64() - want) < 1e-12 * (1 + std::abs(want)));
  check_module_gradients("block", block, step);
}

TEST_CASE("nn::Gpt has the peer's parameters, names and count", "[xfmr][nn][gpt]") {
  frugal::nn::Gpt one({.vocab = 11, .context = 6, .layers = 1, .d_model = 8, .heads = 2});
  std::vector<std::string> names;
  for (auto& [n, t] : one.named_parameters()) names.push_back(n);
  CHECK(names == std::vector<std::string>{
                     "tok.weight", "pos.weight", "blocks.0.ln1.weight", "blocks.0.ln1.bias", "blocks.0.attn.qkv.weight",
                     "blocks.0.attn.qkv.bias", "blocks.0.attn.proj.weight", "blocks.0.attn.proj.bias",
                     "blocks.0.ln2.weight", "blocks.0.ln2.bias", "blocks.0.fc.weight", "blocks.0.fc.bias",
                     "blocks.0.fc_proj.weight", "blocks.0.fc_proj.bias", "ln_f.weight", "ln_f.bias", "head.weight"});
  // The peer's gpt workload: sum(p.numel() for p in GPT().parameters()).
  frugal::nn::Gpt peer;
  CHECK(peer.num_parameters() == 3454464);
}

TEST_CASE("nn::Gpt forward matches the reference, and its gradients finite differences", "[xfmr][nn][gpt]") {
  using namespace frugal::nn;
  manual_seed(6);
  const std::int64_t B = 2, T = 5, Vocab = 9, d = 8;
  Gpt gpt({.vocab = Vocab, .context = 7, .layers = 2, .d_model = d, .heads = 2, .mlp_hidden = 10, .dtype = DType::f64});
  frugal::Tensor idx({B, T}, DType::i32), tgt({B, T}, DType::i32);
  frugal::Rng rng(9);
  for (std::int64_t i = 0; i < B * T; ++i) {
    idx.data<std::int32_t>()[i] = std::int32_t(rng.below(std::uint64_t(Vocab)));
    tgt.data<std::int32_t>()[i] = std::int32_t(rng.below(std::uint64_t(Vocab)));
  }
  frugal::Step step = frugal::compile_gradients(
      [&] {
        return gpt.loss(frugal::persistent_var(idx, frugal::ValueKind::state, "idx"),
                        frugal::persistent_var(tgt, frugal::ValueKind::state, "tgt"));
      },
      {}, gpt.parameters());
  step.run();
  // The reference: the peer's forward, step by step.
  ref::Array x = ref::embedding(param(idx), param(gpt.tok.weight));
  ref::Array pos = ref::slice(param(gpt.pos.weight), 0, 0, T);
  x = ref::add(x, pos);
  for (std::size_t b = 0; b < gpt.blocks.size(); ++b) {
    auto& blk = static_cast<TransformerBlock&>(gpt.blocks[b]);
    ref::Array qkv = lin(lnorm(x, blk.ln1), blk.attn.qkv);
    x = ref::add(x, lin(ref::causal_attention_from_qkv(qkv, 2), blk.attn.proj));
    ref::Array m = lin(lnorm(x, blk.ln2), blk.fc);
    x = ref::add(x, lin(ref::gelu_erf(m), blk.fc_proj));
  }
  ref::Array logits = lin(lnorm(x, gpt.ln_f), gpt.head);
  const double want = ref::cross_entropy(logits, param(tgt)).v[0];
  CHECK(std::abs(step.last_loss_f64() - want) < 1e-12 * (1 + std::abs(want)));
  check_module_gradients("gpt", gpt, step, 4);
}

TEST_CASE("a 2-layer GPT trains: the loss falls over 20 AdamW steps, and the audit meets the prediction",
          "[xfmr][nn][gpt]") {
  using namespace frugal;
  nn::manual_seed(1);
  const std::int64_t B = 4, T = 16, Vocab = 32;
  nn::Gpt gpt({.vocab = Vocab, .context = T, .layers = 2, .d_model = 32, .heads = 4});
  optim::AdamW opt(gpt.parameters(), {.lr = 3e-3, .beta1 = 0.9, .beta2 = 0.95, .weight_decay = 0.1});
  Step step =
      compile([&](Var idx, Var tgt) { return gpt.loss(idx, tgt); },
              {input<std::int32_t>({B, T}, "idx"), input<std::int32_t>({B, T}, "targets")}, opt, {}, {.threads = 2});
  Tensor idx({B, T}, DType::i32), tgt({B, T}, DType::i32);
  Rng rng(2);
  for (std::int64_t i = 0; i < B * T; ++i) {
    idx.data<std::int32_t>()[i] = std::int32_t(rng.below(std::uint64_t(Vocab)));
    tgt.data<std::int32_t>()[i] = std::int32_t(rng.below(std::uint64_t(Vocab)));
  }
  std::vector<float> losses;
  for (int s = 0; s < 20; ++s) losses.push_back(step.run(idx, tgt));
  INFO("losses: first " << losses.front() << ", last " << losses.back());
  for (float l : losses) REQUIRE(std::isfinite(l));
  CHECK(losses.front() > 0.8f * std::log(float(Vocab)));  // near chance at the start: log(32) = 3.47
  CHECK(losses.back() < 0.7f * losses.front());           // memorising the one batch
  for (std::size_t i = 5; i < losses.size(); ++i) CHECK(losses[i] < losses[i - 5]);
  auto a = step.audit(idx, tgt);
  INFO("audit: measured " << a.high_water << ", predicted " << a.predicted);
  CHECK(a.high_water == a.predicted);
  CHECK(a.canary_intact);
  CHECK(step.verify().ok());
}

TEST_CASE("nn layer errors", "[xfmr][nn]") {
  using namespace frugal::nn;
  CHECK_THAT(error_message<frugal::ShapeError>([] { MultiHeadAttention m(10, 3); }), Contains("10") && Contains("3"));
  CHECK_THAT(error_message<frugal::ShapeError>([] { LayerNorm m(0); }), Contains("LayerNorm"));
  Gpt gpt({.vocab = 5, .context = 4, .layers = 1, .d_model = 4, .heads = 1});
  frugal::Tensor idx({2, 6}, DType::i32);
  std::string m = error_message<frugal::ShapeError>([&] {
    auto s =
        frugal::compile_inference([&] { return gpt(frugal::persistent_var(idx, frugal::ValueKind::state, "i")); }, {});
  });
  CHECK_THAT(m, Contains("Gpt") && Contains("context 4") && Contains("[2, 6]"));
}

// ---- vectorised math: exp_poly, erf_poly, gelu_erf_poly --------------------------

TEST_CASE("exp_poly is within 2 ulp of exp, exactly 0 far below, and keeps NaN", "[xfmr][gelu]") {
  double worst = 0;
  for (int i = 0; i <= 200000; ++i) {
    const float x = -87.0f + 175.0f * float(i) / 200000.0f;
    const double want = std::exp(double(x));
    worst = std::max(worst, std::abs(double(frugal::math::exp_poly(x)) - want) / want);
  }
  INFO("worst relative error " << worst);
  CHECK(worst <= 2 * 1.1920929e-7);
  CHECK(frugal::math::exp_poly(-std::numeric_limits<float>::infinity()) == 0.0f);
  CHECK(frugal::math::exp_poly(-100.0f) == 0.0f);
  CHECK(frugal::math::exp_poly(0.0f) == 1.0f);
  CHECK(std::isnan(frugal::math::exp_poly(std::numeric_limits<float>::quiet_NaN())));
  CHECK(frugal::math::exp_poly(-1.5) == std::exp(-1.5));  // f64: libm
}

TEST_CASE("erf_poly is within 4.5e-7 of erf everywhere", "[xfmr][gelu]") {
  double worst = 0;
  for (int i = -1000000; i <= 1000000; ++i) {
    const float x = float(i) * 6e-6f;
    worst = std::max(worst, std::abs(double(frugal::math::erf_poly(x)) - std::erf(double(x))));
  }
  INFO("worst absolute error " << worst);
  CHECK(worst <= 4.5e-7);
  CHECK(frugal::math::erf_poly(0.0f) == 0.0f);
  CHECK(frugal::math::erf_poly(-30.0f) == -1.0f);
  CHECK(frugal::math::erf_poly(0.3) == std::erf(0.3));  // f64: libm
}

TEST_CASE("gelu_erf_poly is the exact GELU, forward and backward", "[xfmr][gelu]") {
  check_op(unary(
      "gelu_erf_poly [4,6]", x({4, 6}), [](Var v) { return frugal::gelu_erf_poly(v); }, ref::gelu_erf));
  check_op(unary(
      "gelu_erf_poly [3,7] wide", wide({3, 7}), [](Var v) { return frugal::gelu_erf_poly(v); }, ref::gelu_erf));
  check_op(unary(
      "gelu_erf_poly [1]", x({1}), [](Var v) { return frugal::gelu_erf_poly(v); }, ref::gelu_erf));
}

TEST_CASE("layer_norm and dropout written in place over a dying input give the same results", "[xfmr][inplace]") {
  // (x * 1) dies at the op, so the planner may hand its buffer to the output.
  frugal::Tensor xt = random_tensor({6, 10}, DType::f32, 61);
  auto run = [&](bool inplace, std::function<Var(Var)> f) {
    frugal::CompileOptions o;
    o.plan.inplace = inplace;
    frugal::Step s = frugal::compile_inference(
        [&] { return f(frugal::persistent_var(xt, frugal::ValueKind::parameter, "x") * 1.0); }, {}, {}, o);
    s.run();
    return s.output(0).to_vector<float>();
  };
  auto ln = [](Var v) { return frugal::layer_norm(v); };
  auto dr = [](Var v) { return frugal::dropout_with_key(v, 0.5, 3); };
  CHECK(run(true, ln) == run(false, ln));
  CHECK(run(true, dr) == run(false, dr));
}

TEST_CASE("two GPT trainings with the same seed, dropout on, give identical bits", "[xfmr][nn][gpt]") {
  using namespace frugal;
  auto train = [](std::vector<float>& losses, std::vector<float>& params) {
    nn::manual_seed(12);
    nn::Gpt gpt({.vocab = 24, .context = 12, .layers = 2, .d_model = 32, .heads = 2, .dropout = 0.1});
    optim::AdamW opt(gpt.parameters(), {.lr = 3e-3});
    Step step = compile([&](Var idx, Var tgt) { return gpt.loss(idx, tgt); },
                        {input<std::int64_t>({3, 12}), input<std::int64_t>({3, 12})}, opt, {}, {.threads = 2});
    Tensor idx({3, 12}, DType::i64), tgt({3, 12}, DType::i64);
    for (std::int64_t i = 0; i < 36; ++i)
      idx.data<std::int64_t>()[i] = (i * 5) % 24, tgt.data<std::int64_t>()[i] = (i * 7) % 24;
    for (int s = 0; s < 8; ++s) losses.push_back(step.run(idx, tgt));
    for (auto& t : gpt.parameters())
      for (float v : t.to_vector<float>()) params.push_back(v);
  };
  std::vector<float> l1, p1, l2, p2;
  train(l1, p1);
  train(l2, p2);
  CHECK(l1.front() != l1.back());
  CHECK(std::memcmp(l1.data(), l2.data(), l1.size() * 4) == 0);
  REQUIRE(p1.size() == p2.size());
  CHECK(std::memcmp(p1.data(), p2.data(), p1.size() * 4) == 0);
}
