// The memory broker (runtime/broker.hpp): several steps on one device
// budget, joining and leaving, each computing the bits it computes alone.
#include <catch2/catch.hpp>

#include <cstring>
#include <atomic>
#include <map>
#include <thread>
#include <frugal/frugal.hpp>

#include "../tools/model_zoo.hpp"
#include "slow_profile.hpp"
#include "separate_memory_backend.hpp"

using namespace frugal;

namespace {

std::uint32_t bits_of(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// A model's training step and an evaluation step over the same weights,
// as the broker plans them, beside a twin (the same model, built the same
// way) whose two steps run alone with nothing evicted.
struct Family {
  DeviceProfile profile = DeviceProfile::defaults("cpu", 2);
  // No re-planning on measured times: the broker asks for it (a timed
  // re-plan could move weights another step shares off the device).
  CompileOptions o{.profile = &profile, .replan = false};
  zoo::Workload w, twin;
  std::function<Var(Var, Var)> eval_fn, twin_eval_fn;
  Step train_alone, eval_alone;
  std::vector<Tensor> batch;

  explicit Family(const zoo::Config& c)
      : w(zoo::make(c)), twin(zoo::make(c)),
        eval_fn([this](Var a, Var b) { return w.loss({a, b}); }),
        twin_eval_fn([this](Var a, Var b) { return twin.loss({a, b}); }),
        train_alone(zoo::compile(twin, {}, o)), eval_alone(compile_inference(twin_eval_fn, twin.inputs, {}, o)),
        batch(w.batch(7)) {}

  MemoryBroker::Id join_train(MemoryBroker& b, const std::string& name) {
    return b.join(name, [this](const Budget& bu) { return zoo::compile(w, bu, o); },
                  [this](const Budget& bu) { return zoo::plan(w, bu, o); });
  }
  MemoryBroker::Id join_eval(MemoryBroker& b, const std::string& name) {
    return b.join(name, [this](const Budget& bu) { return compile_inference(eval_fn, w.inputs, bu, o); },
                  [this](const Budget& bu) { return plan_inference(eval_fn, w.inputs, bu, o); });
  }
  // The least and the unconstrained bytes of each step alone.
  std::pair<std::size_t, std::size_t> train_bytes() {
    return bytes_of([&](const Budget& b) { return zoo::plan(w, b, o); });
  }
  std::pair<std::size_t, std::size_t> eval_bytes() {
    return bytes_of([&](const Budget& b) { return plan_inference(eval_fn, w.inputs, b, o); });
  }
  template <class PlanFn>
  static std::pair<std::size_t, std::size_t> bytes_of(PlanFn&& plan) {
    try {
      plan(Budget{.device = 1});
    } catch (const BudgetError& e) {
      return {e.smallest_feasible_bytes, e.unconstrained_bytes};
    }
    FAIL("a step planned in one byte");
    return {};
  }
  std::size_t weight_bytes() const {
    std::size_t n = 0;
    for (const Tensor& p : w.model->parameters()) n += p.nbytes();
    return n;
  }
  // One training step in the broker and in the twin: the same loss bits.
  void train(Step& s) {
    const float got = s.run(batch[0], batch[1]);
    const float want = train_alone.run(batch[0], batch[1]);
    CHECK(bits_of(got) == bits_of(want));
  }
  void evaluate(Step& s) {
    s.run(batch[0], batch[1]);
    eval_alone.run(batch[0], batch[1]);
    CHECK(bits_of(s.output().item<float>()) == bits_of(eval_alone.output().item<float>()));
  }
  bool same_weights() const {
    const auto a = w.model->parameters(), b = twin.model->parameters();
    for (std::size_t i = 0; i < a.size(); ++i)
      if (std::memcmp(a[i].raw(), b[i].raw(), a[i].nbytes()) != 0) return false;
    return true;
  }
};


zoo::Config mlp_config() {
  return {.family = "mlp", .batch = 16, .layers = 2, .width = 64, .features = 32};
}
zoo::Config gpt_config() {
  return {.family = "gpt", .batch = 2, .layers = 1, .width = 32, .seq = 16, .heads = 2, .vocab = 64};
}
zoo::Config gcn_config() {
  return {.family = "gcn", .batch = 48, .layers = 2, .width = 16, .features = 12, .classes = 4};
}

}  // namespace

TEST_CASE("a broker counts the weights its training and evaluation steps share once", "[broker]") {
  Family f(mlp_config());
  const auto [train_least, train_full] = f.train_bytes();
  const auto [eval_least, eval_full] = f.eval_bytes();
  // Unconstrained, both keep the weights on the device: a budget short of
  // the two by half the weights fits them only if the weights count once.
  const std::size_t budget = train_full + eval_full - f.weight_bytes() / 2;
  MemoryBroker b(Budget{.device = budget});
  const auto train = f.join_train(b, "train");
  const auto eval = f.join_eval(b, "eval");
  INFO(b.summary());
  const auto shares = b.shares();
  REQUIRE(shares.size() == 2);
  CHECK(shares[0].shared == 0);
  CHECK(shares[1].shared > 0);
  CHECK(shares[0].budget + shares[1].budget > budget);  // each plan counts the weights; the broker once
  CHECK(b.planned_device_bytes() <= budget);
  for (int k = 0; k < 3; ++k) {
    f.train(b.step(train));
    f.evaluate(b.step(eval));
    CHECK(b.measured_device_bytes() <= budget);
  }
  CHECK(f.same_weights());
  CHECK(b.measured_device_bytes() <= b.planned_device_bytes());
}

TEST_CASE("on a backend with device copies of its own, a broker counts a shared weight in each step", "[broker]") {
  Family f(mlp_config());
  f.o.use_backend = std::make_shared<test_backends::SeparateMemory>();
  const auto [train_least, train_full] = f.train_bytes();
  const auto [eval_least, eval_full] = f.eval_bytes();
  const std::size_t budget = train_full + eval_full;  // room for both, each with its own copy
  MemoryBroker b(Budget{.device = budget});
  const auto train = f.join_train(b, "train");
  const auto eval = f.join_eval(b, "eval");
  INFO(b.summary());
  CHECK(b.shares()[1].persistents > 0);
  CHECK(b.shares()[1].shared == 0);
  CHECK(b.planned_device_bytes() == b.step(train).plan().total_bytes() + b.step(eval).plan().total_bytes());
  f.train(b.step(train));
  f.evaluate(b.step(eval));
  CHECK(b.measured_device_bytes() <= budget);
  // With no host memory both keep every weight on the device at their
  // least; short of the two leasts by half the weights, which fits on the
  // CPU backend (the next test), does not fit here.
  const Budget no_host{.device = 1, .host = 1};
  const std::size_t train_tight = Family::bytes_of([&](const Budget&) { return zoo::plan(f.w, no_host, f.o); }).first;
  const std::size_t eval_tight =
      Family::bytes_of([&](const Budget&) { return plan_inference(f.eval_fn, f.w.inputs, no_host, f.o); }).first;
  MemoryBroker tight(Budget{.device = train_tight + eval_tight - f.weight_bytes() / 2, .host = 2});
  f.join_train(tight, "train");
  CHECK_THROWS_AS(f.join_eval(tight, "eval"), BudgetError);
}

TEST_CASE("with no host memory, a broker fits training and evaluation where counting the weights twice would not",
          "[broker]") {
  Family f(mlp_config());
  // A host pool of one byte each: nothing can be swapped, so at their least
  // both keep every weight on the device.
  const Budget no_host{.device = 1, .host = 1};
  const std::size_t train_least = Family::bytes_of([&](const Budget&) { return zoo::plan(f.w, no_host, f.o); }).first;
  const std::size_t eval_least =
      Family::bytes_of([&](const Budget&) { return plan_inference(f.eval_fn, f.w.inputs, no_host, f.o); }).first;
  const std::size_t budget = train_least + eval_least - f.weight_bytes() / 2;
  MemoryBroker b(Budget{.device = budget, .host = 2});
  const auto train = f.join_train(b, "train");
  const auto eval = f.join_eval(b, "eval");
  INFO(b.summary());
  CHECK(b.shares()[1].shared >= f.weight_bytes() / 2);
  CHECK(b.planned_device_bytes() <= budget);
  for (int k = 0; k < 2; ++k) {
    f.train(b.step(train));
    f.evaluate(b.step(eval));
    CHECK(b.measured_device_bytes() <= budget);
  }
  CHECK(f.same_weights());
}

TEST_CASE("a step that cannot fit beside the others is refused at admission with the bytes it needs", "[broker]") {
  Family gpt(gpt_config()), mlp(mlp_config());
  const auto [gpt_least, gpt_full] = gpt.train_bytes();
  const auto [mlp_least, mlp_full] = mlp.train_bytes();
  const std::size_t budget = gpt_least + mlp_least - 1;  // the two share nothing
  MemoryBroker b(Budget{.device = budget});
  const auto g = gpt.join_train(b, "gpt");
  Step* before = &b.step(g);
  const std::size_t share = b.shares()[0].budget;
  gpt.train(b.step(g));
  try {
    mlp.join_train(b, "mlp");
    FAIL("the broker admitted a step that does not fit");
  } catch (const BudgetError& e) {
    CHECK(e.smallest_feasible_bytes == gpt_least + mlp_least);
    const std::string what = e.what();
    CHECK(what.find("'mlp'") != std::string::npos);
    CHECK(what.find(std::to_string(gpt_least + mlp_least)) != std::string::npos);
  }
  // The step already there is untouched: the same share, the same object,
  // the same bits as it goes on.
  REQUIRE(b.size() == 1);
  CHECK(&b.step(g) == before);
  CHECK(b.shares()[0].budget == share);
  gpt.train(b.step(g));
  CHECK(gpt.same_weights());
}

TEST_CASE("a step leaving gives its bytes to the others, which go on with the same bits", "[broker]") {
  Family gpt(gpt_config()), mlp(mlp_config());
  const auto [gpt_least, gpt_full] = gpt.train_bytes();
  const auto [mlp_least, mlp_full] = mlp.train_bytes();
  REQUIRE(gpt_least < gpt_full);
  // Room for gpt unconstrained, but not beside mlp.
  const std::size_t budget = gpt_full + mlp_least / 2;
  MemoryBroker b(Budget{.device = budget});
  const auto g = gpt.join_train(b, "gpt");
  CHECK(b.step(g).plan().decisions.empty());  // alone it needs nothing evicted
  const auto m = mlp.join_train(b, "mlp");
  CHECK(b.shares()[0].budget < gpt_full);
  CHECK_FALSE(b.step(g).plan().decisions.empty());
  for (int k = 0; k < 2; ++k) {
    gpt.train(b.step(g));
    mlp.train(b.step(m));
  }
  CHECK(b.step(g).steps_run() == 3 - 1);
  b.leave(m);
  CHECK(b.shares()[0].budget == gpt_full);
  CHECK(b.step(g).plan().decisions.empty());
  CHECK(b.step(g).steps_run() == 2);  // the step counter carries over a re-plan
  gpt.train(b.step(g));
  CHECK(gpt.same_weights());
  CHECK(mlp.same_weights());
  CHECK_THROWS_WITH(b.leave(m), Catch::Contains("no step"));
}

TEST_CASE("steps joining and leaving at random never take the broker past its budget, and compute what they "
          "compute alone",
          "[broker]") {
  Family gpt(gpt_config()), mlp(mlp_config()), gcn(gcn_config());
  struct Kind {
    Family* f;
    bool train;
    std::string name;
    std::optional<MemoryBroker::Id> id;
    int joined = 0;
  };
  std::vector<Kind> kinds{{&mlp, true, "mlp train", {}}, {&mlp, false, "mlp eval", {}},
                          {&gpt, true, "gpt train", {}}, {&gpt, false, "gpt eval", {}},
                          {&gcn, true, "gcn train", {}}, {&gcn, false, "gcn eval", {}}};
  // A budget under what all six need at their least, so some joins are
  // refused, and far under what they need unconstrained.
  std::size_t least = 0, full = 0;
  for (Family* f : {&mlp, &gpt, &gcn}) {
    const auto t = f->train_bytes(), e = f->eval_bytes();
    least += t.first + e.first;
    full += t.second + e.second;
  }
  REQUIRE(least < full);
  const std::size_t budget = least * 3 / 4;
  MemoryBroker b(Budget{.device = budget});
  Rng rng(2026);
  int joins = 0, leaves = 0, refused = 0;
  for (int event = 0; event < 36; ++event) {
    Kind& k = kinds[rng.below(kinds.size())];
    if (k.id) {
      b.leave(*k.id);
      k.id.reset();
      ++leaves;
    } else {
      const std::size_t there = b.size();
      try {
        k.id = k.train ? k.f->join_train(b, k.name) : k.f->join_eval(b, k.name);
        ++joins;
        ++k.joined;
      } catch (const BudgetError& e) {
        ++refused;
        CHECK(e.smallest_feasible_bytes > budget);
        CHECK(b.size() == there);
      }
    }
    INFO("event " << event << ": " << b.summary());
    CHECK(b.planned_device_bytes() <= budget);
    for (Kind& r : kinds)
      if (r.id) r.train ? r.f->train(b.step(*r.id)) : r.f->evaluate(b.step(*r.id));
    CHECK(b.measured_device_bytes() <= budget);
  }
  CHECK(joins > 3);
  CHECK(leaves > 1);
  CHECK(refused > 0);
  CHECK(mlp.same_weights());
  CHECK(gpt.same_weights());
  CHECK(gcn.same_weights());
  for (const Kind& k : kinds) {
    INFO(k.name);
    CHECK(k.joined > 0);
  }
}

namespace {
// A gpt whose sequence length changes from step to step.
struct VaryingGpt {
  nn::Gpt model;
  optim::AdamW opt;
  VaryingGpt()
      : model((nn::manual_seed(3), nn::GptConfig{.vocab = 32, .context = 24, .layers = 1, .d_model = 16, .heads = 2})),
        opt(model.parameters(), {.lr = 3e-3}) {}
  auto loss_fn() {
    return [this](Var x, Var y) { return model.loss(x, y); };
  }
};
bool same_tensor_bits(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i].nbytes() != b[i].nbytes() || std::memcmp(a[i].raw(), b[i].raw(), a[i].nbytes()) != 0) return false;
  return true;
}
std::vector<Tensor> varying_batch(int s, std::int64_t length) {
  Rng g(700 + std::uint64_t(s));
  Tensor x({2, length}, DType::i32), y({2, length}, DType::i32);
  for (std::int64_t i = 0; i < x.numel(); ++i) x.data<std::int32_t>()[i] = std::int32_t(g.below(32));
  for (std::int64_t i = 0; i < y.numel(); ++i) y.data<std::int32_t>()[i] = std::int32_t(g.below(32));
  return {x, y};
}
}  // namespace

TEST_CASE("shape cache: a gpt whose sequence length changes every step trains bit for bit as one step per length "
          "compiled alone, inside one budget, evicting the least recently run lengths",
          "[broker][shapes]") {
  const std::vector<std::int64_t> lengths{8, 16, 24, 8, 12, 16, 24, 24, 8, 12, 16, 8};
  const std::vector<InputSpec> specs{input<std::int32_t>({2, 8}, "tokens"), input<std::int32_t>({2, 8}, "targets")};
  // The reference: a step per length, compiled alone with no budget, run in
  // the same order over the same parameters.
  VaryingGpt ref;
  std::map<std::int64_t, std::unique_ptr<Step>> alone;
  std::vector<float> expected;
  std::size_t largest = 0;
  for (std::size_t s = 0; s < lengths.size(); ++s) {
    const std::int64_t T = lengths[s];
    if (!alone.count(T)) {
      alone[T] = std::make_unique<Step>(compile(ref.loss_fn(), {input<std::int32_t>({2, T}), input<std::int32_t>({2, T})},
                                                ref.opt));
      largest = std::max(largest, alone[T]->plan().total_bytes());
    }
    auto b = varying_batch(int(s), T);
    expected.push_back(alone[T]->run(b[0], b[1]));
  }
  // The cache: room for the longest length and a little, so lengths leave
  // it as others arrive, and at most three cached.
  VaryingGpt cached;
  const Budget total{.device = largest * 3 / 2};
  auto cache = cache_shapes(cached.loss_fn(), specs, cached.opt, total, {}, 3);
  std::vector<float> got;
  for (std::size_t s = 0; s < lengths.size(); ++s) {
    auto b = varying_batch(int(s), lengths[s]);
    got.push_back(cache->run(b));
    CHECK(cache->broker().planned_device_bytes() <= total.device);
    CHECK(cache->cached() <= 3);
  }
  CHECK(got == expected);
  CHECK(same_tensor_bits(cached.model.parameters(), ref.model.parameters()));
  CHECK(cache->evicted() > 0);                      // lengths left to make room
  CHECK(cache->compiled() == cache->evicted() + cache->cached());
  CHECK(cache->hits() + cache->compiled() == lengths.size());
  CHECK(cache->hits() > 0);
  // Measured, every cached step inside the budget together.
  auto b = varying_batch(99, 16);
  Step::Audit a = cache->step_for(b).audit(b[0], b[1]);
  CHECK(a.canary_intact);
  CHECK(cache->broker().measured_device_bytes() <= total.device);
  // A wrong element type is named before anything is compiled.
  Tensor f({2, 8}, DType::f32);
  CHECK_THROWS_WITH(cache->run({f, b[1]}), Catch::Contains("input 0 (tokens) is f32, the step takes i32"));
}

namespace {
// A copy of the mlp zoo model's forward: what a serving step answers.
std::function<Var(Var)> logits_of(zoo::Workload& w) {
  auto* m = static_cast<zoo::Mlp*>(w.model.get());
  return [m](Var x) { return m->forward(x); };
}
std::vector<Tensor> clones(const std::vector<Tensor>& ts) {
  std::vector<Tensor> out;
  for (const Tensor& t : ts) out.push_back(t.clone());
  return out;
}
}  // namespace

TEST_CASE("corun: streams are admitted from plans until one does not fit, and training beside all of them at once, "
          "each in its own thread, stays inside the budget and computes what each computes alone",
          "[broker][corun]") {
  const zoo::Config c = mlp_config();
  DeviceProfile profile = DeviceProfile::defaults("cpu", 1);
  // One thread each: steps running at once share the cores, and one thread
  // each keeps them from waiting on each other; the bits would be the same
  // at any count (worker_team.hpp).
  const CompileOptions o{.threads = 1, .profile = &profile, .replan = false};
  zoo::Workload trained = zoo::make(c), served = zoo::make(c), twin = zoo::make(c), ref = zoo::make(c);
  const std::int64_t Q = 8;  // queries per serving run
  const std::vector<InputSpec> query_in{{{DType::f32, Shape{Q, c.features}}, "queries"}};
  auto serve_fn = logits_of(served);
  auto ref_fn = logits_of(ref);
  auto serve_compile = [&](const Budget& b) { return compile_inference(serve_fn, query_in, b, o); };
  auto serve_plan = [&](const Budget& b) { return plan_inference(serve_fn, query_in, b, o); };

  // Room for training unconstrained and about three serving arenas: how
  // many streams fit is for the broker to find, not for this test to fix.
  const std::size_t train_full = zoo::plan(trained, {}, o).plan.total_bytes();
  const PlannedStep one = serve_plan({});
  const std::size_t budget = train_full + one.plan.persistent_bytes + 3 * one.plan.arena_bytes +
                             one.plan.arena_bytes / 2;
  MemoryBroker broker(Budget{.device = budget});
  const auto train_id = broker.join("retraining", [&](const Budget& b) { return zoo::compile(trained, b, o); },
                                    [&](const Budget& b) { return zoo::plan(trained, b, o); });
  const StreamAdmission admitted = admit_streams(broker, "serving", serve_compile, serve_plan, 64);
  INFO(broker.summary());
  const int N = int(admitted.ids.size());
  REQUIRE(N >= 2);
  REQUIRE(N < 64);  // stopped by a refusal, which names what one more would need
  CHECK(admitted.next_needs_bytes > budget);
  CHECK(admitted.refusal.find("serving " + std::to_string(N + 1)) != std::string::npos);
  CHECK(broker.planned_device_bytes() <= budget);
  // The served weights are counted once, by the first stream that keeps them.
  const auto shares = broker.shares();
  for (std::size_t i = 2; i < shares.size(); ++i) CHECK(shares[i].shared == shares[i].persistents);

  ServedWeights weights(*trained.model, *served.model);
  Step& train = broker.step(train_id);
  std::vector<Step*> serving;
  for (auto id : admitted.ids) serving.push_back(&broker.step(id));
  const int train_steps = 12, publish_every = 3, queries = 5;
  std::vector<float> losses;
  std::map<std::int64_t, std::vector<Tensor>> published{{0, clones(trained.model->parameters())}};
  struct Answer {
    std::int64_t version;
    int query;
    Tensor logits;
  };
  std::vector<std::vector<Answer>> answers(static_cast<std::size_t>(N));
  std::atomic<bool> trained_all{false};
  auto query = [&](int k) {
    Rng r(500 + std::uint64_t(k));
    Tensor x({Q, c.features});
    zoo::fill_normal(x, r);
    return x;
  };
  {
    std::vector<std::thread> threads;
    threads.emplace_back([&] {
      for (int s = 0; s < train_steps; ++s) {
        auto b = trained.batch(std::uint64_t(s));
        losses.push_back(train.run(b[0], b[1]));
        if ((s + 1) % publish_every == 0) {
          weights.publish(serving);
          published[weights.version()] = clones(trained.model->parameters());
        }
      }
    });
    // The streams ask back to back until training is done: a publish must
    // get in between their runs (a lock that prefers readers would hang
    // here), and each keeps its first answers to check.
    for (int i = 0; i < N; ++i)
      threads.emplace_back([&, i] {
        for (int k = 0; k < queries || !trained_all.load(); ++k) {
          const Tensor x = query(k % queries);
          auto hold = weights.reading();
          serving[std::size_t(i)]->run(x);
          if (answers[std::size_t(i)].size() < 40)
            answers[std::size_t(i)].push_back({weights.version(), k % queries, serving[std::size_t(i)]->output().clone()});
        }
      });
    threads[0].join();
    trained_all = true;
    for (std::size_t t = 1; t < threads.size(); ++t) threads[t].join();
  }
  CHECK(broker.measured_device_bytes() <= budget);
  CHECK(weights.version() == train_steps / publish_every);

  // Training beside the streams: the twin's losses, trained alone.
  Step twin_step = zoo::compile(twin, {}, o);
  for (int s = 0; s < train_steps; ++s) {
    auto b = twin.batch(std::uint64_t(s));
    CHECK(bits_of(losses[std::size_t(s)]) == bits_of(twin_step.run(b[0], b[1])));
  }
  // Each answer: what a serving step alone computes from the weights of the
  // version it read.
  Step alone = compile_inference(ref_fn, query_in, {}, o);
  auto ref_params = ref.model->parameters();
  int checked = 0;
  for (const auto& stream : answers)
    for (const Answer& a : stream) {
      const auto& w = published.at(a.version);
      for (std::size_t p = 0; p < w.size(); ++p) ref_params[p].copy_from(w[p]);
      alone.parameters_changed();
      alone.run(query(a.query));
      CHECK(std::memcmp(alone.output().raw(), a.logits.raw(), a.logits.nbytes()) == 0);
      ++checked;
    }
  CHECK(checked >= N * queries);
}

TEST_CASE("corun: served weights are refused when they are the trained tensors themselves or another model's",
          "[broker][corun]") {
  zoo::Workload a = zoo::make(mlp_config()), b = zoo::make({.family = "mlp", .batch = 16, .layers = 2, .width = 48,
                                                             .features = 32});
  CHECK_THROWS_WITH(ServedWeights(*a.model, *a.model), Catch::Contains("the same tensor in both models"));
  CHECK_THROWS_WITH(ServedWeights(*a.model, *b.model), Catch::Contains("same model"));
  // One stream at least, or it is not a corun: a first stream that cannot
  // fit is the broker's own refusal.
  MemoryBroker tiny(Budget{.device = 64});
  auto fn = logits_of(a);
  const std::vector<InputSpec> in{{{DType::f32, Shape{4, 32}}, "queries"}};
  CHECK_THROWS_AS(admit_streams(tiny, "serving", [&](const Budget& u) { return compile_inference(fn, in, u); },
                                [&](const Budget& u) { return plan_inference(fn, in, u); }, 4),
                  BudgetError);
}

TEST_CASE("a broker's steps re-plan on measured times where all steps still fit the budget, and compute the bits "
          "they compute alone",
          "[broker][replan]") {
  // Every prediction misses, so each step re-plans after its timed runs.
  DeviceProfile slow = test_profiles::thousandfold_slow();
  Family f(gpt_config());
  f.o.profile = &slow;
  f.o.replan = true;
  const auto [train_least, train_full] = f.train_bytes();
  const auto [eval_least, eval_full] = f.eval_bytes();
  const std::size_t budget = (train_least + train_full) / 2 + eval_least;  // both steps' budgets bind
  MemoryBroker b(Budget{.device = budget});
  const auto train = f.join_train(b, "train");
  const auto eval = f.join_eval(b, "eval");
  INFO(b.summary());
  for (int k = 0; k < 6; ++k) {
    f.train(b.step(train));
    f.evaluate(b.step(eval));
    CHECK(b.planned_device_bytes() <= budget);
    CHECK(b.measured_device_bytes() <= budget);
  }
  CHECK(f.same_weights());
  bool taken = false;
  for (auto id : {train, eval}) {
    const Step& s = b.step(id);
    INFO(s.replan_declined());
    CHECK_FALSE(s.may_replan());  // tried: taken, or declined by the arena or the broker
    CHECK(s.replans() + !s.replan_declined().empty() <= 1);
    taken |= s.replans() == 1;
  }
  // A step joining later: the shares are found with the plans the others'
  // shares give, so a re-planned step is planned again with its share.
  MemoryBroker::Id third = 0;
  try {
    third = f.join_eval(b, "eval again");
  } catch (const BudgetError&) {
    third = 0;  // no room beside the two: nothing was re-planned
  }
  if (third) {
    if (taken) CHECK(b.step(train).replans() + b.step(eval).replans() == 0);
    CHECK(b.planned_device_bytes() <= budget);
    f.train(b.step(train));
    f.evaluate(b.step(third));
    CHECK(b.measured_device_bytes() <= budget);
  }
}

TEST_CASE("a broker takes a step's re-plan only where all steps' device bytes still fit its budget with it",
          "[broker][replan]") {
  Family f(mlp_config());
  const auto [train_least, train_full] = f.train_bytes();
  const auto [eval_least, eval_full] = f.eval_bytes();
  const std::size_t budget = train_least + eval_least + f.weight_bytes() / 4;
  REQUIRE(budget < train_full);
  MemoryBroker b(Budget{.device = budget});
  const auto train = f.join_train(b, "train");
  f.join_eval(b, "eval");
  const std::size_t before = b.planned_device_bytes();
  // Its own plan fits, as it did when it joined.
  CHECK(b.replan_fits(train, b.step(train).graph(), b.step(train).plan()).empty());
  // A plan keeping every weight and moment on the device, in the same
  // arena, would take the steps past the budget: declined, with the bytes.
  const PlannedStep all_on_device = zoo::plan(f.w, {}, f.o);
  const std::string why = b.replan_fits(train, *all_on_device.graph, all_on_device.plan);
  CHECK_THAT(why, Catch::Contains("'train' kept its plan") && Catch::Contains(format_bytes(budget)));
  // What the broker counts is unchanged by the declined one.
  CHECK(b.planned_device_bytes() == before);
  CHECK(b.replan_fits(train, b.step(train).graph(), b.step(train).plan()).empty());
}
