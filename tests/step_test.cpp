// capture -> autograd -> plan -> run, end to end: training, determinism,
// the arena, optimizers against their reference rules, and errors.
#include <omp.h>
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <frugal/frugal.hpp>
#include <optional>
#include <thread>

#include "counting_backend.hpp"
#include "toy_task.hpp"

using namespace frugal;

namespace {

struct GeluTanhMlp : nn::Module {
  nn::Linear fc1, fc2, fc3;
  GeluTanhMlp(int in, int hidden, int out, DType dt = DType::f32)
      : fc1(in, hidden, {.dtype = dt}), fc2(hidden, hidden, {.dtype = dt}), fc3(hidden, out, {.dtype = dt}) {
    register_module("fc1", fc1);
    register_module("fc2", fc2);
    register_module("fc3", fc3);
  }
  Var forward(Var x) { return fc3(frugal::tanh(fc2(gelu(fc1(x))))); }
};

using toy::make_batch;

std::vector<std::uint32_t> float_bits_of(const std::vector<float>& v) {
  std::vector<std::uint32_t> out(v.size());
  std::memcpy(out.data(), v.data(), v.size() * 4);
  return out;
}

}  // namespace

TEST_CASE("a captured MLP's loss falls", "[step]") {
  nn::manual_seed(3);
  GeluTanhMlp model(12, 32, 4);
  optim::SGD opt(model.parameters(), {.lr = 0.05, .momentum = 0.9});
  Step step = compile([&](Var x, Var y) { return cross_entropy(model.forward(x), y); },
                      {input<float>({64, 12}), input<std::int32_t>({64})}, opt);
  Tensor x({64, 12}), y({64}, DType::i32);
  float first = 0, last = 0;
  for (int s = 0; s < 150; ++s) {
    make_batch(x, y, std::uint64_t(s % 10));
    float loss = step.run(x, y);
    REQUIRE(std::isfinite(loss));
    if (s < 10) first += loss / 10;
    if (s >= 140) last += loss / 10;
  }
  INFO("mean loss over the first 10 steps " << first << ", over the last 10 " << last);
  CHECK(first > 1.0f);  // about log(4) at initialisation
  CHECK(last < 0.5f * first);
}

TEST_CASE("two runs with the same seed give identical bits", "[step]") {
  auto train = [](std::vector<float>& losses, std::vector<float>& params) {
    nn::manual_seed(11);
    GeluTanhMlp model(12, 40, 4);
    optim::AdamW opt(model.parameters(), {.lr = 3e-3});
    Step step = compile([&](Var x, Var y) { return cross_entropy(model.forward(x), y); },
                        {input<float>({96, 12}), input<std::int32_t>({96})}, opt, {}, {.threads = 2});
    Tensor x({96, 12}), y({96}, DType::i32);
    for (int s = 0; s < 20; ++s) {
      make_batch(x, y, std::uint64_t(s));
      losses.push_back(step.run(x, y));
    }
    for (auto& t : model.parameters())
      for (float v : t.to_vector<float>()) params.push_back(v);
  };
  std::vector<float> l1, p1, l2, p2;
  train(l1, p1);
  train(l2, p2);
  REQUIRE(l1.size() == 20);
  CHECK(l1.front() != l1.back());  // it did train
  CHECK(float_bits_of(l1) == float_bits_of(l2));
  CHECK(float_bits_of(p1) == float_bits_of(p2));
}

TEST_CASE("activations share one arena, placed by liveness", "[step][plan]") {
  // A deep, narrow MLP: many activations, few alive at once.
  struct Deep : nn::Module {
    std::vector<std::unique_ptr<nn::Linear>> layers;
    Deep() {
      for (int i = 0; i < 8; ++i) {
        layers.push_back(std::make_unique<nn::Linear>(64, 64));
        register_module(std::string("l") + std::to_string(i), *layers.back());
      }
    }
    Var forward(Var x) {
      for (auto& l : layers) x = relu((*l)(x));
      return x;
    }
  } model;
  optim::SGD opt(model.parameters(), {.lr = 0.01});
  Step step = compile([&](Var x, Var y) { return cross_entropy(model.forward(x), y); },
                      {input<float>({128, 64}), input<std::int32_t>({128})}, opt);
  const Plan& plan = step.plan();
  std::size_t one_buffer_each = 0;
  for (const Value& v : step.graph().values())
    if (v.kind == ValueKind::activation || v.kind == ValueKind::input) one_buffer_each += align_up(v.meta.nbytes());
  INFO("arena " << plan.arena_bytes << " bytes, one buffer per value would be " << one_buffer_each);
  CHECK(plan.arena_bytes < one_buffer_each / 2);
  CHECK(plan.arena_bytes >= plan.lower_bound_bytes);
  CHECK(plan.arena_ratio() <= 1.10);
  // Independent check of the placement: values alive together never share bytes.
  for (std::size_t i = 0; i < plan.intervals.size(); ++i) {
    const auto& a = plan.intervals[i];
    CHECK(plan.offsets[i] % kAlignment == 0);
    CHECK(plan.offsets[i] + a.bytes <= plan.arena_bytes);
    for (std::size_t j = i + 1; j < plan.intervals.size(); ++j) {
      const auto& b = plan.intervals[j];
      bool same_time = a.first <= b.last && b.first <= a.last;
      bool same_bytes = plan.offsets[i] < plan.offsets[j] + b.bytes && plan.offsets[j] < plan.offsets[i] + a.bytes;
      if (same_time && same_bytes) FAIL("values " << a.value << " and " << b.value << " overlap in time and memory");
    }
  }
}

TEST_CASE("a module's gradients match central finite differences in float64", "[step][grad]") {
  nn::manual_seed(5);
  GeluTanhMlp model(5, 7, 3, DType::f64);
  Tensor x({4, 5}, DType::f64), y({4}, DType::i32);
  Rng r(9);
  for (auto& v : std::span(x.data<double>(), 20)) v = r.normal();
  for (int i = 0; i < 4; ++i) y.data<std::int32_t>()[i] = i % 3;
  Step step = compile_gradients([&](Var xs, Var ys) { return cross_entropy(model.forward(xs), ys); },
                                {input<double>({4, 5}), input<std::int32_t>({4})}, model.parameters());
  step.run(x, y);
  std::vector<Tensor> analytic;  // read all before any perturbed run overwrites them
  for (auto& p : model.parameters()) analytic.push_back(step.grad(p));
  std::size_t k = 0;
  for (auto& [name, p] : model.named_parameters()) {
    const Tensor& g = analytic[k++];
    double* w = p.data<double>();
    for (std::int64_t i = 0; i < p.numel(); ++i) {
      const double h = 1e-6, keep = w[i];
      w[i] = keep + h;
      step.run(x, y);
      double up = step.last_loss_f64();
      w[i] = keep - h;
      step.run(x, y);
      double down = step.last_loss_f64();
      w[i] = keep;
      double fd = (up - down) / (2 * h);
      INFO(name << "[" << i << "]: analytic " << g.data<double>()[i] << ", finite difference " << fd);
      REQUIRE(std::abs(g.data<double>()[i] - fd) <= 1e-7 * (1 + std::abs(fd)));
    }
  }
}

namespace {
// loss(w) = sum(w * c) + 0.5 * sum(w * w): gradient c + w, known in closed form.
template <class Opt>
Step quadratic_step(Opt& opt, Tensor& w, Tensor& c) {
  return compile(
      [&](Var cv) {
        Var wv = persistent_var(w, ValueKind::parameter, "w");
        return sum(wv * cv) + 0.5 * sum(wv * wv);
      },
      {input<double>(c.shape(), "c")}, opt);
}
}  // namespace

TEST_CASE("SGD follows torch.optim.SGD's rule (momentum, dampening, decay, Nesterov)", "[step][optim]") {
  for (bool nesterov : {false, true}) {
    optim::SGDOptions o{.lr = 0.1, .momentum = 0.8, .dampening = nesterov ? 0.0 : 0.3, .weight_decay = 0.05,
                        .nesterov = nesterov};
    Tensor w = Tensor::from(std::vector<double>{0.5, -1.5, 2.0}, Shape{3});
    Tensor c = Tensor::from(std::vector<double>{1.0, -0.25, 0.75}, Shape{3});
    optim::SGD opt({w}, o);
    Step step = quadratic_step(opt, w, c);
    std::vector<double> rw{0.5, -1.5, 2.0}, buf(3);
    for (int t = 1; t <= 6; ++t) {
      step.run(c);
      for (int i = 0; i < 3; ++i) {  // the rule as torch/optim/sgd.py writes it
        double g = c.data<double>()[i] + rw[i];
        double d = g + o.weight_decay * rw[i];
        buf[i] = t == 1 ? d : o.momentum * buf[i] + (1 - o.dampening) * d;
        double dir = nesterov ? d + o.momentum * buf[i] : buf[i];
        rw[i] -= o.lr * dir;
        CHECK(w.data<double>()[i] == Approx(rw[i]).epsilon(1e-12));
      }
    }
  }
}

TEST_CASE("AdamW follows torch.optim.AdamW's rule with decoupled weight decay", "[step][optim]") {
  optim::AdamWOptions o{.lr = 0.05, .beta1 = 0.8, .beta2 = 0.95, .eps = 1e-6, .weight_decay = 0.1};
  Tensor w = Tensor::from(std::vector<double>{0.5, -1.5, 2.0, 0.1}, Shape{4});
  Tensor c = Tensor::from(std::vector<double>{1.0, -0.25, 0.75, -2.0}, Shape{4});
  optim::AdamW opt({w}, o);
  Step step = quadratic_step(opt, w, c);
  std::vector<double> rw{0.5, -1.5, 2.0, 0.1}, m(4), v(4);
  for (int t = 1; t <= 8; ++t) {
    if (t == 5) opt.set_lr(0.01);  // a schedule changes hyperparameters between steps
    step.run(c);
    double lr = t >= 5 ? 0.01 : o.lr;
    for (int i = 0; i < 4; ++i) {
      double g = c.data<double>()[i] + rw[i];
      rw[i] *= 1 - lr * o.weight_decay;
      m[i] = o.beta1 * m[i] + (1 - o.beta1) * g;
      v[i] = o.beta2 * v[i] + (1 - o.beta2) * g * g;
      double mhat = m[i] / (1 - std::pow(o.beta1, t)), vhat = v[i] / (1 - std::pow(o.beta2, t));
      rw[i] -= lr * mhat / (std::sqrt(vhat) + o.eps);
      CHECK(w.data<double>()[i] == Approx(rw[i]).epsilon(1e-10));
    }
  }
  CHECK(opt.exp_avg(0).data<double>()[0] == Approx(m[0]).epsilon(1e-12));
}

TEST_CASE("parameters the optimizer does not own stay frozen", "[step][optim]") {
  nn::manual_seed(2);
  GeluTanhMlp model(6, 8, 3);
  std::vector<Tensor> trainable = model.fc3.parameters();
  optim::SGD opt(trainable, {.lr = 0.5});
  Step step = compile([&](Var x, Var y) { return cross_entropy(model.forward(x), y); },
                      {input<float>({8, 6}), input<std::int32_t>({8})}, opt);
  Tensor x({8, 6}), y({8}, DType::i32);
  make_batch(x, y, 1, 3);
  auto frozen = model.fc1.weight.to_vector<float>();
  auto trained = model.fc3.weight.to_vector<float>();
  step.run(x, y);
  CHECK(model.fc1.weight.to_vector<float>() == frozen);
  CHECK(model.fc3.weight.to_vector<float>() != trained);
}

TEST_CASE("an inference step reads the parameters the training step updates", "[step]") {
  nn::manual_seed(4);
  GeluTanhMlp model(6, 10, 3);
  optim::SGD opt(model.parameters(), {.lr = 0.3});
  Step train = compile([&](Var x, Var y) { return cross_entropy(model.forward(x), y); },
                       {input<float>({16, 6}), input<std::int32_t>({16})}, opt);
  Step infer = compile_inference([&](Var x) { return model.forward(x); }, {input<float>({16, 6})});
  Tensor x({16, 6}), y({16}, DType::i32);
  make_batch(x, y, 8, 3);
  for (int round = 0; round < 3; ++round) {
    infer.run(x);
    const float* logits = infer.output().data<float>();
    double ce = 0;  // cross-entropy of the inference logits, by hand
    for (int i = 0; i < 16; ++i) {
      double mx = -1e30, z = 0;
      for (int k = 0; k < 3; ++k) mx = std::max(mx, double(logits[i * 3 + k]));
      for (int k = 0; k < 3; ++k) z += std::exp(double(logits[i * 3 + k]) - mx);
      ce += mx + std::log(z) - logits[i * 3 + y.data<std::int32_t>()[i]];
    }
    float loss = train.run(x, y);  // computed before this step's update
    CHECK(loss == Approx(ce / 16).epsilon(1e-5));
  }
}

TEST_CASE("modules name their parameters as PyTorch does and initialise like it", "[nn]") {
  nn::Sequential seq{std::make_shared<nn::Linear>(300, 20), std::make_shared<nn::ReLU>(),
                     std::make_shared<nn::Linear>(20, 5, nn::LinearOptions{.bias = false})};
  std::vector<std::string> names;
  for (auto& [n, _] : seq.named_parameters()) names.push_back(n);
  CHECK(names == std::vector<std::string>{"0.weight", "0.bias", "2.weight"});
  GeluTanhMlp mlp(3, 4, 2);
  CHECK(mlp.named_parameters().front().first == "fc1.weight");
  CHECK(mlp.num_parameters() == 3 * 4 + 4 + 4 * 4 + 4 + 4 * 2 + 2);
  // kaiming_uniform(a=sqrt(5)): U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
  auto w = seq.named_parameters()[0].second.to_vector<float>();
  double bound = 1 / std::sqrt(300.0), mean = 0, var = 0;
  for (float v : w) {
    REQUIRE(std::abs(v) <= bound);
    mean += v / double(w.size());
  }
  for (float v : w) var += (v - mean) * (v - mean) / double(w.size());
  CHECK(mean == Approx(0).margin(0.1 * bound));
  CHECK(var == Approx(bound * bound / 3).epsilon(0.1));
  seq.eval();
  CHECK_FALSE(seq[0].is_training());
}

TEST_CASE("references returned by register_parameter and register_buffer survive later registrations", "[nn]") {
  struct Many : nn::Module {};
  Many m;
  Tensor& w = m.register_parameter("w", Tensor::from<float>({1, 2, 3}, {3}));
  Tensor& b = m.register_buffer("b", Tensor::from<float>({4, 5}, {2}));
  void* w_data = w.raw();
  void* b_data = b.raw();
  for (int i = 0; i < 200; ++i) {
    m.register_parameter("p" + std::to_string(i), Tensor({4}));
    m.register_buffer("q" + std::to_string(i), Tensor({4}));
  }
  // Before, w and b pointed into storage the vectors had freed.
  REQUIRE(w.raw() == w_data);
  REQUIRE(b.raw() == b_data);
  CHECK(w.to_vector<float>() == std::vector<float>{1, 2, 3});
  CHECK(b.to_vector<float>() == std::vector<float>{4, 5});
  w = Tensor::from<float>({7, 8, 9}, {3});  // writing through the reference reaches the module
  CHECK(m.named_parameters().front().second.to_vector<float>() == std::vector<float>{7, 8, 9});
  CHECK(m.named_parameters().size() == 201);
}

TEST_CASE("a Sequential model trains through compile", "[nn][step]") {
  nn::manual_seed(6);
  nn::Sequential seq{std::make_shared<nn::Linear>(12, 24), std::make_shared<nn::GELU>(false),
                     std::make_shared<nn::Linear>(24, 24), std::make_shared<nn::Sigmoid>(),
                     std::make_shared<nn::Linear>(24, 4)};
  optim::AdamW opt(seq.parameters(), {.lr = 1e-2});
  Step step = compile([&](Var x, Var y) { return cross_entropy(seq(x), y); },
                      {input<float>({64, 12}), input<std::int32_t>({64})}, opt);
  Tensor x({64, 12}), y({64}, DType::i32);
  make_batch(x, y, 0);
  float first = step.run(x, y), last = first;
  for (int s = 0; s < 60; ++s) last = step.run(x, y);
  CHECK(last < 0.5f * first);
}

TEST_CASE("unused forward work is not planned", "[step][plan]") {
  Tensor w = Tensor::from(std::vector<float>{1, 2, 3, 4}, Shape{2, 2});
  Step step = compile_inference(
      [&](Var x) {
        Var wv = persistent_var(w, ValueKind::parameter, "w");
        Var unused = frugal::exp(matmul(x, wv));  // captured, never used
        (void)unused;
        return relu(matmul(x, wv));
      },
      {input<float>({2, 2})});
  for (NodeId n : step.plan().schedule) CHECK(step.graph().node(n).op->name() != "exp");
}

TEST_CASE("bad inputs and impossible budgets are clear errors", "[step][errors]") {
  nn::manual_seed(1);
  GeluTanhMlp model(6, 8, 3);
  optim::SGD opt(model.parameters(), {.lr = 0.1});
  auto fn = [&](Var x, Var y) { return cross_entropy(model.forward(x), y); };
  std::vector<InputSpec> specs{input<float>({8, 6}, "images"), input<std::int32_t>({8}, "labels")};

  SECTION("a wrong input shape names the input and both shapes") {
    Step step = compile(fn, specs, opt);
    Tensor x({8, 7}), y({8}, DType::i32);
    CHECK_THROWS_WITH(step.run(x, y), Catch::Contains("images") && Catch::Contains("[8, 7]") &&
                                          Catch::Contains("[8, 6]"));
    Tensor xf({8, 6});
    Tensor yf({8}, DType::f32);
    CHECK_THROWS_AS(step.run(xf, yf), ShapeError);
    CHECK_THROWS_WITH(step.run(xf), Catch::Contains("expected 2 inputs"));
  }
  SECTION("a budget below the smallest feasible fails at compile, naming it") {
    try {
      compile(fn, specs, opt, Budget{.device = 1});
      FAIL("a one-byte budget compiled");
    } catch (const BudgetError& e) {
      CHECK_THAT(e.what(), Catch::Contains("smallest feasible budget") && Catch::Contains("Largest consumers"));
    }
  }
  SECTION("the step function must return one scalar loss") {
    CHECK_THROWS_WITH(compile([&](Var x, Var) { return model.forward(x); }, specs, opt),
                      Catch::Contains("single number"));
  }
  SECTION("a parameter used outside a capture says so") {
    CHECK_THROWS_WITH(model.forward(Var{}), Catch::Contains("outside a capture"));
  }
}

TEST_CASE("a step whose executor fails part way gives its arena back", "[step][arena]") {
  nn::manual_seed(1);
  GeluTanhMlp model(6, 8, 3);
  optim::SGD opt(model.parameters(), {.lr = 0.1});
  auto fn = [&](Var x, Var y) { return cross_entropy(model.forward(x), y); };
  counting::reset();
  counting::hide_kernels = true;  // binding the first node fails, after the arena is allocated
  CHECK_THROWS_WITH(compile(fn, {input<float>({8, 6}), input<std::int32_t>({8})}, opt,
                            Budget{}, CompileOptions{.use_backend = counting::make()}),
                    Catch::Contains("has no kernel"));
  counting::hide_kernels = false;
  CHECK(counting::allocations == 1);
  CHECK(counting::deallocations == counting::allocations);
}

TEST_CASE("a step's thread count is its own: steps of two counts, alternating or at once, give their lone bits",
          "[step][threads]") {
  constexpr int kSteps = 4;
  std::vector<std::pair<Tensor, Tensor>> batches;
  for (int s = 0; s < kSteps; ++s) {
    Tensor x({128, 64}), y({128}, DType::i32);
    make_batch(x, y, std::uint64_t(s + 1), 8);
    batches.emplace_back(x, y);
  }
  struct Trainer {
    std::unique_ptr<GeluTanhMlp> model;
    std::unique_ptr<optim::SGD> opt;
    std::optional<Step> step;
    std::vector<float> losses;
    explicit Trainer(int threads) {
      nn::manual_seed(7);
      model = std::make_unique<GeluTanhMlp>(64, 256, 8);
      opt = std::make_unique<optim::SGD>(model->parameters(), optim::SGDOptions{.lr = 0.05, .momentum = 0.9});
      GeluTanhMlp* m = model.get();
      step.emplace(compile([m](Var x, Var y) { return cross_entropy(m->forward(x), y); },
                           {input<float>({128, 64}), input<std::int32_t>({128})}, *opt, Budget{},
                           CompileOptions{.threads = threads}));
    }
    void run(const std::pair<Tensor, Tensor>& b) { losses.push_back(step->run(b.first, b.second)); }
    std::vector<std::uint32_t> bits() const {
      std::vector<float> all = losses;
      for (const Tensor& p : model->parameters()) all.insert(all.end(), p.data<float>(), p.data<float>() + p.numel());
      return float_bits_of(all);
    }
  };
  const int caller = omp_get_max_threads();
  omp_set_num_threads(3);  // the caller's own count, which no step may change
  std::vector<std::uint32_t> alone[2];
  for (int k = 0; k < 2; ++k) {
    Trainer t(k + 1);
    for (auto& b : batches) t.run(b);
    alone[k] = t.bits();
    CHECK(omp_get_max_threads() == 3);
  }
  {
    Trainer a(1), b(2);
    for (auto& batch : batches) {
      a.run(batch);
      CHECK(omp_get_max_threads() == 3);
      b.run(batch);
      CHECK(omp_get_max_threads() == 3);
    }
    CHECK(a.bits() == alone[0]);
    CHECK(b.bits() == alone[1]);
  }
  {
    Trainer a(1), b(2);
    std::atomic<int> changed{0};
    auto loop = [&](Trainer& t) {
      const int before = omp_get_max_threads();
      for (auto& batch : batches) {
        t.run(batch);
        changed += omp_get_max_threads() != before;
      }
    };
    std::thread ta(loop, std::ref(a)), tb(loop, std::ref(b));
    ta.join();
    tb.join();
    CHECK(changed == 0);
    CHECK(a.bits() == alone[0]);
    CHECK(b.bits() == alone[1]);
  }
  CHECK(omp_get_max_threads() == 3);
  omp_set_num_threads(caller);
}

TEST_CASE("a step with no inputs (a loss over parameters only) compiles, runs and audits", "[step][inputs]") {
  Tensor w = Tensor::from(std::vector<float>{1, -2, 3, 0.5f, 4, -1}, {2, 3});
  optim::SGD opt({w}, {.lr = 0.125});
  Step step = compile([&] { Var v = persistent_var(w, ValueKind::parameter, "w"); return sum(v * v); }, {}, opt);
  CHECK(step.run() == 1 + 4 + 9 + 0.25f + 16 + 1);
  // w <- w - 0.125 * 2w = 0.75 w
  CHECK(w.to_vector<float>() == std::vector<float>{0.75f, -1.5f, 2.25f, 0.375f, 3, -0.75f});
  auto a = step.audit();
  CHECK(a.canary_intact);
  CHECK(a.high_water == a.predicted);
}

TEST_CASE("a step that fails on bad data counts for nothing: six good steps around a failed one train as six good "
          "steps",
          "[step][errors][atomic]") {
  auto train = [](bool with_failure) {
    nn::manual_seed(8);
    GeluTanhMlp model(6, 16, 3);
    optim::AdamW opt(model.parameters(), {.lr = 1e-2});  // its bias correction reads the step count
    Step step = compile([&](Var x, Var y) { return cross_entropy(model.forward(x), y); },
                        {input<float>({8, 6}), input<std::int32_t>({8})}, opt);
    Tensor x({8, 6}), y({8}, DType::i32);
    std::vector<float> losses;
    for (int s = 0; s < 6; ++s) {
      if (with_failure && s == 3) {
        make_batch(x, y, 99, 3);
        y.data<std::int32_t>()[5] = 7;  // a label outside [0, 3)
        CHECK_THROWS_AS(step.run(x, y), DataError);
        CHECK(opt.steps() == 3);
        CHECK(step.steps_run() == 3);
      }
      make_batch(x, y, std::uint64_t(s), 3);
      losses.push_back(step.run(x, y));
    }
    std::vector<std::vector<char>> state;
    for (auto& [name, t] : model.named_parameters()) {
      state.emplace_back(t.nbytes());
      std::memcpy(state.back().data(), t.raw(), t.nbytes());
    }
    for (auto& st : opt.state()) {
      state.emplace_back(st.tensor.nbytes());
      std::memcpy(state.back().data(), st.tensor.raw(), st.tensor.nbytes());
    }
    return std::tuple{losses, state, opt.steps(), step.steps_run()};
  };
  auto [good_losses, good_state, good_opt_steps, good_steps] = train(false);
  auto [losses, state, opt_steps, steps] = train(true);
  CHECK(float_bits_of(losses) == float_bits_of(good_losses));
  CHECK(state == good_state);
  CHECK(opt_steps == good_opt_steps);
  CHECK(steps == good_steps);
}
