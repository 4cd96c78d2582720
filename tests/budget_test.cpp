// Training under a device budget: the solver's choices (recompute, swap to
// the host, spill to NVMe, keep optimizer state on the host) must never
// change a single bit of what the step computes, must keep the step inside
// the budget, and an infeasible budget must fail at compile naming the
// smallest feasible one.
#include <catch2/catch.hpp>

#include <numeric>

#include "budget_problem_of.hpp"
#include "bytes_of.hpp"

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <frugal/frugal.hpp>
#include <frugal/plan/budget_solve.hpp>
#include <frugal/runtime/nvme_store.hpp>

#include "../tools/model_zoo.hpp"
#include "slow_profile.hpp"
#include "counting_backend.hpp"
#include "random_net.hpp"

using namespace frugal;
using testnets::RandomNet;

namespace {

struct Run {
  std::vector<float> losses;
  std::vector<std::vector<char>> params;
  Plan plan;
  std::size_t high_water = 0;
};


// Trains the random net for `steps` under `budget`; the same seed builds
// the same weights and batches every time.
Run train_random(std::uint64_t seed, Budget budget, int steps, bool audit = false) {
  Rng r(seed * 7 + 1);
  const int in = 4 + int(r.below(20)), width = 8 + int(r.below(40)), depth = 2 + int(r.below(6)),
            classes = 2 + int(r.below(6)), batch = 1 + int(r.below(12));
  const bool adam = r.below(2);
  RandomNet net(seed, in, width, depth, classes);
  std::unique_ptr<Optimizer> opt;
  if (adam) opt = std::make_unique<optim::AdamW>(net.parameters(), optim::AdamWOptions{.lr = 1e-2});
  else opt = std::make_unique<optim::SGD>(net.parameters(), optim::SGDOptions{.lr = 0.05, .momentum = 0.9});
  Step step = compile([&](Var x, Var y) { return cross_entropy(net.forward(x), y); },
                      {input<float>({batch, in}), input<std::int32_t>({batch})}, *opt, budget);
  Run run;
  run.plan = step.plan();
  for (int s = 0; s < steps; ++s) {
    Rng d(seed * 1000 + std::uint64_t(s));
    Tensor x({batch, in}), y({batch}, DType::i32);
    zoo::fill_normal(x, d);
    zoo::fill_labels(y, d, classes);
    if (audit && s == 0) {
      auto a = step.audit(x, y);
      run.high_water = a.high_water;
      CHECK(a.canary_intact);
      return run;
    }
    run.losses.push_back(step.run(x, y));
  }
  for (auto& [name, t] : net.named_parameters()) run.params.push_back(bytes_of(t));
  return run;
}

std::size_t min_feasible(std::uint64_t seed, std::size_t unconstrained, std::size_t host = 0) {
  Budget b{.device = unconstrained - 1, .host = host};
  try {
    return train_random(seed, b, 0).plan.min_feasible_bytes;
  } catch (const BudgetError&) {
    return unconstrained;  // nothing to evict: only the unconstrained plan fits
  }
}

}  // namespace

TEST_CASE("under any feasible budget, random graphs train bit for bit as unconstrained, inside the budget",
          "[budget][property]") {
  // Every third seed has no host pool (a 1-byte one: nothing fits), so only
  // recomputation, chains of it included, can meet the budget.
  int binding = 0, evicting = 0, chains = 0, recompute_only = 0;
  for (std::uint64_t seed = 1; seed <= 200; ++seed) {
    INFO("seed " << seed);
    const std::size_t host = seed % 3 == 0 ? 1 : 0;
    Run free = train_random(seed, {}, 2);
    const std::size_t unconstrained = free.plan.total_bytes();
    const std::size_t least = min_feasible(seed, unconstrained, host);
    REQUIRE(least <= unconstrained);
    Rng r(seed);
    const std::size_t budget = least + std::size_t(r.uniform() * double(unconstrained - least));
    Run tight = train_random(seed, Budget{.device = budget, .host = host}, 2);
    CHECK(tight.plan.total_bytes() <= budget);
    CHECK(tight.losses == free.losses);
    CHECK(tight.params == free.params);
    Run audited = train_random(seed, Budget{.device = budget, .host = host}, 1, true);
    CHECK(audited.high_water <= audited.plan.peak_bytes);
    binding += budget < unconstrained;
    evicting += !tight.plan.decisions.empty();
    if (host) recompute_only += !tight.plan.decisions.empty();
    for (auto& d : tight.plan.decisions) {
      if (host) CHECK(d.choice == plan::Choice::recompute);
      if (d.reason.find("deeper recomputation") != std::string::npos || d.reason.find("re-creating") != std::string::npos) {
        ++chains;
        break;
      }
    }
  }
  // The property must have been exercised, not passed vacuously.
  CHECK(binding > 150);
  CHECK(evicting > 100);
  CHECK(recompute_only > 20);
  CHECK(chains > 10);
}

TEST_CASE("the smallest feasible budget works and one byte less fails, naming it", "[budget]") {
  for (std::uint64_t seed : {3, 11, 42}) {
    Run free = train_random(seed, {}, 1);
    const std::size_t least = min_feasible(seed, free.plan.total_bytes());
    REQUIRE(least < free.plan.total_bytes());
    Run at = train_random(seed, Budget{.device = least}, 1);
    CHECK(at.plan.total_bytes() <= least);
    CHECK(at.losses == free.losses);
    try {
      train_random(seed, Budget{.device = least - 1}, 1);
      FAIL("one byte below the smallest feasible budget compiled");
    } catch (const BudgetError& e) {
      CHECK_THAT(e.what(), Catch::Contains(std::to_string(least)) && Catch::Contains("Largest consumers") &&
                               Catch::Contains("smallest feasible"));
    }
  }
}

namespace {

// Layers of Linear, an affine map (whose backward saves nothing) and tanh
// (whose backward reads its output): the affine output and the Linear
// output are dead once the forward has passed them, so recomputing a tanh
// output needs the two ops before it re-created too, from the layer input.
struct ChainNet : nn::Module {
  std::vector<std::unique_ptr<nn::Linear>> fc;
  explicit ChainNet(int width, int depth, int classes) {
    nn::manual_seed(7);
    for (int i = 0; i < depth; ++i) {
      fc.push_back(std::make_unique<nn::Linear>(width, width));
      register_module(cat("fc", i), *fc.back());
    }
    fc.push_back(std::make_unique<nn::Linear>(width, classes));
    register_module("head", *fc.back());
  }
  Var forward(Var x) {
    for (std::size_t i = 0; i + 1 < fc.size(); ++i) x = tanh((*fc[i])(x) * 0.5 + 0.1);
    return (*fc.back())(x);
  }
};

struct ChainRun {
  std::vector<float> losses;
  std::vector<std::vector<char>> params;
  Plan plan;
  std::size_t high_water = 0;
};

ChainRun train_chain(Budget budget, int steps) {
  const int batch = 64, width = 64, depth = 6, classes = 4;
  ChainNet net(width, depth, classes);
  optim::SGD opt(net.parameters(), optim::SGDOptions{.lr = 0.05, .momentum = 0.9});
  // Unfused: the test is about this graph's shape (fusion would merge the
  // affine map and tanh into one node, leaving one op of depth to re-create).
  CompileOptions unfused;
  unfused.plan.fuse = false;
  Step step = compile([&](Var x, Var y) { return cross_entropy(net.forward(x), y); },
                      {input<float>({batch, width}), input<std::int32_t>({batch})}, opt, budget, unfused);
  ChainRun run;
  run.plan = step.plan();
  for (int s = 0; s <= steps; ++s) {
    Rng d(1000 + std::uint64_t(s));
    Tensor x({batch, width}), y({batch}, DType::i32);
    zoo::fill_normal(x, d);
    zoo::fill_labels(y, d, classes);
    if (s == steps) {
      auto a = step.audit(x, y);
      CHECK(a.canary_intact);
      run.high_water = a.high_water;
    } else {
      run.losses.push_back(step.run(x, y));
    }
  }
  for (auto& [name, t] : net.named_parameters()) run.params.push_back(bytes_of(t));
  return run;
}

}  // namespace

TEST_CASE("with no host pool, recomputation re-creates dead inputs two ops deep: a budget one op of recomputation "
          "cannot reach trains bit for bit", "[budget][recompute][chain]") {
  ChainRun free = train_chain({}, 2);
  const std::size_t unconstrained = free.plan.total_bytes();
  const std::size_t activation = align_up(std::size_t(64 * 64 * 4));  // one layer's tanh output
  // Recomputing one op alone frees nothing here: tanh's input would have to
  // stay alive as long as its output would have. Re-creating the affine map
  // and the Linear as well drops tanh outputs whose layer input is kept.
  const Budget budget{.device = unconstrained - 2 * activation, .host = 1};
  ChainRun tight = train_chain(budget, 2);
  CHECK(tight.plan.total_bytes() <= budget.device);
  CHECK(tight.high_water <= tight.plan.peak_bytes);
  CHECK(tight.losses == free.losses);
  CHECK(tight.params == free.params);
  int deep = 0;
  for (auto& d : tight.plan.decisions) {
    CHECK(d.choice == plan::Choice::recompute);
    deep += d.reason.find(" dead inputs with it") != std::string::npos;  // two or more
  }
  CHECK(deep >= 2);
}

// Checkpointing with its checkpoints off the device (ZeRO-Infinity keeps
// them in host memory): a segment's input copied out after the forward and
// back only when the segment is recomputed, before the backward reaches it.
TEST_CASE("a segment's input may wait on the host until its segment is recomputed", "[budget][recompute][checkpoint]") {
  const int depth = 12, batch = 512;
  const std::size_t activation = align_up(std::size_t(batch * 64 * 4));  // one layer's output
  // The options: a recomputation reading an activation inside that
  // activation's own window may have it fetched back just for itself.
  {
    nn::manual_seed(7);
    ChainNet net(64, depth, 4);
    optim::SGD opt(net.parameters(), optim::SGDOptions{.lr = 0.05, .momentum = 0.9});
    CompileOptions unfused;
    unfused.plan.fuse = false;
    const PlannedStep ps = plan_training([&](Var x, Var y) { return cross_entropy(net.forward(x), y); },
                                         {input<float>({batch, 64}), input<std::int32_t>({batch})}, opt, {}, unfused);
    const Graph& g = *ps.graph;
    const plan::BudgetProblem p = test_support::budget_problem_of(ps, {.device = 1, .host = 4 * activation});
    int found = 0;
    std::vector<int> choice;
    std::size_t window = 0;
    test_support::for_each_option_a_recomputation_allows(p, [&](std::size_t k, int j, const plan::Requirement& r, int m) {
      const plan::Option& rec = p.candidates[k].options[std::size_t(j)];
      const plan::Candidate& win = p.candidates[std::size_t(r.candidate)];
      const plan::Option& fetch = win.options[std::size_t(m)];
      if (g.value(win.value).kind != ValueKind::activation || fetch.choice != plan::Choice::host || fetch.in_done < 0)
        return;
      INFO(fetch.reason);
      CHECK(fetch.in_done <= rec.in_start);  // back before the recomputation reads it
      CHECK(fetch.in_done < win.after);      // not only before its own reader
      CHECK(fetch.price_free);
      // Off the device from its use before the window to the fetch, on the
      // host only until then.
      REQUIRE(fetch.device.size() == 1);
      CHECK(fetch.device[0].span.first == win.before + 1);
      CHECK(fetch.device[0].span.last == fetch.in_done - 1);
      REQUIRE(fetch.host.size() == 1);
      CHECK(fetch.host[0].span.last == fetch.in_done);
      ++found;
      if (!choice.empty() || fetch.in_done != rec.in_start) return;
      window = std::size_t(r.candidate);
      choice.assign(p.candidates.size(), 0);
      choice[k] = j;
      choice[window] = m;
    });
    REQUIRE(found > 0);
    test_support::verified_window_choice(ps, p, choice, window);
  }
}

namespace {

struct ModelRun {
  std::vector<float> losses;
  std::vector<std::vector<char>> params;
  Plan plan;
  std::size_t device_high_water = 0;  // the audited arena high-water mark plus the device-resident persistents
  std::size_t saved = 0;              // forward activations live where the backward starts
};

ModelRun train_model(const zoo::Config& c, Budget budget, int steps, CompileOptions o = {}) {
  zoo::Workload w = zoo::make(c);
  Step step = zoo::compile(w, budget, o);
  ModelRun r;
  r.plan = step.plan();
  r.saved = plan::saved_for_backward_bytes(step.graph(), r.plan);
  for (int s = 0; s < steps; ++s) {
    auto batch = w.batch(std::uint64_t(s + 1));
    std::vector<const Tensor*> in;
    for (auto& t : batch) in.push_back(&t);
    r.losses.push_back(step.run_inputs(in));
  }
  for (auto& [name, t] : w.model->named_parameters()) r.params.push_back(bytes_of(t));
  for (auto& [name, t] : w.model->named_buffers()) r.params.push_back(bytes_of(t));
  auto batch = w.batch(99);
  auto a = batch.size() == 2 ? step.audit(batch[0], batch[1]) : step.audit(batch[0], batch[1], batch[2]);
  CHECK(a.canary_intact);
  r.device_high_water = a.high_water + step.plan().persistent_bytes;
  return r;
}

}  // namespace

// Hidden ([.slow]: `frugal_tests "[slow]"`): its least-memory search closes
// with CBC, a minute on a 2-core machine, which CI's ten minutes cannot
// spare. The option itself (its placement, the rewrite, the rewritten
// plan's verification) is checked by the test above in CI.
TEST_CASE("a gpt whose checkpoints wait on the host for their segments' recomputation trains bit for bit",
          "[budget][recompute][checkpoint][.slow]") {
  // At the least device memory a host pool of about a seventh of the
  // step's activations allows, the plan copies residual-stream values out
  // after the forward and back only for the recomputation of the block
  // after them (the option above), and the step computes what it computes
  // unconstrained.
  zoo::Config c;
  c.family = "gpt";
  c.layers = 4;
  c.width = 64;
  c.heads = 4;
  c.batch = 16;
  c.seq = 64;
  const ModelRun free = train_model(c, {}, 2);
  const Budget probe{.device = free.plan.total_bytes() - 1, .host = 1000000};
  const std::size_t least = train_model(c, probe, 0).plan.min_feasible_bytes;
  REQUIRE(least > 0);
  const Budget budget{.device = least, .host = probe.host};
  const ModelRun tight = train_model(c, budget, 2);
  CHECK(tight.plan.total_bytes() <= budget.device);
  CHECK(tight.device_high_water <= budget.device);
  CHECK(tight.losses == free.losses);
  CHECK(tight.params == free.params);
  int early = 0;
  for (auto& d : tight.plan.decisions) early += d.reason.find(" and back for a recomputation before position") != std::string::npos;
  CHECK(early > 0);
}

TEST_CASE("mlp, resnet (f32 and bf16), gpt and gcn train bit for bit at 100%, 60%, 35% and the smallest feasible budget",
          "[budget][models]") {
  std::vector<zoo::Config> configs{
      {.family = "mlp", .batch = 16, .layers = 3, .width = 64, .features = 32},
      {.family = "resnet", .batch = 4, .layers = 1, .width = 8, .optimizer = "sgd", .image = 8},
      // The same ResNet wholly in bf16 (its BatchNorm statistics in f32).
      {.family = "resnet", .batch = 4, .layers = 1, .width = 8, .dtype = DType::bf16, .optimizer = "sgd", .image = 8},
      {.family = "gpt", .batch = 2, .layers = 2, .width = 32, .seq = 16, .heads = 2, .vocab = 64},
      {.family = "gcn", .batch = 64, .layers = 2, .width = 32, .features = 16, .classes = 4},
  };
  for (const auto& c : configs) {
    INFO(c.name());
    ModelRun free = train_model(c, {}, 10);
    const std::size_t full = free.plan.total_bytes();
    const std::size_t least = train_model(c, Budget{.device = full - 1}, 0).plan.min_feasible_bytes;
    // Recomputing and swapping activations reach below 60% of the
    // unconstrained bytes; in bf16 the tensors halve but the convolutions'
    // f32 scratch does not, and it is most of this small ResNet's least
    // (73%), so there the budgets run are the full one and the least.
    CHECK(least < (c.dtype == DType::bf16 ? full : full * 6 / 10));
    for (std::size_t budget : {full, full * 6 / 10, full * 35 / 100, least}) {
      if (budget < least) continue;
      INFO("budget " << budget << " of " << full << " (smallest feasible " << least << ")");
      ModelRun tight = train_model(c, Budget{.device = budget}, 10);
      CHECK(tight.plan.total_bytes() <= budget);
      CHECK(tight.device_high_water <= budget);
      CHECK(tight.losses == free.losses);
      CHECK(tight.params == free.params);
      if (budget < full) CHECK_FALSE(tight.plan.decisions.empty());
    }
  }
}

TEST_CASE("least_saved_activations holds fewer forward values where the backward starts, inside the budget, "
          "bit for bit", "[budget][recompute][saved]") {
  // Recomputation only (a 1-byte host pool): the default plan keeps the last
  // block's values, which its backward reads first, since that lowers no
  // peak; the option trades step time for holding fewer of them.
  const zoo::Config c{.family = "gpt", .batch = 2, .layers = 2, .width = 32, .seq = 16, .heads = 2, .vocab = 64};
  ModelRun free = train_model(c, {}, 4);
  const std::size_t full = free.plan.total_bytes();
  const std::size_t least = train_model(c, Budget{.device = full - 1, .host = 1}, 0).plan.min_feasible_bytes;
  CompileOptions fewer;
  fewer.plan.least_saved_activations = true;
  // The least budget, one 5% of the unconstrained bytes above it, and one
  // that does not bind (the option still makes its choices under it).
  for (std::size_t budget : {least, least + full / 20, full}) {
    INFO("budget " << budget << " of " << full << " (smallest feasible " << least << ")");
    ModelRun fast = budget == full ? free : train_model(c, Budget{.device = budget, .host = 1}, 4);
    ModelRun lean = train_model(c, Budget{.device = budget, .host = 1}, 4, fewer);
    INFO("saved for backward: " << lean.saved << " with the option, " << fast.saved << " without");
    CHECK(lean.saved <= fast.saved);
    if (budget > least) CHECK(lean.saved < fast.saved);
    CHECK(lean.plan.total_bytes() <= budget);
    CHECK(lean.device_high_water <= budget);
    CHECK(lean.plan.host_bytes <= 1);
    CHECK(lean.losses == free.losses);
    CHECK(lean.params == free.params);
  }
}

#include <csignal>
#include <sys/resource.h>

namespace {
std::filesystem::path fresh_dir(const std::string& name) {
  auto d = std::filesystem::temp_directory_path() / cat("frugal-budget-", name, "-", ::getpid());
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}
}  // namespace

TEST_CASE("with no host room, activations spill to NVMe and training is unchanged bit for bit", "[budget][nvme]") {
  auto dir = fresh_dir("nvme");
  zoo::Config c{.family = "gpt", .batch = 2, .layers = 2, .width = 32, .seq = 16, .heads = 2, .vocab = 64};
  ModelRun free = train_model(c, {}, 5);
  Budget b{.device = free.plan.total_bytes() - 1, .host = 1, .nvme_dir = dir.string()};
  const std::size_t budget = b.device = train_model(c, b, 0).plan.min_feasible_bytes;
  ModelRun spilled = train_model(c, b, 5);
  CHECK(spilled.plan.count(plan::Choice::nvme) > 0);
  CHECK(spilled.plan.count(plan::Choice::host) == 0);
  CHECK(spilled.plan.nvme_bytes > 0);
  CHECK(spilled.device_high_water <= budget);
  CHECK(spilled.losses == free.losses);
  CHECK(spilled.params == free.params);
  CHECK(std::filesystem::is_empty(dir));  // the NVMe file is anonymous: nothing is left behind
  std::filesystem::remove_all(dir);
}

TEST_CASE("a full disk for the NVMe tier fails at compile, naming the directory, and the weights are untouched",
          "[budget][nvme][errors]") {
  auto dir = fresh_dir("full");
  zoo::Config c{.family = "gpt", .batch = 2, .layers = 2, .width = 32, .seq = 16, .heads = 2, .vocab = 64};
  zoo::Workload w = zoo::make(c);
  std::vector<std::vector<char>> before;
  for (auto& [n, t] : w.model->named_parameters()) before.push_back(bytes_of(t));
  Budget b{.device = zoo::plan(w).plan.total_bytes() - 1, .host = 1, .nvme_dir = dir.string()};
  b.device = zoo::plan(w, b).plan.min_feasible_bytes;
  // A file size limit makes the tier's reservation fail as a full disk would.
  std::signal(SIGXFSZ, SIG_IGN);
  rlimit old{};
  getrlimit(RLIMIT_FSIZE, &old);
  rlimit tiny = old;
  tiny.rlim_cur = 4096;
  setrlimit(RLIMIT_FSIZE, &tiny);
  std::string message;
  try {
    zoo::compile(w, b);
  } catch (const IoError& e) {
    message = e.what();
  }
  setrlimit(RLIMIT_FSIZE, &old);
  CHECK_THAT(message, Catch::Contains(dir.string()));
  std::vector<std::vector<char>> after;
  for (auto& [n, t] : w.model->named_parameters()) after.push_back(bytes_of(t));
  CHECK(after == before);
  std::filesystem::remove_all(dir);
}

TEST_CASE("a step whose NVMe read fails after some updates ran is undone: six good steps around it train as six "
          "good steps",
          "[budget][nvme][errors][atomic]") {
  auto dir = fresh_dir("undo");
  zoo::Config c{.family = "gpt", .batch = 2, .layers = 2, .width = 32, .seq = 16, .heads = 2, .vocab = 64};
  Budget b;
  {
    zoo::Workload w = zoo::make(c);
    b = Budget{.device = zoo::plan(w).plan.total_bytes() - 1, .host = 1, .nvme_dir = dir.string()};
    b.device = zoo::plan(w, b).plan.min_feasible_bytes;
  }
  auto& fault = testing::nvme_read_fault_in();
  // How many NVMe reads one step makes (the plan is the same every time).
  long reads = 0;
  {
    zoo::Workload w = zoo::make(c);
    Step step = zoo::compile(w, b);
    auto batch = w.batch(1);
    fault = 1L << 40;
    step.run(batch[0], batch[1]);
    reads = (1L << 40) - fault.load();
    fault = -1;
  }
  REQUIRE(reads > 0);
  auto train = [&](bool with_failure) {
    zoo::Workload w = zoo::make(c);
    Step step = zoo::compile(w, b);
    // The last read comes after updates have run (they run as soon as their
    // gradient is complete), so undoing needs the journal.
    if (with_failure) CHECK(step.undo_journal_bytes() > 0);
    std::vector<float> losses;
    for (int s = 0; s < 6; ++s) {
      auto batch = w.batch(std::uint64_t(s + 1));
      if (with_failure && s == 3) {
        fault = reads - 1;  // this step's last NVMe read fails
        CHECK_THROWS_AS(step.run(batch[0], batch[1]), IoError);
        CHECK(fault.load() == -1);  // the planted fault was met
        CHECK(step.steps_run() == 3);
        CHECK(w.opt->steps() == 3);
      }
      losses.push_back(step.run(batch[0], batch[1]));
    }
    step.sync_to_host();  // tensors the plan keeps on NVMe between steps
    std::vector<std::vector<char>> state;
    for (auto& [n, t] : w.model->named_parameters()) state.push_back(bytes_of(t));
    for (auto& st : w.opt->state()) state.push_back(bytes_of(st.tensor));
    return std::pair{losses, state};
  };
  auto good = train(false);
  auto failed = train(true);
  fault = -1;
  CHECK(failed.first == good.first);
  CHECK(failed.second == good.second);
  std::filesystem::remove_all(dir);
}

TEST_CASE("plans record each decision with its reason", "[budget]") {
  zoo::Config c{.family = "gpt", .batch = 2, .layers = 2, .width = 32, .seq = 16, .heads = 2, .vocab = 64};
  zoo::Workload w = zoo::make(c);
  const std::size_t full = zoo::plan(w).plan.total_bytes();
  PlannedStep ps = zoo::plan(w, Budget{.device = full / 2});
  REQUIRE_FALSE(ps.plan.decisions.empty());
  for (auto& d : ps.plan.decisions) {
    CHECK(d.choice != plan::Choice::keep);
    CHECK(d.bytes > 0);
    CHECK_FALSE(d.reason.empty());
  }
  std::string j = plan::json(*ps.graph, ps.plan, "gpt");
  for (const char* key : {"\"budget_bytes\"", "\"min_feasible_bytes\"", "\"predicted_step_ms\"", "\"decision_counts\""})
    CHECK_THAT(j, Catch::Contains(key));
  CHECK_THAT(plan::summary(*ps.graph, ps.plan), Catch::Contains("decisions:"));
}

TEST_CASE("measured op times refine the cost model: a step whose prediction is far off re-plans at most once, in "
          "its arena, unchanged in bits",
          "[budget][replan]") {
  // A GPT at 3/4 of its memory whose re-plan (with real prices) needs less
  // arena than the first plan: it runs in the arena reserved at compile.
  zoo::Config c{.family = "gpt", .batch = 2, .layers = 2, .width = 32, .seq = 16, .heads = 2, .vocab = 64};
  ModelRun free = train_model(c, {}, 8);
  // A profile that claims ops and copies are a thousand times slower than
  // they are: the prediction misses by far more than 20%, so the step must
  // re-plan. (The measured prices decide the re-plan; in this case it
  // keeps less in the arena, a plan plan_test checks the refusal of a
  // larger one without timing.)
  DeviceProfile slow = test_profiles::thousandfold_slow();
  zoo::Workload w = zoo::make(c);
  const std::size_t budget = zoo::plan(w).plan.total_bytes() * 3 / 4;
  counting::reset();
  std::vector<float> losses;
  {
    Step step = zoo::compile(w, Budget{.device = budget}, CompileOptions{.use_backend = counting::make(), .profile = &slow});
    const double predicted = step.plan().predicted_step_ms;
    const std::size_t first_arena = step.plan().arena_bytes;
    for (int s = 0; s < 8; ++s) {
      auto batch = w.batch(std::uint64_t(s + 1));
      losses.push_back(step.run(batch[0], batch[1]));
    }
    CHECK(step.measured_step_ms() > 0);
    CHECK(plan::prediction_is_off(predicted, step.measured_step_ms()));
    // The re-plan is solved with the measured times, so whether it fits the
    // arena reserved at compile depends on this run's timings (in most runs
    // here it does). Taken, it is at most one, priced closer to the
    // measurement and inside the arena; refused, the first plan runs on.
    // Either way nothing is allocated again and no bit changes.
    // (plan_test checks the taking and the refusal without timings.)
    CHECK(step.replans() <= 1);
    if (step.replans() == 1) {
      CHECK(std::abs(step.plan().predicted_step_ms - step.measured_step_ms()) <
            std::abs(predicted - step.measured_step_ms()));
      CHECK(step.plan().arena_bytes <= first_arena);
    } else {
      CHECK(step.plan().predicted_step_ms == predicted);
    }
    CHECK(step.plan().total_bytes() <= budget);
    // What the user is shown: each plan's arena mark with that plan's own
    // persistents, never one plan's arena beside the other's persistents.
    CHECK(step.measured_device_bytes() <= budget);
    // The arena was allocated once, at compile, and never again.
    CHECK(counting::allocations == 1);
    CHECK(counting::deallocations == 0);
  }
  CHECK(counting::deallocations == 1);
  CHECK(losses == free.losses);
  std::vector<std::vector<char>> params;
  for (auto& [name, t] : w.model->named_parameters()) params.push_back(bytes_of(t));
  CHECK(params == free.params);
}

TEST_CASE("the end of a step fetches what the next step reads first, and a changed parameter is fetched again",
          "[budget][prefetch]") {
  zoo::Config c{.family = "gpt", .batch = 2, .layers = 2, .width = 32, .seq = 16, .heads = 2, .vocab = 64};
  // Two identical runs, one unconstrained, one at the smallest budget; in
  // both, a parameter is edited between steps 2 and 3.
  auto run = [&](bool tight, std::size_t& early) {
    zoo::Workload w = zoo::make(c);
    Budget b;
    if (tight) {
      b.device = zoo::plan(w).plan.total_bytes() - 1;
      b.device = zoo::plan(w, b).plan.min_feasible_bytes;
    }
    Step step = zoo::compile(w, b);
    early = step.plan().early_fetches.size();
    std::vector<float> losses;
    for (int s = 0; s < 5; ++s) {
      if (s == 3) {
        Tensor p = w.model->parameters().front();
        for (std::int64_t i = 0; i < p.numel(); ++i) p.data<float>()[i] *= 0.5f;
        step.parameters_changed();
      }
      auto batch = w.batch(std::uint64_t(s + 1));
      losses.push_back(step.run(batch[0], batch[1]));
    }
    return losses;
  };
  std::size_t early_free = 0, early_tight = 0;
  auto free = run(false, early_free);
  auto tight = run(true, early_tight);
  CHECK(early_free == 0);
  CHECK(early_tight > 0);
  CHECK(tight == free);
}

namespace {
// A GPT's training step and an evaluation step on the same weights, both at
// their smallest budget, so both keep the weights on the host and fetch
// some of them early, at the end of the step before.
struct SharedWeights {
  zoo::Config c{.family = "gpt", .batch = 2, .layers = 2, .width = 32, .seq = 16, .heads = 2, .vocab = 64};
  zoo::Workload w = zoo::make(c);
  DeviceProfile profile = DeviceProfile::defaults("cpu", 2);
  // No re-planning on measured times: these tests count fetches of one plan,
  // and whether a timed re-plan changes it depends on the machine's load.
  CompileOptions o{.profile = &profile, .replan = false};
  std::function<Var(Var, Var)> eval_fn = [this](Var a, Var b) { return w.loss({a, b}); };
  Step train = tight_training();
  Step eval = tight_eval();
  std::vector<Tensor> batch = w.batch(1);

  Step tight_training() {
    Budget b{.device = zoo::plan(w, {}, o).plan.total_bytes() - 1};
    b.device = zoo::plan(w, b, o).plan.min_feasible_bytes;
    return zoo::compile(w, b, o);
  }
  // The first budget from the smallest feasible up whose plan fetches early.
  Step tight_eval() {
    const std::size_t full = plan_inference(eval_fn, w.inputs, {}, o).plan.total_bytes();
    const std::size_t least = plan_inference(eval_fn, w.inputs, Budget{.device = full - 1}, o).plan.min_feasible_bytes;
    Budget b;
    for (int k = 0; k < 16; ++k) {
      b.device = least + (full - least) * std::size_t(k) / 16;
      if (!plan_inference(eval_fn, w.inputs, b, o).plan.early_fetches.empty()) break;
    }
    return compile_inference(eval_fn, w.inputs, b, o);
  }
  float evaluate(Step& s) {
    s.run(batch[0], batch[1]);
    return s.output().item<float>();
  }
  // What the weights as they are now give, from a step that fetches nothing early.
  float truth() {
    Step fresh = compile_inference(eval_fn, w.inputs, {}, o);
    return evaluate(fresh);
  }
  static std::uint64_t fetch_starts(const Step& s) {
    std::uint64_t n = 0;
    for (NodeId id : s.plan().schedule)
      if (auto* t = s.graph().node(id).op->as_transfer()) n += t->kind() == TransferKind::fetch_start;
    return n;
  }
};
}  // namespace

TEST_CASE("an evaluation step's early fetches of weights another step wrote, or was told changed, are fetched again",
          "[budget][prefetch]") {
  SharedWeights s;
  REQUIRE_FALSE(s.eval.plan().early_fetches.empty());
  s.evaluate(s.eval);
  float got = s.evaluate(s.eval);  // from its own early fetches
  CHECK(got == s.truth());
  // Training writes the weights back: the evaluation's early copies are stale.
  s.train.run(s.batch[0], s.batch[1]);
  got = s.evaluate(s.eval);
  CHECK(got == s.truth());
  // Edited weights, which only the training step is told of: the write
  // generation is the storage's, so the evaluation step fetches them too.
  s.evaluate(s.eval);
  for (Tensor& p : s.w.model->parameters())
    for (std::int64_t i = 0; i < p.numel(); ++i) p.data<float>()[i] *= 0.5f;
  s.train.parameters_changed();
  got = s.evaluate(s.eval);
  CHECK(got == s.truth());
}

TEST_CASE("a step that writes nothing another step fetched early leaves those fetches valid", "[budget][prefetch]") {
  SharedWeights s;
  const std::uint64_t starts = SharedWeights::fetch_starts(s.train), early = s.train.plan().early_fetches.size();
  REQUIRE(early > 0);
  zoo::Config other{.family = "mlp", .batch = 4, .layers = 2, .width = 16, .features = 8};
  zoo::Workload u = zoo::make(other);
  Step unrelated = zoo::compile(u, {}, s.o);
  auto ub = u.batch(1);
  s.train.run(s.batch[0], s.batch[1]);
  s.train.run(s.batch[0], s.batch[1]);
  // Each run performs every fetch once: its early ones were issued by the
  // run before, beside that run's tail.
  auto fetches_of_a_run = [&] {
    const std::uint64_t before = s.train.fetches_performed();
    s.train.run(s.batch[0], s.batch[1]);
    return s.train.fetches_performed() - before;
  };
  CHECK(fetches_of_a_run() == starts);
  // An unrelated step, and an evaluation that only reads the same weights,
  // write nothing the training step fetched.
  unrelated.run(ub[0], ub[1]);
  CHECK(fetches_of_a_run() == starts);
  s.evaluate(s.eval);
  CHECK(fetches_of_a_run() == starts);
  // A declared change does invalidate them: the early ones are fetched again.
  s.train.parameters_changed();
  CHECK(fetches_of_a_run() == starts + early);
}

TEST_CASE("on steps of up to 40 ops the greedy solver is within 5% of the exact optimum", "[budget][exact]") {
  // Budget problems built from real captured steps (random nets small
  // enough for the exact solver), at budgets from the least reachable to the
  // unconstrained peak. The gap is the greedy's extra cost as a share of the
  // step time the exact answer predicts.
  std::vector<double> gaps;
  int infeasible_greedy = 0, solved = 0;
  auto cm = std::make_shared<plan::CostModel>(DeviceProfile::defaults("cpu", 2));
  plan::PriceModel price = plan::prices_from(cm);
  for (std::uint64_t seed = 1; seed <= 60 && solved < 120; ++seed) {
    Rng r(seed * 7 + 1);
    const int in = 4 + int(r.below(20)), width = 8 + int(r.below(40)), depth = 1 + int(r.below(2)),
              classes = 2 + int(r.below(6)), batch = 1 + int(r.below(12));
    RandomNet net(seed, in, width, depth, classes);
    optim::SGD opt(net.parameters(), {.lr = 0.05, .momentum = 0.9});
    PlannedStep ps = plan_training([&](Var x, Var y) { return cross_entropy(net.forward(x), y); },
                                   {input<float>({batch, in}), input<std::int32_t>({batch})}, opt);
    const auto& schedule = ps.plan.schedule;
    if (schedule.size() > 40) continue;
    const plan::Prices prices = plan::step_prices(price, *ps.graph, schedule);
    const double base_ms = std::accumulate(prices.op_ms.begin(), prices.op_ms.end(), 0.0);
    auto built = plan::build_budget_problem(*ps.graph, schedule, ps.roots, Budget{.device = 1}, prices);
    const auto& problem = built.problem;
    auto least = plan::solve_exact_min_memory(problem, 10);
    REQUIRE(least.solution.feasible);
    const std::int64_t lo = least.solution.eval.device_peak, hi = evaluate(problem, std::vector<int>(problem.candidates.size(), 0)).device_peak;
    for (int k = 0; k <= 4; ++k) {
      const std::int64_t target = lo + (hi - lo) * k / 4;
      auto exact = plan::solve_exact(problem, target, 10);
      REQUIRE(exact.solution.feasible);
      CHECK(exact.optimal);
      auto greedy = plan::solve_greedy(problem, target);
      ++solved;
      if (!greedy.feasible) {
        ++infeasible_greedy;
        continue;
      }
      CHECK(greedy.eval.cost_ms >= exact.solution.eval.cost_ms - 1e-9);
      gaps.push_back((greedy.eval.cost_ms - exact.solution.eval.cost_ms) / (base_ms + exact.solution.eval.cost_ms));
    }
  }
  REQUIRE(gaps.size() > 50);
  std::sort(gaps.begin(), gaps.end());
  const double median = gaps[gaps.size() / 2], p90 = gaps[gaps.size() * 9 / 10];
  WARN("greedy vs exact on " << solved << " real-graph budgets: median gap " << 100 * median << "% of the step, p90 "
                              << 100 * p90 << "%, max " << 100 * gaps.back() << "%; greedy found nothing in "
                              << infeasible_greedy);
  CHECK(median <= 0.05);
  CHECK(p90 <= 0.05);
}

TEST_CASE("compile under a binding budget measures nothing, writes no file and makes one backend unless asked",
          "[budget][profile]") {
  auto cache = fresh_dir("no-hidden-work");
  const char* old_cache = std::getenv("FRUGAL_CACHE_DIR");
  const char* old_forced = std::getenv("FRUGAL_PROFILE");
  std::string saved_cache = old_cache ? old_cache : "", saved_forced = old_forced ? old_forced : "";
  ::setenv("FRUGAL_CACHE_DIR", cache.c_str(), 1);
  ::unsetenv("FRUGAL_PROFILE");
  nn::manual_seed(3);
  nn::Linear a(64, 256), b(256, 256), c(256, 8);
  auto params = a.parameters();
  for (auto& t : b.parameters()) params.push_back(t);
  for (auto& t : c.parameters()) params.push_back(t);
  auto fn = [&](Var x, Var y) { return cross_entropy(c(relu(b(relu(a(x))))), y); };
  std::vector<InputSpec> in{input<float>({128, 64}), input<std::int32_t>({128})};
  optim::SGD opt(params, {.lr = 0.1});
  // Backends made: the extra-kernels hook runs once each time one is built.
  int backends = 0;
  CompileOptions o;
  o.backend_options.extra_kernels = {[&](KernelTable&) { ++backends; }};
  const std::size_t full = plan_training(fn, in, opt, {}, o).plan.total_bytes();
  backends = 0;
  std::size_t least = 0;
  try {
    compile(fn, in, opt, Budget{.device = 1}, o);
  } catch (const BudgetError& e) {
    least = e.smallest_feasible_bytes;
  }
  REQUIRE(least > 0);
  REQUIRE(least < full);
  backends = 0;
  Step s = compile(fn, in, opt, Budget{.device = (least + full) / 2}, o);
  CHECK(backends == 1);
  CHECK_FALSE(s.plan().decisions.empty());
  CHECK(std::filesystem::is_empty(cache));  // no calibration was cached: none ran
  CHECK_THAT(s.summary(), Catch::Contains("priced with frugal's built-in cpu rates"));
  // Asked for, calibration runs, is cached and is said. The budget binds by
  // one byte: the smallest feasible budget under this machine's measured
  // rates differs from the built-in one (issue 13), but no pricing puts it
  // within a byte of the unconstrained step.
  o.calibrate = true;
  Step measured = compile(fn, in, opt, Budget{.device = full - 1}, o);
  CHECK_FALSE(std::filesystem::is_empty(cache));
  CHECK_THAT(measured.summary(), Catch::Contains("priced with this machine's measured rates"));
  old_cache ? ::setenv("FRUGAL_CACHE_DIR", saved_cache.c_str(), 1) : ::unsetenv("FRUGAL_CACHE_DIR");
  if (old_forced) ::setenv("FRUGAL_PROFILE", saved_forced.c_str(), 1);
  std::filesystem::remove_all(cache);
}
