// The memory-manager simulation (plan/paging_sim.hpp) on traces small
// enough to follow by hand, and traces recorded from a real step
// (plan/access_trace.hpp).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <frugal/frugal.hpp>
#include <frugal/plan/paging_sim.hpp>
#include <frugal/runtime/paged_step.hpp>

#include "../tools/model_zoo.hpp"

using namespace frugal;
using namespace frugal::plan;

namespace {

// A (a persistent of two pages) read by op 0, which makes B (one page);
// op 1 reads B and makes C; op 2 reads A and C. B dies at op 1, C at op 2.
AccessTrace three_ops() {
  AccessTrace t;
  t.tensors = {{8192, true, true, "A"}, {4096, false, false, "B"}, {4096, false, false, "C"}};
  t.ops = {{1.0, {0}, {1}, {}, 0}, {1.0, {1}, {2}, {1}, 0}, {1.0, {0, 2}, {}, {2}, 0}};
  t.steps = 1;
  return t;
}

PagingOptions by_hand(std::size_t capacity) {
  PagingOptions o;
  o.capacity = capacity;
  o.h2d = o.d2h = CopyLink{4096e3, 0};  // a 4 KiB page in 1 ms
  o.fault_latency_s = 1e-4;             // 0.1 ms
  return o;
}

}  // namespace

TEST_CASE("demand paging on a three-op trace faults and evicts as worked out by hand", "[paging]") {
  // op 0: A's two pages fault and copy (2 x (0.1 + 1) ms), B's page faults
  // on first touch with no copy (0.1), compute 1: 3.3 ms, 3 pages used.
  // op 1: C faults (0.1) and evicts A's first page, the least recently used
  // and clean; compute 1: 4.4; B dies. op 2: A's first page faults and
  // copies again (1.1), compute 1: 6.5 ms, 5 faults, 3 pages in, none out.
  const PagingResult r = simulate_pages(three_ops(), by_hand(3 * 4096), 4096);
  CHECK(r.faults == 5);
  CHECK(r.bytes_in == 3 * 4096);
  CHECK(r.bytes_out == 0);
  CHECK(r.ms == Approx(6.5));
  CHECK(r.compute_ms == Approx(3.0));
}

TEST_CASE("a dirty page is written back before its room is used again", "[paging]") {
  // One page of room: op 0 makes B (first touch), op 1 reads A, which
  // evicts B, dirty and still read at op 2, so it is written back (1 ms on
  // the other link) before A's copy may land in its room.
  AccessTrace t;
  t.tensors = {{4096, true, true, "A"}, {4096, false, false, "B"}};
  t.ops = {{1.0, {}, {1}, {}, 0}, {1.0, {0}, {}, {}, 0}, {1.0, {1}, {}, {1}, 0}};
  t.steps = 1;
  const PagingResult r = simulate_pages(t, by_hand(4096), 4096);
  // op 0: first touch 0.1, compute 1.1. op 1: fault 1.2, B's write-back
  // 1.2-2.2, A's copy 2.2-3.2, compute 4.2. op 2: fault 4.3, A is clean and
  // dropped, B's copy 4.3-5.3, compute 6.3.
  CHECK(r.faults == 3);
  CHECK(r.bytes_out == 4096);
  CHECK(r.bytes_in == 2 * 4096);
  CHECK(r.ms == Approx(6.3));
}

TEST_CASE("the next-use manager keeps what is needed soonest and never counts an allocation as a fault",
          "[paging]") {
  // op 0: A is fetched on demand (2 ms) and B allocated; compute: 3 ms.
  // op 1: C is allocated by evicting A (clean, next used at op 2); the
  // prefetch of A finds no room (B and C are op 1's); compute: 4 ms.
  // op 2: A on demand again (2 ms, the link free since 2 ms): 6, compute 7.
  const PagingResult r = simulate_next_use(three_ops(), by_hand(3 * 4096));
  CHECK(r.faults == 2);
  CHECK(r.bytes_in == 2 * 8192);
  CHECK(r.bytes_out == 0);
  CHECK(r.ms == Approx(7.0));
}

TEST_CASE("with room for everything, each manager copies every host tensor once and writes nothing back",
          "[paging]") {
  const AccessTrace t = three_ops();
  const PagingOptions o = by_hand(t.footprint());
  CHECK(t.footprint() == 8192 + 4096 + 4096);
  for (const PagingResult& r : {simulate_pages(t, o, 4096), simulate_next_use(t, o)}) {
    INFO(r.policy);
    CHECK(r.bytes_in == 8192);
    CHECK(r.bytes_out == 0);
  }
}

TEST_CASE("a trace recorded from a training step accesses every value it plans, and each activation dies once",
          "[paging]") {
  nn::manual_seed(3);
  nn::Sequential net{std::make_shared<nn::Linear>(128, 256), std::make_shared<nn::ReLU>(),
                     std::make_shared<nn::Linear>(256, 4)};
  optim::AdamW opt(net.parameters(), optim::AdamWOptions{});
  Step step = compile([&](Var x, Var y) { return cross_entropy(net(x), y); },
                      {input<float>({64, 128}), input<std::int32_t>({64})}, opt);
  AccessTrace t;
  const CostModel cm(DeviceProfile::defaults("cuda", 1));
  append_step(t, step.graph(), step.plan(), cm);
  append_step(t, step.graph(), step.plan(), cm);
  CHECK(t.steps == 2);
  CHECK(t.ops.size() == 2 * step.plan().schedule.size());
  // Persistents are shared by the two steps; activations are new in each.
  std::size_t persistents = 0, dies = 0, activations = 0;
  for (const auto& x : t.tensors) {
    persistents += x.persistent;
    activations += !x.persistent;
  }
  for (const auto& op : t.ops) dies += op.dies.size();
  CHECK(persistents == 4 * 3);  // 4 parameters, each with AdamW's two moments
  CHECK(dies == activations);
  // A made tensor is written before it is read.
  std::vector<char> made(t.tensors.size(), 0);
  for (const auto& op : t.ops) {
    for (int r : op.reads) CHECK((t.tensors[std::size_t(r)].from_host || made[std::size_t(r)]));
    for (int w : op.writes) made[std::size_t(w)] = 1;
  }
  // Oversubscribed, every manager still finishes, and the ops take the same time.
  PagingOptions o;
  o.capacity = std::max(t.footprint() * 2 / 3, t.largest_op_bytes());
  REQUIRE(o.capacity < t.footprint());
  const double compute = simulate_next_use(t, PagingOptions{.capacity = t.footprint() * 4}).compute_ms;
  for (const PagingResult& r : {simulate_pages(t, o, 4096), simulate_pages(t, o, 65536, 8), simulate_next_use(t, o)}) {
    INFO(r.policy);
    CHECK(r.compute_ms == Approx(compute));
    CHECK(r.ms >= r.compute_ms);
  }
}

// ---- The run-time manager (runtime/paged_step.hpp) on real steps ----

namespace {

bool same_tensors(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  for (std::size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(a[i].raw(), b[i].raw(), a[i].nbytes()) != 0) return false;
  return true;
}
std::uint32_t float_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

}  // namespace

TEST_CASE("paged step: a gpt, a resnet and a gcn train bit for bit as their static plans, in pools from everything "
          "down to their largest op, never holding more than the pool",
          "[paging][paged]") {
  // gpt: attention and a fused softmax; resnet: convolutions with scratch
  // and batch norm's running statistics (buffers updated in place); gcn: a
  // constant sparse adjacency.
  const std::vector<zoo::Config> models{
      {.family = "gpt", .batch = 2, .layers = 2, .width = 32, .seq = 16, .heads = 2, .vocab = 64},
      {.family = "resnet", .batch = 2, .layers = 1, .width = 4, .classes = 10, .image = 8},
      {.family = "gcn", .batch = 64, .layers = 2, .width = 16, .features = 8, .classes = 4},
  };
  const CompileOptions o{.threads = 1};
  for (const zoo::Config& c : models) {
    zoo::Workload ref = zoo::make(c);
    Step alone = zoo::compile(ref, {}, o);
    std::vector<std::uint32_t> want;
    for (int s = 0; s < 3; ++s) {
      auto b = ref.batch(std::uint64_t(s));
      want.push_back(float_bits(alone.run(b[0], b[1])));
    }
    // The pools: room for every tensor at once; the most one run has live
    // (the persistents it touched so far and its live activations), which
    // a second run exceeds by the persistents it keeps from the first; a
    // half of that; the least.
    zoo::Workload probe = zoo::make(c);
    const AccessTrace sizing = PagedStep::trace_of(zoo::plan(probe, {}, o));
    std::size_t every = 0;
    for (const auto& t : sizing.tensors) every += t.bytes;
    const std::size_t all = sizing.footprint(), least = sizing.largest_op_bytes();
    REQUIRE(least < all);
    for (std::size_t capacity : {every, all, std::max(least, all / 2), least}) {
      INFO(c.name() << ": pool of " << capacity << " bytes (one run's footprint: " << all
                    << ", the largest op: " << least << ")");
      zoo::Workload w = zoo::make(c);
      PagedStep paged(zoo::plan(w, {}, o), w.opt.get(), capacity, o);
      std::vector<std::uint32_t> got;
      for (int s = 0; s < 3; ++s) {
        auto b = w.batch(std::uint64_t(s));
        got.push_back(float_bits(paged.run(b[0], b[1])));
        CHECK(paged.last_run().peak_bytes <= capacity);
      }
      CHECK(got == want);
      CHECK(same_tensors(w.model->parameters(), ref.model->parameters()));
      CHECK(same_tensors(w.model->buffers(), ref.model->buffers()));
      CHECK(paged.steps_run() == 3);
      const auto& st = paged.stats();
      if (capacity == every) {  // the persistents come once, each run's inputs once, nothing goes back
        std::size_t persistents = 0, inputs = 0;
        for (const auto& t : sizing.tensors) (t.persistent ? persistents : inputs) += t.from_host ? t.bytes : 0;
        CHECK(st.evictions == 0);
        CHECK(st.bytes_out == 0);
        CHECK(st.bytes_in == persistents + 3 * inputs);
      } else if (capacity < all) {
        CHECK(st.evictions > 0);
      }
    }
  }
}

TEST_CASE("paged step: one run makes the decisions the next-use simulator makes on its trace", "[paging][paged]") {
  const zoo::Config c{.family = "gpt", .batch = 2, .layers = 2, .width = 32, .seq = 16, .heads = 2, .vocab = 64};
  for (double fraction : {0.75, 0.5}) {
    zoo::Workload w = zoo::make(c);
    const PlannedStep planned = zoo::plan(w);
    const AccessTrace sizing = PagedStep::trace_of(planned);
    const std::size_t capacity =
        std::max(sizing.largest_op_bytes(), std::size_t(double(sizing.footprint()) * fraction));
    PagedStep paged(planned, w.opt.get(), capacity);
    auto b = w.batch(1);
    paged.run(b[0], b[1]);
    const PagingResult sim = simulate_next_use(paged.trace(), PagingOptions{.capacity = capacity});
    INFO(fraction << " of the footprint: " << capacity << " bytes");
    CHECK(paged.last_run().faults == sim.faults);
    CHECK(paged.last_run().bytes_in == sim.bytes_in);
    CHECK(paged.last_run().bytes_out == sim.bytes_out);
    CHECK(paged.last_run().bytes_in > 0);
  }
}

TEST_CASE("paged step: an inference step answers as compiled alone; a pool under its largest op is refused by name",
          "[paging][paged]") {
  const zoo::Config c{.family = "mlp", .batch = 16, .layers = 2, .width = 64, .features = 32};
  zoo::Workload w = zoo::make(c);
  auto* m = static_cast<zoo::Mlp*>(w.model.get());
  auto fn = [m](Var x) { return m->forward(x); };
  const std::vector<InputSpec> in{{{DType::f32, Shape{16, 32}}, "x"}};
  Step alone = compile_inference(fn, in);
  const std::size_t least = PagedStep::trace_of(plan_inference(fn, in)).largest_op_bytes();
  PagedStep paged(plan_inference(fn, in), nullptr, least);
  const auto b = w.batch(4);
  CHECK(std::isnan(paged.run(b[0])));
  alone.run(b[0]);
  REQUIRE(paged.output().nbytes() == alone.output().nbytes());
  CHECK(std::memcmp(paged.output().raw(), alone.output().raw(), alone.output().nbytes()) == 0);
  CHECK(paged.last_run().peak_bytes <= least);
  try {
    PagedStep tiny(plan_inference(fn, in), nullptr, least - 1);
    FAIL("a pool under the largest op was accepted");
  } catch (const BudgetError& e) {
    CHECK(e.smallest_feasible_bytes == least);
    CHECK_THAT(e.what(), Catch::Contains("cannot hold op") && Catch::Contains(std::to_string(least)));
  }
  // A wrong input shape is named before anything runs.
  Tensor wrong({8, 32});
  CHECK_THROWS_WITH(paged.run(wrong), Catch::Contains("input 0 ('x')"));
  // A budgeted plan is not what it pages.
  zoo::Workload t = zoo::make(c);
  const std::size_t full = zoo::plan(t).plan.total_bytes();
  CHECK_THROWS_WITH(PagedStep(zoo::plan(t, Budget{.device = full * 7 / 10}), t.opt.get(), full),
                    Catch::Contains("planned with no budget"));
}
