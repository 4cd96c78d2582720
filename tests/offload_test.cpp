// Optimizer offload (ZeRO-Offload, plan/offload.hpp): optimizer state on
// the host, its update run there in place. Pinned by
// CompileOptions::offload_optimizer, or chosen by the budget solve where the
// budget binds; the same bits either way. Under mpirun the stages with
// offload are checked bit for bit in tests/dist/dist_test.cpp zero.
#include <catch2/catch.hpp>
#include <filesystem>
#include <frugal/dist/plan_only.hpp>
#include <frugal/plan/budget_build.hpp>  // kMinPersistentCandidate
#include <frugal/frugal.hpp>
#include <frugal/runtime/nvme_store.hpp>  // testing::nvme_read_fault_in

#include "../tools/model_zoo.hpp"

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

struct OffloadRun {
  std::vector<float> losses;
  std::vector<Tensor> params;
  Plan plan;
  std::size_t device_high_water = 0;  // audited arena high-water plus the persistents kept on the device
  bool canary_intact = true;
  int host_update_nodes = 0;          // updates the graph runs on the host
};

OffloadRun offload_train(std::optional<bool> offload, Budget budget = {}, int steps = 5, int accumulate = 1) {
  nn::manual_seed(5);
  OffloadMlp m;
  optim::AdamW opt(m.parameters(), {.lr = 0.05, .weight_decay = 0.01});
  CompileOptions o;
  o.threads = 1;
  o.offload_optimizer = offload;
  o.accumulate = accumulate;
  Step step = compile([&](Var x) { return mean(m.forward(x) * m.forward(x)); }, {input<float>({4, 5})}, opt, budget, o);
  OffloadRun r;
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


// ZeRO-Infinity's NVMe offload (plan/nvme_home.hpp): a 2-layer gpt whose
// larger tensors (8 to 16 KiB, several pages each) can live on NVMe.
zoo::Config nvme_gpt() {
  return {.family = "gpt", .batch = 2, .layers = 2, .width = 32, .seq = 16, .heads = 2, .vocab = 64};
}
std::filesystem::path nvme_test_dir(const std::string& name) {
  auto d = std::filesystem::temp_directory_path() / cat("frugal-nvme-home-", name, "-", ::getpid());
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}
CompileOptions pinned_to_nvme(bool state, bool parameters) {
  CompileOptions o;
  o.threads = 1;
  o.plan.nvme_offload.optimizer_state = state;
  o.plan.nvme_offload.parameters = parameters;
  return o;
}
std::vector<std::vector<char>> bytes_of_all(const std::vector<Tensor>& ts) {
  std::vector<std::vector<char>> out;
  for (const Tensor& t : ts) out.emplace_back(static_cast<const char*>(t.raw()), static_cast<const char*>(t.raw()) + t.nbytes());
  return out;
}
std::vector<Tensor> state_tensors(const Optimizer& opt) {
  std::vector<Tensor> out;
  for (auto& s : opt.state()) out.push_back(s.tensor);
  return out;
}
std::size_t page_bytes() { return std::size_t(sysconf(_SC_PAGESIZE)); }
// Whether every whole page inside t's storage reads as zeros (its pages
// were given back), and there is at least one.
bool pages_given_back(const Tensor& t) {
  const std::uintptr_t page = page_bytes();
  const std::uintptr_t b = (std::uintptr_t(t.raw()) + page - 1) / page * page;
  const std::uintptr_t e = (std::uintptr_t(t.raw()) + t.nbytes()) / page * page;
  if (e <= b) return false;
  for (std::uintptr_t a = b; a < e; ++a)
    if (*reinterpret_cast<const unsigned char*>(a) != 0) return false;
  return true;
}

}  // namespace offload_test

using namespace offload_test;

TEST_CASE("offload: pinned, the optimizer state lives on the host and its update runs there, with the same bits",
          "[offload]") {
  const std::size_t psi = parameter_elements();
  const OffloadRun device = offload_train(std::nullopt), host = offload_train(true);
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
  const OffloadRun device2 = offload_train(std::nullopt, {}, 7, 2), host2 = offload_train(true, {}, 7, 2);
  CHECK(host2.host_update_nodes == 6);
  CHECK(host2.losses == device2.losses);
  CHECK(same_bits(host2.params, device2.params));
  CHECK_FALSE(same_bits(host2.params, host.params));  // accumulation changed the training: the comparison is not empty
}

TEST_CASE("offload: where the budget binds, the budget solve moves optimizer state to the host first, at no copy",
          "[offload][budget]") {
  const OffloadRun free = offload_train(std::nullopt);
  // One byte under the unconstrained step: a host update of one moment
  // meets it with nothing copied, nothing recomputed.
  const std::size_t budget = free.plan.total_bytes() - 1;
  const OffloadRun tight = offload_train(std::nullopt, Budget{.device = budget});
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
  const OffloadRun kept = offload_train(false, Budget{.device = budget});
  CHECK(kept.plan.count(plan::Choice::host_update) == 0);
  CHECK(kept.host_update_nodes == 0);
  CHECK(kept.plan.total_bytes() <= budget);
  CHECK(same_bits(kept.params, free.params));

  // Lower than the state alone can give: host updates and other evictions
  // together, wide's two moments on the host.
  const std::size_t wide_moments = 2 * 4 * 288;
  REQUIRE(wide_moments >= 2 * plan::kMinPersistentCandidate);
  const std::size_t lower = free.plan.total_bytes() - wide_moments - 256;
  const OffloadRun both = offload_train(std::nullopt, Budget{.device = lower});
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

TEST_CASE("nvme offload: pinned, parameters and optimizer state live on NVMe between steps, with the same bits",
          "[offload][nvme]") {
  const auto dir = nvme_test_dir("pinned");
  zoo::Workload ref = zoo::make(nvme_gpt()), nv = zoo::make(nvme_gpt());
  Step a = zoo::compile(ref);
  Step b = zoo::compile(nv, Budget{.nvme_dir = dir.string()}, pinned_to_nvme(true, true));
  const Plan& p = b.plan();
  // Every parameter and state tensor of at least 1 KiB lives there, and the
  // device keeps only the rest: the bytes add up to the unconstrained plan's.
  std::size_t big_state = 0, big_params = 0, homes = 0, big_param_count = 0;
  for (const Tensor& t : state_tensors(*nv.opt)) big_state += t.nbytes() >= 1024 ? t.nbytes() : 0, homes += t.nbytes() >= 1024;
  for (const Tensor& t : nv.model->parameters())
    big_params += t.nbytes() >= 1024 ? t.nbytes() : 0, big_param_count += t.nbytes() >= 1024;
  homes += big_param_count;
  REQUIRE(big_state > 0);
  CHECK(of_kind(p.nvme_home_by_kind, "optimizer state") == big_state);
  CHECK(of_kind(p.nvme_home_by_kind, "parameters") == big_params);
  CHECK(p.nvme_home_bytes == big_state + big_params);
  CHECK(p.count(plan::Choice::nvme_home) == homes);
  CHECK(p.offloaded_bytes == 0);
  CHECK(p.persistent_bytes + p.nvme_home_bytes == a.plan().persistent_bytes);
  CHECK(p.nvme_bytes >= 2 * p.nvme_home_bytes);  // two slots each
  CHECK_THAT(p.optimizer_offload, Catch::Contains("live on NVMe between steps") && Catch::Contains("pinned"));

  std::vector<Tensor> handles = state_tensors(*nv.opt);
  for (const Tensor& t : nv.model->parameters()) handles.push_back(t);
  for (std::uint64_t s = 1; s <= 4; ++s) {
    auto batch = ref.batch(s);
    CHECK(a.run(batch[0], batch[1]) == b.run(batch[0], batch[1]));
  }
  // Between steps the tensors hold nothing: their pages went back. (Read
  // through handles taken before training: Optimizer::state() and
  // Module::parameters() would bring the bytes back.)
  CHECK(NvmeHomes::registry().held() == homes);
  int checked = 0;
  for (const Tensor& t : handles)
    if (t.nbytes() >= 3 * page_bytes()) {
      CHECK(pages_given_back(t));
      ++checked;
    }
  CHECK(checked > 0);
  // Another step reading the parameters gets them back first.
  Step eval_a = zoo::with_step_fn(ref, [&](auto fn) { return compile_inference(fn, ref.inputs); });
  Step eval_b = zoo::with_step_fn(nv, [&](auto fn) { return compile_inference(fn, nv.inputs); });
  auto held = ref.batch(9);
  eval_a.run(held[0], held[1]);
  eval_b.run(held[0], held[1]);
  CHECK(bytes_of_all({eval_a.output()}) == bytes_of_all({eval_b.output()}));
  CHECK(NvmeHomes::registry().held() == homes - big_param_count);  // the state stays there
  // sync_to_host brings the rest back, bit for bit; the next run takes them again.
  b.sync_to_host();
  CHECK(NvmeHomes::registry().held() == 0);
  for (const Tensor& t : handles)
    if (t.nbytes() >= 3 * page_bytes()) CHECK_FALSE(pages_given_back(t));
  CHECK(bytes_of_all(state_tensors(*nv.opt)) == bytes_of_all(state_tensors(*ref.opt)));
  CHECK(bytes_of_all(nv.model->parameters()) == bytes_of_all(ref.model->parameters()));
  auto batch = ref.batch(5);
  CHECK(a.run(batch[0], batch[1]) == b.run(batch[0], batch[1]));
  CHECK(NvmeHomes::registry().held() == homes);
  // Optimizer::state() and Module::parameters() bring them back themselves.
  CHECK(bytes_of_all(state_tensors(*nv.opt)) == bytes_of_all(state_tensors(*ref.opt)));
  CHECK(bytes_of_all(nv.model->parameters()) == bytes_of_all(ref.model->parameters()));
  CHECK(NvmeHomes::registry().held() == 0);
  std::filesystem::remove_all(dir);
}

TEST_CASE("nvme offload: where neither the device nor the host pool holds them, the budget solve homes tensors on "
          "NVMe, inside the budget and bit for bit",
          "[offload][nvme][budget]") {
  const auto dir = nvme_test_dir("auto");
  zoo::Workload probe = zoo::make(nvme_gpt());
  Budget b{.device = zoo::plan(probe).plan.total_bytes() - 1, .host = 1, .nvme_dir = dir.string()};
  b.device = zoo::plan(probe, b).plan.min_feasible_bytes;
  zoo::Workload ref = zoo::make(nvme_gpt()), nv = zoo::make(nvme_gpt());
  Step a = zoo::compile(ref);
  Step s = zoo::compile(nv, b);
  REQUIRE(s.plan().count(plan::Choice::nvme_home) > 0);
  CHECK(s.plan().nvme_home_bytes > 0);
  CHECK_THAT(s.plan().optimizer_offload, Catch::Contains("chosen by the budget solve"));
  for (const auto& d : s.plan().decisions)
    if (d.choice == plan::Choice::nvme_home) CHECK_THAT(d.reason, Catch::Contains("lives on NVMe between steps"));
  for (std::uint64_t k = 1; k <= 3; ++k) {
    auto batch = ref.batch(k);
    CHECK(a.run(batch[0], batch[1]) == s.run(batch[0], batch[1]));
  }
  CHECK(bytes_of_all(nv.model->parameters()) == bytes_of_all(ref.model->parameters()));
  CHECK(bytes_of_all(state_tensors(*nv.opt)) == bytes_of_all(state_tensors(*ref.opt)));
  auto batch = ref.batch(4);
  Step::Audit audit = s.audit(batch[0], batch[1]);
  CHECK(audit.canary_intact);
  CHECK(audit.high_water + s.plan().persistent_bytes <= b.device);
  std::filesystem::remove_all(dir);
}

TEST_CASE("nvme offload: checkpoints read and write tensors that live on NVMe, and training resumes bit for bit",
          "[offload][nvme][io]") {
  const auto dir = nvme_test_dir("io");
  const auto file = dir / "checkpoint.safetensors";
  zoo::Workload w = zoo::make(nvme_gpt());
  Step s = zoo::compile(w, Budget{.nvme_dir = dir.string()}, pinned_to_nvme(true, true));
  std::vector<float> through;
  for (std::uint64_t k = 1; k <= 5; ++k) {
    if (k == 4) io::save_checkpoint(file, *w.model, *w.opt, 3);
    auto batch = w.batch(k);
    const float l = s.run(batch[0], batch[1]);
    if (k >= 4) through.push_back(l);
  }
  auto resume = [&](zoo::Workload& into, Step& step) {
    step.set_steps_run(io::load_checkpoint(file, *into.model, *into.opt).step);
    std::vector<float> losses;
    for (std::uint64_t k = 4; k <= 5; ++k) {
      auto batch = into.batch(k);
      losses.push_back(step.run(batch[0], batch[1]));
    }
    return losses;
  };
  // Into the same step, whose tensors live on NVMe: loading writes them,
  // and the next run takes what was loaded.
  CHECK(resume(w, s) == through);
  // Into a fresh model and step.
  zoo::Workload fresh = zoo::make(nvme_gpt());
  Step t = zoo::compile(fresh, Budget{.nvme_dir = dir.string()}, pinned_to_nvme(true, true));
  CHECK(resume(fresh, t) == through);
  CHECK(bytes_of_all(w.model->parameters()) == bytes_of_all(fresh.model->parameters()));
  std::filesystem::remove_all(dir);
}

TEST_CASE("nvme offload: a step whose NVMe read fails part way leaves the state it started from", "[offload][nvme][atomic]") {
  const auto dir = nvme_test_dir("undo");
  auto& fault = frugal::testing::nvme_read_fault_in();
  auto train = [&](bool with_failure) {
    zoo::Workload w = zoo::make(nvme_gpt());
    Step s = zoo::compile(w, Budget{.nvme_dir = dir.string()}, pinned_to_nvme(true, true));
    long reads = 0;
    std::vector<float> losses;
    for (std::uint64_t k = 1; k <= 6; ++k) {
      auto batch = w.batch(k);
      if (k == 1) fault = 1L << 40;
      if (with_failure && k == 4) {
        fault = reads - 1;  // this step's last NVMe read fails, after updates have written back
        CHECK_THROWS_AS(s.run(batch[0], batch[1]), IoError);
        CHECK(fault.load() == -1);
      }
      losses.push_back(s.run(batch[0], batch[1]));
      if (k == 1) reads = (1L << 40) - fault.load(), fault = -1;
    }
    s.sync_to_host();
    auto all = bytes_of_all(w.model->parameters());
    for (auto& st : bytes_of_all(state_tensors(*w.opt))) all.push_back(st);
    return std::pair{losses, all};
  };
  auto good = train(false);
  auto failed = train(true);
  fault = -1;
  CHECK(failed.first == good.first);
  CHECK(failed.second == good.second);
  std::filesystem::remove_all(dir);
}

TEST_CASE("nvme offload: with one slot each, updates are written back in place: half the homes' file, the same bits, "
          "and a step that fails after a write back refuses to go on until a checkpoint is loaded",
          "[offload][nvme][atomic]") {
  const auto dir = nvme_test_dir("one-slot");
  const auto file = dir / "checkpoint.safetensors";
  auto& fault = frugal::testing::nvme_read_fault_in();
  CompileOptions one_slot = pinned_to_nvme(true, true);
  one_slot.plan.nvme_offload.slots = 1;
  {
    zoo::Workload w2 = zoo::make(nvme_gpt()), w1 = zoo::make(nvme_gpt());
    Step two = zoo::compile(w2, Budget{.nvme_dir = dir.string()}, pinned_to_nvme(true, true));
    Step one = zoo::compile(w1, Budget{.nvme_dir = dir.string()}, one_slot);
    const Plan &p2 = two.plan(), &p1 = one.plan();
    REQUIRE(p1.nvme_home_bytes > 0);
    CHECK(p1.nvme_home_slots == 1);
    CHECK(p2.nvme_home_slots == 2);
    CHECK(p1.nvme_home_bytes == p2.nvme_home_bytes);
    // Each home's slot is its bytes rounded up for O_DIRECT, so the file
    // shrinks by one slot per home, and holds at least one.
    std::size_t slots = 0;
    for (ValueId v = 0; v < ValueId(p1.nvme_home_of.size()); ++v)
      if (p1.nvme_home_of[std::size_t(v)])
        slots += align_up(std::max<std::size_t>(one.graph().value(v).meta.nbytes(), 1), plan::kTierAlignment);
    CHECK(slots >= p1.nvme_home_bytes);
    CHECK(p2.nvme_bytes == p1.nvme_bytes + slots);
    CHECK_THAT(p1.optimizer_offload, Catch::Contains("in place"));
    zoo::Workload ref = zoo::make(nvme_gpt());
    Step a = zoo::compile(ref);
    for (std::uint64_t k = 1; k <= 4; ++k) {
      auto batch = ref.batch(k);
      const float l = a.run(batch[0], batch[1]);
      CHECK(one.run(batch[0], batch[1]) == l);
      CHECK(two.run(batch[0], batch[1]) == l);
    }
    CHECK(bytes_of_all(w1.model->parameters()) == bytes_of_all(ref.model->parameters()));
    CHECK(bytes_of_all(state_tensors(*w1.opt)) == bytes_of_all(state_tensors(*ref.opt)));
  }
  // Steps 1-6 with a checkpoint after step 3; in step 4 the NVMe read
  // `fail_at` fails (-1: none), then the run goes on as the case allows.
  auto train = [&](long fail_at, bool torn) {
    zoo::Workload w = zoo::make(nvme_gpt());
    std::vector<float> losses;
    long reads = 0;
    {
      Step s = zoo::compile(w, Budget{.nvme_dir = dir.string()}, one_slot);
      for (std::uint64_t k = 1; k <= 6; ++k) {
        auto batch = w.batch(k);
        if (k == 1) fault = 1L << 40;
        if (k == 4) io::save_checkpoint(file, *w.model, *w.opt, 3);
        if (k == 4 && fail_at >= 0) {
          fault = fail_at >= reads ? reads - 1 : fail_at;
          CHECK_THROWS_AS(s.run(batch[0], batch[1]), IoError);
          CHECK(fault.load() == -1);
          if (torn) {
            // Nothing runs or reads the part-updated state: not the step,
            // not a program or checkpoint asking for the tensors back.
            CHECK_THROWS_WITH(s.run(batch[0], batch[1]), Catch::Contains("part updated") && Catch::Contains("checkpoint"));
            CHECK_THROWS_WITH(s.sync_to_host(), Catch::Contains("part updated"));
            CHECK_THROWS_WITH(io::save_checkpoint(dir / "torn.safetensors", *w.model, *w.opt, 3),
                              Catch::Contains("part updated"));
            break;
          }
        }
        losses.push_back(s.run(batch[0], batch[1]));
        if (k == 1) reads = (1L << 40) - fault.load(), fault = -1;
      }
    }
    if (torn) {  // recovery: a step compiled again, from the checkpoint
      Step s = zoo::compile(w, Budget{.nvme_dir = dir.string()}, one_slot);
      s.set_steps_run(io::load_checkpoint(file, *w.model, *w.opt).step);
      for (std::uint64_t k = 4; k <= 6; ++k) {
        auto batch = w.batch(k);
        losses.push_back(s.run(batch[0], batch[1]));
      }
    }
    auto all = bytes_of_all(w.model->parameters());
    for (auto& st : bytes_of_all(state_tensors(*w.opt))) all.push_back(st);
    return std::pair{losses, all};
  };
  const auto good = train(-1, false);
  REQUIRE(good.first.size() == 6);
  // The step's first read fails before anything is written back: the state
  // it started from is intact, and training goes on with the same bits.
  const auto early = train(0, false);
  CHECK(early.first == good.first);
  CHECK(early.second == good.second);
  // Its last read fails after its updates were written back in place.
  const auto late = train(1L << 40, true);
  fault = -1;
  CHECK(late.first == good.first);
  CHECK(late.second == good.second);
  std::filesystem::remove_all(dir);
}
