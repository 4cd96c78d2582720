// plan/ and the executor: the schedule, in-place reuse, the independent
// verifier (and planted planner bugs it must catch), and execution that
// matches the prediction byte for byte without allocating.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <frugal/frugal.hpp>
#include <frugal/runtime/executor.hpp>
#include <frugal/backend/cpu/worker_team.hpp>
#include <new>
#include <numeric>
#include <random>
#include <thread>

#include "../samples/common/plot.hpp"
#include "../tools/model_zoo.hpp"
#include "counting_backend.hpp"

using namespace frugal;

// ---- counting every C++ allocation in this test binary ------------------------
namespace {
std::atomic<long> g_allocations{0};
std::atomic<bool> g_counting{false};
void* counted(std::size_t n, std::size_t align = 0) {
  if (g_counting.load(std::memory_order_relaxed)) g_allocations.fetch_add(1, std::memory_order_relaxed);
  void* p = align ? std::aligned_alloc(align, (n + align - 1) / align * align) : std::malloc(n ? n : 1);
  if (!p) throw std::bad_alloc();
  return p;
}
}  // namespace
// GCC 12 warns that these deletes free what "operator new" returned once it
// inlines them into a caller (-Wmismatched-new-delete); both are this file's
// replacements over malloc, so the pairing is right.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void* operator new(std::size_t n) { return counted(n); }
void* operator new[](std::size_t n) { return counted(n); }
void* operator new(std::size_t n, std::align_val_t a) { return counted(n, std::size_t(a)); }
void* operator new[](std::size_t n, std::align_val_t a) { return counted(n, std::size_t(a)); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
#pragma GCC diagnostic pop

namespace {

struct Net : nn::Module {
  std::vector<std::unique_ptr<nn::Linear>> layers;
  Net(std::vector<int> widths, DType dt = DType::f32) {
    for (std::size_t i = 0; i + 1 < widths.size(); ++i) {
      layers.push_back(std::make_unique<nn::Linear>(widths[i], widths[i + 1], nn::LinearOptions{.dtype = dt}));
      register_module(std::string("fc") + std::to_string(i), *layers.back());
    }
  }
  Var forward(Var x) {
    for (std::size_t i = 0; i < layers.size(); ++i) {
      x = (*layers[i])(x);
      if (i + 1 < layers.size()) x = i % 2 ? gelu(x) : relu(x) * 0.5 + 0.1;
    }
    return x;
  }
};

void fill_batch(Tensor& x, Tensor& y, std::uint64_t seed, int classes) {
  Rng r(seed);
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    if (x.dtype() == DType::f64) x.data<double>()[i] = r.normal();
    else x.data<float>()[i] = float(r.normal());
  }
  for (std::int64_t i = 0; i < y.numel(); ++i) y.data<std::int32_t>()[i] = std::int32_t(r.below(std::uint64_t(classes)));
}

struct Trained {
  std::unique_ptr<Net> net;
  std::unique_ptr<Optimizer> opt;
  Step step;
};

Trained make_training(std::vector<int> widths, int batch, CompileOptions o = {}, bool adam = false,
                      DType dt = DType::f32) {
  nn::manual_seed(21);
  auto net = std::make_unique<Net>(widths, dt);
  std::unique_ptr<Optimizer> opt;
  if (adam) opt = std::make_unique<optim::AdamW>(net->parameters(), optim::AdamWOptions{.lr = 1e-3});
  else opt = std::make_unique<optim::SGD>(net->parameters(), optim::SGDOptions{.lr = 0.05, .momentum = 0.9});
  Net* n = net.get();
  Step step = compile([n](Var x, Var y) { return cross_entropy(n->forward(x), y); },
                      {InputSpec{{dt, Shape{batch, widths.front()}}, "x"}, input<std::int32_t>({batch}, "y")}, *opt,
                      {}, o);
  return {std::move(net), std::move(opt), std::move(step)};
}

}  // namespace

TEST_CASE("the verifier accepts every plan the planner makes", "[plan]") {
  for (bool reorder : {false, true})
    for (bool inplace : {false, true}) {
      CompileOptions o{.plan = {.reorder = reorder, .inplace = inplace}, .verify = false};
      auto t = make_training({9, 16, 16, 5}, 7, o, reorder);
      INFO("reorder " << reorder << ", inplace " << inplace);
      auto report = t.step.verify();
      INFO(report.str());
      CHECK(report.ok());
    }
  Net net({4, 6, 3});
  Step inference = compile_inference([&](Var x) { return softmax(net.forward(x)); }, {input<float>({2, 4})});
  CHECK(inference.verify().ok());
}

TEST_CASE("planted planner bugs are caught by the verifier", "[plan]") {
  auto t = make_training({9, 16, 16, 5}, 7, {.verify = false});
  const Graph& g = t.step.graph();
  Plan good = t.step.plan();
  std::vector<ValueId> roots;  // the loss: the one value a training step keeps
  for (ValueId v = 0; v < ValueId(g.num_values()); ++v)
    if (g.value(v).producer >= 0 && g.node(g.value(v).producer).op->name() == "cross_entropy") roots.push_back(v);
  REQUIRE(plan::verify(g, good, roots).ok());

  SECTION("two values alive together share bytes") {
    Plan bad = good;
    // The first matmul-like op's output placed over one of its live inputs' bytes.
    bool planted = false;
    for (NodeId n : bad.schedule) {
      const Node& node = g.node(n);
      if (node.op->name() != "linear") continue;
      ValueId in = node.inputs[0], out = node.outputs[0];
      if (!bad.offset_of[std::size_t(in)]) continue;
      bad.offset_of[std::size_t(out)] = bad.offset_of[std::size_t(in)];
      planted = true;
      break;
    }
    REQUIRE(planted);
    auto r = plan::verify(g, bad, roots);
    INFO(r.str());
    CHECK_FALSE(r.ok());
  }
  SECTION("a consumer scheduled before its producer") {
    Plan bad = good;
    std::swap(bad.schedule[0], bad.schedule[1]);
    CHECK_FALSE(plan::verify(g, bad, roots).ok());
  }
  SECTION("a value placed past the end of the arena") {
    Plan bad = good;
    for (auto& o : bad.offset_of)
      if (o && *o + 256 >= bad.arena_bytes) {
        *o += 1024;
        break;
      }
    auto r = plan::verify(g, bad, roots);
    CHECK_THAT(r.str(), Catch::Contains("past the arena"));
  }
  SECTION("an offset off the alignment") {
    Plan bad = good;
    for (auto& o : bad.offset_of)
      if (o) {
        *o += 4;
        break;
      }
    CHECK_THAT(plan::verify(g, bad, roots).str(), Catch::Contains("not a multiple"));
  }
  SECTION("the loss overwritten before the step ends") {
    Plan bad = good;
    ValueId loss = roots[0];
    // Put the last value the optimizer phase reads... any value produced after the loss, over the loss.
    int loss_pos = -1;
    for (int t = 0; t < int(bad.schedule.size()); ++t)
      for (ValueId o : g.node(bad.schedule[std::size_t(t)]).outputs)
        if (o == loss) loss_pos = t;
    bool planted = false;
    for (int t = loss_pos + 1; t < int(bad.schedule.size()) && !planted; ++t)
      for (ValueId o : g.node(bad.schedule[std::size_t(t)]).outputs)
        if (bad.offset_of[std::size_t(o)] && g.value(o).meta.nbytes() >= 4) {
          bad.offset_of[std::size_t(o)] = bad.offset_of[std::size_t(loss)];
          planted = true;
          break;
        }
    REQUIRE(planted);
    CHECK_FALSE(plan::verify(g, bad, roots).ok());
  }
  SECTION("an update scheduled before a reader of its parameter") {
    Plan bad = good;
    // Move the first optimizer update to just after the first forward op.
    auto it = std::find_if(bad.schedule.begin(), bad.schedule.end(),
                           [&](NodeId n) { return g.node(n).phase == Phase::optimizer; });
    REQUIRE(it != bad.schedule.end());
    NodeId update = *it;
    bad.schedule.erase(it);
    bad.schedule.insert(bad.schedule.begin() + 1, update);
    CHECK_FALSE(plan::verify(g, bad, roots).ok());
  }
}

TEST_CASE("updates run as soon as their gradient is complete, and in-place reuse lowers the peak", "[plan]") {
  std::size_t baseline = 0, reordered = 0, both = 0;
  {
    auto t = make_training({64, 256, 256, 256, 10}, 32, {.plan = {.reorder = false, .inplace = false}});
    baseline = t.step.plan().lower_bound_bytes;
  }
  {
    auto t = make_training({64, 256, 256, 256, 10}, 32, {.plan = {.reorder = true, .inplace = false}});
    reordered = t.step.plan().lower_bound_bytes;
    // Each update directly follows the completion of its gradient.
    const Graph& g = t.step.graph();
    const auto& s = t.step.plan().schedule;
    for (std::size_t i = 0; i < s.size(); ++i) {
      if (g.node(s[i]).phase != Phase::optimizer) continue;
      ValueId grad = g.node(s[i]).inputs[1];
      std::size_t made = 0;
      for (std::size_t j = 0; j < i; ++j)
        for (ValueId o : g.node(s[j]).outputs)
          if (o == grad) made = j;
      CHECK(i - made <= 3);
    }
  }
  {
    auto t = make_training({64, 256, 256, 256, 10}, 32, {});
    both = t.step.plan().lower_bound_bytes;
  }
  INFO("lower bound: capture order " << baseline << ", reordered " << reordered << ", reordered + in place " << both);
  CHECK(reordered < baseline);
  CHECK(both <= reordered);

  // A chain of elementwise ops: in place, each output takes over its dying
  // input, so one buffer serves the whole chain.
  auto chain = [](bool inplace) {
    return compile_inference([](Var x) { return frugal::exp(frugal::tanh(x * 2.0 + 1.0)) - 0.5; },
                             {input<float>({256, 256})}, {}, {.plan = {.reorder = true, .inplace = inplace}});
  };
  std::size_t one = 256 * 256 * 4;
  CHECK(chain(false).plan().lower_bound_bytes == 2 * one);
  CHECK(chain(true).plan().lower_bound_bytes == one);
  Tensor x({256, 256});
  Step s = chain(true);
  auto a = s.audit(x);
  CHECK(a.high_water == one);
}

TEST_CASE("planning choices never change results", "[plan]") {
  auto run = [](PlanOptions po, std::vector<float>& losses, std::vector<float>& params) {
    auto t = make_training({10, 24, 24, 4}, 16, {.threads = 2, .plan = po}, true);
    Tensor x({16, 10}), y({16}, DType::i32);
    for (int s = 0; s < 6; ++s) {
      fill_batch(x, y, std::uint64_t(s), 4);
      losses.push_back(t.step.run(x, y));
    }
    for (auto& p : t.net->parameters())
      for (float v : p.to_vector<float>()) params.push_back(v);
  };
  std::vector<float> l0, p0;
  run({.reorder = false, .inplace = false}, l0, p0);
  for (PlanOptions po : {PlanOptions{true, false}, PlanOptions{false, true}, PlanOptions{true, true}}) {
    std::vector<float> l, p;
    run(po, l, p);
    CHECK(std::memcmp(l.data(), l0.data(), l.size() * 4) == 0);
    CHECK(std::memcmp(p.data(), p0.data(), p.size() * 4) == 0);
  }
}

TEST_CASE("the executor's measured high-water mark equals the prediction, and the canary is untouched", "[plan][executor]") {
  struct Config {
    std::vector<int> widths;
    int batch;
    bool adam;
    DType dt;
  };
  for (auto c : {Config{{784, 256, 256, 10}, 64, true, DType::f32}, Config{{7, 13, 5}, 1, false, DType::f32},
                 Config{{32, 64, 64, 64, 3}, 17, true, DType::f64}}) {
    auto t = make_training(c.widths, c.batch, {}, c.adam, c.dt);
    Tensor x({c.batch, c.widths.front()}, c.dt), y({c.batch}, DType::i32);
    fill_batch(x, y, 3, c.widths.back());
    auto a = t.step.audit(x, y);
    INFO("batch " << c.batch << ": measured " << a.high_water << ", predicted " << a.predicted << ", arena "
                  << t.step.plan().arena_bytes);
    CHECK(a.high_water == a.predicted);
    CHECK(a.canary_intact);
    CHECK(t.step.plan().arena_ratio() <= 1.05);
  }
  Net net({5, 8, 3});
  Step inference = compile_inference([&](Var x) { return log_softmax(net.forward(x)); }, {input<float>({4, 5})});
  Tensor x({4, 5});
  auto a = inference.audit(x);
  CHECK(a.high_water == a.predicted);
}

TEST_CASE("a step allocates nothing while it runs", "[plan][executor]") {
  auto t = make_training({784, 256, 256, 10}, 64, {.threads = 2}, true);
  Tensor x({64, 784}), y({64}, DType::i32);
  fill_batch(x, y, 1, 10);
  t.step.run(x, y);  // the first run may start OpenMP's and OpenBLAS's threads
  g_allocations = 0;
  g_counting = true;
  for (int s = 0; s < 3; ++s) t.step.run(x, y);
  g_counting = false;
  CHECK(g_allocations.load() == 0);
  // The counter itself works: compiling allocates.
  g_counting = true;
  auto other = make_training({4, 4, 2}, 2);
  g_counting = false;
  CHECK(g_allocations.load() > 0);
}

TEST_CASE("training steps of every op family allocate nothing while they run", "[plan][executor]") {
  // Each zoo family (conv + batch norm, embedding + layer norm + fused
  // attention, spmm), plus dropout and a bf16 model with loss scaling: kernels
  // take scratch from the plan, never from the heap.
  auto count_steps = [](Step& step, const std::vector<Tensor>& batch) {
    auto run = [&] { return batch.size() == 2 ? step.run(batch[0], batch[1]) : step.run(batch[0], batch[1], batch[2]); };
    run();  // the first run may start OpenMP's and OpenBLAS's threads
    g_allocations = 0;
    g_counting = true;
    for (int s = 0; s < 3; ++s) run();
    g_counting = false;
    return g_allocations.load();
  };
  for (std::string family : {"resnet", "gpt", "gcn"}) {
    zoo::Config c;
    c.family = family;
    c.layers = 1;
    c.width = family == "resnet" ? 8 : 32;
    c.batch = family == "gcn" ? 300 : 4;
    c.image = 8;
    c.seq = 16;
    c.vocab = 40;
    c.features = 16;
    auto w = zoo::make(c);
    Step step = zoo::compile(w, {}, {.threads = 2});
    INFO(family);
    CHECK(count_steps(step, w.batch(1)) == 0);
  }
  {
    nn::Gpt gpt(nn::GptConfig{.vocab = 30, .context = 8, .layers = 1, .d_model = 16, .heads = 2, .dropout = 0.1});
    optim::AdamW opt(gpt.parameters(), {});
    Step step = compile([&](Var i, Var t) { return gpt.loss(i, t); },
                        {input<std::int32_t>({2, 8}), input<std::int32_t>({2, 8})}, opt, {}, {.threads = 2});
    Tensor ids({2, 8}, DType::i32);
    for (std::int64_t i = 0; i < ids.numel(); ++i) ids.data<std::int32_t>()[i] = std::int32_t(i % 30);
    INFO("gpt with dropout");
    CHECK(count_steps(step, {ids, ids}) == 0);
  }
  {
    nn::Linear fc1(16, 32), fc2(32, 4);
    std::vector<Tensor> params = fc1.parameters();
    for (auto& p : fc2.parameters()) params.push_back(p);
    optim::AdamW opt(params, {});
    optim::LossScaler scaler;
    Step step = compile(
        [&](Var x, Var y) { return cross_entropy(fc2(relu(fc1(cast(x, DType::f16)))), y); },
        {input<float>({8, 16}), input<std::int32_t>({8})}, opt, {}, {.threads = 2, .loss_scaler = &scaler});
    Tensor x({8, 16}), y({8}, DType::i32);
    fill_batch(x, y, 3, 4);
    INFO("f16 with loss scaling");
    CHECK(count_steps(step, {x, y}) == 0);
  }
}

TEST_CASE("a region nested in a helper's chunk allocates nothing, whichever thread runs it", "[plan][executor][team]") {
  // Which thread of a team first runs a nested region (attention's heads
  // inside a chunk) depends on the load; a helper that made a team of its
  // own there allocated in a step's later run. Here each of two threads is
  // made to run one chunk (each waits, up to a second, for the other to
  // arrive), on a fresh caller whose helper has run chunks but no nested
  // region yet.
  long allocations = -1;
  int threads_seen = 0;
  std::thread caller([&] {
    cpu::WorkerTeam& team = cpu::WorkerTeam::mine();
    auto both_threads = [&](auto&& body) {
      std::atomic<int> arrived{0};
      std::atomic<std::thread::id> ids[2];
      team.run(2, 2, [&](std::int64_t c) {
        ids[c] = std::this_thread::get_id();
        arrived.fetch_add(1);
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(1);
        while (arrived.load() < 2 && std::chrono::steady_clock::now() < until) std::this_thread::yield();
        body();
      });
      return ids[0].load() != ids[1].load() ? 2 : 1;
    };
    both_threads([] {});  // the helper exists and has run a chunk
    std::atomic<int> inner{0};
    g_allocations = 0;
    g_counting = true;
    threads_seen = both_threads([&] { cpu::WorkerTeam::mine().run(4, 2, [&](std::int64_t) { inner++; }); });
    g_counting = false;
    allocations = g_allocations.load();
    if (inner.load() != 8) allocations = -2;
  });
  caller.join();
  REQUIRE(threads_seen == 2);  // else the machine never ran the helper within a second: nothing was tested
  CHECK(allocations == 0);
}

TEST_CASE("plans explain themselves as text, JSON and SVG", "[plan][report]") {
  auto t = make_training({32, 64, 10}, 8, {}, true);
  std::string s = t.step.summary();
  CHECK_THAT(s, Catch::Contains("lower bound") && Catch::Contains("live at the peak") &&
                    Catch::Contains("optimizer state") && Catch::Contains("gradients"));
  std::string j = plan::json(t.step.graph(), t.step.plan(), "mlp");
  for (const char* key : {"\"model\":\"mlp\"", "\"peak_bytes\":", "\"lower_bound_bytes\":", "\"arena_bytes\":",
                          "\"by_category\":{", "\"parameters\":", "\"activations\":"})
    CHECK_THAT(j, Catch::Contains(key));
  std::string svg = plan::svg(t.step.graph(), t.step.plan(), "mlp");
  CHECK_THAT(svg, Catch::StartsWith("<svg") && Catch::Contains("highest byte written") && Catch::EndsWith("</svg>\n"));
  std::size_t rects = 0;
  for (std::size_t p = svg.find("<rect"); p != std::string::npos; p = svg.find("<rect", p + 1)) ++rects;
  CHECK(rects >= t.step.plan().intervals.size());
}


TEST_CASE("SVG text is XML-escaped: a title with < & \" > gives well-formed SVG", "[plan][report]") {
  const std::string title = "<a & \"b\">";
  const std::string escaped = "&lt;a &amp; &quot;b&quot;&gt;";
  auto t = make_training({8, 16, 4}, 4);
  std::string plan_svg = plan::svg(t.step.graph(), t.step.plan(), title);
  samples::MemoryPlot mem{{1, 2, 3}, {1, 3, 2}, 4, 3};
  samples::LossPlot loss{{2.0f, 1.5f, 1.0f}, {{2, 1.4}}, "val <loss> & 'acc'"};
  std::string sample_svg = samples::plot_svg(title, loss, mem);
  for (const std::string* svg : {&plan_svg, &sample_svg}) {
    CHECK_THAT(*svg, Catch::Contains(escaped));
    CHECK(svg->find("<a") == std::string::npos);
    CHECK(svg->find("& ") == std::string::npos);  // every & starts an entity
    CHECK(svg->find("\\\"") == std::string::npos);  // no JSON escapes
  }
  CHECK_THAT(sample_svg, Catch::Contains("val &lt;loss&gt; &amp; &apos;acc&apos;"));
  CHECK(xml_escape("&<>\"'\t\x01x") == "&amp;&lt;&gt;&quot;&apos;\t\xef\xbf\xbdx");
}

TEST_CASE("every model family plans within 5% of its lower bound and runs exactly as predicted", "[plan][zoo]") {
  for (zoo::Config c : {zoo::Config{.family = "mlp", .batch = 32, .layers = 2, .width = 128, .features = 64},
                        zoo::Config{.family = "gpt", .batch = 2, .layers = 2, .width = 64, .seq = 32, .vocab = 64},
                        zoo::Config{.family = "gcn", .batch = 300, .layers = 2, .width = 32, .features = 48, .classes = 5},
                        zoo::Config{.family = "mlp", .batch = 5, .layers = 3, .width = 33, .dtype = DType::f64,
                                    .optimizer = "sgd", .features = 17}}) {
    INFO(c.name());
    auto w = zoo::make(c);
    Step step = zoo::compile(w);
    CHECK(step.verify().ok());
    CHECK(step.plan().arena_ratio() <= 1.05);
    auto batch = w.batch(3);
    auto a = batch.size() == 2 ? step.audit(batch[0], batch[1]) : step.audit(batch[0], batch[1], batch[2]);
    CHECK(a.high_water == a.predicted);
    CHECK(a.canary_intact);
    // Planning without compiling gives the same plan.
    auto w2 = zoo::make(c);
    PlannedStep ps = zoo::plan(w2);
    CHECK(ps.plan.peak_bytes == step.plan().peak_bytes);
    CHECK(ps.plan.lower_bound_bytes == step.plan().lower_bound_bytes);
  }
}

TEST_CASE("an audit catches a write beyond the predicted peak", "[plan][executor]") {
  nn::Linear fc(4, 3);
  optim::SGD opt(fc.parameters(), {.lr = 0.1});
  auto fn = [&](Var x, Var y) { return cross_entropy(fc(x), y); };
  std::vector<InputSpec> specs{input<float>({2, 4}), input<std::int32_t>({2})};
  CompileOptions o;
  auto prepared = detail::prepare_training(fn, specs, opt, o);
  Plan plan = detail::plan_prepared(prepared, {}, o);
  // A planted executor-side bug: the loss lands past the arena, in the canary.
  plan.offset_of[std::size_t(prepared.loss)] = plan.arena_bytes;
  Step step(Step::Parts{prepared.c.graph, plan, make_backend("cpu"), &opt, prepared.c.inputs, prepared.loss, {}, {},
                        0, prepared.roots});
  Tensor x({2, 4}), y({2}, DType::i32);
  auto a = step.audit(x, y);
  CHECK(a.high_water > a.predicted);
  CHECK_FALSE(a.canary_intact);
}

// ---- planned scratch space ------------------------------------------------------
namespace {

// y = 2x, computed through the op's scratch space: the kernel copies x into
// the workspace, doubles it there and copies it out, so the result is right
// only if the workspace it was handed is real and its own.
class DoubleViaScratch final : public Op {
 public:
  std::string name() const override { return "double_via_scratch"; }
  std::vector<TensorMeta> infer(std::span<const TensorMeta> in) const override { return {in[0]}; }
  std::vector<std::optional<Var>> backward(const BackwardArgs& a) const override {
    return {*a.grad_outputs[0] * 2.0};
  }
};

// A program's own op gets its kernel (and the kernel's scratch size) into
// the backend's table through BackendOptions::extra_kernels.
void add_double_via_scratch(KernelTable& t) {
  t.add<DoubleViaScratch>(
      [](const DoubleViaScratch&, const KernelArgs& a) {
        REQUIRE(a.workspace != nullptr);
        REQUIRE(a.workspace_bytes == std::size_t(a.in[0].numel()) * 4 + 100);
        REQUIRE(a.out.size() == 1);
        auto* w = static_cast<float*>(a.workspace);
        std::memcpy(w, a.in[0].data, std::size_t(a.in[0].numel()) * 4);
        for (std::int64_t i = 0; i < a.in[0].numel(); ++i) w[i] *= 2;
        std::memcpy(a.out[0].data, w, std::size_t(a.in[0].numel()) * 4);
      },
      [](const DoubleViaScratch&, std::span<const TensorMeta> in, std::span<const TensorMeta>) {
        return in[0].nbytes() + 100;  // deliberately not a multiple of the alignment
      });
}

}  // namespace

TEST_CASE("an op's scratch space is a planned value, live only while the op runs", "[plan][executor]") {
  CompileOptions o;
  o.backend_options.extra_kernels = {add_double_via_scratch};
  Tensor x({64, 16});
  for (std::int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = float(i % 7) - 3;
  Step s = compile_inference([](Var v) { return relu(apply1<DoubleViaScratch>({v}) + 1.0); }, {input<float>({64, 16})},
                             {}, o);
  // The workspace is one more value of the graph, in the arena, of the
  // op's requested size, and the report counts it as workspace.
  std::size_t ws_values = 0;
  for (ValueId v = 0; v < ValueId(s.graph().num_values()); ++v)
    if (s.graph().value(v).is_workspace) {
      ++ws_values;
      CHECK(s.graph().value(v).meta.nbytes() == 64 * 16 * 4 + 100);
      CHECK(s.plan().offset_of[std::size_t(v)].has_value());
    }
  CHECK(ws_values == 1);
  CHECK(s.verify().ok());
  // The scratch (4196 B) is live together with x and the op's output: the
  // peak must include it, and the audit must agree with the prediction.
  CHECK(s.plan().lower_bound_bytes >= 3 * 4096 + align_up(100));
  auto a = s.audit(x);
  CHECK(a.canary_intact);
  CHECK(a.high_water == a.predicted);
  s.run(x);
  for (std::int64_t i = 0; i < x.numel(); ++i) REQUIRE(s.output().data<float>()[i] == std::max(2 * x.data<float>()[i] + 1, 0.f));
  CHECK(plan::at_peak(s.graph(), s.plan()).bytes.at("workspace") > 0);
  // Its gradient sees only the real output.
  nn::Linear fc(16, 16);
  Step g = compile_gradients([&](Var v) { return sum(apply1<DoubleViaScratch>({fc(v)})); }, {input<float>({64, 16})},
                             fc.parameters(), {}, o);
  g.run(x);
  CHECK(g.verify().ok());
}

// ---- transfers are recognised through Op::as_transfer -------------------------
namespace {
// An ordinary op that merely calls itself a fetch: a name is not a kind.
class NamedFetch final : public Op {
 public:
  std::string name() const override { return "fetch"; }
  std::vector<TensorMeta> infer(std::span<const TensorMeta> in) const override { return {in[0]}; }
};
}  // namespace

TEST_CASE("the planner's transfers, and only they, are seen as transfers", "[plan][transfer]") {
  CHECK(NamedFetch().as_transfer() == nullptr);
  const ops::Transfer t(TransferKind::write_back_start, 3, "w");
  REQUIRE(t.as_transfer() == &t);
  CHECK(t.as_transfer()->kind() == TransferKind::write_back_start);
  CHECK(t.as_transfer()->slot() == 3);
  CHECK(t.as_transfer()->is_start());
  CHECK(t.as_transfer()->what() == "w");
  // Every node of a budget plan (the captured ops and the transfers the
  // rewrite inserted) answers as its C++ type says.
  zoo::Config c{.family = "gpt", .batch = 2, .layers = 2, .width = 32, .seq = 16, .heads = 2, .vocab = 64};
  zoo::Workload w = zoo::make(c);
  const DeviceProfile profile = DeviceProfile::defaults("cpu", 1);
  const CompileOptions o{.profile = &profile};
  Budget b{.device = zoo::plan(w, {}, o).plan.total_bytes() - 1};
  b.device = zoo::plan(w, b, o).plan.min_feasible_bytes;
  PlannedStep ps = zoo::plan(w, b, o);
  std::size_t transfers = 0, others = 0;
  for (NodeId n = 0; n < NodeId(ps.graph->num_nodes()); ++n) {
    const Op& op = *ps.graph->node(n).op;
    auto* real = dynamic_cast<const ops::Transfer*>(&op);
    INFO(op.name());
    CHECK(op.as_transfer() == static_cast<const TransferOp*>(real));
    ++(real ? transfers : others);
  }
  CHECK(transfers > 0);
  CHECK(others > 0);
}

TEST_CASE("a re-plan runs in its predecessor's memory only if it fits, and a refused one leaves that memory whole",
          "[plan][executor][replan]") {
  zoo::Config c{.family = "gpt", .batch = 2, .layers = 2, .width = 32, .seq = 16, .heads = 2, .vocab = 64};
  zoo::Workload w = zoo::make(c);
  const DeviceProfile profile = DeviceProfile::defaults("cpu", 1);
  const CompileOptions o{.profile = &profile};
  PlannedStep a = zoo::plan(w, {}, o);
  Budget b{.device = a.plan.total_bytes() - 1};
  b.device = zoo::plan(w, b, o).plan.min_feasible_bytes;
  PlannedStep z = zoo::plan(w, b, o);
  if (a.plan.arena_bytes > z.plan.arena_bytes) std::swap(a, z);
  const PlannedStep &small = a, &large = z;
  REQUIRE(small.plan.arena_bytes < large.plan.arena_bytes);
  counting::reset();
  {
    auto backend = counting::make();
    Executor first(small.graph, small.plan, *backend);
    CHECK(first.fits(small.plan));
    CHECK_FALSE(first.fits(large.plan));
    CHECK_THROWS_WITH(Executor(large.graph, large.plan, first), Catch::Contains("more memory"));
    CHECK(counting::allocations == 1);
    // Still its own: the refused re-plan took nothing.
    CHECK(first.fits(small.plan));
    Executor second(small.graph, small.plan, first);
    CHECK(counting::allocations == 1);
    CHECK_FALSE(first.fits(small.plan));  // its memory went to the re-plan
    CHECK(second.fits(small.plan));
    CHECK(counting::deallocations == 0);
  }
  CHECK(counting::allocations == 1);
  CHECK(counting::deallocations == 1);
}

TEST_CASE("views over in-place chains plan, verify and train: Linear, reshape, BatchNorm2d, relu, reshape, Linear",
          "[plan][view]") {
  nn::manual_seed(5);
  nn::Linear fc1(6, 4 * 3 * 3), fc2(4 * 3 * 3, 3);
  nn::BatchNorm2d bn(4);
  std::vector<Tensor> params = fc1.parameters();
  for (auto& t : bn.parameters()) params.push_back(t);
  for (auto& t : fc2.parameters()) params.push_back(t);
  for (bool inplace : {true, false}) {
    optim::SGD opt(params, {.lr = 0.1});
    auto fn = [&](Var x, Var y) {
      Var h = reshape(fc1(x), {5, 4, 3, 3});
      return cross_entropy(fc2(reshape(relu(bn(h)), {5, 36})), y);
    };
    INFO("inplace " << inplace);
    Step step = compile(fn, {input<float>({5, 6}), input<std::int32_t>({5})}, opt, {},
                        {.plan = {.inplace = inplace}});
    CHECK(step.verify().ok());
    Tensor x({5, 6}), y({5}, DType::i32);
    fill_batch(x, y, 3, 3);
    float loss = step.run(x, y);
    CHECK(std::isfinite(loss));
  }
}

TEST_CASE("constants are bound once, read-only, reported as constants, and offloaded under a tight budget; module "
          "buffers are reported as buffers",
          "[plan][constant]") {
  // A wide fixed feature matrix read by the first layer forward and again by
  // its weight gradient: the same step as with the features as an input.
  const int n = 64, f = 96;
  Tensor features({n, f}), labels({n}, DType::i32);
  fill_batch(features, labels, 17, 4);
  auto train = [&](bool as_constant, Budget budget) {
    nn::manual_seed(2);
    nn::Linear fc1(f, 8), fc2(8, 4);
    std::vector<Tensor> params = fc1.parameters();
    for (auto& t : fc2.parameters()) params.push_back(t);
    optim::SGD opt(params, {.lr = 0.1});
    counting::reset();
    CompileOptions o{.use_backend = counting::make()};
    std::optional<Step> step;
    if (as_constant)
      step.emplace(compile([&](Var y) { return cross_entropy(fc2(relu(fc1(constant(features, "features")))), y); },
                           {input<std::int32_t>({n})}, opt, budget, o));
    else
      step.emplace(compile([&](Var x, Var y) { return cross_entropy(fc2(relu(fc1(x))), y); },
                           {input<float>({n, f}), input<std::int32_t>({n})}, opt, budget, o));
    std::vector<float> losses;
    for (int s = 0; s < 3; ++s) losses.push_back(as_constant ? step->run(labels) : step->run(features, labels));
    const std::size_t copied = counting::bytes_to_device;
    std::string described;
    for (ValueId v : step->graph().values_of_kind(ValueKind::constant)) described += plan::describe_value(step->graph(), v);
    return std::tuple{losses, fc1.weight.clone(), step->plan(), copied, described};
  };
  auto [in_losses, in_w, in_plan, in_copied, in_summary] = train(false, {});
  auto [c_losses, c_w, c_plan, c_copied, c_summary] = train(true, {});
  CHECK(c_losses == in_losses);
  CHECK(std::memcmp(c_w.raw(), in_w.raw(), c_w.nbytes()) == 0);
  // The input is copied in by every run; the constant never is.
  CHECK(in_copied >= 3 * features.nbytes());
  CHECK(c_copied < features.nbytes());
  CHECK(c_plan.persistent_by_kind.at("constants") == features.nbytes());
  CHECK(c_summary == "constant 'features' f32[64, 96]");
  CHECK(in_summary.empty());
  // A constant read once, early (a fixed offset added to the first layer's
  // output; the add's backward does not read it): under a tight budget it
  // waits on the host through the backward's peak, and the bits stay.
  Tensor offset({n, 64});
  {
    Rng r(5);
    for (std::int64_t i = 0; i < offset.numel(); ++i) offset.data<float>()[i] = float(r.normal());
  }
  auto offset_run = [&](Budget budget) {
    nn::manual_seed(4);
    nn::Linear fc1(f, 64), fc2(64, 4);
    std::vector<Tensor> params = fc1.parameters();
    for (auto& t : fc2.parameters()) params.push_back(t);
    optim::SGD opt(params, {.lr = 0.1});
    Step step = compile([&](Var x, Var y) { return cross_entropy(fc2(relu(fc1(x) + constant(offset, "offset"))), y); },
                        {input<float>({n, f}), input<std::int32_t>({n})}, opt, budget);
    std::vector<float> losses;
    for (int s = 0; s < 3; ++s) losses.push_back(step.run(features, labels));
    return std::tuple{losses, fc2.weight.clone(), step.plan()};
  };
  auto [o_losses, o_w, o_plan] = offset_run({});
  const std::size_t least = std::get<2>(offset_run(Budget{.device = o_plan.total_bytes() - 1})).min_feasible_bytes;
  REQUIRE(least < o_plan.total_bytes());
  auto [t_losses, t_w, t_plan] = offset_run(Budget{.device = least});
  CHECK(t_plan.total_bytes() <= least);
  CHECK(t_plan.offloaded_bytes >= offset.nbytes());
  CHECK(t_losses == o_losses);
  CHECK(std::memcmp(t_w.raw(), o_w.raw(), t_w.nbytes()) == 0);

  // A constant is read-only: an op that writes one is refused at capture.
  Tensor count({}, DType::i64), found({}, DType::f32);
  Graph g;
  ValueId c = g.add_persistent(count, ValueKind::constant, "steps");
  ValueId fi = g.add_persistent(found, ValueKind::parameter, "found_inf");
  CHECK_THROWS_WITH(g.apply(std::make_shared<ops::AdvanceStepCount>(), {c, fi}),
                    Catch::Contains("'steps', which is a constant"));

  // BatchNorm's running statistics are buffers, not optimizer state.
  nn::BatchNorm2d bn(3);
  nn::Linear head(3 * 2 * 2, 2);
  std::vector<Tensor> params = bn.parameters();
  for (auto& t : head.parameters()) params.push_back(t);
  optim::SGD opt(params, {.lr = 0.1});
  Step step = compile([&](Var x, Var y) { return cross_entropy(head(reshape(bn(x), {4, 12})), y); },
                      {input<float>({4, 3, 2, 2}), input<std::int32_t>({4})}, opt);
  const std::size_t stats = 2 * 3 * sizeof(float);
  CHECK(step.plan().persistent_by_kind.at("buffers") >= stats);
  std::string names;
  for (ValueId v : step.graph().values_of_kind(ValueKind::buffer)) names += plan::describe_value(step.graph(), v) + ";";
  CHECK_THAT(names, Catch::Contains("buffer 'running_mean'") && Catch::Contains("buffer 'running_var'"));
}

namespace {

// plan::assign_offsets as it was written first: every placed interval
// checked for overlap with each new one.
plan::Placement assign_offsets_by_scanning(const std::vector<plan::Interval>& iv) {
  std::vector<std::size_t> order(iv.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    if (iv[a].bytes != iv[b].bytes) return iv[a].bytes > iv[b].bytes;
    int la = iv[a].last - iv[a].first, lb = iv[b].last - iv[b].first;
    if (la != lb) return la > lb;
    return iv[a].value < iv[b].value;
  });
  plan::Placement p;
  p.offset.assign(iv.size(), 0);
  std::vector<std::size_t> placed;
  std::vector<std::pair<std::size_t, std::size_t>> busy;
  for (std::size_t i : order) {
    busy.clear();
    for (std::size_t j : placed)
      if (iv[i].overlaps(iv[j])) busy.push_back({p.offset[j], p.offset[j] + iv[j].bytes});
    std::sort(busy.begin(), busy.end());
    std::size_t best = SIZE_MAX, best_gap = SIZE_MAX, cursor = 0;
    for (auto [b, e] : busy) {
      if (b > cursor && b - cursor >= iv[i].bytes && b - cursor < best_gap) best = cursor, best_gap = b - cursor;
      cursor = std::max(cursor, e);
    }
    p.offset[i] = best != SIZE_MAX ? best : cursor;
    p.arena_bytes = std::max(p.arena_bytes, p.offset[i] + iv[i].bytes);
    placed.push_back(i);
  }
  return p;
}

}  // namespace

TEST_CASE("arena offsets found through the time index are those scanning every placed buffer gives", "[plan]") {
  // Random lifetimes over few and many positions, sizes with many ties
  // (the order's tie-breaks), single-position and whole-step buffers; and
  // every placement checked: buffers that overlap in time never share bytes.
  std::mt19937_64 rng(17);
  for (int trial = 0; trial < 200; ++trial) {
    const int positions = 1 + int(rng() % (trial % 2 ? 400 : 9));
    const std::size_t n = std::size_t(rng() % 300);
    std::vector<plan::Interval> iv(n);
    for (std::size_t k = 0; k < n; ++k) {
      int a = int(rng() % std::uint64_t(positions)), b = int(rng() % std::uint64_t(positions));
      if (rng() % 5 == 0) a = 0, b = positions - 1;
      iv[k].value = ValueId(rng() % 1000);
      iv[k].bytes = 64 * (1 + rng() % (trial % 3 ? 4 : 40));
      iv[k].used = iv[k].bytes;
      iv[k].first = std::min(a, b), iv[k].last = std::max(a, b);
    }
    const plan::Placement fast = plan::assign_offsets(iv), scanned = assign_offsets_by_scanning(iv);
    INFO("trial " << trial << ", " << n << " buffers over " << positions << " positions");
    CHECK(fast.offset == scanned.offset);
    CHECK(fast.arena_bytes == scanned.arena_bytes);
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t j = i + 1; j < n; ++j)
        if (iv[i].overlaps(iv[j]))
          REQUIRE((fast.offset[i] + iv[i].bytes <= fast.offset[j] || fast.offset[j] + iv[j].bytes <= fast.offset[i]));
  }
}
