// Issue 20: planning at cluster scale. Meta tensors (MetaScope): a model
// built of shapes plans exactly as the same model with real weights, and a
// 1T-parameter GPT plans on this machine; the step simulator (plan/step_sim.hpp)
// runs a plan in virtual time.
#include <catch2/catch.hpp>

#include <chrono>

#include <frugal/dist/plan_only.hpp>
#include <frugal/frugal.hpp>
#include <frugal/plan/profile_prices.hpp>
#include <frugal/runtime/process_memory.hpp>

#include "../tools/model_zoo.hpp"

using namespace frugal;
using Catch::Matchers::Contains;

namespace {

PlannedStep plan_zoo_rank(zoo::Config c, bool meta, int rank, int ranks, std::optional<int> stage, Budget b = {}) {
  c.meta = meta;
  zoo::Workload w = zoo::make(c);
  CompileOptions o;
  if (ranks > 1) {
    o.communicator = std::make_shared<dist::PlanOnly>(rank, ranks);
    o.zero_stage = stage;
    o.overlap_collectives = true;
  }
  return zoo::plan(w, b, o);
}

void require_same_plan(const PlannedStep& a, const PlannedStep& b) {
  REQUIRE(a.graph->num_nodes() == b.graph->num_nodes());
  CHECK(a.plan.schedule == b.plan.schedule);
  CHECK(a.plan.offsets == b.plan.offsets);
  CHECK(a.plan.arena_bytes == b.plan.arena_bytes);
  CHECK(a.plan.peak_bytes == b.plan.peak_bytes);
  CHECK(a.plan.persistent_bytes == b.plan.persistent_bytes);
  CHECK(a.plan.persistent_by_kind == b.plan.persistent_by_kind);
  CHECK(a.plan.offloaded_bytes == b.plan.offloaded_bytes);
  CHECK(a.plan.host_bytes == b.plan.host_bytes);
  CHECK(a.plan.nvme_bytes == b.plan.nvme_bytes);
  CHECK(a.plan.decisions.size() == b.plan.decisions.size());
  CHECK(a.plan.zero_stage == b.plan.zero_stage);
}

}  // namespace

TEST_CASE("meta: a tensor made in a MetaScope has a shape, a unique address and no data", "[cluster][meta]") {
  Tensor real({3, 4});
  Tensor a, b;
  {
    MetaScope meta;
    a = Tensor({1000, 1000, 1000}, DType::f32);  // 4 GB that are never allocated
    b = Tensor({2});
    {
      MetaScope off(false);
      Tensor inner({2});
      CHECK_FALSE(inner.is_meta());
    }
    CHECK(MetaScope::active());
  }
  CHECK_FALSE(MetaScope::active());
  CHECK_FALSE(real.is_meta());
  CHECK(a.is_meta());
  CHECK(a.defined());
  CHECK(a.nbytes() == 4000000000ull);
  CHECK(a.raw() != b.raw());
  CHECK(a.clone().is_meta());
  CHECK(a.clone().raw() != a.raw());
  CHECK_THROWS_WITH(a.data<float>(), Contains("meta tensor") && Contains("MetaScope"));
  CHECK_THROWS_WITH(b.copy_from(Tensor({2})), Contains("meta tensor"));
}

TEST_CASE("meta: a model of meta tensors plans exactly as the same model with its weights", "[cluster][meta]") {
  zoo::Config gpt;
  gpt.family = "gpt", gpt.layers = 2, gpt.width = 64, gpt.batch = 4, gpt.seq = 32, gpt.vocab = 97;
  zoo::Config resnet;
  resnet.family = "resnet", resnet.layers = 1, resnet.width = 8, resnet.batch = 4, resnet.image = 16;
  zoo::Config gcn;
  gcn.family = "gcn", gcn.layers = 2, gcn.width = 32, gcn.batch = 200;
  for (const zoo::Config& c : {gpt, resnet, gcn}) {
    INFO(c.name());
    require_same_plan(plan_zoo_rank(c, true, 0, 1, {}), plan_zoo_rank(c, false, 0, 1, {}));
    // Under a budget that binds, the solver's choices too.
    PlannedStep free = plan_zoo_rank(c, false, 0, 1, {});
    Budget tight{.device = free.plan.total_bytes() * 7 / 8};
    PlannedStep real = plan_zoo_rank(c, false, 0, 1, {}, tight);
    CHECK_FALSE(real.plan.decisions.empty());
    require_same_plan(plan_zoo_rank(c, true, 0, 1, {}, tight), real);
  }
  // Every ZeRO stage, on the first and the last of 3 ranks (a shard with a remainder).
  for (int stage = 0; stage <= 3; ++stage)
    for (int rank : {0, 2}) {
      INFO("stage " << stage << ", rank " << rank);
      require_same_plan(plan_zoo_rank(gpt, true, rank, 3, stage), plan_zoo_rank(gpt, false, rank, 3, stage));
    }
}

TEST_CASE("meta: a 1T-parameter GPT plans in under a minute and 2 GiB, sharded over 16 ranks", "[cluster][meta]") {
  // The ZeRO-Infinity paper's 1T configuration: 128 layers of width 25600,
  // 1024-token sequences (its vocabulary is GPT-2's).
  zoo::Config c;
  c.family = "gpt", c.layers = 128, c.width = 25600, c.heads = 160, c.seq = 1024, c.batch = 1, c.vocab = 50257;
  const std::size_t rss_before = current_rss_bytes();
  auto t0 = std::chrono::steady_clock::now();
  PlannedStep ps = plan_zoo_rank(c, true, 0, 16, 3);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::size_t rss_after = peak_rss_bytes();
  INFO("planned in " << seconds << " s; peak RSS " << format_bytes(rss_after) << ", before " << format_bytes(rss_before));
  CHECK(seconds < 60);
  CHECK(rss_after < rss_before + (std::size_t(2) << 30));
  // 12 L h^2 for the blocks, the embeddings and the untied head:
  const double params = 12.0 * 128 * 25600.0 * 25600 + 2.0 * 50257 * 25600 + 1024.0 * 25600;
  CHECK(params > 1e12);
  CHECK(ps.plan.zero_stage == 3);
  // Stage 3 over 16: each rank holds a sixteenth of the f32 parameters (and
  // the norms' biases and gains, which the formula above leaves out).
  auto params_it = ps.plan.persistent_by_kind.find("parameters");
  REQUIRE(params_it != ps.plan.persistent_by_kind.end());
  CHECK(double(params_it->second) >= 4 * params / 16);
  CHECK(double(params_it->second) <= 4 * params / 16 * 1.001);
}

TEST_CASE("meta: a step over meta tensors cannot be compiled to run", "[cluster][meta]") {
  zoo::Config c;
  c.family = "mlp", c.meta = true;
  zoo::Workload w = zoo::make(c);
  CHECK_THROWS_WITH(zoo::compile(w), Contains("meta tensor") && Contains("planned") && Contains("outside the"));
}
