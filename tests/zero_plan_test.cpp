// ZeRO's sharding as the planner sees it, without MPI: each rank's step
// planned with dist::PlanOnly (the rank and the rank count, no transport).
// The bits are checked under mpirun (tests/dist/dist_test.cpp zero); here,
// what planning other layouts leaves of a stage-3 step that runs over
// dist::local().
#include <catch2/catch.hpp>
#include <omp.h>

#include <array>
#include <bit>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <thread>

#include <unistd.h>

#include <frugal/dist/plan_only.hpp>
#include <frugal/plan/budget_solve.hpp>
#include <frugal/plan/verify.hpp>
#include <frugal/frugal.hpp>

#include "../tools/model_zoo.hpp"
#include "budget_problem_of.hpp"
#include "thread_ranks.hpp"

using namespace frugal;

namespace {

// Parameter counts with a remainder over 4 ranks (fc1's weight, 10), ones
// too small to shard over 4 (fc1's bias, fc2's weight and bias), and ones
// that split evenly (wide's).
struct ZeroMlp : nn::Module {
  nn::Linear fc1{5, 2}, fc2{2, 3};
  nn::Linear wide{3, 24};
  ZeroMlp() {
    register_module("fc1", fc1);
    register_module("fc2", fc2);
    register_module("wide", wide);
  }
  Var forward(Var x) { return wide(relu(fc2(relu(fc1(x))))); }
};

PlannedStep plan_rank(ZeroMlp& m, Optimizer& opt, int rank, int ranks, std::optional<int> stage, Budget budget = {},
                      bool overlap = true) {
  CompileOptions o;
  o.communicator = std::make_shared<dist::PlanOnly>(rank, ranks);
  o.zero_stage = stage;
  o.overlap_collectives = overlap;
  o.bucket_bytes = 0;  // a collective per gradient
  return plan_training([&](Var x) { return mean(m.forward(x)); }, {input<float>({4, 5})}, opt, budget, o);
}

// The zoo's gpt at 2 layers of width 64, 4 x 32 tokens, over `vocab`.
zoo::Config small_gpt(int vocab) {
  zoo::Config c;
  c.family = "gpt";
  c.layers = 2;
  c.width = 64;
  c.batch = 4;
  c.seq = 32;
  c.vocab = vocab;
  return c;
}

std::size_t kind_bytes(const Plan& p, const std::string& kind) {
  auto it = p.persistent_by_kind.find(kind);
  return it == p.persistent_by_kind.end() ? 0 : it->second;
}

// The bytes of the values `op` (by name) produces, workspaces aside, run in
// place or started beside compute.
std::size_t produced_bytes(const Graph& g, const std::string& op) {
  std::size_t b = 0;
  for (NodeId n = 0; n < NodeId(g.num_nodes()); ++n)
    if (g.node(n).op->name() == op || g.node(n).op->name() == op + ".start")
      for (ValueId v : g.node(n).outputs)
        if (!g.value(v).is_workspace) b += g.value(v).meta.nbytes();
  return b;
}

}  // namespace

TEST_CASE("zero: a shard is rank r's chunk of ceil(numel / ranks), and too small a parameter is not sharded", "[zero]") {
  std::int64_t covered = 0;
  for (int r = 0; r < 4; ++r) {
    const ZeroShard s = ZeroShard::of(10, r, 4);
    CHECK(s.chunk == 3);
    CHECK(s.offset == 3 * r);
    CHECK(s.length == (r < 3 ? 3 : 1));
    CHECK(s.every_rank_has_elements());
    covered += s.length;
  }
  CHECK(covered == 10);
  CHECK_FALSE(ZeroShard::of(3, 0, 4).every_rank_has_elements());  // chunk 1: rank 3 would hold nothing
  CHECK_FALSE(ZeroShard::of(5, 0, 4).every_rank_has_elements());  // chunk 2: ranks 0-2 already cover 5
  CHECK(ZeroShard::of(7, 3, 4).length == 1);
  CHECK(ZeroShard::of(1, 0, 1).length == 1);
}

TEST_CASE("zero: each rank's optimizer state and reduced gradients are its shards, its parameters too at stage 3", "[zero]") {
  const int ranks = 4;
  for (int stage : {0, 1, 2, 3}) {
    for (int rank = 0; rank < ranks; ++rank) {
      nn::manual_seed(3);
      ZeroMlp m;
      optim::AdamW opt(m.parameters(), {});
      PlannedStep ps = plan_rank(m, opt, rank, ranks, stage);
      INFO("stage " << stage << ", rank " << rank);
      std::size_t psi = 0, shard = 0, unsharded = 0;
      for (const Tensor& p : m.parameters()) {
        const std::int64_t n = p.numel();
        psi += std::size_t(n);
        const ZeroShard s = ZeroShard::of(n, rank, ranks);
        shard += std::size_t(stage > 0 && s.every_rank_has_elements() ? s.length : n);
        if (!s.every_rank_has_elements()) unsharded += std::size_t(n);
      }
      // fc1's bias (2), fc2's weight (6: chunks of 2, three ranks cover it)
      // and bias (3) stay whole over 4 ranks.
      REQUIRE(unsharded == 2 + 6 + 3);
      CHECK(ps.plan.zero_stage == stage);
      // Whole parameters below stage 3; at 3 the shards, gathered where read.
      CHECK(kind_bytes(ps.plan, "parameters") == 4 * (stage == 3 ? shard : psi));
      CHECK(produced_bytes(*ps.graph, "all_gather_parameter") == (stage == 3 ? 4 * (psi - unsharded) : 0));
      CHECK(kind_bytes(ps.plan, "optimizer state") == 8 * shard);  // AdamW's two f32 moments
      // The gradients the updates read: whole after an all-reduce (stages 0
      // and 1), the rank's shard after a reduce-scatter (stages 2 and 3).
      const std::size_t whole_reduced = produced_bytes(*ps.graph, "all_reduce_mean");
      const std::size_t shard_reduced = produced_bytes(*ps.graph, "reduce_scatter_mean");
      if (stage < 2) {
        CHECK(whole_reduced == 4 * psi);
        CHECK(shard_reduced == 0);
      } else {
        CHECK(shard_reduced + whole_reduced == 4 * shard);
        CHECK(whole_reduced == 4 * unsharded);  // all-reduced whole, as at stage 0
      }
    }
  }
}

TEST_CASE("zero: left to choose, the planner takes the fastest stage that fits and says why", "[zero]") {
  auto least = [](std::optional<int> stage) {
    nn::manual_seed(3);
    ZeroMlp m;
    optim::AdamW opt(m.parameters(), {});
    // Unconstrained with the collectives in place (beside compute they
    // hold more): a budget below it binds either way.
    const std::size_t free = plan_rank(m, opt, 0, 4, stage, {}, false).plan.total_bytes();
    return plan_rank(m, opt, 0, 4, stage, Budget{.device = free - 1}).plan.min_feasible_bytes;
  };
  const std::size_t least0 = least(0), least1 = least(1);
  REQUIRE(least1 < least0);
  nn::manual_seed(3);
  ZeroMlp m;
  optim::AdamW opt(m.parameters(), {});
  // Without a budget, or where stage 0 evicts nothing, stage 0: the others
  // only add communication.
  CHECK(plan_rank(m, opt, 0, 4, std::nullopt).plan.zero_stage == 0);
  // At stage 0's least, stage 0 fits only by evicting: every stage is
  // priced, and the one taken is predicted no slower than stage 0 there.
  PlannedStep at_least0 = plan_rank(m, opt, 0, 4, std::nullopt, Budget{.device = least0});
  const double stage0_ms = plan_rank(m, opt, 0, 4, 0, Budget{.device = least0}).plan.predicted_step_ms;
  CHECK(at_least0.plan.predicted_step_ms <= stage0_ms);
  CHECK_THAT(at_least0.plan.zero_reason, Catch::Contains("stage 0 fits") && Catch::Contains("the fastest that fits"));
  PlannedStep chosen = plan_rank(m, opt, 0, 4, std::nullopt, Budget{.device = least1});
  CHECK(chosen.plan.zero_stage >= 1);
  CHECK(chosen.plan.total_bytes() <= least1);
  CHECK_THAT(chosen.plan.zero_reason, Catch::Contains("stage 0 needs at least"));
  CHECK_THAT(plan::summary(*chosen.graph, chosen.plan), Catch::Contains("ZeRO stage"));
  CHECK_THROWS_WITH(plan_rank(m, opt, 0, 4, std::nullopt, Budget{.device = least1 / 2}),
                    Catch::Contains("no ZeRO stage fits"));
}

TEST_CASE("zero: compile refuses a communicator that cannot communicate, naming it", "[zero]") {
  ZeroMlp m;
  optim::AdamW opt(m.parameters(), {});
  CompileOptions o;
  o.communicator = std::make_shared<dist::PlanOnly>(0, 2);
  CHECK_THROWS_WITH(compile([&](Var x) { return mean(m.forward(x)); }, {input<float>({4, 5})}, opt, {}, o),
                    Catch::Contains("cannot communicate"));
  CHECK_THROWS_WITH(dist::PlanOnly(2, 2), Catch::Contains("rank 2 of 2"));
}

TEST_CASE("zero: gradient collectives run beside the backward, at most the planned number in flight", "[zero][overlap]") {
  for (int stage : {0, 2}) {
    INFO("stage " << stage);
    nn::manual_seed(3);
    ZeroMlp m;
    optim::AdamW opt(m.parameters(), {});
    const PlannedStep ps = plan_rank(m, opt, 0, 4, stage);
    const Graph& g = *ps.graph;
    const auto& order = ps.plan.schedule;
    CHECK_THAT(ps.plan.collectives, Catch::Contains("beside compute"));
    auto is_start = [&](NodeId n) { return dynamic_cast<const ops::CollectiveStart*>(g.node(n).op.get()) != nullptr; };
    auto is_done = [&](NodeId n) { return dynamic_cast<const ops::CollectiveDone*>(g.node(n).op.get()) != nullptr; };
    int started = 0, overlapping = 0, in_flight = 0, most = 0;
    for (std::size_t i = 0; i < order.size(); ++i) {
      if (is_done(order[i])) --in_flight;
      if (!is_start(order[i])) continue;
      most = std::max(most, ++in_flight);
      ++started;
      // Backward compute (not communication, not an update) before its done.
      for (std::size_t j = i + 1; j < order.size(); ++j) {
        const Node& n = g.node(order[j]);
        if (is_done(order[j]) && n.inputs[0] == g.node(order[i]).outputs[0]) break;
        if (!n.op->is_collective() && !is_done(order[j]) && n.phase == Phase::backward) {
          ++overlapping;
          break;
        }
      }
    }
    // Every parameter's gradient: whole (all-reduce) or sharded (reduce-scatter);
    // at stage 2 also each sharded parameter's gather of its updated shards.
    int sharded = 0;
    for (const Tensor& t : m.parameters()) sharded += ZeroShard::of(t.numel(), 0, 4).every_rank_has_elements();
    CHECK(started == int(m.parameters().size()) + (stage == 2 ? sharded : 0));
    // The backward's first gradients overlap what it computes next; the
    // last ones have no backward left to overlap.
    CHECK(overlapping >= 2);
    CHECK(most == PlanOptions{}.collectives_in_flight);
    CHECK(in_flight == 0);
    // The overlapped step holds more than the same step in place.
    CHECK(ps.plan.total_bytes() > plan_rank(m, opt, 0, 4, stage, {}, false).plan.total_bytes());

    // Planned under a budget that binds (compile would run these collectives
    // in place there; the solver must still never move what a collective in
    // flight reads or writes): the plan verifies, and no decision's window
    // meets a start..done span of the value it moves.
    auto cm = std::make_shared<plan::CostModel>(DeviceProfile::defaults("cpu", 1));
    auto solve = [&](std::size_t bytes) {
      return plan::solve_budget(std::make_shared<Graph>(g), ps.roots, Budget{.device = bytes}, plan::prices_from(cm));
    };
    std::size_t least = 0;
    try {
      solve(1);
    } catch (const BudgetError& e) {
      least = e.smallest_feasible_bytes;
    }
    REQUIRE(least > 0);
    REQUIRE(least < ps.plan.total_bytes());
    plan::BudgetedPlan bp = solve(least);
    REQUIRE_FALSE(bp.plan.decisions.empty());
    CHECK(bp.plan.total_bytes() <= least);
    CHECK(plan::verify(*bp.graph, bp.plan, ps.roots).ok());
    std::vector<int> pos(g.num_nodes(), -1);
    for (std::size_t t = 0; t < order.size(); ++t) pos[std::size_t(order[t])] = int(t);
    for (const auto& d : bp.plan.decisions)
      for (NodeId n = 0; n < NodeId(g.num_nodes()); ++n) {
        if (!is_done(n)) continue;
        const int s = pos[std::size_t(g.value(g.node(n).inputs[0]).producer)], e = pos[std::size_t(n)];
        for (ValueId in : g.node(n).inputs)
          if (in == d.value) CHECK_FALSE((d.from + 1 <= e && d.to - 1 >= s));
      }
  }
}

TEST_CASE("zero: left to choose, collectives run beside compute only with a core free for them, and the plan says so", "[zero][overlap]") {
  nn::manual_seed(3);
  ZeroMlp m;
  optim::AdamW opt(m.parameters(), {});
  CompileOptions o;
  o.communicator = std::make_shared<dist::PlanOnly>(0, 4);  // 4 ranks on this machine, as under mpirun here
  o.threads = 1;
  o.bucket_bytes = 0;
  const PlannedStep ps = plan_training([&](Var x) { return mean(m.forward(x)); }, {input<float>({4, 5})}, opt, {}, o);
  int started = 0;
  for (NodeId n : ps.plan.schedule) started += dynamic_cast<const ops::CollectiveStart*>(ps.graph->node(n).op.get()) != nullptr;
  INFO(ps.plan.collectives);
  if (started > 0) {
    CHECK_THAT(ps.plan.collectives, Catch::Contains("beside compute") && Catch::Contains("a core is free"));
  } else {
    CHECK_THAT(ps.plan.collectives, Catch::Contains("in place") && Catch::Contains("cores"));
  }
  // More compute threads than the machine has cores: never beside compute.
  o.threads = 4 * omp_get_num_procs();
  const PlannedStep busy = plan_training([&](Var x) { return mean(m.forward(x)); }, {input<float>({4, 5})}, opt, {}, o);
  CHECK_THAT(busy.plan.collectives, Catch::Contains("in place") && Catch::Contains("would slow the backward down"));
}

// The budget problem counts live bytes; the arena adds the gaps its offsets
// leave, so a priced solution can land over the budget by a few bytes while
// its modelled peak sits far below the target (evictions come in whole
// tensors). The retry must tighten below that peak: tightening only the
// target found the same solution six times and fell back to the least-memory
// plan (the gpt sample's stages 1 and 2 under --budget 60%, on generated
// text). A budget one byte below a priced plan's device bytes is met by a
// priced plan with one more eviction, at every stage.
TEST_CASE("zero: a pinned stage one byte below a priced plan of it is planned priced, not least-memory", "[zero][budget]") {
  zoo::Config c = small_gpt(29);  // the sample's generated text: shards that do not split evenly
  for (int stage : {0, 1, 2, 3}) {
    INFO("stage " << stage);
    zoo::Workload w = zoo::make(c);
    CompileOptions o;
    o.communicator = std::make_shared<dist::PlanOnly>(0, 2);
    o.zero_stage = stage;
    const std::size_t free = zoo::plan(w, {}, o).plan.total_bytes();
    const PlannedStep priced = zoo::plan(w, Budget{.device = free * 6 / 10}, o);
    REQUIRE(priced.plan.zero_stage == stage);
    REQUIRE_FALSE(priced.plan.least_memory_fallback);
    const std::size_t tight = priced.plan.total_bytes() - 1;
    const PlannedStep ps = zoo::plan(w, Budget{.device = tight}, o);
    CHECK(ps.plan.total_bytes() <= tight);
    CHECK_FALSE(ps.plan.least_memory_fallback);
  }
}

namespace {

// Two ranks as two threads of this process, for what compile asks of the
// ranks (the all-gathers that check they agree); any other collective
// fails. `local` is each rank's answer to ranks_on_this_machine(), so the
// ranks can see different machines.
class ThreadRanks {
 public:
  class Rank final : public Communicator {
   public:
    Rank(ThreadRanks& all, int rank, int local) : all_(all), rank_(rank), local_(local) {}
    std::string name() const override { return "threads"; }
    int rank() const override { return rank_; }
    int size() const override { return 2; }
    bool serialized_threads() const override { return true; }
    int ranks_on_this_machine() const override { return local_; }
    void all_gather(const void* send, void* recv, std::size_t count, DType dtype, const std::string&) override {
      all_.exchange(rank_, send, recv, count * dtype_size(dtype));
    }
    void all_reduce_sum(void*, std::size_t, DType, void*, const std::string& what) override { unused(what); }
    std::size_t all_reduce_workspace(std::size_t, DType) const override { return 0; }
    void reduce_scatter_sum(const void*, void*, std::size_t, DType, void*, const std::string& what) override { unused(what); }
    std::size_t reduce_scatter_workspace(std::size_t, DType) const override { return 0; }
    void broadcast(void*, std::size_t, DType, int, const std::string& what) override { unused(what); }
    void barrier(const std::string& what) override { unused(what); }

   private:
    [[noreturn]] static void unused(const std::string& what) { fail("ThreadRanks: no such collective here (", what, ")"); }
    ThreadRanks& all_;
    int rank_, local_;
  };

  // Each rank's bytes to both, once both have given theirs.
  void exchange(int rank, const void* send, void* recv, std::size_t bytes) {
    std::unique_lock lock(m_);
    const long round = round_;
    slot_[rank].assign(static_cast<const char*>(send), static_cast<const char*>(send) + bytes);
    if (++arrived_ == 2) cv_.notify_all();
    cv_.wait(lock, [&] { return arrived_ == 2 || round_ != round; });
    std::memcpy(recv, slot_[0].data(), bytes);
    std::memcpy(static_cast<char*>(recv) + bytes, slot_[1].data(), bytes);
    if (++copied_ == 2) {  // the last to copy opens the next round
      arrived_ = copied_ = 0;
      ++round_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return round_ != round; });
    }
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  std::vector<char> slot_[2];
  int arrived_ = 0, copied_ = 0;
  long round_ = 0;
};

}  // namespace

TEST_CASE("zero: ranks that would plan different collectives are made to agree at compile, or refused, not left to hang",
          "[zero][overlap]") {
  const int procs = omp_get_num_procs();
  if (procs < 2) {
    WARN("one core: no rank here can have a core free for its collectives");
    return;
  }
  // Rank 0 shares this machine with the other rank and computes on every
  // core: its collectives run in place. Rank 1 is alone on its machine
  // with a core free: left to itself, it runs them beside compute, in
  // buckets. Their sequences differ; compile must see it.
  auto compile_both = [&](std::optional<bool> overlap1, std::string* err) {
    ThreadRanks ranks;
    std::array<std::string, 2> collectives, errors;
    auto one = [&](int r) {
      try {
        nn::manual_seed(3);
        ZeroMlp m;
        optim::AdamW opt(m.parameters(), {});
        CompileOptions o;
        o.communicator = std::make_shared<ThreadRanks::Rank>(ranks, r, r == 0 ? 2 : 1);
        o.zero_stage = 0;
        o.threads = r == 0 ? procs : procs - 1;
        if (r == 1) o.overlap_collectives = overlap1;
        Step step = compile([&](Var x) { return mean(m.forward(x)); }, {input<float>({4, 5})}, opt, {}, o);
        collectives[std::size_t(r)] = step.plan().collectives;
      } catch (const Error& e) {
        errors[std::size_t(r)] = e.what();
      }
    };
    std::thread t1(one, 1);
    one(0);
    t1.join();
    *err = errors[0] + " | " + errors[1];
    return collectives;
  };
  std::string err;
  const auto agreed = compile_both(std::nullopt, &err);
  INFO(err);
  CHECK_THAT(agreed[0], Catch::Contains("in place") && Catch::Contains("planned different collectives"));
  CHECK_THAT(agreed[1], Catch::Contains("in place") && Catch::Contains("planned different collectives"));
  CHECK(agreed[0] == agreed[1]);
  // Pinned beside compute on rank 1, in place is not rank 1's choice: both refuse, naming the difference.
  compile_both(true, &err);
  CHECK_THAT(err, Catch::Contains("would not communicate") && Catch::Contains("collectives") &&
                      Catch::Contains("overlap_collectives is pinned"));
  CHECK(err.find("would not communicate") != err.rfind("would not communicate"));  // on both ranks
}

// Stage 3 frees each gathered parameter after its forward reads and, where
// the budget needs it, gathers it again before the backward reads it: a
// recomputation of the all-gather (its shard does not change before the
// update), chosen by the budget solve like any other.
TEST_CASE("zero: stage 3 gathers a parameter again for the backward where the budget needs it", "[zero][budget]") {
  zoo::Config c = small_gpt(32);
  c.layers = 1;  // each binding plan searches for its least memory: one layer keeps that quick
  zoo::Workload w = zoo::make(c);
  CompileOptions o;
  o.communicator = std::make_shared<dist::PlanOnly>(0, 2);
  o.zero_stage = 3;
  o.offload_optimizer = false;
  auto gathers = [](const PlannedStep& ps) {  // in place or, unconstrained on a machine with cores to spare, prefetched
    int n = 0;
    for (NodeId id : ps.plan.schedule) {
      const std::string op = ps.graph->node(id).op->name();
      n += op == "all_gather_parameter" || op == "all_gather_parameter.start";
    }
    return n;
  };
  const PlannedStep free = zoo::plan(w, {}, o);
  // No host memory to swap the gathered parameters to: the least the step
  // can run in frees them after the forward and gathers them again.
  Budget least{.device = free.plan.total_bytes() - 1, .host = 1};
  const PlannedStep again = zoo::plan(w, least, o);
  o.plan.recompute_collectives = false;
  const PlannedStep once = zoo::plan(w, least, o);
  INFO(plan::budget_summary(*again.graph, again.plan));
  CHECK(gathers(once) == gathers(free));
  CHECK(again.plan.min_feasible_bytes < once.plan.min_feasible_bytes);
  // At the least that needs re-gathering, the plan gathers some parameter twice.
  o.plan.recompute_collectives = true;
  const PlannedStep tight = zoo::plan(w, Budget{.device = again.plan.min_feasible_bytes, .host = 1}, o);
  CHECK(tight.plan.total_bytes() <= again.plan.min_feasible_bytes);
  CHECK(gathers(tight) > gathers(free));
  bool named = false;
  for (const auto& d : tight.plan.decisions) named = named || d.reason.find("recomputed by all_gather_parameter") != std::string::npos;
  CHECK(named);
  CHECK(plan::verify(*tight.graph, tight.plan, tight.roots).ok());
}

// Stage 3 beside compute: each parameter's gather starts once the one
// before it is done, so it runs while the forward computes with that
// earlier parameter, and its own readers wait only for what is left.
TEST_CASE("zero: stage 3 prefetches each parameter's gather while the compute before it runs", "[zero][overlap]") {
  zoo::Workload w = zoo::make(small_gpt(32));
  CompileOptions o;
  o.communicator = std::make_shared<dist::PlanOnly>(0, 2);
  o.zero_stage = 3;
  o.offload_optimizer = false;
  o.overlap_collectives = true;
  const PlannedStep ps = zoo::plan(w, {}, o);
  const Graph& g = *ps.graph;
  const auto& order = ps.plan.schedule;
  CHECK_THAT(ps.plan.collectives, Catch::Contains("parameter gathers, each started once the one before it is done"));
  std::vector<int> pos(g.num_nodes(), -1);
  for (std::size_t t = 0; t < order.size(); ++t) pos[std::size_t(order[t])] = int(t);
  auto gather_start = [&](NodeId n) {
    auto* s = dynamic_cast<const ops::CollectiveStart*>(g.node(n).op.get());
    return s && dynamic_cast<const ops::AllGatherParameter*>(&s->inner());
  };
  // Each gather's start and its done (the one reader of its output), in order.
  std::vector<std::pair<int, int>> gathers;
  for (std::size_t t = 0; t < order.size(); ++t) {
    CHECK(g.node(order[t]).op->name() != "all_gather_parameter");  // none in place
    if (!gather_start(order[t])) continue;
    int done = -1;
    for (std::size_t u = t + 1; u < order.size() && done < 0; ++u)
      if (dynamic_cast<const ops::CollectiveDone*>(g.node(order[u]).op.get()) &&
          g.node(order[u]).inputs[0] == g.node(order[t]).outputs[0])
        done = int(u);
    REQUIRE(done > int(t));
    gathers.push_back({int(t), done});
  }
  o.overlap_collectives = false;
  const PlannedStep in_place = zoo::plan(w, {}, o);
  int gathered_in_place = 0;
  for (NodeId n : in_place.plan.schedule) gathered_in_place += in_place.graph->node(n).op->name() == "all_gather_parameter";
  REQUIRE(gathered_in_place > 4);
  REQUIRE(int(gathers.size()) == gathered_in_place);
  // Groups, by capture order (node ids): the parameters captured with no
  // compute between them (one op's weight and bias, say) are gathered
  // together; each later group starts once the group before it is done.
  auto computes = [&](NodeId n) {
    const Op& op = *g.node(n).op;
    return !op.is_view() && !op.is_collective() && !dynamic_cast<const ops::CollectiveDone*>(&op);
  };
  std::vector<int> group(gathers.size(), 0);
  for (std::size_t i = 1; i < gathers.size(); ++i) {
    bool between = false;
    for (NodeId n = order[std::size_t(gathers[i - 1].second)]; n < order[std::size_t(gathers[i].first)]; ++n)
      between = between || computes(n);
    group[i] = group[i - 1] + (between ? 1 : 0);
  }
  REQUIRE(group.back() > 4);
  int overlapped = 0;
  for (std::size_t i = 0; i < gathers.size(); ++i) {
    if (group[i] == 0) continue;  // the first: nothing computes before it
    INFO("gather " << i << " of " << gathers.size() << ", group " << group[i]);
    const auto [start, done] = gathers[i];
    // Started once the group before is done, not earlier: at most one
    // group of parameters is gathered ahead of its readers.
    std::size_t last_before = i;
    while (group[last_before] == group[i]) --last_before;
    CHECK(gathers[last_before].second < start);
    // Forward compute reading a parameter of the group before runs while it is in flight.
    bool reads_before = false;
    for (int t = start + 1; t < done; ++t) {
      const Node& n = g.node(order[std::size_t(t)]);
      if (n.phase != Phase::forward || !computes(order[std::size_t(t)])) continue;
      for (ValueId in : n.inputs)
        for (std::size_t k = 0; k < gathers.size(); ++k)
          if (group[k] == group[i] - 1 &&
              plan::view_root(g, in) == plan::view_root(g, g.node(order[std::size_t(gathers[k].second)]).outputs[0]))
            reads_before = true;
    }
    CHECK(reads_before);
    overlapped += reads_before;
  }
  CHECK(overlapped > int(gathers.size()) / 2);
}

// In place (compile's choice where the budget binds), a reduce-scatter
// still runs as soon as its gradient is complete: left to the backward's
// end, every layer's whole gradient would be alive at once, the memory
// stages 2-3 exist to save.
TEST_CASE("zero: in place, stages 2-3 reduce-scatter each gradient once it is complete, not after the backward",
          "[zero][budget]") {
  for (int stage : {2, 3}) {
    INFO("stage " << stage);
    zoo::Workload w = zoo::make(small_gpt(32));
    CompileOptions o;
    o.communicator = std::make_shared<dist::PlanOnly>(0, 4);
    o.zero_stage = stage;
    o.offload_optimizer = false;
    o.overlap_collectives = false;
    const PlannedStep ps = zoo::plan(w, {}, o);
    const Graph& g = *ps.graph;
    const auto& order = ps.plan.schedule;
    std::vector<int> pos(g.num_nodes(), -1);
    for (std::size_t t = 0; t < order.size(); ++t) pos[std::size_t(order[t])] = int(t);
    int scattered = 0, last_backward = -1;
    for (std::size_t t = 0; t < order.size(); ++t)
      if (g.node(order[t]).phase == Phase::backward && !g.node(order[t]).op->is_collective()) last_backward = int(t);
    // Whole gradients waiting for their reduce-scatter, at each position.
    std::vector<int> waiting(order.size() + 1, 0);
    for (std::size_t t = 0; t < order.size(); ++t) {
      const Node& n = g.node(order[t]);
      if (n.op->name() != "reduce_scatter_mean") continue;
      ++scattered;
      const int made = pos[std::size_t(g.value(n.inputs[0]).producer)];
      ++waiting[std::size_t(made) + 1];
      --waiting[t];
      // Nothing but views, updates and collectives before it since its gradient.
      for (int u = made + 1; u < int(t); ++u) {
        const Node& m = g.node(order[std::size_t(u)]);
        INFO("position " << u << ": " << m.op->name() << ", between gradient " << made << " and its reduce-scatter " << t);
        CHECK((m.op->is_view() || m.op->is_collective() || m.phase == Phase::optimizer));
      }
    }
    REQUIRE(scattered > 4);
    int most = 0, at_end = 0;
    for (std::size_t t = 0; t < order.size(); ++t) {
      if (t > 0) waiting[t] += waiting[t - 1];
      most = std::max(most, waiting[t]);
      if (int(t) == last_backward) at_end = waiting[t];
    }
    CHECK(most <= 1);
    CHECK(at_end <= 1);
  }
}

// A recomputation that reads a parameter between two of its reads (stage 3's
// re-gather of a weight for the forward recomputed before its backward)
// may have it fetched again for it, instead of pinning it on the device the
// whole window: the window gets an option dropped after the read before it
// and fetched again, complete before the recomputation. Without that, a 1T
// model's stage-3 shards all stayed on the device from forward to backward.
TEST_CASE("zero: a shard dropped between its reads is fetched again for a re-gather that recomputes before the second",
          "[zero][budget]") {
  zoo::Config c = small_gpt(32);
  c.layers = 1;
  zoo::Workload w = zoo::make(c);
  CompileOptions o;
  o.communicator = std::make_shared<dist::PlanOnly>(0, 2);
  o.zero_stage = 3;
  o.offload_optimizer = false;
  o.overlap_collectives = false;
  const PlannedStep ps = zoo::plan(w, {}, o);
  const Graph& g = *ps.graph;
  const plan::BudgetProblem p = test_support::budget_problem_of(ps, Budget{.device = 1});
  // A re-gather's recomputation, and the shard window it reads inside.
  int found = 0;
  std::vector<int> choice;  // the first such pair, chosen together
  std::size_t window = 0;
  test_support::for_each_option_a_recomputation_allows(p, [&](std::size_t k, int j, const plan::Requirement& r, int m) {
    const plan::Option& rec = p.candidates[k].options[std::size_t(j)];
    const plan::Candidate& win = p.candidates[std::size_t(r.candidate)];
    if (win.wraps || g.value(win.value).kind != ValueKind::parameter) return;
    const plan::Option& fetch = win.options[std::size_t(m)];
    INFO(fetch.reason);
    CHECK(fetch.in_done >= 0);  // back before the recomputation, not only before the window's end
    CHECK(fetch.in_done <= rec.in_start);
    CHECK(fetch.in_done < win.after);
    CHECK(fetch.price_free);
    ++found;
    if (!choice.empty() || fetch.in_done != rec.in_start) return;
    // Chosen together, with the home the fetch is staged from.
    window = std::size_t(r.candidate);
    choice.assign(p.candidates.size(), 0);
    choice[k] = j;
    choice[std::size_t(r.candidate)] = m;
    for (const plan::Requirement& home : fetch.requires_)
      choice[std::size_t(home.candidate)] = std::countr_zero(home.allowed & ~1u);
  });
  REQUIRE(found > 0);
  // The window's bytes are off the device until the fetch, and the rewrite
  // runs the recomputation on the fetched copy.
  const plan::Rewritten rw = test_support::verified_window_choice(ps, p, choice, window);
  auto gathers = [](const Graph& graph, const std::vector<NodeId>& schedule) {
    int n = 0;
    for (NodeId id : schedule) n += graph.node(id).op->name() == "all_gather_parameter";
    return n;
  };
  CHECK(gathers(*rw.graph, rw.schedule) > gathers(g, ps.plan.schedule));
}

namespace {
// ZeroMlp's step over `comm` at ZeRO `stage` (unset: the optimizer's, or
// the planner's pick) within `budget`.
Step compile_over(ZeroMlp& m, Optimizer& opt, std::shared_ptr<Communicator> comm, std::optional<int> stage,
                  Budget budget = {}) {
  CompileOptions o;
  o.communicator = std::move(comm);
  o.zero_stage = stage;
  o.threads = 1;
  return compile([&](Var x) { return mean(m.forward(x)); }, {input<float>({4, 5})}, opt, budget, o);
}
// ZeroMlp trained at ZeRO `stage` over one rank (dist::local(): at stage
// 3 every shard is its whole parameter), so that the steps run.
Step compile_alone(ZeroMlp& m, Optimizer& opt, std::optional<int> stage = 3) {
  return compile_over(m, opt, dist::local(), stage);
}
float run_steps(Step& s, int from, int to) {
  Tensor x({4, 5});
  float loss = 0;
  for (int k = from; k < to; ++k) {
    for (std::int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = std::sin(0.7f * float(i) + 1.3f * float(k));
    loss = s.run(x);
  }
  return loss;
}
using test_support::same_bits;
std::uint32_t bits(float x) { return std::bit_cast<std::uint32_t>(x); }
// ZeroMlp of seed 3 and its AdamW, trained `steps` steps at stage 3 over
// one rank; `trained`: copies of its parameter shards then.
struct Stage3Run {
  std::unique_ptr<ZeroMlp> m;
  std::unique_ptr<optim::AdamW> opt;
  Step s;
  std::vector<Tensor> trained;
};
Stage3Run trained_stage3(int steps) {
  nn::manual_seed(3);
  auto m = std::make_unique<ZeroMlp>();
  auto opt = std::make_unique<optim::AdamW>(m->parameters(), optim::AdamWOptions{});
  Step s = compile_alone(*m, *opt);
  run_steps(s, 0, steps);
  std::vector<Tensor> trained;
  for (const auto& st : opt->parameter_shards()) trained.push_back(st.tensor.clone());
  return {std::move(m), std::move(opt), std::move(s), std::move(trained)};
}
}  // namespace

// At stage 3 the step trains the shards and leaves the module's tensors as
// they were: a shard cut from its parameter again, because another layout
// was planned meanwhile, would throw the training away, and a step compiled
// before the plan and one after would train different shards.
TEST_CASE("zero: planning another layout keeps the trained stage-3 shards, and training goes on as if it never had "
          "been planned",
          "[zero]") {
  Stage3Run ref = trained_stage3(3);
  Stage3Run f = trained_stage3(3);
  ZeroMlp& m = *f.m;
  REQUIRE(f.trained.size() == m.parameters().size());  // every parameter, whole over one rank
  // Ranks 0 and 1 of 2, as frugal-plan --ranks plans them: shards of other elements.
  for (int rank : {0, 1}) {
    const PlannedStep ps = plan_rank(m, *f.opt, rank, 2, 3);
    REQUIRE(kind_bytes(ps.plan, "parameters") < 4 * std::size_t(m.num_parameters()));
  }
  Step again = compile_alone(m, *f.opt);
  const auto kept = f.opt->parameter_shards();  // what a checkpoint saves
  REQUIRE(kept.size() == f.trained.size());
  for (std::size_t k = 0; k < kept.size(); ++k) {
    INFO("parameter " << k);
    CHECK_FALSE(kept[k].tensor.is_meta());
    CHECK(same_bits(kept[k].tensor, f.trained[k]));
  }
  // The step compiled before the plan and the one after, in turns.
  for (int step = 3; step < 9; ++step) {
    INFO("step " << step);
    const float want = run_steps(ref.s, step, step + 1);
    const float got = run_steps(step % 2 ? again : f.s, step, step + 1);
    CHECK(bits(got) == bits(want));
  }
  ref.s.gather_parameters();
  again.gather_parameters();
  for (std::size_t k = 0; k < f.trained.size(); ++k) {
    INFO("parameter " << k);
    CHECK(same_bits(m.parameters()[k], ref.m->parameters()[k]));
  }
}

// What checkpoints save, and what io::save_gathered_checkpoint gathers into
// the parameters: the shards of the step that trains (compiled or run
// last), not those of a layout planned before it. An optimizer that only
// plans reports the layout planned last, alone.
TEST_CASE("zero: parameter_shards() are the shards of the step compiled or run last, none below stage 3",
          "[zero][checkpoint]") {
  Stage3Run f = trained_stage3(3);
  ZeroMlp& m = *f.m;
  optim::AdamW& opt = *f.opt;
  // Rank 0 of 4 planned: the trained shards are still the ones reported.
  plan_rank(m, opt, 0, 4, 3);
  {
    const auto shards = opt.parameter_shards();
    REQUIRE(shards.size() == f.trained.size());
    for (std::size_t k = 0; k < shards.size(); ++k) {
      INFO("parameter " << k);
      CHECK(same_bits(shards[k].tensor, f.trained[k]));
    }
  }
  // Planned alone, ranks 0 of 2 then 0 of 4: rank 0 of 4's, where fc1's
  // bias and fc2's parameters are too small to shard over 4.
  {
    optim::AdamW planner(m.parameters(), {});
    plan_rank(m, planner, 0, 2, 3);
    plan_rank(m, planner, 0, 4, 3);
    std::vector<std::size_t> want, got;
    for (std::size_t k = 0; k < m.parameters().size(); ++k)
      if (ZeroShard::of(m.parameters()[k].numel(), 0, 4).every_rank_has_elements()) want.push_back(k);
    for (const auto& st : planner.parameter_shards()) {
      got.push_back(st.param);
      CHECK(st.tensor.numel() == ZeroShard::of(m.parameters()[st.param].numel(), 0, 4).length);
    }
    CHECK(got == want);
  }
  // Stage 1 trains the parameters themselves, and has no shard to save,
  // though stage 3 was planned with its optimizer first: a stage-3 shard
  // cut then and gathered now would overwrite what stage 1 trained since.
  f.s.gather_parameters();
  optim::AdamW opt1(m.parameters(), {});
  plan_rank(m, opt1, 0, 1, 3);
  Step s1 = compile_alone(m, opt1, 1);
  CHECK(opt1.parameter_shards().empty());
  run_steps(s1, 3, 5);
  std::vector<Tensor> stage1;
  for (const Tensor& p : m.parameters()) stage1.push_back(p.clone());
  const auto path = std::filesystem::temp_directory_path() / cat("frugal-zero-shards-", ::getpid(), ".safetensors");
  io::save_gathered_checkpoint(path, m, opt1, 5, *dist::local());
  std::filesystem::remove(path);
  for (std::size_t k = 0; k < stage1.size(); ++k) {
    INFO("parameter " << k);
    CHECK(same_bits(m.parameters()[k], stage1[k]));  // no stage-3 shard gathered over them
  }
  // The optimizer whose steps train stage 3 takes no stage-1 step (one
  // stage per optimizer), and keeps its shards as its steps left them.
  CHECK_THROWS_WITH(compile_alone(m, opt, 1), Catch::Contains("pins ZeRO stage 1"));
  const auto kept = opt.parameter_shards();
  REQUIRE(kept.size() == f.trained.size());
  for (std::size_t k = 0; k < kept.size(); ++k) {
    INFO("parameter " << k);
    CHECK(same_bits(kept[k].tensor, f.trained[k]));
  }
}

// A checkpoint describes the layout of the step that trains: one saved
// right after another layout was planned (dist::PlanOnly, as frugal-plan
// --ranks does) holds the trained state and shards, loads into a fresh run
// of the trained step, and that run goes on as if nothing had been planned.
TEST_CASE("zero: a checkpoint saved right after planning another layout resumes the trained step bit for bit",
          "[zero][checkpoint]") {
  const auto path = std::filesystem::temp_directory_path() / cat("frugal-zero-planned-", ::getpid(), ".safetensors");
  const int saved_at = 3, steps = 6;
  for (int stage : {1, 3}) {
    INFO("stage " << stage);
    nn::manual_seed(3);
    ZeroMlp ref;
    optim::AdamW ropt(ref.parameters(), {});
    Step rs = compile_alone(ref, ropt, stage);
    std::vector<float> want;
    for (int k = 0; k < steps; ++k) want.push_back(run_steps(rs, k, k + 1));

    nn::manual_seed(3);
    ZeroMlp m;
    optim::AdamW opt(m.parameters(), {});
    Step s = compile_alone(m, opt, stage);
    run_steps(s, 0, saved_at);
    plan_rank(m, opt, 0, 2, stage);  // rank 0 of 2: a shard of every parameter large enough
    io::save_checkpoint(path, m, opt, saved_at);

    nn::manual_seed(11);  // other starting values: what resumes must come from the file
    ZeroMlp fresh;
    optim::AdamW fopt(fresh.parameters(), {});
    Step fs = compile_alone(fresh, fopt, stage);
    io::TrainingState st;
    REQUIRE_NOTHROW(st = io::load_checkpoint(path, fresh, fopt));
    fs.set_steps_run(st.step);
    fs.parameters_changed();
    for (int k = saved_at; k < steps; ++k) {
      INFO("step " << k);
      CHECK(bits(run_steps(fs, k, k + 1)) == bits(want[std::size_t(k)]));
    }
    rs.gather_parameters();
    fs.gather_parameters();
    for (std::size_t k = 0; k < ref.parameters().size(); ++k) {
      INFO("parameter " << k);
      CHECK(same_bits(fresh.parameters()[k], ref.parameters()[k]));
    }
    const auto got_state = fopt.state(), want_state = ropt.state();
    REQUIRE(got_state.size() == want_state.size());
    for (std::size_t k = 0; k < want_state.size(); ++k) {
      INFO(want_state[k].slot << " of parameter " << want_state[k].param);
      CHECK(same_bits(got_state[k].tensor, want_state[k].tensor));
    }
  }
  std::filesystem::remove(path);
}

// The first stage-3 step of a layout cuts its shards from the parameters'
// values. A parameter another step keeps on NVMe has them in that step's
// file until asked for (runtime/nvme_homes.hpp), not in its storage.
TEST_CASE("zero: a stage-3 shard cut from a parameter that a step keeps on NVMe holds the parameter's values",
          "[zero][nvme]") {
  const auto dir = std::filesystem::temp_directory_path() / cat("frugal-zero-nvme-", ::getpid());
  std::filesystem::create_directories(dir);
  nn::manual_seed(3);
  nn::Linear m{64, 64};  // a weight of 16 KiB: whole pages, which a step keeping it on NVMe gives back between steps
  const std::vector<Tensor> ps = m.parameters();  // taken now: parameters() brings them back from NVMe
  optim::AdamW opt(ps, {});
  auto fn = [&](Var x) { return mean(m(x)); };
  CompileOptions nvme;
  nvme.threads = 1;
  nvme.plan.nvme_offload.parameters = true;
  Step s0 = compile(fn, {input<float>({4, 64})}, opt, Budget{.nvme_dir = dir.string()}, nvme);
  Tensor x({4, 64});
  for (int k = 0; k < 2; ++k) {
    for (std::int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = std::sin(0.3f * float(i) + float(k));
    s0.run(x);
  }
  REQUIRE(NvmeHomes::registry().held() > 0);  // the parameters live in s0's file between its steps
  CompileOptions o;
  o.communicator = dist::local();
  o.zero_stage = 3;
  o.threads = 1;
  Step s3 = compile(fn, {input<float>({4, 64})}, opt, {}, o);
  const auto shards = opt.parameter_shards();
  REQUIRE(shards.size() == ps.size());
  for (std::size_t k = 0; k < ps.size(); ++k) {
    INFO("parameter " << k << " (" << ps[k].numel() << " elements)");
    NvmeHomes::registry().bring_back(ps[k].raw());
    CHECK(same_bits(shards[k].tensor, ps[k]));
  }
  std::filesystem::remove_all(dir);
}

// ---- one stage per optimizer --------------------------------------------------

namespace {
// What one rank of a two-rank run of ZeroMlp left: its losses, its
// parameters (gathered) and its optimizer's state(), and the ZeRO stage
// and reason of the second step, where it had one.
struct RankRun {
  std::vector<float> losses;
  std::vector<Tensor> params, state;
  int second_stage = -1;
  std::string second_reason;
};
// ZeroMlp of seed 3 and its AdamW over two thread ranks, 6 steps of a step
// pinned at `stage`; with `second`, in turns with a step compiled after it
// on the same optimizer with the stage unset and no budget, where the
// planner alone would take stage 0 (nothing to shard for). Each rank
// trains on data of its own.
std::array<RankRun, 2> train_two_ranks(int stage, bool second) {
  std::array<RankRun, 2> out;
  test_support::run_two_ranks_ok([&](int r, std::shared_ptr<Communicator> comm) {
    nn::manual_seed(3);
    ZeroMlp m;
    optim::AdamW opt(m.parameters(), {});
    RankRun& got = out[std::size_t(r)];
    Step first = compile_over(m, opt, comm, stage);
    std::optional<Step> other;
    if (second) {
      other.emplace(compile_over(m, opt, comm, std::nullopt));
      got.second_stage = other->plan().zero_stage;
      got.second_reason = other->plan().zero_reason;
    }
    for (int k = 0; k < 6; ++k) got.losses.push_back(run_steps(other && k % 2 ? *other : first, 7 * k + r, 7 * k + r + 1));
    first.gather_parameters();
    test_support::record_trained(got, m.parameters(), opt);
  });
  return out;
}
}  // namespace

// A stage lays the optimizer's state out its own way (whole moments at 0, a
// shard's at 1 and 2, the parameter shards at 3): a second step on the same
// optimizer at another stage would train state of its own, and the two
// steps would part.
TEST_CASE("zero: a step compiled on an optimizer whose steps train at a ZeRO stage takes that stage, and trains the "
          "same state",
          "[zero]") {
  for (int stage : {1, 3}) {
    INFO("stage " << stage);
    const std::array<RankRun, 2> want = train_two_ranks(stage, false), got = train_two_ranks(stage, true);
    for (std::size_t r = 0; r < 2; ++r) {
      INFO("rank " << r);
      CHECK(got[r].second_stage == stage);
      CHECK_THAT(got[r].second_reason, Catch::Contains(cat("the stage the optimizer's earlier steps train, ", stage)));
      test_support::check_same_training(got[r], want[r]);
    }
  }
}

namespace {
// A 64 x 64 linear layer, whose weight's moments (32 KiB) are most of what
// its step holds: sharding them over two ranks lowers the least it fits in.
struct WideLayer {
  nn::Linear fc{64, 64};
  std::vector<InputSpec> inputs{input<float>({4, 64})};
  Var loss(Var x) { return mean(fc(x)); }
};
// The least device budget rank `rank` of 2 plans `w`'s step in at `stage`
// (unset: the planner's pick), with an optimizer of its own.
std::size_t least_of_rank(WideLayer& w, int rank, std::optional<int> stage) {
  optim::AdamW scratch(w.fc.parameters(), {});
  CompileOptions o;
  o.communicator = std::make_shared<dist::PlanOnly>(rank, 2);
  o.zero_stage = stage;
  try {
    plan_training([&](Var x) { return w.loss(x); }, w.inputs, scratch, Budget{.device = 1}, o);
  } catch (const BudgetError& e) {
    return e.smallest_feasible_bytes;
  }
  FAIL("a budget of one byte was not refused");
  return 0;
}
// Rank 0 of two thread ranks, for planning alone: it runs no collective,
// and its plans are those the ranks of test_support::run_two_ranks compile.
struct PlanningRank0 {
  test_support::ThreadGroup group{2};
  std::shared_ptr<Communicator> comm = std::make_shared<test_support::ThreadComm>(group, 0);
};
// What rank 0 of 2 plans `w`'s step in at `stage` with nothing evicted,
// its collectives in place.
std::size_t unconstrained_at(WideLayer& w, int stage) {
  optim::AdamW scratch(w.fc.parameters(), {});
  PlanningRank0 rank0;
  CompileOptions o;
  o.communicator = rank0.comm;
  o.zero_stage = stage;
  o.overlap_collectives = false;
  o.threads = 1;
  return plan_training([&](Var x) { return w.loss(x); }, w.inputs, scratch, {}, o).plan.total_bytes();
}
}  // namespace

TEST_CASE("zero: a step that does not fit at the stage its optimizer's steps train is refused, naming the stage and "
          "its bytes",
          "[zero][budget]") {
  nn::manual_seed(3);
  WideLayer w;
  const std::size_t least0 = least_of_rank(w, 0, 0);
  // Under stage 0's least, the planner alone takes a sharded stage.
  const Budget tight{.device = least0 - 1};
  for (int rank : {0, 1}) REQUIRE(least_of_rank(w, rank, std::nullopt) <= tight.device);
  std::array<std::string, 2> refusals;
  std::array<std::size_t, 2> needed{};
  test_support::run_two_ranks_ok([&](int r, std::shared_ptr<Communicator> comm) {
    optim::AdamW opt(w.fc.parameters(), {});
    CompileOptions o;
    o.communicator = comm;
    o.zero_stage = 0;
    o.threads = 1;
    auto fn = [&](Var x) { return w.loss(x); };
    Step first = compile(fn, w.inputs, opt, {}, o);
    o.zero_stage.reset();
    try {
      compile(fn, w.inputs, opt, tight, o);
    } catch (const BudgetError& e) {
      refusals[std::size_t(r)] = e.what();
      needed[std::size_t(r)] = e.smallest_feasible_bytes;
    }
  });
  for (std::size_t r = 0; r < 2; ++r) {
    INFO("rank " << r << ": " << refusals[r]);
    CHECK(needed[r] > tight.device);
    CHECK_THAT(refusals[r], Catch::Contains("ZeRO stage 0") && Catch::Contains("the optimizer's earlier steps train") &&
                                Catch::Contains(cat(needed[r], " bytes")));
  }
}

namespace {
// A single-process step whose least device budget grows with n: an n x 1
// linear layer trained by SGD.
struct Ballast {
  explicit Ballast(std::int64_t n) : fc(n, 1), inputs{input<float>({1, n})} {}
  nn::Linear fc;
  std::vector<InputSpec> inputs;
  Var loss(Var x) { return mean(fc(x)); }
  std::size_t least() {
    optim::SGD scratch(fc.parameters(), {.lr = 0.1});
    try {
      plan_training([&](Var x) { return loss(x); }, inputs, scratch, Budget{.device = 1}, {.threads = 1});
    } catch (const BudgetError& e) {
      return e.smallest_feasible_bytes;
    }
    FAIL("a budget of one byte was not refused");
    return 0;
  }
};
// The least and the unconstrained bytes a rank plans `w`'s step in over
// `comm` on one thread, at `stage` (unset: the planner's search), from its
// refusal of a one-byte budget, as a broker's probe finds them (planning
// alone runs no collective).
struct Refusal {
  std::size_t least = 0, unconstrained = 0;
};
Refusal refusal_over(WideLayer& w, std::shared_ptr<Communicator> comm, std::optional<int> stage) {
  optim::AdamW scratch(w.fc.parameters(), {});
  CompileOptions o;
  o.communicator = std::move(comm);
  o.zero_stage = stage;
  o.threads = 1;
  try {
    plan_training([&](Var x) { return w.loss(x); }, w.inputs, scratch, Budget{.device = 1}, o);
  } catch (const BudgetError& e) {
    return {e.smallest_feasible_bytes, e.unconstrained_bytes};
  }
  FAIL("a budget of one byte was not refused");
  return {};
}
}  // namespace

// A broker probes a joining step for its least and unconstrained bytes
// before its first compile, when its optimizer's ZeRO stage is not fixed
// yet: the planner's refusal then names the least of any stage, and stage
// 0's unconstrained bytes (where its search stops), so the step gets a share
// up to those. The first compile fixes a stage, which every later compile of
// the step must plan at, so the broker probes it again: the step's least is
// that stage's from then on, and a step that joins later and would cut it
// below that is refused at admission with the bytes both need (not by the
// first step's compile failing midway through the re-share).
TEST_CASE("zero: a broker gives a step of unpinned stage up to stage 0's unconstrained bytes, then counts the least of "
          "the stage its first compile fixed",
          "[zero][broker]") {
  nn::manual_seed(5);
  std::array<WideLayer, 2> layers;
  struct Seen {
    std::size_t any = 0, total = 0, stage0_total = 0, fixed = 0, ballast = 0;
    std::optional<int> stage;
    MemoryBroker::Share share;
    bool evicts = true;
    std::string refusal;
    float loss = 0;
  };
  std::array<Seen, 2> seen;
  test_support::run_two_ranks_ok([&](int r, std::shared_ptr<Communicator> comm) {
    WideLayer& w = layers[std::size_t(r)];
    Seen& s = seen[std::size_t(r)];
    const Refusal search = refusal_over(w, comm, std::nullopt), stage0 = refusal_over(w, comm, 0);
    s.any = search.least;
    s.total = search.unconstrained;
    s.stage0_total = stage0.unconstrained;
    optim::AdamW opt(w.fc.parameters(), {});
    CompileOptions o;
    o.communicator = comm;
    o.threads = 1;
    auto fn = [&](Var x) { return w.loss(x); };
    MemoryBroker broker(Budget{.device = s.total});
    const auto a = broker.join(
        "wide", [&](const Budget& b) { return compile(fn, w.inputs, opt, b, o); },
        [&](const Budget& b) { return plan_training(fn, w.inputs, opt, b, o); });
    s.stage = opt.zero_stage();
    s.evicts = !broker.step(a).plan().decisions.empty();
    s.fixed = refusal_over(w, comm, s.stage.value_or(-1)).least;
    s.share = broker.shares().at(0);
    // The smallest ballast that does not fit beside the first step at the
    // least of its fixed stage.
    std::int64_t lo = 1, hi = 1 << 16;
    while (lo < hi) {
      const std::int64_t mid = (lo + hi) / 2;
      if (Ballast(mid).least() > s.total - s.fixed) hi = mid;
      else lo = mid + 1;
    }
    Ballast ballast(lo);
    s.ballast = ballast.least();
    optim::SGD sgd(ballast.fc.parameters(), {.lr = 0.1});
    auto bfn = [&](Var x) { return ballast.loss(x); };
    try {
      broker.join(
          "ballast", [&](const Budget& b) { return compile(bfn, ballast.inputs, sgd, b, {.threads = 1}); },
          [&](const Budget& b) { return plan_training(bfn, ballast.inputs, sgd, b, {.threads = 1}); });
    } catch (const BudgetError& e) {
      s.refusal = e.what();
    }
    if (broker.size() != 1) fail("the ballast was admitted");
    Tensor x({4, 64});
    s.loss = broker.step(a).run(x);
  });
  for (std::size_t r = 0; r < 2; ++r) {
    const Seen& s = seen[r];
    INFO("rank " << r << ": least of any stage " << s.any << ", stage 0 unconstrained " << s.total << "; share "
                 << s.share.budget << " (least " << s.share.least << ", unconstrained " << s.share.unconstrained
                 << "); stage " << s.stage.value_or(-1) << " with least " << s.fixed << "; ballast " << s.ballast
                 << ": " << s.refusal);
    // The search's refusal names stage 0's unconstrained bytes, and the
    // broker gives the step up to them, where the planner takes stage 0
    // with nothing evicted.
    CHECK(s.total == s.stage0_total);
    REQUIRE(s.total > s.any);
    CHECK(s.share.budget == s.total);
    CHECK(s.share.unconstrained == s.total);
    CHECK(s.stage == 0);
    CHECK_FALSE(s.evicts);
    // Probed again at the stage fixed.
    CHECK(s.fixed > s.any);
    CHECK(s.share.least == s.fixed);
    CHECK_THAT(s.refusal, Catch::Contains("memory broker: step 'ballast' needs at least") &&
                              Catch::Contains(cat("together ", s.fixed + s.ballast, " bytes")));
    CHECK(std::isfinite(s.loss));
  }
}

// At a sharded stage each rank holds its shard of the state, cut for the
// rank count the stage was fixed over: a step over no communicator, or
// over another count, would find none of it and train fresh state from
// zero. At stage 0 the state is whole, and a single-rank step shares it.
TEST_CASE("zero: a step over another rank count than its optimizer's sharded steps is refused; at stage 0 it is not",
          "[zero]") {
  nn::manual_seed(3);
  WideLayer w;
  std::array<std::string, 2> alone, over_one;
  std::array<bool, 2> stage0_alone_ok{};
  test_support::run_two_ranks_ok([&](int r, std::shared_ptr<Communicator> comm) {
    auto fn = [&](Var x) { return w.loss(x); };
    CompileOptions o;
    o.communicator = comm;
    o.zero_stage = 1;
    o.threads = 1;
    optim::AdamW sharded(w.fc.parameters(), {});
    Step first = compile(fn, w.inputs, sharded, {}, o);
    CompileOptions no_comm;
    no_comm.threads = 1;
    try {
      compile(fn, w.inputs, sharded, {}, no_comm);
    } catch (const Error& e) {
      alone[std::size_t(r)] = e.what();
    }
    CompileOptions one = no_comm;
    one.communicator = dist::local();
    try {
      compile(fn, w.inputs, sharded, {}, one);
    } catch (const Error& e) {
      over_one[std::size_t(r)] = e.what();
    }
    optim::AdamW whole(w.fc.parameters(), {});
    o.zero_stage = 0;
    Step replicated = compile(fn, w.inputs, whole, {}, o);
    Step single = compile(fn, w.inputs, whole, {}, no_comm);
    stage0_alone_ok[std::size_t(r)] = single.plan().zero_stage <= 0;
  });
  for (std::size_t r = 0; r < 2; ++r) {
    INFO("rank " << r);
    CHECK_THAT(alone[r], Catch::Contains("ZeRO stage 1 over 2 ranks") && Catch::Contains("over no communicator") &&
                             Catch::Contains("io::save_gathered_checkpoint"));
    CHECK_THAT(over_one[r], Catch::Contains("ZeRO stage 1 over 2 ranks") && Catch::Contains("this step is over 1 rank:"));
    CHECK(stage0_alone_ok[r]);
  }
}

// Planning alone (plan_training, dist::PlanOnly, frugal-plan --ranks) asks
// what a step would be: it follows the stage the optimizer's steps train
// where none is pinned, as compile would, and plans a pinned one as asked,
// but fixes none: only a compiled step trains the state.
TEST_CASE("zero: a pin of another stage than the optimizer's steps train is refused at compile; planning alone fixes "
          "no stage",
          "[zero]") {
  nn::manual_seed(3);
  ZeroMlp m;
  optim::AdamW opt(m.parameters(), {});
  plan_rank(m, opt, 0, 2, 1);  // planned at stage 1 first: no step trains it
  Step s = compile_alone(m, opt, 3);
  CHECK_THROWS_WITH(compile_alone(m, opt, 1),
                    Catch::Contains("pins ZeRO stage 1") && Catch::Contains("earlier steps train at stage 3") &&
                        Catch::Contains("io::save_gathered_checkpoint"));
  const PlannedStep what_if = plan_rank(m, opt, 0, 2, 1);
  CHECK(what_if.plan.zero_stage == 1);
  const PlannedStep follows = plan_rank(m, opt, 0, 2, std::nullopt);
  CHECK(follows.plan.zero_stage == 3);
  CHECK_THAT(follows.plan.zero_reason, Catch::Contains("the stage the optimizer's earlier steps train, 3"));
  Step again = compile_alone(m, opt, std::nullopt);
  CHECK(again.plan().zero_stage == 3);
}

namespace {
// What one rank of a shape cache's run left: each shape's step's ZeRO
// stage and reason, the losses, parameters (gathered) and state().
struct CacheRun {
  std::vector<int> stages;
  std::vector<std::string> reasons;
  std::vector<float> losses;
  std::vector<Tensor> params, state;
};
// WideLayer of seed 3 trained over two thread ranks by a shape cache within
// `total`, at ZeRO `stage` (unset: the cache's pick), on batches of 4 and
// 8 rows in turns.
std::array<CacheRun, 2> train_cached(const Budget& total, std::optional<int> stage) {
  std::array<CacheRun, 2> out;
  test_support::run_two_ranks_ok([&](int r, std::shared_ptr<Communicator> comm) {
    nn::manual_seed(3);
    WideLayer w;
    optim::AdamW opt(w.fc.parameters(), {});
    CompileOptions o;
    o.communicator = comm;
    o.zero_stage = stage;
    o.threads = 1;
    auto cache = cache_shapes([&](Var x) { return w.loss(x); }, w.inputs, opt, total, o);
    CacheRun& got = out[std::size_t(r)];
    for (int k = 0; k < 4; ++k) {
      Tensor x({k % 2 ? 8 : 4, 64});
      for (std::int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = std::sin(0.37f * float(i) + 1.1f * float(2 * k + r));
      got.losses.push_back(cache->run({x}));
      if (k < 2) {
        got.stages.push_back(cache->step_for({x}).plan().zero_stage);
        got.reasons.push_back(cache->step_for({x}).plan().zero_reason);
      }
    }
    cache->gather_parameters();
    test_support::record_trained(got, w.fc.parameters(), opt);
  });
  return out;
}
}  // namespace

// The cache's steps share the optimizer's state: every shape trains at the
// stage picked for the first, at the whole budget, before any is compiled.
TEST_CASE("zero: a shape cache trains every shape at the stage the planner picks for the first at the whole budget",
          "[zero][shapes]") {
  nn::manual_seed(3);
  WideLayer probe;
  const Budget total{.device = unconstrained_at(probe, 0) - 1};
  const std::array<CacheRun, 2> picked = train_cached(total, std::nullopt);
  const int stage = picked[0].stages[0];
  const std::array<CacheRun, 2> pinned = train_cached(total, stage);
  for (std::size_t r = 0; r < 2; ++r) {
    INFO("rank " << r << ": " << picked[r].reasons[0]);
    CHECK(picked[r].stages == std::vector<int>{stage, stage});
    CHECK_THAT(picked[r].reasons[1], Catch::Contains(cat("the stage the optimizer's earlier steps train, ", stage)));
    test_support::check_same_training(picked[r], pinned[r]);
  }
}

// ---- the stage search's pick -----------------------------------------------------

namespace {
// What one rank of WideLayer's two-rank run left after 4 steps: its plan's
// stage and reason, its losses, parameters, state() and checkpoint file.
struct WideRun {
  int stage = -1;
  std::string reason;
  std::vector<float> losses;
  std::vector<Tensor> params, state;
  std::string checkpoint;
};
std::string file_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
// WideLayer of seed 3 trained over two thread ranks within `budget`, at
// ZeRO `stage` (unset: the planner's pick), on data of each rank's own.
std::array<WideRun, 2> train_wide(const Budget& budget, std::optional<int> stage) {
  std::array<WideRun, 2> out;
  test_support::run_two_ranks_ok([&](int r, std::shared_ptr<Communicator> comm) {
    nn::manual_seed(3);
    WideLayer w;
    optim::AdamW opt(w.fc.parameters(), {});
    CompileOptions o;
    o.communicator = comm;
    o.zero_stage = stage;
    o.threads = 1;
    Step s = compile([&](Var x) { return w.loss(x); }, w.inputs, opt, budget, o);
    WideRun& got = out[std::size_t(r)];
    got.stage = s.plan().zero_stage;
    got.reason = s.plan().zero_reason;
    Tensor x({4, 64});
    for (int k = 0; k < 4; ++k) {
      for (std::int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = std::sin(0.37f * float(i) + 1.1f * float(2 * k + r));
      got.losses.push_back(s.run(x));
    }
    s.gather_parameters();
    test_support::record_trained(got, w.fc.parameters(), opt);
    const auto path = std::filesystem::temp_directory_path() / cat("frugal-zero-pick-", ::getpid(), "-", r, ".safetensors");
    io::save_checkpoint(path, w.fc, opt, 4);
    got.checkpoint = file_bytes(path);
    std::filesystem::remove(path);
  });
  return out;
}
}  // namespace

// The search prepares every stage it tries; the one it picks may come
// before the last. Each prepared step carries its own layout of the
// optimizer's state (Optimizer::Layout), and the step made trains that
// one, whatever was prepared after it.
TEST_CASE("zero: a stage the search picks before the last one it tried trains, reports and checkpoints what a run "
          "pinned to it does",
          "[zero][budget][checkpoint]") {
  nn::manual_seed(3);
  WideLayer probe;
  // One byte under stage 0's unconstrained bytes, every stage is tried.
  const Budget tight{.device = unconstrained_at(probe, 0) - 1};
  const std::array<WideRun, 2> chosen = train_wide(tight, std::nullopt);
  INFO(chosen[0].reason);
  REQUIRE_THAT(chosen[0].reason, Catch::Contains("stage 3 fits"));
  REQUIRE(chosen[0].stage < 3);  // picked before the last stage tried
  const std::array<WideRun, 2> pinned = train_wide(tight, chosen[0].stage);
  for (std::size_t r = 0; r < 2; ++r) {
    INFO("rank " << r);
    CHECK(chosen[r].stage == chosen[0].stage);
    test_support::check_same_training(chosen[r], pinned[r]);
    CHECK(chosen[r].checkpoint == pinned[r].checkpoint);
  }
  // Planned alone, the optimizer reports the picked stage's layout, though
  // stage 3 was prepared last: its state, and no stage-3 shards.
  optim::AdamW opt(probe.fc.parameters(), {});
  PlanningRank0 rank0;
  CompileOptions o;
  o.communicator = rank0.comm;
  o.threads = 1;
  const PlannedStep planned = plan_training([&](Var x) { return probe.loss(x); }, probe.inputs, opt, tight, o);
  REQUIRE(planned.plan.zero_stage == chosen[0].stage);
  const auto state = opt.state();
  REQUIRE(state.size() == chosen[0].state.size());
  for (std::size_t k = 0; k < state.size(); ++k) CHECK(state[k].tensor.shape() == chosen[0].state[k].shape());
  CHECK(opt.parameter_shards().empty());
}
