// An API that is hard to misuse: a step that outlives its optimizer, bad
// hyperparameters, byte sizes, train/eval modes after compile, and one
// argument order for compile and its siblings. Each case is a mistake a
// libtorch user makes, and the error it must get.
#include <catch2/catch.hpp>

#include <cmath>
#include <frugal/frugal.hpp>
#include <limits>
#include <memory>
#include <string>

using namespace frugal;
using Catch::Matchers::Contains;

namespace {

template <class E = Error>
std::string message_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const E& e) {
    return e.what();
  }
  FAIL("no error was raised");
  return {};
}

struct ApiNet : nn::Module {
  nn::Linear fc1{4, 8}, fc2{8, 3};
  nn::Dropout drop{0.5};
  ApiNet() {
    register_module("fc1", fc1);
    register_module("drop", drop);
    register_module("fc2", fc2);
  }
  Var forward(Var x) { return fc2(drop(relu(fc1(x)))); }
};

std::vector<InputSpec> api_specs() { return {input<float>({2, 4}), input<std::int32_t>({2})}; }

Tensor batch_x() {
  Tensor x({2, 4});
  for (std::int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = float(i % 5) * 0.25f - 0.5f;
  return x;
}
Tensor batch_y() { return Tensor::from(std::vector<std::int32_t>{0, 2}, Shape{2}); }

// The factory a user writes: model, optimizer and step, but only the step
// is returned; the model and the optimizer die at the closing brace.
Step make_step_whose_optimizer_dies() {
  ApiNet model;
  optim::AdamW opt(model.parameters(), {.lr = 1e-2});
  return compile([&](Var x, Var y) { return cross_entropy(model.forward(x), y); }, api_specs(), opt);
}

// Same, but the optimizer is handed back with the step; the model still dies.
std::pair<std::unique_ptr<optim::SGD>, Step> make_step_whose_model_dies() {
  ApiNet model;
  auto opt = std::make_unique<optim::SGD>(model.parameters(), optim::SGDOptions{.lr = 0.1});
  Step step = compile([&](Var x, Var y) { return cross_entropy(model.forward(x), y); }, api_specs(), *opt);
  return {std::move(opt), std::move(step)};
}

Var plain_step_function(Var x) { return x * 2.0; }

}  // namespace

// ---- lifetimes ---------------------------------------------------------------

TEST_CASE("a step whose optimizer went out of scope fails with an error naming it, not a crash", "[api14]") {
  Step step = make_step_whose_optimizer_dies();
  const std::string m = message_of([&] { step.run(batch_x(), batch_y()); });
  CHECK_THAT(m, Contains("optimizer") && Contains("adamw") && Contains("destroyed") && Contains("alive"));
  CHECK(step.steps_run() == 0);
  // audit() runs the step too, and is refused the same way.
  CHECK_THAT(message_of([&] { step.audit(batch_x(), batch_y()); }), Contains("destroyed"));
}

TEST_CASE("a step outlives its model: parameters are shared storage, so it trains on", "[api14]") {
  auto [opt, step] = make_step_whose_model_dies();
  const Tensor w0 = opt->params()[0].clone();
  const float l0 = step.run(batch_x(), batch_y());
  step.run(batch_x(), batch_y());
  CHECK(std::isfinite(l0));
  CHECK(opt->params()[0].to_vector<float>() != w0.to_vector<float>());  // the update reached the weights
  CHECK(step.steps_run() == 2);
}

TEST_CASE("a copy of an optimizer has a life of its own", "[api14]") {
  ApiNet model;
  auto original = std::make_unique<optim::SGD>(model.parameters(), optim::SGDOptions{.lr = 0.1});
  optim::SGD copy = *original;
  Step step = compile([&](Var x, Var y) { return cross_entropy(model.forward(x), y); }, api_specs(), copy);
  original.reset();  // the step was compiled with the copy, which lives
  CHECK(std::isfinite(step.run(batch_x(), batch_y())));
}

// ---- hyperparameters ---------------------------------------------------------

TEST_CASE("optimizers reject NaN, infinite and out-of-range hyperparameters, naming the field", "[api14]") {
  ApiNet model;
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  auto adamw = [&](optim::AdamWOptions o) { return message_of([&] { optim::AdamW(model.parameters(), o); }); };
  CHECK_THAT(adamw({.lr = nan}), Contains("lr") && Contains("nan"));
  CHECK_THAT(adamw({.lr = inf}), Contains("lr") && Contains("inf"));
  CHECK_THAT(adamw({.lr = -1}), Contains("lr") && Contains("-1"));
  CHECK_THAT(adamw({.beta1 = 1}), Contains("beta1") && Contains("[0, 1)"));
  CHECK_THAT(adamw({.beta1 = nan}), Contains("beta1"));
  CHECK_THAT(adamw({.beta2 = -0.1}), Contains("beta2"));
  CHECK_THAT(adamw({.eps = nan}), Contains("eps"));
  CHECK_THAT(adamw({.eps = -1e-8}), Contains("eps"));
  CHECK_THAT(adamw({.weight_decay = inf}), Contains("weight_decay"));
  CHECK_THAT(adamw({.weight_decay = -0.01}), Contains("weight_decay"));
  CHECK_NOTHROW(optim::AdamW(model.parameters(), {.lr = 0, .beta1 = 0, .beta2 = 0, .eps = 0, .weight_decay = 0}));

  auto sgd = [&](optim::SGDOptions o) { return message_of([&] { optim::SGD(model.parameters(), o); }); };
  CHECK_THAT(sgd({.lr = nan}), Contains("lr") && Contains("nan"));
  CHECK_THAT(sgd({.lr = -inf}), Contains("lr"));
  CHECK_THAT(sgd({.momentum = -0.9}), Contains("momentum") && Contains("-0.9"));
  CHECK_THAT(sgd({.momentum = nan}), Contains("momentum"));
  CHECK_THAT(sgd({.dampening = inf}), Contains("dampening"));
  CHECK_THAT(sgd({.weight_decay = nan}), Contains("weight_decay"));
  CHECK_NOTHROW(optim::SGD(model.parameters(), {.lr = 0.1, .momentum = 0.9, .dampening = 0.1, .weight_decay = 1e-4}));
}

TEST_CASE("set_lr checks the learning rate and leaves the old one on a bad value", "[api14]") {
  ApiNet model;
  optim::AdamW a(model.parameters(), {.lr = 1e-3});
  optim::SGD s(model.parameters(), {.lr = 0.1});
  for (double bad : {std::nan(""), std::numeric_limits<double>::infinity(), -1e-3}) {
    CHECK_THAT(message_of([&] { a.set_lr(bad); }), Contains("set_lr") && Contains("lr"));
    CHECK_THAT(message_of([&] { s.set_lr(bad); }), Contains("set_lr") && Contains("lr"));
  }
  CHECK(a.lr() == 1e-3);
  CHECK(s.lr() == 0.1);
  a.set_lr(5e-4);
  CHECK(a.lr() == 5e-4);
}

// ---- bytes -------------------------------------------------------------------

TEST_CASE("parse_bytes reads sizes with or without a space, binary units up to EiB, decimals", "[api14]") {
  CHECK(parse_bytes("64MiB") == 64_MiB);
  CHECK(parse_bytes("64 MiB") == 64_MiB);
  CHECK(parse_bytes("1.5GiB") == 3 * 512_MiB);
  CHECK(parse_bytes("1011.1 KiB") == 1035366);  // 1011.1 * 1024 = 1035366.4, to the nearest byte
  CHECK(parse_bytes("3.0 TiB") == std::size_t(3) << 40);
  CHECK(parse_bytes("2 PiB") == std::size_t(2) << 50);
  CHECK(parse_bytes("1EiB") == std::size_t(1) << 60);
  CHECK(parse_bytes("512k") == 512_KiB);
  CHECK(parse_bytes("512KB") == 512_KiB);  // KB is binary, as it always was here
  CHECK(parse_bytes("2g") == 2_GiB);
  CHECK(parse_bytes("4096") == 4096);
  CHECK(parse_bytes("7 B") == 7);
  CHECK(parse_bytes(".5KiB") == 512);
  CHECK(parse_bytes("18446744073709551615") == std::numeric_limits<std::size_t>::max());
}

TEST_CASE("parse_bytes rejects what is not a size, naming the text", "[api14]") {
  for (const char* bad : {"", "0", "0.4", "0 MiB", "inf", "nan", "-5", "-1MiB", "+5", "1e30GiB", "1e3", "0x10", "lots",
                          "12 parsecs", "64MiB!", "64  MiB", " 64MiB", "64MiB ", "1.2.3", ".", "16 EiB",
                          "18446744073709551616", "100000000000000000000000 B", "50%"}) {
    INFO("'" << bad << "'");
    const std::string m = message_of([&] { parse_bytes(bad); });
    CHECK_THAT(m, Contains(std::string("'") + bad + "'"));
  }
  CHECK_THAT(message_of([] { parse_bytes("0.4"); }), Contains("rounds to 0"));
  CHECK_THAT(message_of([] { parse_bytes("50%"); }), Contains("percentage"));
  CHECK_THAT(message_of([] { parse_bytes("16 EiB"); }), Contains("2^64"));
}

TEST_CASE("parse_bytes with a reference size reads percentages of it", "[api14]") {
  CHECK(parse_bytes("50%", 1000) == 500);
  CHECK(parse_bytes("12.5 %", 1000) == 125);
  CHECK(parse_bytes("150%", 64_MiB) == 96_MiB);
  CHECK(parse_bytes("64MiB", 1000) == 64_MiB);  // a plain size ignores the reference
  for (const char* bad : {"%", "-5%", "nan%", "inf%", "0%", "0.01%", "5%%", "5 MiB%", "0x5%"}) {
    INFO("'" << bad << "'");
    CHECK_THAT(message_of([&] { parse_bytes(bad, 1000); }), Contains(std::string("'") + bad + "'"));
  }
}

TEST_CASE("format_bytes writes what parse_bytes reads back, within the printed precision", "[api14]") {
  // The examples, and the edges: just under a unit, and 2^64 - 1.
  CHECK(format_bytes(1023) == "1023 B");
  CHECK(format_bytes(1024) == "1.0 KiB");
  CHECK(format_bytes(1048575) == "1.0 MiB");  // not "1024.0 KiB"
  CHECK(format_bytes(std::size_t(3) << 40) == "3.0 TiB");
  Rng rng(14);
  std::vector<std::size_t> sizes{0, 1, 1023, 1024, 1035366, 1048575, 1048576, std::size_t(3) << 40,
                                 std::numeric_limits<std::size_t>::max(), std::numeric_limits<std::size_t>::max() / 2};
  // Log-uniform over 1 B .. 2^64 - 1: every unit gets its share.
  for (int i = 0; i < 2000; ++i) {
    const int bits = 1 + int(rng.below(64));
    const std::uint64_t top = bits == 64 ? ~std::uint64_t(0) : (std::uint64_t(1) << bits) - 1;
    sizes.push_back(std::size_t(((std::uint64_t(rng.next_u32()) << 32 | rng.next_u32()) & top) | (std::uint64_t(1) << (bits - 1))));
  }
  for (std::size_t n : sizes) {
    const std::string text = format_bytes(n);
    INFO(n << " -> '" << text << "'");
    if (n == 0) {
      // 0 bytes prints, but is no size to parse (a 0 budget means unlimited).
      CHECK(text == "0 B");
      continue;
    }
    const std::size_t back = parse_bytes(text);
    // One decimal of the unit: rounding to it moves at most half a tenth of
    // the unit (near 2^64 it rounds down, up to a tenth), plus half a byte
    // from parse_bytes' own rounding.
    // The unit it printed in: a tenth of it is the printed precision.
    long double unit = 1;
    for (const char* u : {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"})
      if (unit *= 1024; text.ends_with(std::string(" ") + u)) break;
    if (text.ends_with(" B")) unit = 1;
    const long double bound = unit == 1 ? 0 : unit * (n > (std::size_t(15) << 60) ? 0.1L : 0.05L) + 0.5L;
    CHECK(std::fabs((long double)back - (long double)n) <= bound);
  }
}

// ---- modes -------------------------------------------------------------------

TEST_CASE("a mode change after compile is reported at the next run, naming the module", "[api14]") {
  ApiNet model;
  optim::SGD opt(model.parameters(), {.lr = 0.1});
  Step step = compile([&](Var x, Var y) { return cross_entropy(model.forward(x), y); }, api_specs(), opt);
  step.run(batch_x(), batch_y());
  model.eval();  // as a PyTorch user would before validating
  const Tensor w = opt.params()[0].clone();
  const std::string m = message_of([&] { step.run(batch_x(), batch_y()); });
  CHECK_THAT(m, Contains("'drop'") && Contains("eval") && Contains("compile_inference"));
  CHECK(opt.params()[0].to_vector<float>() == w.to_vector<float>());  // refused before anything ran
  CHECK(step.steps_run() == 1);
  model.train();
  CHECK(std::isfinite(step.run(batch_x(), batch_y())));
}

TEST_CASE("compile_inference runs modules in eval mode and leaves their flags alone", "[api14]") {
  ApiNet model;
  REQUIRE(model.is_training());
  auto forward = [&](Var x) { return model.forward(x); };
  const Tensor x = batch_x();
  // Dropout off: the output equals the same network with dropout left out.
  Step infer = compile_inference(forward, {input<float>({2, 4})});
  CHECK(model.is_training());
  CHECK(model.drop.is_training());
  infer.run(x);
  Step reference = compile_inference([&](Var v) { return model.fc2(relu(model.fc1(v))); }, {input<float>({2, 4})});
  reference.run(x);
  CHECK(infer.output().to_vector<float>() == reference.output().to_vector<float>());
  // Its flags are not the step's: switching them later changes nothing and is no error.
  model.eval();
  infer.run(x);
  model.train();
  infer.run(x);
  CHECK(infer.output().to_vector<float>() == reference.output().to_vector<float>());
  // CompileOptions::training forces a mode: dropout on in an inference step.
  Step noisy = compile_inference(forward, {input<float>({2, 4})}, {}, {.training = true});
  noisy.run(x);
  CHECK(noisy.output().to_vector<float>() != reference.output().to_vector<float>());
}

TEST_CASE("a training step compiled in eval mode reports a switch back to train", "[api14]") {
  ApiNet model;
  model.eval();  // fine-tuning with dropout off
  optim::SGD opt(model.parameters(), {.lr = 0.1});
  Step step = compile([&](Var x, Var y) { return cross_entropy(model.forward(x), y); }, api_specs(), opt);
  step.run(batch_x(), batch_y());
  model.train();
  CHECK_THAT(message_of([&] { step.run(batch_x(), batch_y()); }), Contains("switched to train"));
  // A forced mode is no flag of the module's: nothing to report.
  Step forced = compile([&](Var x, Var y) { return cross_entropy(model.forward(x), y); }, api_specs(), opt, {},
                        {.training = false});
  model.eval();
  forced.run(batch_x(), batch_y());
  model.train();
  forced.run(batch_x(), batch_y());
}

// ---- one argument order ------------------------------------------------------

TEST_CASE("compile, plan_training, compile_inference and plan_inference take (..., Budget, CompileOptions)",
          "[api14]") {
  ApiNet model;
  optim::SGD opt(model.parameters(), {.lr = 0.1});
  auto loss = [&](Var x, Var y) { return cross_entropy(model.forward(x), y); };
  auto forward = [&](Var x) { return model.forward(x); };
  const Budget budget{.device = 64_MiB};
  const CompileOptions o{.verify = true};
  PlannedStep planned = plan_training(loss, api_specs(), opt, budget, o);
  Step step = compile(loss, api_specs(), opt, budget, o);
  CHECK(planned.plan.peak_bytes == step.plan().peak_bytes);
  PlannedStep planned_eval = plan_inference(forward, {input<float>({2, 4})}, budget, o);
  Step eval = compile_inference(forward, {input<float>({2, 4})}, budget, o);
  CHECK(planned_eval.plan.peak_bytes == eval.plan().peak_bytes);
  Step grads = compile_gradients(loss, api_specs(), model.parameters(), budget, o);
  grads.run(batch_x(), batch_y());
  CHECK(grads.grad(model.fc1.weight).shape() == model.fc1.weight.shape());
}

TEST_CASE("a plain function is a step function too", "[api14]") {
  Step s = compile_inference(plain_step_function, {input<float>({3})});
  s.run(Tensor::from(std::vector<float>{1, 2, 3}, Shape{3}));
  CHECK(s.output().to_vector<float>() == std::vector<float>{2, 4, 6});
  CHECK_THAT(message_of([] { compile_inference(plain_step_function, {}); }),
             Contains("takes 1 inputs but 0 were declared"));
}
