// Optimizer offload (ZeRO-Offload, plan/offload.hpp): optimizer state on
// the host, its update run there in place. Pinned by
// CompileOptions::offload_optimizer, or chosen by the budget solve where the
// budget binds; the same bits either way. Under mpirun the stages with
// offload are checked bit for bit in tests/dist/dist_test.cpp zero.
#include <catch2/catch.hpp>
#include <filesystem>
#include <frugal/dist/plan_only.hpp>
#include <frugal/frugal.hpp>

using namespace frugal;

namespace offload_test {

// Parameter counts that do not split evenly over 4 ranks (fc1's weight,
// 10), ones too small to shard (fc1's bias, fc2's), and one whose moments
// are large enough for the budget solve to move (wide's weight: 288
// elements, over plan::kMinPersistentCandidate).
struct OffloadMlp : nn::Module {
  nn::Linear fc1{5, 2}, fc2{2, 3}, wide{3, 96};
  OffloadMlp() {
    register_module("fc1", fc1);
    register_module("fc2", fc2);
    register_module("wide", wide);
  }
  Var forward(Var x) { return wide(relu(fc2(relu(fc1(x))))); }
};

Tensor offload_batch(int s) {
  Tensor x({4, 5}, DType::f32);
  for (std::int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = float(std::sin(0.7 * double(i) + 1.3 * s));
  return x;
}

std::size_t of_kind(const std::map<std::string, std::size_t>& m, const std::string& kind) {
  auto it = m.find(kind);
  return it == m.end() ? 0 : it->second;
}

bool same_bits(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t k = 0; k < a.size(); ++k)
    if (a[k].numel() != b[k].numel() || std::memcmp(a[k].raw(), b[k].raw(), a[k].nbytes()) != 0) return false;
  return true;
}

struct Run {
  std::vector<float> losses;
  std::vector<Tensor> params;
  Plan plan;
  std::size_t device_high_water = 0;  // audited arena high-water plus the persistents kept on the device
  bool canary_intact = true;
  int host_update_nodes = 0;          // updates the graph runs on the host
};

Run offload_train(std::optional<bool> offload, Budget budget = {}, int steps = 5, int accumulate = 1) {
  nn::manual_seed(5);
  OffloadMlp m;
  optim::AdamW opt(m.parameters(), {.lr = 0.05, .weight_decay = 0.01});
  CompileOptions o;
  o.threads = 1;
  o.offload_optimizer = offload;
  o.accumulate = accumulate;
  Step step = compile([&](Var x) { return mean(m.forward(x) * m.forward(x)); }, {input<float>({4, 5})}, opt, budget, o);
  Run r;
  for (int s = 0; s < steps; ++s) {
    if (s + 1 == steps) {
      Step::Audit a = step.audit(offload_batch(s));
      r.device_high_water = a.high_water + step.plan().persistent_bytes;
      r.canary_intact = a.canary_intact;
    } else {
      r.losses.push_back(step.run(offload_batch(s)));
    }
  }
  r.plan = step.plan();
  for (NodeId n : step.plan().schedule)
    r.host_update_nodes += dynamic_cast<const ops::HostUpdate*>(step.graph().node(n).op.get()) != nullptr;
  for (const Tensor& p : m.parameters()) r.params.push_back(p.clone());
  return r;
}

std::size_t parameter_elements() {
  OffloadMlp m;
  std::size_t n = 0;
  for (const Tensor& p : m.parameters()) n += std::size_t(p.numel());
  return n;
}

}  // namespace offload_test

using namespace offload_test;

TEST_CASE("offload: pinned, the optimizer state lives on the host and its update runs there, with the same bits",
          "[offload]") {
  const std::size_t psi = parameter_elements();
  const Run device = offload_train(std::nullopt), host = offload_train(true);
  // AdamW's two f32 moments per element: 8 psi bytes, all on the host.
  CHECK(of_kind(device.plan.persistent_by_kind, "optimizer state") == 8 * psi);
  CHECK(of_kind(host.plan.persistent_by_kind, "optimizer state") == 0);
  CHECK(of_kind(host.plan.offloaded_by_kind, "optimizer state") == 8 * psi);
  CHECK(of_kind(host.plan.persistent_by_kind, "parameters") == 4 * psi);
  // The arena is the same: the state never was in it.
  CHECK(host.plan.total_bytes() == device.plan.total_bytes() - 8 * psi);
  CHECK(host.plan.arena_bytes == device.plan.arena_bytes);
  CHECK(host.host_update_nodes == 6);  // one per parameter
  CHECK(device.host_update_nodes == 0);
  CHECK_THAT(host.plan.optimizer_offload, Catch::Contains("pinned"));
  CHECK(device.plan.optimizer_offload.empty());
  CHECK(host.losses == device.losses);
  CHECK(same_bits(host.params, device.params));
  CHECK(host.canary_intact);
  CHECK(host.device_high_water <= host.plan.total_bytes());
  // With gradient accumulation (the updates skipped between micro-steps).
  const Run device2 = offload_train(std::nullopt, {}, 7, 2), host2 = offload_train(true, {}, 7, 2);
  CHECK(host2.host_update_nodes == 6);
  CHECK(host2.losses == device2.losses);
  CHECK(same_bits(host2.params, device2.params));
  CHECK_FALSE(same_bits(host2.params, host.params));  // accumulation changed the training: the comparison is not empty
}

TEST_CASE("offload: where the budget binds, the budget solve moves optimizer state to the host first, at no copy",
          "[offload][budget]") {
  const Run free = offload_train(std::nullopt);
  // One byte under the unconstrained step: a host update of one moment
  // meets it with nothing copied, nothing recomputed.
  const std::size_t budget = free.plan.total_bytes() - 1;
  const Run tight = offload_train(std::nullopt, Budget{.device = budget});
  CHECK(tight.plan.total_bytes() <= budget);
  CHECK(tight.plan.count(plan::Choice::host_update) >= 1);
  CHECK(tight.plan.count(plan::Choice::host_update) == tight.plan.decisions.size());
  CHECK(tight.host_update_nodes >= 1);
  CHECK_THAT(tight.plan.optimizer_offload, Catch::Contains("chosen by the budget solve"));
  CHECK(tight.canary_intact);
  CHECK(tight.device_high_water <= budget);
  CHECK(tight.losses == free.losses);
  CHECK(same_bits(tight.params, free.params));

  // Forbidden, the same budget is met by copies or recomputation instead.
  const Run kept = offload_train(false, Budget{.device = budget});
  CHECK(kept.plan.count(plan::Choice::host_update) == 0);
  CHECK(kept.host_update_nodes == 0);
  CHECK(kept.plan.total_bytes() <= budget);
  CHECK(same_bits(kept.params, free.params));

  // Lower than the state alone can give: host updates and other evictions
  // together, wide's two moments on the host.
  const std::size_t wide_moments = 2 * 4 * 288;
  REQUIRE(wide_moments >= 2 * plan::kMinPersistentCandidate);
  const std::size_t lower = free.plan.total_bytes() - wide_moments - 256;
  const Run both = offload_train(std::nullopt, Budget{.device = lower});
  CHECK(both.plan.total_bytes() <= lower);
  CHECK(of_kind(both.plan.offloaded_by_kind, "optimizer state") >= wide_moments);
  CHECK(both.device_high_water <= lower);
  CHECK(same_bits(both.params, free.params));
  // Another option can only lower the smallest feasible budget.
  CHECK(both.plan.min_feasible_bytes <= kept.plan.min_feasible_bytes);
}

TEST_CASE("offload: each rank keeps its shard of the optimizer state on the host at ZeRO stages 1 to 3", "[offload][zero]") {
  const int ranks = 4;
  for (int stage : {0, 1, 2, 3})
    for (int rank = 0; rank < ranks; ++rank) {
      INFO("stage " << stage << ", rank " << rank);
      nn::manual_seed(3);
      OffloadMlp m;
      optim::AdamW opt(m.parameters(), {});
      CompileOptions o;
      o.communicator = std::make_shared<dist::PlanOnly>(rank, ranks);
      o.zero_stage = stage;
      o.offload_optimizer = true;
      PlannedStep ps = plan_training([&](Var x) { return mean(m.forward(x)); }, {input<float>({4, 5})}, opt, {}, o);
      std::size_t psi = 0, shard = 0;
      for (const Tensor& p : m.parameters()) {
        const ZeroShard s = ZeroShard::of(p.numel(), rank, ranks);
        psi += std::size_t(p.numel());
        shard += std::size_t(stage > 0 && s.every_rank_has_elements() ? s.length : p.numel());
      }
      CHECK(of_kind(ps.plan.persistent_by_kind, "optimizer state") == 0);
      CHECK(of_kind(ps.plan.offloaded_by_kind, "optimizer state") == 8 * shard);
      CHECK(of_kind(ps.plan.persistent_by_kind, "parameters") == 4 * (stage == 3 ? shard : psi));
      const auto rows = plan::rank_rows(std::vector<PlannedStep>{ps});
      CHECK(rows[0].optimizer_state == 0);
      CHECK(rows[0].host_state == 8 * shard);
    }
}

TEST_CASE("offload: a checkpoint of offloaded state resumes bit for bit", "[offload][io]") {
  namespace fs = std::filesystem;
  const fs::path file = fs::temp_directory_path() / cat("frugal_offload_", ::getpid(), ".safetensors");
  auto make = [](OffloadMlp& m, optim::AdamW& opt) {
    CompileOptions o;
    o.threads = 1;
    o.offload_optimizer = true;
    return compile([&](Var x) { return mean(m.forward(x) * m.forward(x)); }, {input<float>({4, 5})}, opt, {}, o);
  };
  nn::manual_seed(5);
  OffloadMlp a;
  optim::AdamW oa(a.parameters(), {.lr = 0.05});
  Step sa = make(a, oa);
  std::vector<float> through, resumed;
  for (int s = 0; s < 6; ++s) {
    if (s == 3) io::save_checkpoint(file, a, oa, 3);
    const float l = sa.run(offload_batch(s));
    if (s >= 3) through.push_back(l);
  }
  nn::manual_seed(77);
  OffloadMlp b;
  optim::AdamW ob(b.parameters(), {.lr = 0.05});
  Step sb = make(b, ob);
  sb.set_steps_run(io::load_checkpoint(file, b, ob).step);
  sb.parameters_changed();
  for (int s = 3; s < 6; ++s) resumed.push_back(sb.run(offload_batch(s)));
  fs::remove(file);
  CHECK(resumed == through);
  CHECK(same_bits(b.parameters(), a.parameters()));
}

TEST_CASE("offload: guarded by a loss scaler, the offloaded updates give the same bits and the same scale",
          "[offload][loss_scaling]") {
  struct Scaled {
    std::vector<float> losses;
    std::vector<Tensor> params;
    float scale = 0;
    int host_update_nodes = 0;
  };
  auto run = [](std::optional<bool> offload) {
    nn::manual_seed(5);
    OffloadMlp m;
    optim::AdamW opt(m.parameters(), {.lr = 0.05});
    optim::LossScaler scaler({.init_scale = 1024, .growth_interval = 2});
    CompileOptions o;
    o.threads = 1;
    o.offload_optimizer = offload;
    o.loss_scaler = &scaler;
    Step step = compile([&](Var x) { return mean(m.forward(x) * m.forward(x)); }, {input<float>({4, 5})}, opt, {}, o);
    Scaled r;
    for (int s = 0; s < 6; ++s) r.losses.push_back(step.run(offload_batch(s)));
    for (const Tensor& p : m.parameters()) r.params.push_back(p.clone());
    r.scale = scaler.scale();
    for (NodeId n : step.plan().schedule)
      r.host_update_nodes += dynamic_cast<const ops::HostUpdate*>(step.graph().node(n).op.get()) != nullptr;
    return r;
  };
  const Scaled device = run(std::nullopt), host = run(true);
  CHECK(host.host_update_nodes == 6);
  CHECK(device.host_update_nodes == 0);
  CHECK(host.scale == device.scale);
  CHECK(host.scale > 1024);  // it grew: the guarded updates ran
  CHECK(host.losses == device.losses);
  CHECK(same_bits(host.params, device.params));
}
