// The issue-14 ops: abs, sqrt, square, sin, cos, pow, clamp, maximum,
// minimum, where, max/min along a dim, argmax/argmin, detach and the losses
// (mse, l1, smooth_l1, huber, binary_cross_entropy_with_logits, nll), each
// forward against the float64 reference (reference_elementwise.hpp) in f32
// and f64 and backward against finite differences (op_harness.hpp); then
// PyTorch's special cases (tie splits, NaN), errors on bad input, a budget
// run, and one [nan] test over every elementwise op and reduction.
#include <cstring>
#include <limits>

#include "op_harness.hpp"
#include "reference_elementwise.hpp"

using namespace optest;
using frugal::DType;
using frugal::Tensor;
using frugal::Var;
using A = Arrays;
using V = Vars;

namespace {

// The tensors' values, bound as persistent inputs of one inference step,
// through fn; returns output 0.
Tensor eval(const std::vector<Tensor>& ts, const std::function<Var(const V&)>& fn) {
  frugal::Step step = frugal::compile_inference(
      [&] {
        V vs;
        for (std::size_t i = 0; i < ts.size(); ++i)
          vs.push_back(frugal::persistent_var(ts[i], frugal::ValueKind::state, "t" + std::to_string(i)));
        return fn(vs);
      },
      {});
  step.run();
  return step.output(0).clone();
}

// d sum(fn(ts)) / d ts[k] for each k in wrt.
std::vector<Tensor> grads(const std::vector<Tensor>& ts, const std::vector<int>& wrt,
                          const std::function<Var(const V&)>& fn) {
  std::vector<Tensor> w;
  for (int k : wrt) w.push_back(ts[std::size_t(k)]);
  frugal::Step step = frugal::compile_gradients(
      [&] {
        V vs;
        for (std::size_t i = 0; i < ts.size(); ++i) {
          const bool trained = std::find(wrt.begin(), wrt.end(), int(i)) != wrt.end();
          vs.push_back(frugal::persistent_var(ts[i], trained ? frugal::ValueKind::parameter : frugal::ValueKind::state,
                                              "t" + std::to_string(i)));
        }
        return frugal::sum(fn(vs));
      },
      {}, w);
  step.run();
  std::vector<Tensor> out;
  for (auto& t : w) out.push_back(step.grad(t).clone());
  return out;
}

Tensor f64(std::vector<double> v, frugal::Shape s) { return Tensor::from(v, std::move(s)); }
std::vector<double> vals(const Tensor& t) { return t.to_vector<double>(); }
std::vector<std::int64_t> ivals(const Tensor& t) { return t.to_vector<std::int64_t>(); }

}  // namespace

// ---- elementwise unary -------------------------------------------------------

TEST_CASE("abs, sqrt, square, sin and cos forward and backward", "[ops14]") {
  check_op(unary("abs [3,5]", wide({3, 5}), [](Var v) { return frugal::abs(v); }, ref::abs));
  check_op(unary("sqrt [4,3]", pos({4, 3}), [](Var v) { return frugal::sqrt(v); }, ref::sqrt));
  check_op(unary("square [2,7]", wide({2, 7}), [](Var v) { return frugal::square(v); }, ref::square));
  check_op(unary("sin [3,6] wide", wide({3, 6}), [](Var v) { return frugal::sin(v); }, ref::sin));
  check_op(unary("cos [3,6] wide", wide({3, 6}), [](Var v) { return frugal::cos(v); }, ref::cos));
}

TEST_CASE("pow with a scalar exponent forward and backward", "[ops14]") {
  for (double p : {3.0, 2.0, -1.0}) {
    check_op(unary("pow " + std::to_string(p) + " [3,4]", den({3, 4}), [p](Var v) { return frugal::pow(v, p); },
                   [p](const ref::Array& a) { return ref::pow(a, p); }));
  }
  for (double p : {0.5, -1.5, 2.7}) {
    check_op(unary("pow " + std::to_string(p) + " [5,2] positive", pos({5, 2}),
                   [p](Var v) { return frugal::pow(v, p); }, [p](const ref::Array& a) { return ref::pow(a, p); }));
  }
  // Exponent 0: ones, and a gradient of exactly zero (PyTorch's).
  check_op(unary("pow 0 [2,3]", x({2, 3}), [](Var v) { return frugal::pow(v, 0.0); },
                 [](const ref::Array& a) { return ref::pow(a, 0.0); }));
}

TEST_CASE("clamp with both bounds or one forward and backward", "[ops14]") {
  check_op(unary("clamp [-0.5, 0.4] [4,6]", x({4, 6}), [](Var v) { return frugal::clamp(v, -0.5, 0.4); },
                 [](const ref::Array& a) { return ref::clamp(a, -0.5, 0.4); }));
  check_op(unary("clamp_min 0.3 [4,5]", x({4, 5}), [](Var v) { return frugal::clamp_min(v, 0.3); },
                 [](const ref::Array& a) { return ref::clamp(a, 0.3, HUGE_VAL); }));
  check_op(unary("clamp max -0.2 [3,5]", x({3, 5}), [](Var v) { return frugal::clamp(v, std::nullopt, -0.2); },
                 [](const ref::Array& a) { return ref::clamp(a, -HUGE_VAL, -0.2); }));
  // torch.clamp: min > max gives max everywhere; the gradient passes only
  // where lo <= x <= hi, which is nowhere then.
  Tensor t = f64({-1, 0.5, 3}, {3});
  CHECK(vals(eval({t}, [](const V& v) { return frugal::clamp(v[0], 2.0, 1.0); })) == std::vector<double>{1, 1, 1});
  CHECK(vals(grads({t}, {0}, [](const V& v) { return frugal::clamp(v[0], 2.0, 1.0); })[0]) ==
        std::vector<double>{0, 0, 0});
  // At a bound exactly the gradient passes (PyTorch: lo <= x <= hi).
  Tensor b = f64({1, 2, 1.5, 0.5, 2.5}, {5});
  CHECK(vals(grads({b}, {0}, [](const V& v) { return frugal::clamp(v[0], 1.0, 2.0); })[0]) ==
        std::vector<double>{1, 1, 1, 0, 0});
}

TEST_CASE("abs has the gradient 0 at 0, as torch.sgn", "[ops14]") {
  Tensor t = f64({0, -2, 3}, {3});
  CHECK(vals(grads({t}, {0}, [](const V& v) { return frugal::abs(v[0]); })[0]) == std::vector<double>{0, -1, 1});
}

// ---- maximum, minimum --------------------------------------------------------

TEST_CASE("maximum and minimum with broadcasting forward and backward", "[ops14]") {
  auto mx = [](Var a, Var b) { return frugal::maximum(a, b); };
  auto mn = [](Var a, Var b) { return frugal::minimum(a, b); };
  check_op(binary("maximum [3,4] [3,4]", x({3, 4}), x({3, 4}), mx, ref::maximum));
  check_op(binary("maximum [2,3,4] [4]", x({2, 3, 4}), x({4}), mx, ref::maximum));
  check_op(binary("maximum [3,1] [1,5]", x({3, 1}), x({1, 5}), mx, ref::maximum));
  check_op(binary("minimum [3,4] [3,4]", x({3, 4}), x({3, 4}), mn, ref::minimum));
  check_op(binary("minimum [4] [2,3,4]", x({4}), x({2, 3, 4}), mn, ref::minimum));
}

TEST_CASE("maximum and minimum split the gradient evenly at ties, as torch.maximum", "[ops14]") {
  Tensor a = f64({1, 2, 0}, {3}), b = f64({1, 1, 3}, {3});
  auto gmax = grads({a, b}, {0, 1}, [](const V& v) { return frugal::maximum(v[0], v[1]); });
  CHECK(vals(gmax[0]) == std::vector<double>{0.5, 1, 0});
  CHECK(vals(gmax[1]) == std::vector<double>{0.5, 0, 1});
  auto gmin = grads({a, b}, {0, 1}, [](const V& v) { return frugal::minimum(v[0], v[1]); });
  CHECK(vals(gmin[0]) == std::vector<double>{0.5, 0, 1});
  CHECK(vals(gmin[1]) == std::vector<double>{0.5, 1, 0});
  // Broadcast b against a: a tie in each row sends b half of each tie.
  Tensor m = f64({1, 1, 2, 1}, {2, 2}), s = f64({1}, {1});
  auto gb = grads({m, s}, {0, 1}, [](const V& v) { return frugal::maximum(v[0], v[1]); });
  CHECK(vals(gb[0]) == std::vector<double>{0.5, 0.5, 1, 0.5});
  CHECK(vals(gb[1]) == std::vector<double>{1.5});
}

// ---- where -------------------------------------------------------------------

TEST_CASE("where with an integer condition and broadcasting forward and backward", "[ops14]") {
  auto w = [](const V& v) { return frugal::where(v[0], v[1], v[2]); };
  auto r = [](const A& a) { return ref::where(a[0], a[1], a[2]); };
  check_op({"where [3,4] all same", {labels({3, 4}, 2), x({3, 4}), x({3, 4})}, w, r});
  check_op({"where cond [4] a [3,4] b [1]", {labels({4}, 2), x({3, 4}), x({1})}, w, r});
  check_op({"where cond [3,1] a [1,5] b [3,5]", {labels({3, 1}, 2, DType::i64), x({1, 5}), x({3, 5})}, w, r});
}

TEST_CASE("where reads a u8 or float condition as nonzero-is-true", "[ops14]") {
  Tensor a = f64({1, 2, 3, 4}, {4}), b = f64({-1, -2, -3, -4}, {4});
  Tensor u8 = Tensor::from(std::vector<std::uint8_t>{1, 0, 255, 0}, {4});
  Tensor fl = f64({0.5, 0, -1, 0}, {4});
  const std::vector<double> want{1, -2, 3, -4};
  for (const Tensor& c : {u8, fl}) {
    CHECK(vals(eval({c, a, b}, [](const V& v) { return frugal::where(v[0], v[1], v[2]); })) == want);
    auto g = grads({c, a, b}, {1, 2}, [](const V& v) { return frugal::where(v[0], v[1], v[2]); });
    CHECK(vals(g[0]) == std::vector<double>{1, 0, 1, 0});
    CHECK(vals(g[1]) == std::vector<double>{0, 1, 0, 1});
  }
}

// ---- max / min along a dim, argmax / argmin ----------------------------------

TEST_CASE("max and min along a dim, values forward and backward", "[ops14]") {
  for (bool keepdim : {false, true})
    for (int dim : {0, 1, -1}) {
      const std::string tag = " dim " + std::to_string(dim) + (keepdim ? " keepdim" : "");
      check_op(unary("max [3,5,2]" + tag, x({3, 5, 2}), [=](Var v) { return frugal::max(v, dim, keepdim); },
                     [=](const ref::Array& a) { return ref::extreme_along(a, dim, keepdim, true, false); }));
      check_op(unary("min [4,6]" + tag, x({4, 6}), [=](Var v) { return frugal::min(v, dim, keepdim); },
                     [=](const ref::Array& a) { return ref::extreme_along(a, dim, keepdim, false, false); }));
    }
}

TEST_CASE("max/min indices and argmax/argmin match the reference, first extreme winning ties", "[ops14]") {
  frugal::Rng rng(99);
  ref::Array a = ref::zeros({4, 7, 3});
  for (auto& e : a.v) e = double(rng.below(5));  // many ties
  Tensor t = to_tensor(a, DType::f32);
  for (int dim : {0, 1, 2})
    for (bool is_max : {true, false}) {
      INFO("dim " << dim << (is_max ? " max" : " min"));
      const ref::Array want = ref::extreme_along(a, dim, false, is_max, true);
      std::vector<std::int64_t> w(want.v.begin(), want.v.end());
      Tensor idx = eval({t}, [=](const V& v) {
        return is_max ? frugal::max_with_indices(v[0], dim).second : frugal::min_with_indices(v[0], dim).second;
      });
      CHECK(idx.dtype() == DType::i64);
      CHECK(ivals(idx) == w);
      Tensor am = eval({t}, [=](const V& v) { return is_max ? frugal::argmax(v[0], dim) : frugal::argmin(v[0], dim); });
      CHECK(ivals(am) == w);
      Tensor am32 = eval({t}, [=](const V& v) {
        return is_max ? frugal::argmax(v[0], dim, true, DType::i32) : frugal::argmin(v[0], dim, true, DType::i32);
      });
      CHECK(am32.dtype() == DType::i32);
      CHECK(am32.shape().dims()[std::size_t(dim)] == 1);
      CHECK(std::vector<std::int64_t>(am32.data<std::int32_t>(), am32.data<std::int32_t>() + am32.numel()) == w);
    }
  // torch.max(dim) sends the gradient to the index it returns: the first tie.
  Tensor ties = f64({0, 2, 2, 1, 3, 3, 1, 0}, {2, 4});
  CHECK(vals(grads({ties}, {0}, [](const V& v) { return frugal::max(v[0], 1); })[0]) ==
        std::vector<double>{0, 1, 0, 0, 1, 0, 0, 0});
  CHECK(vals(grads({ties}, {0}, [](const V& v) { return frugal::min(v[0], 1); })[0]) ==
        std::vector<double>{1, 0, 0, 0, 0, 0, 0, 1});
}

// ---- detach ------------------------------------------------------------------

TEST_CASE("detach stops the gradient and is a view costing no memory", "[ops14]") {
  Tensor t = f64({1, -2, 3}, {3});
  // d/dx sum(x * detach(x)) = detach(x) = x, not 2x.
  CHECK(vals(grads({t}, {0}, [](const V& v) { return v[0] * frugal::detach(v[0]); })[0]) ==
        std::vector<double>{1, -2, 3});
  CHECK(vals(eval({t}, [](const V& v) { return frugal::detach(v[0]); })) == std::vector<double>{1, -2, 3});
  // relu(detach(x)) plans the same bytes as relu(x).
  auto peak = [](bool detached) {
    frugal::Step s = frugal::compile_inference(
        [&](Var x) { return frugal::relu(frugal::exp(detached ? frugal::detach(x * 2.0) : x * 2.0)); },
        {frugal::input<float>({64, 64})});
    return s.plan().peak_bytes;
  };
  CHECK(peak(true) == peak(false));
}

// ---- losses ------------------------------------------------------------------

TEST_CASE("mse, l1, smooth_l1 and huber losses with every reduction forward and backward", "[ops14]") {
  for (std::string r : {"mean", "sum", "none"}) {
    auto mse = [r](Var a, Var b) { return frugal::mse_loss(a, b, r); };
    check_op(binary("mse_loss " + r + " [3,4]", x({3, 4}), x({3, 4}), mse,
                    [r](const ref::Array& a, const ref::Array& b) { return ref::mse(a, b, r); }));
    check_op(binary("mse_loss " + r + " broadcast [3,4] [4]", x({3, 4}), x({4}), mse,
                    [r](const ref::Array& a, const ref::Array& b) { return ref::mse(a, b, r); }));
    check_op(binary("l1_loss " + r + " [2,5]", x({2, 5}), x({2, 5}),
                    [r](Var a, Var b) { return frugal::l1_loss(a, b, r); },
                    [r](const ref::Array& a, const ref::Array& b) { return ref::l1(a, b, r); }));
    for (double beta : {0.5, 2.0})
      check_op(binary("smooth_l1_loss " + r + " beta " + std::to_string(beta), wide({3, 5}), wide({3, 5}),
                      [=](Var a, Var b) { return frugal::smooth_l1_loss(a, b, r, beta); },
                      [=](const ref::Array& a, const ref::Array& b) { return ref::smooth_l1(a, b, r, beta); }));
    for (double delta : {0.5, 3.0})
      check_op(binary("huber_loss " + r + " delta " + std::to_string(delta), wide({3, 5}), wide({3, 5}),
                      [=](Var a, Var b) { return frugal::huber_loss(a, b, r, delta); },
                      [=](const ref::Array& a, const ref::Array& b) { return ref::huber(a, b, r, delta); }));
  }
  // beta = 0 is l1_loss.
  check_op(binary("smooth_l1_loss beta 0", x({2, 3}), x({2, 3}),
                  [](Var a, Var b) { return frugal::smooth_l1_loss(a, b, "sum", 0.0); },
                  [](const ref::Array& a, const ref::Array& b) { return ref::l1(a, b, "sum"); }));
}

TEST_CASE("smooth_l1 and huber match PyTorch's numbers", "[ops14]") {
  // From torch 1.13: huber_loss([1, 2, .5, -1], [1, 0, 1.5, -1], delta=.5,
  // reduction='none') = [0, .875, .375, 0]; smooth_l1 beta=1 sum gradient
  // for the input [0, 1, -1, 0].
  Tensor a = f64({1, 2, 0.5, -1}, {4}), b = f64({1, 0, 1.5, -1}, {4});
  CHECK(vals(eval({a, b}, [](const V& v) { return frugal::huber_loss(v[0], v[1], "none", 0.5); })) ==
        std::vector<double>{0, 0.875, 0.375, 0});
  auto g = grads({a, b}, {0, 1}, [](const V& v) { return frugal::smooth_l1_loss(v[0], v[1], "sum", 1.0); });
  CHECK(vals(g[0]) == std::vector<double>{0, 1, -1, 0});
  CHECK(vals(g[1]) == std::vector<double>{0, -1, 1, 0});
}

TEST_CASE("the losses give PyTorch's numbers, reductions and gradients included", "[ops14]") {
  // Printed by torch 1.13 in float64 (F.binary_cross_entropy_with_logits,
  // F.nll_loss, F.mse_loss, ...), so these check the float64 references'
  // reading of PyTorch's definitions as well as frugal.
  auto close = [](const std::vector<double>& got, const std::vector<double>& want) {
    REQUIRE(got.size() == want.size());
    for (std::size_t i = 0; i < got.size(); ++i) CHECK(got[i] == Approx(want[i]).epsilon(1e-12).margin(1e-15));
  };
  // bce with logits, weight and pos_weight broadcast over rows, 'mean'.
  Tensor x = f64({0.5, -1.5, 2.0, -0.25, 3.0, -2.0}, {2, 3}), y = f64({1, 0, 0.25, 0, 1, 0.75}, {2, 3});
  Tensor w = f64({1, 2, 0.5}, {3}), pw = f64({3, 1, 0.5}, {3});
  auto bce = [](const V& v) { return frugal::binary_cross_entropy_with_logits(v[0], v[1], v[2], "mean", v[3]); };
  close(vals(eval({x, y, w, pw}, bce)), {0.6197279399690637});
  close(vals(grads({x, y, w, pw}, {0}, bce)[0]), {-0.18877033439907268, 0.060808507935452116, 0.053808120269220584,
                                                  0.07297058318570032, -0.015808624392522213, -0.025041514478014712});
  // nll on [N=2, C=3, d=2] with one ignored position: 'mean' divides by 3.
  Tensor lp = f64({-1, -2, -0.5, -3, -4, -0.25, -2, -1.5, -0.75, -1, -3.5, -2.5}, {2, 3, 2});
  Tensor t = Tensor::from(std::vector<std::int64_t>{2, -100, 0, 1}, {2, 2});
  close(vals(eval({lp, t}, [](const V& v) { return frugal::nll_loss(v[0], v[1]); })), {2.3333333333333335});
  close(vals(eval({lp, t}, [](const V& v) { return frugal::nll_loss(v[0], v[1], "sum"); })), {7});
  close(vals(eval({lp, t}, [](const V& v) { return frugal::nll_loss(v[0], v[1], "none"); })), {4, 0, 2, 1});
  const double third = -0.3333333333333333;
  close(vals(grads({lp, t}, {0}, [](const V& v) { return frugal::nll_loss(v[0], v[1]); })[0]),
        {0, 0, 0, 0, third, 0, third, 0, 0, third, 0, 0});
  // The regression losses.
  Tensor a = f64({1, -2, 0.5, 3}, {4}), b = f64({0, -1, 2.5, 3}, {4});
  close(vals(eval({a, b}, [](const V& v) { return frugal::mse_loss(v[0], v[1]); })), {1.5});
  close(vals(eval({a, b}, [](const V& v) { return frugal::l1_loss(v[0], v[1]); })), {1.0});
  close(vals(eval({a, b}, [](const V& v) { return frugal::smooth_l1_loss(v[0], v[1], "mean", 0.5); })), {0.8125});
  close(vals(eval({a, b}, [](const V& v) { return frugal::huber_loss(v[0], v[1], "sum", 2.0); })), {3.0});
}

TEST_CASE("binary_cross_entropy_with_logits with weight and pos_weight forward and backward", "[ops14]") {
  for (std::string r : {"mean", "sum", "none"}) {
    check_op({"bce_with_logits " + r,
              {wide({3, 4}), pos({3, 4})},
              [r](const V& v) { return frugal::binary_cross_entropy_with_logits(v[0], v[1], std::nullopt, r); },
              [r](const A& a) { return ref::bce_with_logits(a[0], a[1], nullptr, nullptr, r); }});
    check_op({"bce_with_logits weight pos_weight " + r,
              {wide({3, 4}), pos({3, 4}), pos({4}), pos({4})},
              [r](const V& v) { return frugal::binary_cross_entropy_with_logits(v[0], v[1], v[2], r, v[3]); },
              [r](const A& a) { return ref::bce_with_logits(a[0], a[1], &a[2], &a[3], r); }});
  }
  // Stable where the naive form overflows: x = +-100, y = 0 or 1.
  Tensor xl = f64({100, -100, 100, -100}, {4}), yl = f64({0, 1, 1, 0}, {4});
  const auto l = vals(eval({xl, yl}, [](const V& v) {
    return frugal::binary_cross_entropy_with_logits(v[0], v[1], std::nullopt, "none");
  }));
  CHECK(l[0] == 100);
  CHECK(l[1] == 100);
  CHECK(l[2] == Approx(std::exp(-100.0)).epsilon(1e-12));
  CHECK(std::abs(l[3] - std::exp(-100.0)) < 1e-40);  // (1 - 0)(-100) + 100 + log1p(e^-100): 0 in f64, as PyTorch
}

TEST_CASE("nll_loss on [N, C], [C] and [N, C, d] with every reduction forward and backward", "[ops14]") {
  for (std::string r : {"mean", "sum", "none"}) {
    check_op({"nll_loss [5,4] " + r, {x({5, 4}), labels({5}, 4)},
              [r](const V& v) { return frugal::nll_loss(v[0], v[1], r); },
              [r](const A& a) { return ref::nll(a[0], a[1], r, -100); }});
    check_op({"nll_loss [6] " + r, {x({6}), labels({}, 6, DType::i64)},
              [r](const V& v) { return frugal::nll_loss(v[0], v[1], r); },
              [r](const A& a) { return ref::nll(a[0], a[1], r, -100); }});
    check_op({"nll_loss [3,4,5] " + r, {x({3, 4, 5}), labels({3, 5}, 4)},
              [r](const V& v) { return frugal::nll_loss(v[0], v[1], r); },
              [r](const A& a) { return ref::nll(a[0], a[1], r, -100); }});
    // ignore_index a real class: those positions add nothing and 'mean'
    // divides by the rest.
    check_op({"nll_loss [8,3] ignore_index 0 " + r, {x({8, 3}), labels({8}, 3)},
              [r](const V& v) { return frugal::nll_loss(v[0], v[1], r, 0); },
              [r](const A& a) { return ref::nll(a[0], a[1], r, 0); }});
  }
  // The default ignore_index is -100; all ignored gives NaN for 'mean' (0/0).
  Tensor lp = f64({-1, -2, -3, -4}, {2, 2});
  Tensor tg = Tensor::from(std::vector<std::int32_t>{-100, 1}, {2});
  CHECK(vals(eval({lp, tg}, [](const V& v) { return frugal::nll_loss(v[0], v[1]); })) == std::vector<double>{4});
  Tensor none = Tensor::from(std::vector<std::int32_t>{-100, -100}, {2});
  CHECK(std::isnan(vals(eval({lp, none}, [](const V& v) { return frugal::nll_loss(v[0], v[1]); }))[0]));
  CHECK(vals(grads({lp, tg}, {0}, [](const V& v) { return frugal::nll_loss(v[0], v[1]); })[0]) ==
        std::vector<double>{0, 0, 0, -1});
}

// ---- bad input ---------------------------------------------------------------

TEST_CASE("the issue-14 ops name what is wrong with bad input", "[ops14]") {
  using frugal::ShapeError;
  Tensor a = f64({1, 2, 3, 4, 5, 6}, {2, 3}), b = f64({1, 2}, {2});
  Tensor lab = Tensor::from(std::vector<std::int32_t>{0, 1}, {2});
  auto msg = [&](const std::function<Var(const V&)>& fn) {
    return error_message<ShapeError>([&] { eval({a, b, lab}, fn); });
  };
  CHECK_THAT(msg([](const V& v) { return frugal::mse_loss(v[0], v[0], "avg"); }),
             Catch::Contains("mse_loss") && Catch::Contains("'avg'"));
  CHECK_THAT(msg([](const V& v) { return frugal::maximum(v[0], v[1]); }),
             Catch::Contains("maximum") && Catch::Contains("[2, 3]") && Catch::Contains("[2]"));
  CHECK_THAT(msg([](const V& v) { return frugal::where(v[1], v[0], v[0]); }),
             Catch::Contains("where") && Catch::Contains("condition [2]"));
  CHECK_THAT(msg([](const V& v) { return frugal::clamp(v[0], std::nullopt, std::nullopt); }),
             Catch::Contains("clamp"));
  CHECK_THAT(msg([](const V& v) { return frugal::max(v[0], 2); }), Catch::Contains("axis"));
  CHECK_THAT(msg([](const V& v) { return frugal::argmax(v[0], 1, false, DType::f32); }),
             Catch::Contains("argmax") && Catch::Contains("i32 or i64"));
  CHECK_THAT(msg([](const V& v) { return frugal::nll_loss(v[0], v[1]); }), Catch::Contains("target must be i32"));
  CHECK_THAT(msg([](const V& v) { return frugal::binary_cross_entropy_with_logits(v[0], v[1]); }),
             Catch::Contains("binary_cross_entropy_with_logits") && Catch::Contains("input's shape"));
  CHECK_THAT(msg([](const V& v) { return frugal::huber_loss(v[0], v[0], "mean", 0.0); }),
             Catch::Contains("delta must be > 0"));
  // A target out of range stops the step, naming position and value.
  Tensor bad = Tensor::from(std::vector<std::int32_t>{0, 3}, {2});
  auto e = error_message<frugal::DataError>([&] { eval({a, bad}, [](const V& v) { return frugal::nll_loss(v[0], v[1]); }); });
  CHECK_THAT(e, Catch::Contains("nll_loss") && Catch::Contains("target 3 at position 1") && Catch::Contains("[0, 3)"));
}

// ---- the budget planner ------------------------------------------------------

namespace {

struct ElementwiseBudgetRun {
  std::vector<float> losses;
  std::vector<std::vector<char>> params;
  frugal::Plan plan;
};

// A small regression-and-classification net over the issue-14 ops, trained
// for three steps under `budget`.
ElementwiseBudgetRun train_issue14_net(frugal::Budget budget) {
  using namespace frugal;
  nn::manual_seed(5);
  nn::Linear fc1{16, 48}, fc2{48, 48}, head{48, 6};
  std::vector<Tensor> params;
  for (nn::Linear* l : {&fc1, &fc2, &head})
    for (auto& t : l->parameters()) params.push_back(t);
  optim::SGD opt(params, {.lr = 0.05, .momentum = 0.9});
  Step step = compile(
      [&](Var x, Var y, Var cls) {
        Var h = clamp(fc1(x), -2.0, 2.0);
        h = maximum(sin(h), square(h) * 0.5) + abs(cos(h));
        Var g = fc2(h);
        h = where(reshape(cls, {32, 1}), sqrt(square(g) + 1.0), minimum(g, detach(h)));
        Var out = head(h);
        Var logp = log_softmax(out, 1);
        Var reg = max(out, 1);
        return nll_loss(logp, cls) + smooth_l1_loss(reg, y, "mean", 0.5) + huber_loss(reg, y, "sum", 0.7) * 0.1 +
               binary_cross_entropy_with_logits(out, sigmoid(out) * 0.5) + mse_loss(pow(abs(reg) + 1.0, 1.5), y) +
               l1_loss(min(out, 1), y);
      },
      {input<float>({32, 16}), input<float>({32}), input<std::int32_t>({32})}, opt, budget);
  ElementwiseBudgetRun run;
  run.plan = step.plan();
  for (int s = 0; s < 3; ++s) {
    Rng d(100 + std::uint64_t(s));
    Tensor x({32, 16}), y({32}), c({32}, DType::i32);
    for (std::int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = float(d.uniform() * 2 - 1);
    for (std::int64_t i = 0; i < 32; ++i) {
      y.data<float>()[i] = float(d.uniform());
      c.data<std::int32_t>()[i] = std::int32_t(d.below(6));
    }
    run.losses.push_back(step.run(x, y, c));
  }
  for (auto& t : params) {
    std::vector<char> bytes(t.nbytes());
    std::memcpy(bytes.data(), t.raw(), t.nbytes());
    run.params.push_back(std::move(bytes));
  }
  return run;
}

}  // namespace

TEST_CASE("the issue-14 ops train bit for bit the same under a tight budget", "[ops14][budget]") {
  const ElementwiseBudgetRun free = train_issue14_net({});
  const std::size_t full = free.plan.total_bytes();
  std::size_t least = full;
  try {
    least = train_issue14_net(frugal::Budget{.device = full - 1}).plan.min_feasible_bytes;
  } catch (const frugal::BudgetError&) {
    FAIL("the net has nothing to evict below its unconstrained plan");
  }
  REQUIRE(least < full);
  const ElementwiseBudgetRun tight = train_issue14_net(frugal::Budget{.device = least});
  CHECK(tight.plan.total_bytes() <= least);
  CHECK(!tight.plan.decisions.empty());
  CHECK(tight.losses == free.losses);
  CHECK(tight.params == free.params);
}

// ---- NaN semantics -----------------------------------------------------------

namespace {

// Where PyTorch puts a NaN for one NaN input element: at that element
// (elementwise), in that element's row along the last axis (row ops and
// reductions over it), in its column (reductions over the batch, as batch
// norm's statistics), everywhere (full reductions and scalar losses), or
// nowhere (where PyTorch does not propagate it: pow(NaN, 0) is 1, a where()
// that does not select it).
enum class NanAt { element, row, column, all, none };

struct NanCase {
  std::string name;
  NanAt at;
  std::function<Var(Var x, Var y, Var labels)> build;  // x holds the NaN; y and labels are finite
};

}  // namespace

TEST_CASE("every elementwise op, reduction and loss propagates NaN as PyTorch does", "[nan][ops14]") {
  using namespace frugal;
  // Rows of 37 (not a multiple of any SIMD width) so vector bodies and
  // scalar tails both run; the NaN sits mid-vector, in row 1. Positive
  // values keep log, sqrt and rsqrt finite elsewhere.
  const std::int64_t R = 4, C = 37, nan_row = 1, nan_col = 13;
  const std::vector<NanCase> cases = {
      {"relu", NanAt::element, [](Var x, Var, Var) { return relu(x); }},
      {"gelu tanh", NanAt::element, [](Var x, Var, Var) { return gelu(x, true); }},
      {"gelu erf", NanAt::element, [](Var x, Var, Var) { return gelu(x, false); }},
      {"gelu_erf_poly", NanAt::element, [](Var x, Var, Var) { return gelu_erf_poly(x); }},
      {"tanh", NanAt::element, [](Var x, Var, Var) { return tanh(x); }},
      {"sigmoid", NanAt::element, [](Var x, Var, Var) { return sigmoid(x); }},
      {"exp", NanAt::element, [](Var x, Var, Var) { return exp(x); }},
      {"log", NanAt::element, [](Var x, Var, Var) { return log(x); }},
      {"rsqrt", NanAt::element, [](Var x, Var, Var) { return rsqrt(x); }},
      {"affine", NanAt::element, [](Var x, Var, Var) { return x * 3.0 + 1.0; }},
      {"abs", NanAt::element, [](Var x, Var, Var) { return abs(x); }},
      {"sqrt", NanAt::element, [](Var x, Var, Var) { return sqrt(x); }},
      {"square", NanAt::element, [](Var x, Var, Var) { return square(x); }},
      {"sin", NanAt::element, [](Var x, Var, Var) { return sin(x); }},
      {"cos", NanAt::element, [](Var x, Var, Var) { return cos(x); }},
      {"pow 2.5", NanAt::element, [](Var x, Var, Var) { return pow(x, 2.5); }},
      {"clamp", NanAt::element, [](Var x, Var, Var) { return clamp(x, 0.6, 0.9); }},
      {"clamp_min", NanAt::element, [](Var x, Var, Var) { return clamp_min(x, 0.6); }},
      {"add", NanAt::element, [](Var x, Var y, Var) { return x + y; }},
      {"mul broadcast", NanAt::element, [](Var x, Var y, Var) { return x * slice(y, 0, 0, 1); }},
      {"maximum(x, y)", NanAt::element, [](Var x, Var y, Var) { return maximum(x, y); }},
      {"maximum(y, x)", NanAt::element, [](Var x, Var y, Var) { return maximum(y, x); }},
      {"minimum(x, y)", NanAt::element, [](Var x, Var y, Var) { return minimum(x, y); }},
      {"minimum(y, x)", NanAt::element, [](Var x, Var y, Var) { return minimum(y, x); }},
      {"where taking x", NanAt::element, [](Var x, Var y, Var) { return where(fill_like(y, 1.0), x, y); }},
      {"max dim", NanAt::row, [](Var x, Var, Var) { return max(x, 1, true); }},
      {"min dim", NanAt::row, [](Var x, Var, Var) { return min(x, 1, true); }},
      {"sum dim", NanAt::row, [](Var x, Var, Var) { return sum(x, {1}, true); }},
      {"mean dim", NanAt::row, [](Var x, Var, Var) { return mean(x, {1}, true); }},
      {"sum", NanAt::all, [](Var x, Var, Var) { return sum(x); }},
      {"mean", NanAt::all, [](Var x, Var, Var) { return mean(x); }},
      {"softmax", NanAt::row, [](Var x, Var, Var) { return softmax(x, 1); }},
      {"log_softmax", NanAt::row, [](Var x, Var, Var) { return log_softmax(x, 1); }},
      {"layer_norm", NanAt::row, [](Var x, Var, Var) { return layer_norm(x); }},
      {"max_pool2d", NanAt::element, [](Var x, Var, Var) {
         return reshape(max_pool2d(reshape(x, {1, R, C, 1}), {1, 1}), {R, C});
       }},
      {"max_pool2d 1x37 window", NanAt::row, [](Var x, Var, Var) {
         return reshape(max_pool2d(reshape(x, {1, 1, R, C}), {1, C}), {R, 1});
       }},
      {"cross_entropy", NanAt::all, [](Var x, Var, Var l) { return cross_entropy(x, l); }},
      {"mse_loss none", NanAt::element, [](Var x, Var y, Var) { return mse_loss(x, y, "none"); }},
      {"mse_loss", NanAt::all, [](Var x, Var y, Var) { return mse_loss(x, y); }},
      {"l1_loss none", NanAt::element, [](Var x, Var y, Var) { return l1_loss(x, y, "none"); }},
      {"smooth_l1_loss none", NanAt::element, [](Var x, Var y, Var) { return smooth_l1_loss(x, y, "none"); }},
      {"huber_loss sum", NanAt::all, [](Var x, Var y, Var) { return huber_loss(x, y, "sum"); }},
      {"bce_with_logits none", NanAt::element,
       [](Var x, Var y, Var) { return binary_cross_entropy_with_logits(x, sigmoid(y), std::nullopt, "none"); }},
      {"bce_with_logits target NaN", NanAt::element,
       [](Var x, Var y, Var) { return binary_cross_entropy_with_logits(y, x, std::nullopt, "none"); }},
      {"nll_loss none at the target", NanAt::row,
       [](Var x, Var, Var l) { return reshape(nll_loss(x, l, "none"), {R, 1}); }},
      // The rest of the elementwise ops and reductions, so that the list
      // above is all of them (issue 14).
      {"sub", NanAt::element, [](Var x, Var y, Var) { return x - y; }},
      {"sub (y - x)", NanAt::element, [](Var x, Var y, Var) { return y - x; }},
      {"div", NanAt::element, [](Var x, Var y, Var) { return x / y; }},
      {"div (y / x)", NanAt::element, [](Var x, Var y, Var) { return y / x; }},
      {"clamp_max", NanAt::element, [](Var x, Var, Var) { return clamp_max(x, 0.6); }},
      {"pow 3", NanAt::element, [](Var x, Var, Var) { return pow(x, 3.0); }},
      {"pow 0 (torch: 1)", NanAt::none, [](Var x, Var, Var) { return pow(x, 0.0); }},
      {"where taking x as other", NanAt::element,
       [](Var x, Var y, Var) { return where(fill_like(y, 0.0), y, x); }},
      {"where not taking x", NanAt::none, [](Var x, Var y, Var) { return where(fill_like(y, 0.0), x, y); }},
      // A dropped NaN is NaN * 0 = NaN: the NaN row, broadcast over 37
      // elements, has some of them dropped whatever the mask.
      {"dropout (a dropped NaN is NaN * 0)", NanAt::row,
       [](Var x, Var, Var) { return dropout_with_key(broadcast_to(sum(x, {1}, true), {R, C}), 0.5, 14); }},
      {"dropout p = 1", NanAt::element, [](Var x, Var, Var) { return dropout_with_key(x, 1.0, 14); }},
      {"cast through f32/f64", NanAt::element,
       [](Var x, Var, Var) { return cast(cast(x, x.dtype() == DType::f32 ? DType::f64 : DType::f32), x.dtype()); }},
      {"cast through bf16", NanAt::element, [](Var x, Var, Var) { return cast(cast(x, DType::bf16), x.dtype()); }},
      {"cast through f16", NanAt::element, [](Var x, Var, Var) { return cast(cast(x, DType::f16), x.dtype()); }},
      {"sum dim 0", NanAt::column, [](Var x, Var, Var) { return sum(x, {0}, true); }},
      {"mean dim 0", NanAt::column, [](Var x, Var, Var) { return mean(x, {0}, true); }},
      {"max dim 0", NanAt::column, [](Var x, Var, Var) { return max(x, 0, true); }},
      {"min dim 0", NanAt::column, [](Var x, Var, Var) { return min(x, 0, true); }},
      {"softmax dim 0", NanAt::column, [](Var x, Var, Var) { return softmax(x, 0); }},
      {"avg_pool2d 1x1", NanAt::element, [](Var x, Var, Var) {
         return reshape(avg_pool2d(reshape(x, {1, 1, R, C}), {1, 1}), {R, C});
       }},
      {"avg_pool2d 1x37 window", NanAt::row, [](Var x, Var, Var) {
         return reshape(avg_pool2d(reshape(x, {1, 1, R, C}), {1, C}), {R, 1});
       }},
      {"global_avg_pool2d", NanAt::row,
       [](Var x, Var, Var) { return reshape(global_avg_pool2d(reshape(x, {R, 1, 1, C})), {R, 1}); }},
      {"group_norm 1 group", NanAt::row,
       [](Var x, Var, Var) { return reshape(group_norm(reshape(x, {R, C, 1}), 1), {R, C}); }},
      {"batch_norm1d train", NanAt::column, [](Var x, Var y, Var) {
         Var ones = reshape(fill_like(slice(y, 0, 0, 1), 1.0), {C}), zeros = reshape(fill_like(slice(y, 0, 0, 1), 0.0), {C});
         return batch_norm1d(x, std::nullopt, std::nullopt, ones, zeros, true);
       }},
      {"batch_norm1d eval", NanAt::element, [](Var x, Var y, Var) {
         Var ones = reshape(fill_like(slice(y, 0, 0, 1), 1.0), {C}), zeros = reshape(fill_like(slice(y, 0, 0, 1), 0.0), {C});
         return batch_norm1d(x, zeros, ones, ones, zeros, false);
       }},
      {"l1_loss mean", NanAt::all, [](Var x, Var y, Var) { return l1_loss(x, y); }},
      {"smooth_l1_loss mean", NanAt::all, [](Var x, Var y, Var) { return smooth_l1_loss(x, y); }},
      {"huber_loss none", NanAt::element, [](Var x, Var y, Var) { return huber_loss(x, y, "none"); }},
      {"bce_with_logits mean", NanAt::all,
       [](Var x, Var y, Var) { return binary_cross_entropy_with_logits(x, sigmoid(y)); }},
      {"nll_loss mean", NanAt::all, [](Var x, Var, Var l) { return nll_loss(x, l); }},
      // Attention: a NaN in a query gives its output row NaN (not a row of
      // zeros, as a fully masked row gets); a NaN in a key reaches every query.
      {"sdpa, NaN in q", NanAt::row, [](Var x, Var y, Var) {
         Var q = reshape(x, {1, R, C}), kv = reshape(y, {1, R, C});
         return reshape(scaled_dot_product_attention(q, kv, kv), {R, C});
       }},
      {"sdpa causal, NaN in q", NanAt::row, [](Var x, Var y, Var) {
         Var q = reshape(x, {1, R, C}), kv = reshape(y, {1, R, C});
         return reshape(scaled_dot_product_attention(q, kv, kv, std::nullopt, true), {R, C});
       }},
      {"sdpa, NaN in k", NanAt::all, [](Var x, Var y, Var) {
         Var q = reshape(y, {1, R, C}), k = reshape(x, {1, R, C});
         return reshape(scaled_dot_product_attention(q, k, q), {R, C});
       }},
      {"causal_attention, NaN in q", NanAt::row, [](Var x, Var y, Var) {
         Var q = reshape(x, {1, R, C}), kv = reshape(y, {1, R, C});
         return reshape(causal_attention(q, kv, kv), {R, C});
       }},
  };
  for (DType dt : {DType::f32, DType::f64}) {
    ref::Array xa = ref::zeros({R, C}), ya = ref::zeros({R, C});
    for (std::int64_t i = 0; i < R * C; ++i) {
      xa.v[std::size_t(i)] = 0.5 + 0.01 * double(i % 29);
      ya.v[std::size_t(i)] = 0.7 - 0.01 * double(i % 17);
    }
    xa.v[std::size_t(nan_row * C + nan_col)] = std::numeric_limits<double>::quiet_NaN();
    Tensor xt = to_tensor(xa, dt), yt = to_tensor(ya, dt);
    std::vector<std::int32_t> lv(std::size_t(R), 0);
    lv[std::size_t(nan_row)] = std::int32_t(nan_col);  // nll reads the NaN in its row
    Tensor lt = Tensor::from(lv, {R});
    for (const NanCase& c : cases) {
      INFO(c.name << " in " << dtype_name(dt));
      const Tensor out = eval({xt, yt, lt}, [&](const V& v) { return c.build(v[0], v[1], v[2]); });
      const std::vector<double> o = to_doubles(out);
      std::size_t wrong = 0;
      for (std::size_t i = 0; i < o.size(); ++i) {
        bool want_nan = c.at == NanAt::all;
        if (c.at == NanAt::element) want_nan = i == std::size_t(nan_row * C + nan_col);
        if (c.at == NanAt::row) want_nan = i / (o.size() / std::size_t(R)) == std::size_t(nan_row);
        if (c.at == NanAt::column) want_nan = i % std::size_t(C) == std::size_t(nan_col);
        wrong += std::isnan(o[i]) != want_nan;
      }
      CHECK(wrong == 0);
    }
    // Indices: torch.argmax/argmin and max/min(dim) take a NaN as the
    // extreme, so its row answers the NaN's index whichever way it looks.
    for (bool is_max : {true, false}) {
      INFO((is_max ? "argmax" : "argmin") << " in " << dtype_name(dt));
      const Tensor am = eval({xt}, [&](const V& v) { return is_max ? argmax(v[0], 1) : argmin(v[0], 1); });
      const Tensor wi = eval({xt}, [&](const V& v) {
        return is_max ? max_with_indices(v[0], 1).second : min_with_indices(v[0], 1).second;
      });
      CHECK(am.to_vector<std::int64_t>()[std::size_t(nan_row)] == nan_col);
      CHECK(wi.to_vector<std::int64_t>()[std::size_t(nan_row)] == nan_col);
      // The other rows: the extreme of finite values (row r's values are
      // 0.5 + 0.01 * ((r * 37 + c) % 29)).
      CHECK(am.to_vector<std::int64_t>()[0] == (is_max ? 28 : 0));
    }
  }
}

TEST_CASE("relu's and maximum's backward at NaN follow PyTorch", "[nan][ops14]") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  // relu: the gradient is zero only where y <= 0, so dy passes at NaN
  // (torch: relu grad of [nan, 0, -1, 2] is [1, 0, 0, 1]); a NaN dy stays NaN.
  Tensor x = f64({nan, 0, -1, 2}, {4});
  CHECK(vals(grads({x}, {0}, [](const V& v) { return frugal::relu(v[0]); })[0]) == std::vector<double>{1, 0, 0, 1});
  Tensor ok = f64({1, -1}, {2}), dy = f64({nan, nan}, {2});
  const auto g = vals(grads({ok, dy}, {0}, [](const V& v) { return frugal::relu(v[0]) * v[1]; })[0]);
  CHECK(std::isnan(g[0]));
  CHECK(g[1] == 0);
  // maximum: a NaN operand takes the whole gradient on both sides
  // (torch.maximum([nan], [1]) grads [1], [1]).
  Tensor a = f64({nan, 2}, {2}), b = f64({1, nan}, {2});
  auto gm = grads({a, b}, {0, 1}, [](const V& v) { return frugal::maximum(v[0], v[1]); });
  CHECK(vals(gm[0]) == std::vector<double>{1, 1});
  CHECK(vals(gm[1]) == std::vector<double>{1, 1});
  // max along a dim routes the gradient to the first NaN, as torch.max.
  Tensor r = f64({1, nan, 3, nan}, {1, 4});
  CHECK(vals(grads({r}, {0}, [](const V& v) { return frugal::max(v[0], 1); })[0]) == std::vector<double>{0, 1, 0, 0});
}
