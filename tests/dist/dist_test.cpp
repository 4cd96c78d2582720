// Data parallelism over MPI (issue 16, phase 1), run by ctest under mpirun:
//   dist_test collectives   every collective against a plain reference, bit for bit (any rank count)
//   dist_test train         mlp (SGD) and gpt (AdamW) trained on N ranks: the same bits on every rank,
//                           and the single-process run on the global batch within a derived tolerance
//   dist_test zero          ZeRO stages 1, 2 and 3 against stage 0, bit for bit; each rank's parameters
//                           and optimizer state against ZeRO's accounting; the stage the planner picks
//                           under a budget; per-rank checkpoints of stage 3
//   dist_test reshard-save DIR, then reshard-load DIR (reshard_test.cmake): gpt saved at 4 ranks and
//                           stage 3 as one gathered checkpoint, resumed at 2 ranks and stage 1
//   dist_test graphs        2 ranks: packed batches of track events, padded to the ranks' common bucket, trained
//                           data-parallel through a ShapeCache, against one process on both batches
//   dist_test local         one process: dist::local() trains bit for bit as no communicator
//   dist_test stop|kill     rank 1 stops (SIGSTOP) or dies (SIGKILL) before its first step: rank 0's
//                           gradient all-reduce fails naming itself within the timeout, and the job ends
// A plain program (ranks print their own failures); exit status 1 on a failed check.
#include <algorithm>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <unistd.h>
#include <functional>
#include <optional>
#include <cstdio>
#include <cstring>
#include <frugal/dist/local.hpp>
#include <frugal/data/balanced_batches.hpp>
#include <frugal/data/bucket_padding.hpp>
#include <frugal/data/track_graphs.hpp>
#include <frugal/dist/mpi.hpp>
#include <frugal/frugal.hpp>
#include <frugal/nn/edge_classifier.hpp>
#include <iostream>
#include <numeric>
#include <string>
#include <vector>

using namespace frugal;

namespace {

int failures = 0;
int my_rank = 0;

void check(bool ok, const std::string& what) {
  if (!ok) {
    ++failures;
    std::cerr << "rank " << my_rank << ": FAILED: " << what << "\n";
  }
}

// Rank r's row of a collective: values with stray low bits, so that any
// other order of addition changes some of them.
Tensor row(int r, std::size_t count, DType dt, std::uint64_t salt) {
  Tensor t(Shape{std::int64_t(count)}, dt);
  Rng g(1000 * salt + std::uint64_t(r));
  for (std::size_t i = 0; i < count; ++i) {
    const double v = g.normal() * (1 + double(i % 7) * 1e3) + 1e-3 * g.uniform();
    if (dt == DType::f32) t.data<float>()[i] = float(v);
    else if (dt == DType::f64) t.data<double>()[i] = v;
    else if (dt == DType::bf16) t.data<BFloat16>()[i] = BFloat16(float(v));
    else t.data<Half>()[i] = Half(float(v / 1e3));  // inside f16's range
  }
  return t;
}

// The reference: element i of every rank's row added in rank order, in the
// element type (f32 for bf16 and f16, rounded once).
std::vector<unsigned char> reference_sum(int n, std::size_t count, DType dt, std::uint64_t salt, std::size_t from,
                                         std::size_t len) {
  std::vector<Tensor> rows;
  for (int r = 0; r < n; ++r) rows.push_back(row(r, count, dt, salt));
  std::vector<unsigned char> out(len * dtype_size(dt));
  for (std::size_t i = 0; i < len; ++i) {
    if (dt == DType::f64) {
      double a = rows[0].data<double>()[from + i];
      for (int r = 1; r < n; ++r) a += rows[std::size_t(r)].data<double>()[from + i];
      std::memcpy(&out[i * 8], &a, 8);
    } else if (dt == DType::f32) {
      float a = rows[0].data<float>()[from + i];
      for (int r = 1; r < n; ++r) a += rows[std::size_t(r)].data<float>()[from + i];
      std::memcpy(&out[i * 4], &a, 4);
    } else if (dt == DType::bf16) {
      float a = float(rows[0].data<BFloat16>()[from + i]);
      for (int r = 1; r < n; ++r) a += float(rows[std::size_t(r)].data<BFloat16>()[from + i]);
      BFloat16 b(a);
      std::memcpy(&out[i * 2], &b, 2);
    } else {
      float a = float(rows[0].data<Half>()[from + i]);
      for (int r = 1; r < n; ++r) a += float(rows[std::size_t(r)].data<Half>()[from + i]);
      Half h(a);
      std::memcpy(&out[i * 2], &h, 2);
    }
  }
  return out;
}

bool same_bytes(const void* a, const void* b, std::size_t n) { return std::memcmp(a, b, n) == 0; }

void collectives(Communicator& c) {
  const int n = c.size(), me = c.rank();
  std::uint64_t salt = 1;
  for (DType dt : {DType::f32, DType::f64, DType::bf16, DType::f16}) {
    const std::size_t es = dtype_size(dt);
    for (std::size_t count : {std::size_t(1), std::size_t(3), std::size_t(1000), std::size_t(4099)}) {
      const std::string at = cat(dtype_name(dt), " x ", count);
      ++salt;
      // all_reduce_sum, with exactly the workspace it asks for and a canary after it.
      Tensor data = row(me, count, dt, salt);
      const std::size_t ws_bytes = c.all_reduce_workspace(count, dt);
      std::vector<unsigned char> ws(ws_bytes + 64, 0xA5);
      c.all_reduce_sum(data.raw(), count, dt, ws.data(), "test all_reduce " + at);
      const auto expect = reference_sum(n, count, dt, salt, 0, count);
      check(same_bytes(data.raw(), expect.data(), count * es), "all_reduce_sum is the rank-order sum, " + at);
      bool canary = true;
      for (std::size_t i = ws_bytes; i < ws.size(); ++i) canary = canary && ws[i] == 0xA5;
      check(canary, "all_reduce_sum stays inside its workspace, " + at);
      // reduce_scatter_sum: this rank's chunk of every rank's n chunks.
      ++salt;
      Tensor send = row(me, count * std::size_t(n), dt, salt);
      Tensor recv(Shape{std::int64_t(count)}, dt);
      std::vector<unsigned char> ws2(c.reduce_scatter_workspace(count, dt));
      c.reduce_scatter_sum(send.raw(), recv.raw(), count, dt, ws2.data(), "test reduce_scatter " + at);
      const auto chunk = reference_sum(n, count * std::size_t(n), dt, salt, count * std::size_t(me), count);
      check(same_bytes(recv.raw(), chunk.data(), count * es), "reduce_scatter_sum is the rank-order sum, " + at);
      // all_gather: every rank's row, in rank order.
      ++salt;
      Tensor mine = row(me, count, dt, salt);
      Tensor all(Shape{std::int64_t(count) * n}, dt);
      c.all_gather(mine.raw(), all.raw(), count, dt, "test all_gather " + at);
      for (int r = 0; r < n; ++r) {
        Tensor theirs = row(r, count, dt, salt);
        check(same_bytes(static_cast<char*>(all.raw()) + std::size_t(r) * count * es, theirs.raw(), count * es),
              cat("all_gather puts rank ", r, "'s row at its place, ", at));
      }
      // broadcast from the last rank.
      ++salt;
      Tensor b = row(me, count, dt, salt);
      c.broadcast(b.raw(), count, dt, n - 1, "test broadcast " + at);
      Tensor root = row(n - 1, count, dt, salt);
      check(same_bytes(b.raw(), root.raw(), count * es), "broadcast gives the root's row, " + at);
    }
  }
  c.barrier("test barrier");
  try {
    Tensor t = row(me, 4, DType::f32, 0);
    c.broadcast(t.raw(), 4, DType::f32, n, "a root past the last rank");
    check(false, "a broadcast from a rank that does not exist is refused");
  } catch (const Error& e) {
    check(std::string(e.what()).find("is not a rank") != std::string::npos, "the refusal names the root");
  }
}

// A two-layer MLP on a separable task, SGD with momentum.
struct Mlp : nn::Module {
  // fc2's bias has 3 elements: ZeRO pads its shards at 2 ranks and leaves
  // it whole at 4 (one rank would get none).
  nn::Linear fc1{16, 32}, fc2{32, 3};
  Mlp() {
    register_module("fc1", fc1);
    register_module("fc2", fc2);
  }
  Var forward(Var x) { return fc2(relu(fc1(x))); }
};

constexpr std::int64_t kGlobalBatch = 16;

// What every mlp run here trains with: SGD with momentum, one thread, over
// `comm` at ZeRO stage `stage` (unset: the planner's pick).
constexpr optim::SGDOptions kMlpSgd{.lr = 0.05, .momentum = 0.9};
CompileOptions mlp_options(std::shared_ptr<Communicator> comm, std::optional<int> stage) {
  CompileOptions o;
  o.threads = 1;
  o.communicator = std::move(comm);
  o.zero_stage = stage;
  return o;
}

// Rows [first, first + rows) of step s's global batch.
std::vector<Tensor> mlp_batch(int s, std::int64_t first, std::int64_t rows) {
  Rng g(7000 + std::uint64_t(s));
  Tensor x({kGlobalBatch, 16}), y({kGlobalBatch}, DType::i32);
  for (std::int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = float(g.normal());
  for (std::int64_t i = 0; i < kGlobalBatch; ++i) y.data<std::int32_t>()[i] = std::int32_t(g.below(3));
  Tensor xs({rows, 16}), ys({rows}, DType::i32);
  std::memcpy(xs.raw(), x.data<float>() + first * 16, std::size_t(rows * 16) * 4);
  std::memcpy(ys.raw(), y.data<std::int32_t>() + first, std::size_t(rows) * 4);
  return {xs, ys};
}

struct Trained {
  std::vector<float> losses;
  std::vector<Tensor> params;
  std::vector<Tensor> state;           // the optimizer's state tensors after training (Optimizer::state)
  std::size_t planned = 0, least = 0;  // the plan's total bytes; its smallest feasible budget
  Step::Audit audit;                   // of the last step, where asked
  int stage = -1;                      // the ZeRO stage the plan runs at
  std::string zero_reason;             // and why
  std::size_t state_bytes = 0;         // the plan's optimizer-state bytes on this rank
  std::size_t param_bytes = 0;         // and its parameter bytes
  std::size_t host_state_bytes = 0;    // optimizer state it keeps on the host (offload)
  std::size_t nvme_home_bytes = 0;     // parameters and state it keeps on NVMe between steps
  std::string collectives;             // where the plan runs them, and why
  int started = 0;                     // collectives run beside compute (ops::CollectiveStart)
  int overlapping = 0;                 // of those, with compute scheduled before their done
  int gathers = 0;                     // stage 3's parameter all-gathers, a re-gather included
  int gathers_started = 0;             // of those, started beside compute (prefetched)
  int gradient_started = 0;            // gradient collectives (all-reduce, reduce-scatter) started beside compute
  int updated_started = 0;             // stages 1-2's gathers of updated shards started beside compute
  int updated_overlapping = 0;         // of those, with backward compute scheduled before their done
};

void note_plan(const Step& step, Trained& t) {
  t.planned = step.plan().total_bytes();
  t.least = step.plan().min_feasible_bytes;
  t.stage = step.plan().zero_stage;
  t.zero_reason = step.plan().zero_reason;
  t.collectives = step.plan().collectives;
  const auto& kinds = step.plan().persistent_by_kind;
  auto it = kinds.find("optimizer state");
  t.state_bytes = it == kinds.end() ? 0 : it->second;
  it = kinds.find("parameters");
  t.param_bytes = it == kinds.end() ? 0 : it->second;
  it = step.plan().offloaded_by_kind.find("optimizer state");
  t.host_state_bytes = it == step.plan().offloaded_by_kind.end() ? 0 : it->second;
  t.nvme_home_bytes = step.plan().nvme_home_bytes;
  // Each started collective, and whether an op that is not communication
  // runs between its start and its done.
  const Graph& g = step.graph();
  const auto& order = step.plan().schedule;
  for (NodeId n : order) {
    const std::string op = g.node(n).op->name();
    t.gathers += op == "all_gather_parameter" || op == "all_gather_parameter.start";
    t.gathers_started += op == "all_gather_parameter.start";
    t.gradient_started += op == "all_reduce_mean.start" || op == "reduce_scatter_mean.start";
    t.updated_started += op == "all_gather_shards.start";
  }
  for (std::size_t i = 0; i < order.size(); ++i) {
    if (!dynamic_cast<const ops::CollectiveStart*>(g.node(order[i]).op.get())) continue;
    ++t.started;
    const ValueId out = g.node(order[i]).outputs[0];
    bool compute = false, backward = false;
    for (std::size_t j = i + 1; j < order.size(); ++j) {
      const Node& n = g.node(order[j]);
      if (dynamic_cast<const ops::CollectiveDone*>(n.op.get()) && n.inputs[0] == out) break;
      const bool computes = !n.op->is_collective() && !dynamic_cast<const ops::CollectiveDone*>(n.op.get());
      compute = compute || computes;
      backward = backward || (computes && n.phase == Phase::backward);
    }
    t.overlapping += compute;
    t.updated_overlapping += backward && g.node(order[i]).op->name() == "all_gather_shards.start";
  }
}

Trained train_mlp(std::shared_ptr<Communicator> comm, std::int64_t first, std::int64_t rows, int steps,
                  Budget budget = {}, bool audit_last = false, std::optional<int> zero_stage = {},
                  bool overlap = true, const std::function<void()>& compiled = {},
                  std::optional<bool> offload = std::nullopt, std::size_t bucket_bytes = 0) {
  nn::manual_seed(11);
  Mlp m;
  optim::SGD opt(m.parameters(), kMlpSgd);
  CompileOptions o = mlp_options(std::move(comm), zero_stage);
  o.overlap_collectives = overlap;
  o.bucket_bytes = bucket_bytes;  // 0: a collective per gradient, 4 to overlap, not one bucket at the end
  o.offload_optimizer = offload;
  Step step = compile([&](Var x, Var y) { return cross_entropy(m.forward(x), y); },
                      {input<float>({rows, 16}), input<std::int32_t>({rows})}, opt, budget, o);
  if (compiled) compiled();
  Trained t;
  note_plan(step, t);
  for (int s = 0; s < steps; ++s) {
    auto b = mlp_batch(s, first, rows);
    if (audit_last && s + 1 == steps) t.audit = step.audit(b[0], b[1]);
    else t.losses.push_back(step.run(b[0], b[1]));
  }
  step.gather_parameters();  // stage 3 trained the shards; elsewhere a no-op
  t.params = m.parameters();
  for (const auto& st : opt.state()) t.state.push_back(st.tensor.clone());
  return t;
}

constexpr std::int64_t kSeq = 8, kVocab = 32;

std::vector<Tensor> gpt_batch(int s, std::int64_t first, std::int64_t rows) {
  Rng g(9000 + std::uint64_t(s));
  Tensor x({kGlobalBatch / 2, kSeq}, DType::i32), y({kGlobalBatch / 2, kSeq}, DType::i32);
  for (std::int64_t i = 0; i < x.numel(); ++i) x.data<std::int32_t>()[i] = std::int32_t(g.below(kVocab));
  for (std::int64_t i = 0; i < y.numel(); ++i) y.data<std::int32_t>()[i] = std::int32_t(g.below(kVocab));
  Tensor xs({rows, kSeq}, DType::i32), ys({rows, kSeq}, DType::i32);
  std::memcpy(xs.raw(), x.data<std::int32_t>() + first * kSeq, std::size_t(rows * kSeq) * 4);
  std::memcpy(ys.raw(), y.data<std::int32_t>() + first * kSeq, std::size_t(rows * kSeq) * 4);
  return {xs, ys};
}

// What a gpt run sets besides its data.
struct GptRun {
  std::optional<int> zero_stage;
  double clip_grad_norm = 0;
  bool skip_non_finite = false;
  Budget budget;
  bool overlap_collectives = true;
  std::size_t bucket_bytes = 1024;  // buckets of a few of its 29 gradients
  std::optional<bool> offload;      // CompileOptions::offload_optimizer
  bool nvme = false;                // PlanOptions::nvme_offload: state and parameters on NVMe between steps
  int layers = 2;
  bool recompute_collectives = true;  // PlanOptions::recompute_collectives
};

Trained train_gpt(std::shared_ptr<Communicator> comm, std::int64_t first, std::int64_t rows, int steps, GptRun run = {}) {
  nn::manual_seed(12);
  nn::Gpt m({.vocab = kVocab, .context = kSeq, .layers = run.layers, .d_model = 16, .heads = 2});
  optim::AdamW opt(m.parameters(), {.lr = 3e-3});
  CompileOptions o;
  o.threads = 1;
  o.communicator = std::move(comm);
  o.zero_stage = run.zero_stage;
  o.clip_grad_norm = run.clip_grad_norm;
  o.skip_non_finite = run.skip_non_finite;
  o.overlap_collectives = run.overlap_collectives;
  o.bucket_bytes = run.bucket_bytes;
  o.offload_optimizer = run.offload;
  o.plan.recompute_collectives = run.recompute_collectives;
  o.plan.nvme_offload.optimizer_state = o.plan.nvme_offload.parameters = run.nvme;
  if (run.nvme) run.budget.nvme_dir = std::filesystem::temp_directory_path().string();  // each rank's own anonymous file
  Step step = compile([&](Var x, Var y) { return m.loss(x, y); },
                      {input<std::int32_t>({rows, kSeq}), input<std::int32_t>({rows, kSeq})}, opt, run.budget, o);
  Trained t;
  note_plan(step, t);
  for (int s = 0; s < steps; ++s) {
    auto b = gpt_batch(s, first, rows);
    t.losses.push_back(step.run(b[0], b[1]));
  }
  step.gather_parameters();
  t.params = m.parameters();
  return t;
}

// Every rank's parameters, gathered and compared with this rank's bytes.
bool same_on_every_rank(Communicator& c, const std::vector<Tensor>& params) {
  bool same = true;
  for (const Tensor& p : params) {
    const std::size_t n = std::size_t(p.numel());
    Tensor all(Shape{std::int64_t(n) * c.size()}, p.dtype());
    c.all_gather(p.raw(), all.raw(), n, p.dtype(), "test: parameters of every rank");
    for (int r = 0; r < c.size(); ++r)
      same = same && same_bytes(static_cast<char*>(all.raw()) + std::size_t(r) * n * 4, p.raw(), n * 4);
  }
  return same;
}

bool same_params(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  bool same = a.size() == b.size();
  for (std::size_t k = 0; same && k < a.size(); ++k)
    same = a[k].numel() == b[k].numel() && same_bytes(a[k].raw(), b[k].raw(), std::size_t(a[k].numel()) * 4);
  return same;
}

double max_abs_diff(const std::vector<Tensor>& a, const std::vector<Tensor>& b, double* scale) {
  double d = 0;
  *scale = 0;
  for (std::size_t k = 0; k < a.size(); ++k)
    for (std::int64_t i = 0; i < a[k].numel(); ++i) {
      d = std::max(d, std::abs(double(a[k].data<float>()[i]) - double(b[k].data<float>()[i])));
      *scale = std::max(*scale, std::abs(double(b[k].data<float>()[i])));
    }
  return d;
}

void train(const std::shared_ptr<dist::Mpi>& c) {
  const int n = c->size(), me = c->rank();
  const int steps = 10;
  if (kGlobalBatch % (2 * n)) {
    check(false, cat("the global batch ", kGlobalBatch, " splits evenly over ", n, " ranks"));
    return;
  }
  {
    const std::int64_t rows = kGlobalBatch / n;
    Trained dp = train_mlp(c, me * rows, rows, steps);
    check(same_on_every_rank(*c, dp.params), "mlp: every rank holds the same parameter bits after 10 steps");
    // A rank whose step fits no budget tells the others at compile: every
    // rank fails at once, naming it, and none waits for it in a collective.
    {
      const auto t0 = std::chrono::steady_clock::now();
      std::string error;
      bool budget_error = false;
      try {
        train_mlp(c, me * rows, rows, 1, me == 0 ? Budget{.device = 64} : Budget{});
      } catch (const BudgetError& e) {
        budget_error = true;
        error = e.what();
      } catch (const Error& e) {
        error = e.what();
      }
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (me == 0)
        check(budget_error, cat("mlp: rank 0, at a 64-byte budget, fails with its own budget error: ", error));
      else
        check(!budget_error && error.find("rank 0 could not plan its step") != std::string::npos,
              cat("mlp: rank ", me, " learns at compile that rank 0 could not plan: ", error));
      check(s < 60, cat("mlp: the ranks fail within ", s, " s, not at the collectives' timeout"));
    }
    Trained one = train_mlp(nullptr, 0, kGlobalBatch, steps);
    Trained alone = train_mlp(nullptr, me * rows, rows, steps);  // this rank's shard, never averaged
    // The tolerance. Averaging N shard means instead of one mean over the
    // global batch only reassociates each gradient element's sum of
    // kGlobalBatch = 16 terms (and one division): each step's gradient is
    // within 2 * 16 * u = 2e-6 of the other's, relative to the sum of
    // magnitudes (u = 2^-24). SGD with momentum 0.9 accumulates a gradient
    // difference into at most lr * sum_k 0.9^k < 10 lr = 0.5 per unit of
    // gradient over 10 steps, and the network's own sensitivity to the
    // parameters it changed (a Lipschitz constant of order 1 for a 2-layer
    // net with unit inputs over 10 steps of lr 0.05) at most doubles that.
    // So |p_dp - p_one| <= 2 * 0.5 * 2e-6 * max|g| * 16 (terms of size up
    // to max|g|), about 3.2e-5 * max|g| <= 3.2e-5 for |g| <= 1. Bound: 5e-5,
    // absolute. Training on this rank's shard alone moves the parameters
    // by orders of magnitude more, so the check is not vacuous.
    double scale = 0;
    const double d = max_abs_diff(dp.params, one.params, &scale);
    const double d_alone = max_abs_diff(alone.params, one.params, &scale);
    check(d <= 5e-5, cat("mlp: N ranks against one process on the global batch: max |dp - one| = ", d, " <= 5e-5"));
    check(d_alone > 100 * 5e-5, cat("mlp: one shard alone differs from the global batch by ", d_alone,
                                    ", so the tolerance could catch a missing average"));
    if (me == 0)
      std::cout << "mlp, " << n << " ranks: max |data parallel - one process| = " << d << " (bound 5e-5), one shard alone "
                << d_alone << "\n";
    // Under a binding budget (the all-reduce's scratch is an arena value
    // like any other): within it, audited, and bit for bit the unconstrained run.
    // The unconstrained bytes with the collectives in place: the budget
    // binds below them whichever way they run.
    const std::size_t in_place = train_mlp(c, me * rows, rows, 1, {}, false, {}, false).planned;
    const std::size_t least = train_mlp(c, me * rows, rows, 1, Budget{.device = in_place - 1}).least;
    check(least > 0 && least < dp.planned, cat("mlp: a budget below the unconstrained ", dp.planned, " bytes binds (least ", least, ")"));
    // Collectives beside compute hold gradients and scratch for longer, so
    // they are used only where the budget does not bind: at the overlapped
    // step's own bytes they overlap; a byte less, they run in place.
    {
      Trained roomy = train_mlp(c, me * rows, rows, 1, Budget{.device = dp.planned});
      Trained snug = train_mlp(c, me * rows, rows, 1, Budget{.device = dp.planned - 1});
      check(dp.started > 0 && dp.overlapping > 0 && dp.planned > in_place,
            cat("mlp: ", dp.overlapping, " of ", dp.started, " collectives overlap compute, for ", dp.planned - in_place,
                " bytes more than in place"));
      check(roomy.started == dp.started && snug.started == 0 && snug.collectives.find("budget binds") != std::string::npos,
            cat("mlp: at ", dp.planned, " bytes ", roomy.started, " collectives run beside compute, at one byte less ",
                snug.started, " (", snug.collectives, ")"));
    }
    const Budget tight{.device = least};
    Trained budgeted = train_mlp(c, me * rows, rows, steps, tight, true);
    Trained free = train_mlp(c, me * rows, rows, steps, {}, true);
    check(budgeted.planned <= least, cat("mlp: the plan fits the smallest feasible budget ", least));
    check(budgeted.audit.canary_intact && budgeted.audit.high_water <= least,
          cat("mlp: the audited high-water mark ", budgeted.audit.high_water, " is within the budget ", least));
    bool same = budgeted.losses == free.losses;
    for (std::size_t k = 0; k < free.params.size(); ++k)
      same = same && same_bytes(free.params[k].raw(), budgeted.params[k].raw(), std::size_t(free.params[k].numel()) * 4);
    check(same, "mlp: at the smallest feasible budget, N ranks train bit for bit as unconstrained");
    std::vector<Tensor> in_place_params;  // the accumulation runs' parameters in place, by stage
    // Gradient accumulation: each rank's share of every global batch in two
    // micro-batches (CompileOptions::accumulate = 2), at ZeRO stages 0 and 2.
    // The same global batch as `one`: the sum is reassociated the same way
    // as above, so the same bound holds. In place, and beside compute with
    // the whole gradients in one bucket (the micro-steps skip it): the same bits.
    for (int stage : {0, 2})
      for (bool overlap : {false, true}) {
      nn::manual_seed(11);
      Mlp m;
      optim::SGD opt(m.parameters(), kMlpSgd);
      CompileOptions o = mlp_options(c, stage);
      o.accumulate = 2;
      o.overlap_collectives = overlap;
      const std::int64_t micro = rows / 2;
      Step step = compile([&](Var x, Var y) { return cross_entropy(m.forward(x), y); },
                          {input<float>({micro, 16}), input<std::int32_t>({micro})}, opt, {}, o);
      for (int s = 0; s < steps; ++s)
        for (int k = 0; k < 2; ++k) {
          auto b = mlp_batch(s, me * rows + k * micro, micro);
          step.run(b[0], b[1]);
        }
      step.gather_parameters();
      check(same_on_every_rank(*c, m.parameters()), cat("mlp, accumulating, stage ", stage, ": every rank holds the same bits"));
      const double da = max_abs_diff(m.parameters(), one.params, &scale);
      check(da <= 5e-5, cat("mlp: N ranks x 2 micro-batches at stage ", stage, " against one process: ", da, " <= 5e-5"));
      if (!overlap) {
        in_place_params = {};
        for (const Tensor& p : m.parameters()) in_place_params.push_back(p.clone());
        if (me == 0) std::cout << "mlp, " << n << " ranks x 2 micro-batches, stage " << stage << ": max |diff| = " << da << "\n";
      } else {
        check(step.plan().collectives.find("beside compute") != std::string::npos &&
                  same_params(m.parameters(), in_place_params),
              cat("mlp, accumulating, stage ", stage, ": collectives beside compute (", step.plan().collectives,
                  ") train bit for bit as in place"));
      }
    }
  }
  {
    const std::int64_t rows = kGlobalBatch / 2 / n;
    Trained dp = train_gpt(c, me * rows, rows, steps);
    check(same_on_every_rank(*c, dp.params), "gpt: every rank holds the same parameter bits after 10 steps");
    Trained one = train_gpt(nullptr, 0, kGlobalBatch / 2, steps);
    // The global loss of step s is the mean of the ranks' losses (equal
    // shards). AdamW normalises each gradient element, so a rounding-level
    // gradient difference (the 2 * 64 * u of a 64-token mean, 8e-6
    // relative) can move a parameter by up to lr = 3e-3 in a step where
    // that element's gradient is near zero; the loss, a mean over many
    // parameters' effects, moves far less. Bound on the loss after 10
    // steps: 1e-4 relative to it (a missing average is of the order of the
    // loss's step-to-step change, 1e-2).
    std::vector<float> mean(static_cast<std::size_t>(steps));
    for (int s = 0; s < steps; ++s) {
      float l = dp.losses[std::size_t(s)];
      Tensor all(Shape{n});
      c->all_gather(&l, all.raw(), 1, DType::f32, "test: losses");
      double sum = 0;
      for (int r = 0; r < n; ++r) sum += all.data<float>()[r];
      mean[std::size_t(s)] = float(sum / n);
    }
    const double rel = std::abs(double(mean.back()) - double(one.losses.back())) / std::abs(double(one.losses.back()));
    check(rel <= 1e-4, cat("gpt: the ranks' mean loss at step 10 is the one-process loss within 1e-4: ", mean.back(), " vs ",
                           one.losses.back(), " (", rel, ")"));
    if (me == 0)
      std::cout << "gpt, " << n << " ranks: loss at step 10 " << mean.back() << ", one process " << one.losses.back()
                << " (relative " << rel << ", bound 1e-4)\n";
  }
}

// ZeRO's accounting of one rank's optimizer state, from the parameters'
// sizes alone: `slots` f32 tensors per parameter (SGD's momentum: 1; AdamW's
// two moments: 2), each of rank r's chunk of ceil(numel / N) elements, or
// the whole parameter where N - 1 chunks already cover it (then some rank
// would hold none, and the parameter is not sharded).
std::size_t zero_state_bytes(const std::vector<Tensor>& params, int slots, int rank, int ranks, int stage) {
  std::size_t elements = 0;
  for (const Tensor& p : params) {
    const std::int64_t n = p.numel(), chunk = (n + ranks - 1) / ranks;
    if (stage == 0 || std::int64_t(ranks - 1) * chunk >= n) elements += std::size_t(n);
    else elements += std::size_t(std::clamp<std::int64_t>(n - rank * chunk, 0, chunk));
  }
  return elements * std::size_t(slots) * 4;
}
// The parameters a rank keeps: whole below stage 3, its shards at 3.
std::size_t zero_param_bytes(const std::vector<Tensor>& params, int rank, int ranks, int stage) {
  return zero_state_bytes(params, 1, rank, ranks, stage == 3 ? 3 : 0);
}

// ZeRO stages 0 to 3 on N ranks: the same bits as stage 0 after 10
// steps (the stage only moves where each element of the update is computed,
// not how), each rank's optimizer state what ZeRO's accounting says, and
// under a budget that stage 0 cannot meet the planner picks a stage that
// fits, audited.
void zero(const std::shared_ptr<dist::Mpi>& c) {
  const int n = c->size(), me = c->rank();
  const int steps = 10;
  {
    const std::int64_t rows = kGlobalBatch / n;
    Trained s0 = train_mlp(c, me * rows, rows, steps, {}, false, 0);
    check(s0.stage == 0 && s0.state_bytes == zero_state_bytes(s0.params, 1, me, n, 0),
          cat("mlp stage 0: SGD's momentum is whole, ", s0.state_bytes, " bytes"));
    for (int stage : {1, 2, 3}) {
      Trained z = train_mlp(c, me * rows, rows, steps, {}, false, stage);
      check(z.stage == stage, cat("mlp: the plan runs at the pinned stage ", stage));
      check(z.losses == s0.losses && same_params(z.params, s0.params),
            cat("mlp: ZeRO stage ", stage, " trains bit for bit as stage 0 over ", n, " ranks"));
      check(same_on_every_rank(*c, z.params), cat("mlp stage ", stage, ": every rank holds the same parameter bits"));
      const std::size_t expect = zero_state_bytes(z.params, 1, me, n, stage);
      check(z.state_bytes == expect, cat("mlp stage ", stage, ": rank ", me, " keeps ", z.state_bytes,
                                         " bytes of momentum, ZeRO's accounting says ", expect));
      const std::size_t params = zero_param_bytes(z.params, me, n, stage);
      check(z.param_bytes == params, cat("mlp stage ", stage, ": rank ", me, " keeps ", z.param_bytes,
                                         " bytes of parameters, ZeRO's accounting says ", params));
      if (stage >= 2) {
        // The sharded gradients reduce-scattered in one bucket (fc2's bias
        // padded at 2 ranks, whole and all-reduced apart at 4): the bits of
        // one collective per gradient.
        Trained b = train_mlp(c, me * rows, rows, steps, {}, false, stage, true, {}, {}, std::size_t(1) << 20);
        const int per_gradient = z.gradient_started, bucketed = b.gradient_started;
        check(bucketed < per_gradient && bucketed == (n == 2 ? 1 : 2),
              cat("mlp stage ", stage, ": ", bucketed, " gradient collectives in buckets of 1 MiB, ", per_gradient, " one by one"));
        check(b.losses == z.losses && same_params(b.params, z.params),
              cat("mlp stage ", stage, ": reduce-scatters in a bucket train bit for bit as one per gradient over ", n, " ranks"));
      }
    }
    // Optimizer offload at every stage: the momentum (each rank's shard of
    // it) lives on the host, updated there; the same bits as stage 0.
    for (int stage : {0, 1, 2, 3}) {
      Trained z = train_mlp(c, me * rows, rows, steps, {}, false, stage, true, {}, true);
      check(z.losses == s0.losses && same_params(z.params, s0.params),
            cat("mlp: ZeRO stage ", stage, " with optimizer offload trains bit for bit as stage 0 over ", n, " ranks"));
      const std::size_t expect = zero_state_bytes(z.params, 1, me, n, stage);
      check(z.state_bytes == 0 && z.host_state_bytes == expect,
            cat("mlp stage ", stage, " offloaded: rank ", me, " keeps ", z.state_bytes, " bytes of momentum on the device and ",
                z.host_state_bytes, " on the host, ZeRO's accounting says 0 and ", expect));
    }
    // Each sharded stage at its own smallest feasible budget (where stage 3's
    // gathered parameters are swapped, or freed and gathered again):
    // audited within it, and bit for bit stage 0.
    for (int stage : {1, 2, 3}) {
      const std::size_t planned = train_mlp(c, me * rows, rows, 1, {}, false, stage, false).planned;
      const std::size_t least = train_mlp(c, me * rows, rows, 1, Budget{.device = planned - 1}, false, stage).least;
      // Every rank runs at the largest rank's least (the last rank's shards may be smaller).
      std::vector<double> all(static_cast<std::size_t>(n));
      const double mine = double(least);
      c->all_gather(&mine, all.data(), 1, DType::f64, "test: least budgets");
      const std::size_t budget = std::size_t(*std::max_element(all.begin(), all.end()));
      Trained tight = train_mlp(c, me * rows, rows, steps, Budget{.device = budget}, true, stage);
      check(tight.audit.canary_intact && tight.audit.high_water <= budget,
            cat("mlp stage ", stage, " at its smallest budget ", budget, ": audited high-water ", tight.audit.high_water));
      Trained free = train_mlp(c, me * rows, rows, steps, {}, true, 0);
      check(tight.losses == free.losses && same_params(tight.params, free.params),
            cat("mlp stage ", stage, " at its smallest budget trains bit for bit as stage 0 unconstrained"));
      if (me == 0)
        std::cout << "mlp, " << n << " ranks, stage " << stage << ": smallest feasible budget " << budget << " B (unconstrained "
                  << planned << ")\n";
    }
    // The budget: stage 1's least, below stage 0's. Left to choose, the
    // planner must take a sharded stage, stay within it (audited), and still
    // train bit for bit. Offload is off here: on the CPU it is free, and
    // stage 0 with its momentum on the host can fit below stage 1 without
    // (below, offload left to the planner).
    const std::size_t planned0 = train_mlp(c, me * rows, rows, 1, {}, false, 0, false, {}, false).planned;
    const std::size_t least0 = train_mlp(c, me * rows, rows, 1, Budget{.device = planned0 - 1}, false, 0, true, {}, false).least;
    Trained probe1 = train_mlp(c, me * rows, rows, 1, {}, false, 1, false, {}, false);
    const std::size_t least1 = train_mlp(c, me * rows, rows, 1, Budget{.device = probe1.planned - 1}, false, 1, true, {}, false).least;
    check(least1 < least0, cat("mlp: stage 1 needs less than stage 0 (", least1, " < ", least0, " bytes)"));
    // Every rank must be given the same budget: the larger of the ranks'.
    std::vector<double> leasts(static_cast<std::size_t>(n));
    const double mine = double(least1);
    c->all_gather(&mine, leasts.data(), 1, DType::f64, "test: stage 1's least budget");
    const std::size_t budget = std::size_t(*std::max_element(leasts.begin(), leasts.end()));
    if (budget < least0) {
      Trained chosen = train_mlp(c, me * rows, rows, steps, Budget{.device = budget}, true, std::nullopt, true, {}, false);
      check(chosen.stage >= 1, cat("mlp: at ", budget, " bytes (stage 0 needs ", least0, ") the planner picks stage ",
                                   chosen.stage));
      check(chosen.zero_reason.find("stage 0 needs at least") != std::string::npos,
            cat("mlp: the plan says why stage 0 was passed over: ", chosen.zero_reason));
      check(chosen.audit.canary_intact && chosen.audit.high_water <= budget,
            cat("mlp: at the chosen stage the audited high-water mark ", chosen.audit.high_water, " is within ", budget));
      Trained free = train_mlp(c, me * rows, rows, steps, {}, true, 0);
      check(chosen.losses == free.losses && same_params(chosen.params, free.params),
            "mlp: the chosen stage under the budget trains bit for bit as stage 0 unconstrained");
    } else {
      check(false, cat("mlp: ranks' stage-1 budgets (max ", budget, ") leave stage 0 (", least0, ") nothing to refuse"));
    }
    // Plans at every other stage while a step trains (a program comparing
    // stages: planning alone plans a pinned stage as asked, and fixes none)
    // leave that step's state alone: a step compiled again at its stage
    // goes on from the momentum it had. Unpinned, a plan would take the
    // stage the optimizer's steps train and try no other.
    {
      auto losses_with = [&](bool probe) {
        nn::manual_seed(11);
        Mlp m;
        optim::SGD opt(m.parameters(), kMlpSgd);
        const CompileOptions o = mlp_options(c, 0);
        auto fn = [&](Var x, Var y) { return cross_entropy(m.forward(x), y); };
        const std::vector<InputSpec> in{input<float>({rows, 16}), input<std::int32_t>({rows})};
        std::vector<float> losses;
        {
          Step a = compile(fn, in, opt, {}, o);
          for (int s = 0; s < 3; ++s) {
            auto b = mlp_batch(s, me * rows, rows);
            losses.push_back(a.run(b[0], b[1]));
          }
        }
        if (probe)
          for (int stage : {1, 2, 3}) {
            CompileOptions other = o;
            other.zero_stage = stage;
            plan_training(fn, in, opt, Budget{.device = planned0 - 1}, other);
          }
        Step b = compile(fn, in, opt, {}, o);
        for (int s = 3; s < 6; ++s) {
          auto bt = mlp_batch(s, me * rows, rows);
          losses.push_back(b.run(bt[0], bt[1]));
        }
        return losses;
      };
      check(losses_with(true) == losses_with(false),
            "mlp: planning at every stage between two steps of stage 0 leaves the momentum the steps train");
    }
    // One byte under stage 0's unconstrained bytes, left to choose: the
    // planner tries every stage, and where it keeps stage 0 the optimizer
    // state it reports (what a checkpoint saves) must be the state that
    // stage's step trained, not a sharded stage's tried on the way.
    {
      Trained chosen = train_mlp(c, me * rows, rows, steps, Budget{.device = planned0 - 1}, false, std::nullopt, true, {}, false);
      Trained pinned = train_mlp(c, me * rows, rows, steps, Budget{.device = planned0 - 1}, false, chosen.stage, true, {}, false);
      check(chosen.zero_reason.find("stage 1") != std::string::npos,
            cat("mlp: one byte under stage 0's unconstrained bytes the planner priced the other stages: ", chosen.zero_reason));
      bool same = chosen.state.size() == pinned.state.size() && !chosen.state.empty();
      for (std::size_t k = 0; same && k < chosen.state.size(); ++k)
        same = chosen.state[k].shape() == pinned.state[k].shape() &&
               same_bytes(chosen.state[k].raw(), pinned.state[k].raw(), chosen.state[k].nbytes());
      check(same, cat("mlp: at the stage the planner chose (", chosen.stage,
                      ") the optimizer holds the state that stage's step trained, as a run pinned to it does"));
    }
    // Left to choose the stage and offload, one byte under what stage 0
    // needs without offload, the planner fits (a higher stage, the momentum
    // on the host, or both), audited, bit for bit.
    {
      Trained either = train_mlp(c, me * rows, rows, steps, Budget{.device = least0 - 1}, true);
      check(either.stage >= 1 || either.host_state_bytes > 0,
            cat("mlp: under stage 0's least without offload, the plan shards (stage ", either.stage, ") or offloads (",
                either.host_state_bytes, " bytes of momentum on the host)"));
      check(either.audit.canary_intact && either.audit.high_water <= least0 - 1,
            cat("mlp: stage or offload chosen, the audited high-water mark ", either.audit.high_water, " is within ",
                least0 - 1));
      Trained free = train_mlp(c, me * rows, rows, steps, {}, true, 0);
      check(either.losses == free.losses && same_params(either.params, free.params),
            "mlp: the stage and offload chosen under the budget train bit for bit as stage 0 unconstrained");
    }
    try {
      train_mlp(c, me * rows, rows, 1, Budget{.device = least1 / 2}, false, std::nullopt, true, {}, false);
      check(false, "a budget no stage fits is refused");
    } catch (const BudgetError& e) {
      check(std::string(e.what()).find("no ZeRO stage fits") != std::string::npos,
            cat("the refusal says no stage fits: ", e.what()));
    }
  }
  {
    const std::int64_t rows = kGlobalBatch / 2 / n;
    std::vector<std::size_t> state(4), param(4), offloaded(4), offloaded_param(4);
    for (GptRun base : {GptRun{}, GptRun{.clip_grad_norm = 0.5}, GptRun{.skip_non_finite = true}}) {
      const bool whole_grads = base.clip_grad_norm != 0 || base.skip_non_finite;
      const std::string with = base.clip_grad_norm ? " with clip_grad_norm" : base.skip_non_finite ? " with skip_non_finite" : "";
      base.zero_stage = 0;
      Trained s0 = train_gpt(c, me * rows, rows, steps, base);
      if (!whole_grads) state[0] = s0.state_bytes, param[0] = s0.param_bytes;
      // The gradients' collectives run beside the backward (each but the
      // last has backward compute before its done), and give the bits of
      // collectives run in place on the step's thread.
      check(s0.started > 0 && s0.overlapping > 0 && s0.overlapping + 1 >= s0.started,
            cat("gpt", with, ": ", s0.overlapping, " of ", s0.started, " gradient collectives overlap compute"));
      {
        GptRun in_place = base;
        in_place.overlap_collectives = false;
        Trained sync = train_gpt(c, me * rows, rows, steps, in_place);
        check(sync.started == 0, "gpt: overlap_collectives = false starts no collective beside compute");
        check(sync.losses == s0.losses && same_params(sync.params, s0.params),
              cat("gpt", with, ": collectives beside compute train bit for bit as in place, stage 0"));
        // Buckets: one per gradient, and all 29 in one, give the same bits.
        for (std::size_t bytes : {std::size_t(0), std::size_t(1) << 20}) {
          GptRun r = base;
          r.bucket_bytes = bytes;
          Trained b = train_gpt(c, me * rows, rows, steps, r);
          check(b.started == (bytes ? 1 : 29) && s0.started > 1 && s0.started < 29,
                cat("gpt: buckets of ", bytes, " bytes make ", b.started, " collectives (1024: ", s0.started, ")"));
          check(b.losses == s0.losses && same_params(b.params, s0.params),
                cat("gpt", with, ": buckets of ", bytes, " bytes train bit for bit as of 1024"));
        }
      }
      for (int stage = 1; stage <= (whole_grads ? 1 : 3); ++stage) {
        GptRun r = base;
        r.zero_stage = stage;
        Trained z = train_gpt(c, me * rows, rows, steps, r);
        check(z.losses == s0.losses && same_params(z.params, s0.params),
              cat("gpt", with, ": ZeRO stage ", stage, " trains bit for bit as stage 0 over ", n, " ranks"));
        check(z.overlapping > 0, cat("gpt", with, " stage ", stage, ": ", z.overlapping, " of ", z.started,
                                     " gradient collectives overlap compute"));
        if (stage == 3)  // each parameter's gather prefetched while the compute before it runs
          check(z.gathers > 0 && z.gathers_started == z.gathers,
                cat("gpt stage 3: ", z.gathers_started, " of ", z.gathers, " parameter gathers beside compute"));
        else  // each updated shard gathered into its parameter beside compute, while the backward goes on
          check(z.updated_started == 29 && (whole_grads || z.updated_overlapping > 0),
                cat("gpt stage ", stage, with, ": ", z.updated_started, " gathers of updated shards beside compute, ",
                    z.updated_overlapping, " of them beside the backward"));
        if (stage == 1) {
          r.overlap_collectives = false;
          Trained sync = train_gpt(c, me * rows, rows, steps, r);
          check(sync.started == 0 && sync.losses == z.losses && same_params(sync.params, z.params),
                cat("gpt", with, ": all-reduces and gathers of updated shards beside compute train bit for bit as in place, stage 1"));
        }
        if (stage >= 2) {
          // One collective per gradient, and all in one bucket: the same bits.
          for (std::size_t bytes : {std::size_t(0), std::size_t(1) << 20}) {
            GptRun rb = r;
            rb.bucket_bytes = bytes;
            Trained b = train_gpt(c, me * rows, rows, steps, rb);
            const int scatters = b.gradient_started;
            check(scatters == (bytes ? 1 : 29) && z.gradient_started > 1 && z.gradient_started < 29,
                  cat("gpt stage ", stage, ": buckets of ", bytes, " bytes make ", scatters, " reduce-scatters (1024: ",
                      z.gradient_started, ")"));
            check(b.losses == z.losses && same_params(b.params, z.params),
                  cat("gpt", with, " stage ", stage, ": reduce-scatters in buckets of ", bytes, " bytes train bit for bit as of 1024"));
          }
          r.overlap_collectives = false;
          Trained sync = train_gpt(c, me * rows, rows, steps, r);
          check(sync.gathers_started == 0 && sync.started == 0, "gpt: in place, no collective starts beside compute");
          check(sync.losses == z.losses && same_params(sync.params, z.params),
                cat("gpt", with, ": ", stage == 2 ? "reduce-scatters" : "reduce-scatters and prefetched gathers",
                    " beside compute train bit for bit as in place, stage ", stage));
        }
        check(same_on_every_rank(*c, z.params), cat("gpt stage ", stage, with, ": every rank holds the same bits"));
        const std::size_t expect = zero_state_bytes(z.params, 2, me, n, stage);
        check(z.state_bytes == expect + (base.skip_non_finite ? s0.state_bytes - zero_state_bytes(z.params, 2, me, n, 0) : 0),
              cat("gpt stage ", stage, with, ": rank ", me, " keeps ", z.state_bytes, " bytes of AdamW moments, ZeRO's accounting says ", expect));
        check(z.param_bytes == zero_param_bytes(z.params, me, n, stage),
              cat("gpt stage ", stage, with, ": rank ", me, " keeps ", z.param_bytes, " bytes of parameters"));
        if (!whole_grads) state[std::size_t(stage)] = z.state_bytes, param[std::size_t(stage)] = z.param_bytes;
      }
      // Optimizer offload at every stage this run allows: the same bits,
      // the AdamW moments (the rank's shard) on the host, none on the device.
      for (int stage = 0; stage <= (whole_grads ? 1 : 3); ++stage) {
        GptRun r = base;
        r.zero_stage = stage;
        r.offload = true;
        Trained z = train_gpt(c, me * rows, rows, steps, r);
        check(z.losses == s0.losses && same_params(z.params, s0.params),
              cat("gpt", with, ": ZeRO stage ", stage, " with optimizer offload trains bit for bit as stage 0 over ", n,
                  " ranks"));
        const std::size_t expect = zero_state_bytes(z.params, 2, me, n, stage);
        check(z.host_state_bytes == expect && z.state_bytes == (base.skip_non_finite ? s0.state_bytes - zero_state_bytes(z.params, 2, me, n, 0) : 0),
              cat("gpt stage ", stage, with, " offloaded: rank ", me, " keeps ", z.host_state_bytes,
                  " bytes of AdamW moments on the host (ZeRO's accounting: ", expect, ") and ", z.state_bytes,
                  " bytes of optimizer state on the device"));
        if (!whole_grads) offloaded[std::size_t(stage)] = z.host_state_bytes, offloaded_param[std::size_t(stage)] = z.param_bytes;
      }
      // NVMe offload (ZeRO-Infinity) at every stage this run allows: each
      // rank's moments (its shard) and f32 parameters (at stage 3 its shard)
      // live in its own NVMe file between steps; the same bits.
      for (int stage = 0; stage <= (whole_grads ? 1 : 3); ++stage) {
        GptRun r = base;
        r.zero_stage = stage;
        r.nvme = true;
        Trained z = train_gpt(c, me * rows, rows, steps, r);
        check(z.losses == s0.losses && same_params(z.params, s0.params),
              cat("gpt", with, ": ZeRO stage ", stage, " with parameters and state on NVMe trains bit for bit as stage 0 over ",
                  n, " ranks"));
        check(z.nvme_home_bytes > 0, cat("gpt stage ", stage, with, ": rank ", me, " keeps ", z.nvme_home_bytes,
                                         " bytes of parameters and state on NVMe"));
      }
      // Stage 3 under a budget it meets only with no host memory to swap
      // to: parameters freed after the forward and gathered again for the
      // backward, every rank alike, bit for bit against stage 0 of the same
      // model (one layer: each binding budget solve searches for its least
      // memory, seconds on two layers).
      if (!whole_grads) {
        GptRun r = base;
        r.layers = 1;
        const Trained one_layer = train_gpt(c, me * rows, rows, steps, r);
        r.zero_stage = 3;
        r.offload = false;
        r.overlap_collectives = false;  // as compile runs them under a budget that binds: the bytes it starts from
        const Trained free3 = train_gpt(c, me * rows, rows, 1, r);
        // Just below the least every rank reaches without gathering again
        // (from the graph alone: no price enters the least memory), so no
        // rank can meet it that way: one least-memory search per rank.
        std::size_t once_least = 0;
        {
          GptRun once = r;
          once.recompute_collectives = false;
          once.budget = Budget{.device = 1, .host = 1};
          try {
            train_gpt(c, me * rows, rows, 1, once);
          } catch (const BudgetError& e) {
            once_least = e.smallest_feasible_bytes;
          }
        }
        const double mine = double(once_least);
        std::vector<double> all(static_cast<std::size_t>(n));
        c->all_gather(&mine, all.data(), 1, DType::f64, "test: stage 3's least without a re-gather");
        const double fewest = *std::min_element(all.begin(), all.end());
        check(fewest > 0, cat("gpt", with, " stage 3 with no host memory has a least without re-gathering"));
        r.budget = Budget{.device = std::size_t(fewest) - 1, .host = 1};
        Trained z = train_gpt(c, me * rows, rows, steps, r);
        check(z.gathers > free3.gathers, cat("gpt", with, " stage 3 at ", r.budget.device, " bytes, no host memory: ",
                                             z.gathers, " parameter gathers, ", free3.gathers, " unconstrained"));
        check(z.planned <= r.budget.device, cat("gpt", with, " stage 3: the plan's ", z.planned, " bytes fit ", r.budget.device));
        check(z.losses == one_layer.losses && same_params(z.params, one_layer.params),
              cat("gpt", with, ": stage 3 gathering parameters again for the backward trains bit for bit as stage 0"));
        if (me == 0)
          std::cout << "gpt, " << n << " ranks, stage 3 with no host memory: " << z.gathers << " gathers (unconstrained "
                    << free3.gathers << ") at " << r.budget.device << " B (unconstrained " << free3.planned << ")\n";
      }
    }
    // A checkpoint of sharded state, one file per rank: saved after 5
    // steps at stage 3 (without gathering: the shards are the parameters,
    // and the checkpoint holds them), loaded into a fresh model and
    // optimizer at the same stage and rank count, the next 5 steps are the
    // uninterrupted run's, bit for bit. Loaded into a stage 0 step, it is
    // refused, naming the shard and the stage.
    {
      namespace fs = std::filesystem;
      const fs::path dir = fs::temp_directory_path() / cat("frugal_dist_zero_", n, "_", ::getppid());
      fs::create_directories(dir);
      const fs::path file = dir / cat("gpt.rank", me, ".safetensors");
      auto make = [&](nn::Gpt& m, optim::AdamW& opt, int stage) {
        CompileOptions o;
        o.threads = 1;
        o.communicator = c;
        o.zero_stage = stage;
        return compile([&](Var x, Var y) { return m.loss(x, y); },
                       {input<std::int32_t>({rows, kSeq}), input<std::int32_t>({rows, kSeq})}, opt, {}, o);
      };
      const nn::GptConfig config{.vocab = kVocab, .context = kSeq, .layers = 2, .d_model = 16, .heads = 2};
      nn::manual_seed(12);
      nn::Gpt m(config);
      optim::AdamW opt(m.parameters(), {.lr = 3e-3});
      Step step = make(m, opt, 3);
      std::vector<float> through, resumed;
      for (int s = 0; s < steps; ++s) {
        if (s == 5) io::save_checkpoint(file, m, opt, 5);
        auto b = gpt_batch(s, me * rows, rows);
        const float l = step.run(b[0], b[1]);
        if (s >= 5) through.push_back(l);
      }
      nn::manual_seed(99);  // other initial weights: the checkpoint must replace them
      nn::Gpt m2(config);
      optim::AdamW opt2(m2.parameters(), {.lr = 3e-3});
      Step step2 = make(m2, opt2, 3);
      const auto state = io::load_checkpoint(file, m2, opt2);
      step2.set_steps_run(state.step);
      step2.parameters_changed();
      for (int s = 5; s < steps; ++s) {
        auto b = gpt_batch(s, me * rows, rows);
        resumed.push_back(step2.run(b[0], b[1]));
      }
      step.gather_parameters();
      step2.gather_parameters();
      check(resumed == through && same_params(m2.parameters(), m.parameters()),
            "gpt stage 3: resumed from per-rank checkpoints, the last 5 steps are the uninterrupted run's bit for bit");
      nn::Gpt m3(config);
      optim::AdamW opt3(m3.parameters(), {.lr = 3e-3});
      Step step3 = make(m3, opt3, 0);
      try {
        io::load_checkpoint(file, m3, opt3);
        check(false, "a rank's sharded checkpoint loaded into whole optimizer state is refused");
      } catch (const DataError& e) {
        check(std::string(e.what()).find("parameter_shard' is one rank's shard") != std::string::npos &&
                  std::string(e.what()).find("stage 3") != std::string::npos,
              cat("the refusal names the shard and the stage: ", e.what()));
      }
      // The same at stage 1 (whole parameters, sharded state) into stage 0:
      // refused naming the moment and both shapes.
      {
        nn::manual_seed(12);
        nn::Gpt a(config), b(config);
        optim::AdamW oa(a.parameters(), {.lr = 3e-3}), ob(b.parameters(), {.lr = 3e-3});
        Step sa = make(a, oa, 1);
        Step sb = make(b, ob, 0);
        const fs::path f1 = dir / cat("gpt1.rank", me, ".safetensors");
        io::save_checkpoint(f1, a, oa, 0);
        try {
          io::load_checkpoint(f1, b, ob);
          check(false, "a rank's stage-1 checkpoint loaded into whole optimizer state is refused");
        } catch (const DataError& e) {
          check(std::string(e.what()).find("exp_avg") != std::string::npos, cat("the refusal names the moment: ", e.what()));
        }
      }
      c->barrier("test: checkpoints read");
      if (me == 0) fs::remove_all(dir);
    }
    if (me == 0) {
      std::size_t psi = 0;
      nn::manual_seed(12);
      nn::Gpt m({.vocab = kVocab, .context = kSeq, .layers = 2, .d_model = 16, .heads = 2});
      for (const Tensor& p : m.parameters()) psi += std::size_t(p.numel());
      std::cout << "gpt, " << n << " ranks, psi = " << psi << " f32 parameters; rank 0 keeps (parameters + AdamW state):\n";
      for (int stage = 0; stage <= 3; ++stage)
        std::cout << "  stage " << stage << ": " << param[std::size_t(stage)] << " + " << state[std::size_t(stage)]
                  << " = " << param[std::size_t(stage)] + state[std::size_t(stage)] << " B\n";
      std::cout << "  (ZeRO's f32 accounting: stage 0 4psi + 8psi = " << 12 * psi << ", stages 1-2 4psi + 8psi/N = "
                << 4 * psi + 8 * psi / std::size_t(n) << ", stage 3 12psi/N = " << 12 * psi / std::size_t(n) << ")\n";
      std::cout << "with optimizer offload, rank 0 keeps parameters on the device + AdamW state on the host:\n";
      for (int stage = 0; stage <= 3; ++stage)
        std::cout << "  stage " << stage << ": " << offloaded_param[std::size_t(stage)] << " + "
                  << offloaded[std::size_t(stage)] << " B\n";
      std::cout << "  (ZeRO-Offload's f32 accounting: device 4psi = " << 4 * psi << " (stage 3: 4psi/N = "
                << 4 * psi / std::size_t(n) << "), host 8psi = " << 8 * psi << " at stage 0, 8psi/N = "
                << 8 * psi / std::size_t(n) << " at stages 1-3)\n";
    }
  }
}

// Resharding (run by reshard_test.cmake): gpt trained at 4 ranks, ZeRO
// stage 3, saved after 5 steps as one gathered checkpoint; then 2 ranks at
// stage 1 load it and run steps 5-9 on the same global batches. Their mean
// losses must follow both the 4-rank run's and one process's (unsharded,
// no communicator) within 1e-4 relative, the gpt bound derived in train():
// the rank counts only reassociate each gradient's sum. The 4-rank run keeps
// its parameter shards and state on NVMe between steps (the checkpoint
// reads them from there), and so does the one process that loads the file
// last (the load writes them, its next run takes them).
constexpr int kReshardSteps = 10, kReshardAt = 5;

nn::GptConfig reshard_config() { return {.vocab = kVocab, .context = kSeq, .layers = 2, .d_model = 16, .heads = 2}; }

Step reshard_step(nn::Gpt& m, optim::AdamW& opt, std::shared_ptr<Communicator> c, std::int64_t rows, int stage,
                  bool nvme = false) {
  CompileOptions o;
  o.threads = 1;
  o.communicator = std::move(c);
  if (o.communicator) o.zero_stage = stage;
  o.plan.nvme_offload.optimizer_state = o.plan.nvme_offload.parameters = nvme;
  const Budget b{.nvme_dir = nvme ? std::filesystem::temp_directory_path().string() : ""};
  return compile([&](Var x, Var y) { return m.loss(x, y); },
                 {input<std::int32_t>({rows, kSeq}), input<std::int32_t>({rows, kSeq})}, opt, b, o);
}

// The mean over the ranks of this rank's loss.
float mean_loss(Communicator& c, float mine) {
  std::vector<float> all(static_cast<std::size_t>(c.size()));
  c.all_gather(&mine, all.data(), 1, DType::f32, "test: losses");
  double sum = 0;
  for (float l : all) sum += l;
  return float(sum / c.size());
}

void reshard_save(const std::shared_ptr<dist::Mpi>& c, const std::string& dir) {
  const int me = c->rank();
  const std::int64_t rows = kGlobalBatch / 2 / c->size();
  nn::manual_seed(12);
  nn::Gpt m(reshard_config());
  optim::AdamW opt(m.parameters(), {.lr = 3e-3});
  Step step = reshard_step(m, opt, c, rows, 3, true);
  check(step.plan().nvme_home_bytes > 0, "the 4-rank run keeps its shards on NVMe");
  std::vector<float> losses;
  for (int s = 0; s < kReshardSteps; ++s) {
    if (s == kReshardAt) io::save_gathered_checkpoint(dir + "/gpt.safetensors", m, opt, s, *c);
    auto b = gpt_batch(s, me * rows, rows);
    losses.push_back(mean_loss(*c, step.run(b[0], b[1])));
  }
  if (me == 0) {
    std::ofstream f(dir + "/losses.txt");
    f.precision(9);
    for (int s = kReshardAt; s < kReshardSteps; ++s) f << losses[std::size_t(s)] << "\n";
    check(bool(f), "the 4-rank losses are written");
  }
}

void reshard_load(const std::shared_ptr<dist::Mpi>& c, const std::string& dir) {
  const int me = c->rank();
  const std::int64_t rows = kGlobalBatch / 2 / c->size();
  std::vector<float> saved;
  {
    std::ifstream f(dir + "/losses.txt");
    for (float l; f >> l;) saved.push_back(l);
  }
  check(saved.size() == std::size_t(kReshardSteps - kReshardAt), cat("the saved run's ", saved.size(), " losses are read"));
  nn::manual_seed(99);  // other weights: the checkpoint must replace them
  nn::Gpt m(reshard_config());
  optim::AdamW opt(m.parameters(), {.lr = 3e-3});
  Step step = reshard_step(m, opt, c, rows, 1);
  const auto state = io::load_gathered_checkpoint(dir + "/gpt.safetensors", m, opt, *c);
  check(state.step == kReshardAt, cat("the checkpoint's step is ", state.step));
  step.set_steps_run(state.step);
  step.parameters_changed();
  // One process, no communicator, the whole batch: the unsharded run.
  Trained one = train_gpt(nullptr, 0, kGlobalBatch / 2, kReshardSteps);
  double worst_saved = 0, worst_one = 0;
  for (int s = kReshardAt; s < kReshardSteps && saved.size() == std::size_t(kReshardSteps - kReshardAt); ++s) {
    auto b = gpt_batch(s, me * rows, rows);
    const double l = mean_loss(*c, step.run(b[0], b[1]));
    const double a = saved[std::size_t(s - kReshardAt)], o = one.losses[std::size_t(s)];
    worst_saved = std::max(worst_saved, std::abs(l - a) / std::abs(a));
    worst_one = std::max(worst_one, std::abs(l - o) / std::abs(o));
  }
  check(worst_saved <= 1e-4, cat("resumed at 2 ranks, stage 1: the 4-rank run's losses within 1e-4 (", worst_saved, ")"));
  check(worst_one <= 1e-4, cat("resumed at 2 ranks, stage 1: one process's losses within 1e-4 (", worst_one, ")"));
  if (me == 0) {
    std::cout << "resharded 4 -> 2 ranks (stage 3 -> 1): worst relative loss difference " << worst_saved
              << " against the 4-rank run, " << worst_one << " against one process (bound 1e-4)\n";
    // The same file in one process without a communicator: io::load_checkpoint.
    nn::Gpt alone(reshard_config());
    optim::AdamW alone_opt(alone.parameters(), {.lr = 3e-3});
    Step alone_step = reshard_step(alone, alone_opt, nullptr, kGlobalBatch / 2, 0, true);
    alone_step.run(gpt_batch(0, 0, kGlobalBatch / 2)[0], gpt_batch(0, 0, kGlobalBatch / 2)[1]);  // its tensors go to NVMe
    io::load_checkpoint(dir + "/gpt.safetensors", alone, alone_opt);
    alone_step.set_steps_run(kReshardAt);
    auto b = gpt_batch(kReshardAt, 0, kGlobalBatch / 2);
    const double l = alone_step.run(b[0], b[1]), o = one.losses[std::size_t(kReshardAt)];
    check(std::abs(l - o) / std::abs(o) <= 1e-4, cat("the gathered checkpoint resumes one process too: ", l, " vs ", o));
  }
}

void local() {
  Trained none = train_mlp(nullptr, 0, kGlobalBatch, 5);
  Trained one = train_mlp(dist::local(), 0, kGlobalBatch, 5);
  check(none.losses == one.losses, "dist::local(): the same losses as no communicator");
  bool same = true;
  for (std::size_t k = 0; k < none.params.size(); ++k)
    same = same && same_bytes(none.params[k].raw(), one.params[k].raw(), std::size_t(none.params[k].numel()) * 4);
  check(same, "dist::local(): the same parameter bits as no communicator");
  try {
    CompileOptions o;
    o.communicator = dist::local();
    nn::Linear fc(4, 2);
    compile_inference([&](Var x) { return fc(x); }, {input<float>({2, 4})}, {}, o);
    check(false, "an inference step with a communicator is refused");
  } catch (const Error& e) {
    check(std::string(e.what()).find("communicator") != std::string::npos, "the refusal names the communicator");
  }
  // ZeRO on one rank shards nothing away: stages 1 to 3 train as none.
  for (int stage : {1, 2, 3}) {
    Trained z = train_mlp(dist::local(), 0, kGlobalBatch, 5, {}, false, stage);
    check(z.losses == none.losses && same_params(z.params, none.params),
          cat("dist::local() at ZeRO stage ", stage, ": the same bits as no communicator"));
  }
  // Options refused by name, before anything runs.
  auto refused = [&](const std::string& what, const std::function<void()>& f, const std::string& says) {
    try {
      f();
      check(false, what + " is refused");
    } catch (const Error& e) {
      check(std::string(e.what()).find(says) != std::string::npos, cat(what, ": the refusal says '", says, "': ", e.what()));
    }
  };
  refused("zero_stage without a communicator", [&] { train_mlp(nullptr, 0, kGlobalBatch, 1, {}, false, 1); },
          "communicator is not set");
  refused("zero_stage 4", [&] { train_mlp(dist::local(), 0, kGlobalBatch, 1, {}, false, 4); }, "0, 1, 2 or 3");
  refused("zero_stage 2 with clip_grad_norm",
          [&] { train_gpt(dist::local(), 0, kGlobalBatch / 2, 1, {.zero_stage = 2, .clip_grad_norm = 1}); },
          "clip_grad_norm");
}

// Packed batches of many graphs over real ranks (issue 19): each rank trains
// its own batch of the step, padded to the ranks' common bucket
// (data::pad_to_common_bucket), through a ShapeCache whose steps all-reduce
// the gradients. Two ranks (the reference below takes both batches in one
// graph). Checked: every rank holds the same parameter bits; the ranks'
// batches differ and together visit every training event once an epoch; the
// parameters are those of one process stepping on the mean of the two
// batches' losses, within a derived tolerance; each rank's steps stay
// within the device budget it was given.
void graphs(const std::shared_ptr<dist::Mpi>& c) {
  const int n = c->size(), me = c->rank();
  if (n != 2) {
    check(false, cat("graphs runs on 2 ranks, not ", n));
    return;
  }
  const std::vector<data::GraphSample> events = data::track_graphs({.events = 40, .seed = 7});
  const std::int64_t G = std::int64_t(events.size());
  // Any deterministic size measure serves the sampler here (every rank
  // computes the same batches); bench/track_training.cpp packs by the
  // planner's bytes.
  const data::BatchBytes size_of = [&](std::span<const std::int64_t> ids) {
    std::size_t s = 0;
    for (std::int64_t g : ids) s += std::size_t(events[std::size_t(g)].nodes() + 4 * events[std::size_t(g)].edges());
    return s;
  };
  std::size_t largest = 0;
  for (std::int64_t g = 0; g < G; ++g) largest = std::max(largest, size_of(std::span<const std::int64_t>(&g, 1)));
  const data::BatchOptions bo{.strategy = data::BatchStrategy::packed, .budget = largest, .ranks = 2, .seed = 3};
  const data::BucketRule rule{.ratio = 1.25};
  const Budget budget{.device = 64u << 20};
  constexpr std::int64_t hidden = 16, epochs = 2;

  struct Run {
    std::vector<Tensor> params;
    std::vector<float> losses;
    std::size_t most_bytes = 0;
    std::int64_t steps = 0;
  };
  // data_parallel: this rank's batch, gradients averaged over the ranks.
  // Otherwise (reference, one process): both batches in one step, the mean
  // of their two losses; or (alone) this rank's batch only, never averaged.
  enum class Mode { data_parallel, reference, alone };
  auto run = [&](Mode mode) {
    nn::manual_seed(17);
    nn::EdgeClassifier model(3, 3, hidden);
    optim::SGD opt(model.parameters(), {.lr = 0.05, .momentum = 0.9});
    CompileOptions o;
    o.threads = 1;
    if (mode == Mode::data_parallel) o.communicator = c;
    auto one = [&](Var x, Var s, Var d, Var e, Var y) { return model.loss(x, s, d, e, y); };
    auto both = [&](Var x0, Var s0, Var d0, Var e0, Var y0, Var x1, Var s1, Var d1, Var e1, Var y1) {
      return (model.loss(x0, s0, d0, e0, y0) + model.loss(x1, s1, d1, e1, y1)) * 0.5;
    };
    std::vector<InputSpec> spec{input<float>({1, 3}, "x"), input<std::int32_t>({1}, "src"),
                                input<std::int32_t>({1}, "dst"), input<float>({1, 3}, "edge_attr"),
                                input<std::int32_t>({1}, "edge_label")};
    std::vector<InputSpec> spec2 = spec;
    spec2.insert(spec2.end(), spec.begin(), spec.end());
    std::unique_ptr<ShapeCache> cache = mode == Mode::reference ? cache_shapes(both, spec2, opt, budget, o)
                                                                 : cache_shapes(one, spec, opt, budget, o);
    Run r;
    std::vector<std::int64_t> seen;
    for (std::int64_t ep = 0; ep < epochs; ++ep) {
      const data::EpochBatches eb = data::epoch_batches(G, size_of, bo, ep);
      for (std::int64_t s = 0; s < eb.steps(); ++s) {
        const data::GraphBatch b0 = data::batch_graphs(events, eb.batches[std::size_t(2 * s)]);
        const data::GraphBatch b1 = data::batch_graphs(events, eb.batches[std::size_t(2 * s + 1)]);
        if (ep == 0 && mode == Mode::data_parallel)
          for (std::int64_t g : eb.batches[std::size_t(2 * s + me)]) seen.push_back(g);
        std::vector<Tensor> in;
        if (mode == Mode::data_parallel) {
          in = data::pad_to_common_bucket(me == 0 ? b0 : b1, *c, rule).inputs();
        } else {
          // The same common shape, computed without the ranks.
          const std::int64_t N = std::max(rule.bucket(b0.nodes() + 1), rule.bucket(b1.nodes() + 1));
          const std::int64_t E = std::max(rule.bucket(b0.edges()), rule.bucket(b1.edges()));
          in = data::pad_to_size(me == 0 || mode == Mode::reference ? b0 : b1, N, E).inputs();
          if (mode == Mode::reference)
            for (const Tensor& t : data::pad_to_size(b1, N, E).inputs()) in.push_back(t);
        }
        r.losses.push_back(cache->run(in));
        r.most_bytes = std::max(r.most_bytes, cache->step_for(in).measured_device_bytes());
        ++r.steps;
      }
    }
    if (mode == Mode::data_parallel) {
      // The two ranks' first epochs together: every event once.
      std::vector<double> mine(seen.begin(), seen.end()), all;
      double count = double(mine.size()), counts[2];
      c->all_gather(&count, counts, 1, DType::f64, "test: events per rank");
      check(counts[0] > 0 && counts[1] > 0, "graphs: both ranks trained on events");
      // Ragged: each rank sends the larger count, padded with -1 (ids are >= 0).
      const std::size_t most = std::size_t(std::max(counts[0], counts[1]));
      mine.resize(most, -1);
      all.resize(2 * most);
      c->all_gather(mine.data(), all.data(), most, DType::f64, "test: events of each rank");
      std::vector<std::int64_t> ids;
      for (double v : all)
        if (v >= 0) ids.push_back(std::int64_t(v));
      std::sort(ids.begin(), ids.end());
      std::vector<std::int64_t> every(static_cast<std::size_t>(G));
      std::iota(every.begin(), every.end(), std::int64_t(0));
      check(ids == every, "graphs: in the first epoch the two ranks together train on every event exactly once");
    }
    cache->gather_parameters();  // where the planner picked ZeRO stage 3, the shards into the tensors
    for (const Tensor& t : model.parameters()) r.params.push_back(t.clone());
    return r;
  };
  // The ZeRO stage is the planner's pick for the first shape, and the
  // cache keeps it for the rest (a step at another stage would train from
  // stale parameters): unpinned here, so the comparison below checks that.
  const Run dp = run(Mode::data_parallel);
  check(dp.steps >= 4, cat("graphs: ", dp.steps, " steps of packed batches per rank"));
  check(same_on_every_rank(*c, dp.params), "graphs: every rank holds the same parameter bits");
  check(dp.most_bytes <= budget.device, cat("graphs: each rank's steps held at most ", dp.most_bytes, " device bytes"));
  const Run ref = run(Mode::reference), alone = run(Mode::alone);
  // The tolerance. The reference scales each batch's loss by 1/2 before its
  // backward, data parallelism sums the two gradients and scales after: the
  // same terms, each gradient element rounded differently by at most a few
  // units in the last place (2u = 1.2e-7 relative). SGD with momentum 0.9
  // turns a gradient difference into at most lr * sum 0.9^k < 10 lr = 0.5
  // per unit over a few steps, and the model's sensitivity to what changed
  // at most doubles it (ReLU kinks crossed by such a change are rare at
  // this scale): about 2 * 0.5 * 1.2e-7 * max|g| per step, well under 1e-5
  // for gradients below 10. Training one rank's batches alone moves the
  // parameters by orders of magnitude more, so the check can fail.
  double scale = 0;
  const double d = max_abs_diff(dp.params, ref.params, &scale);
  const double d_alone = max_abs_diff(alone.params, ref.params, &scale);
  check(d <= 1e-5, cat("graphs: data parallel against one process on both batches: max |dp - ref| = ", d, " <= 1e-5"));
  check(d_alone > 100 * 1e-5, cat("graphs: one rank's batches alone differ by ", d_alone, ", so the check could fail"));
  if (me == 0)
    std::cout << "graphs, 2 ranks, " << dp.steps << " steps: max |data parallel - one process| = " << d
              << " (bound 1e-5), one rank alone " << d_alone << "; losses " << dp.losses.front() << " -> "
              << dp.losses.back() << "\n";
}

// Rank 1 stops or dies after compiling, before its first step; rank 0 must
// fail in the gradient all-reduce within the timeout, and say so.
void fault(const std::shared_ptr<dist::Mpi>& c, int signal) {
  try {
    train_mlp(c, c->rank() * 8, 8, 1, {}, false, {}, true, [&] {
      if (c->rank() == 1) raise(signal);
    });
    check(c->rank() != 0, "rank 0's step completed although rank 1 never ran its own");
  } catch (const Error& e) {
    std::cout << "rank " << c->rank() << " caught: " << e.what() << std::endl;
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  try {
    if (mode == "local") {
      local();
    } else if ((mode == "reshard-save" || mode == "reshard-load") && argc > 2) {
      auto c = dist::Mpi::world({.timeout_seconds = 120.0});
      my_rank = c->rank();
      if (mode == "reshard-save") reshard_save(c, argv[2]);
      else reshard_load(c, argv[2]);
    } else if (mode == "collectives" || mode == "train" || mode == "zero" || mode == "graphs" || mode == "stop" ||
               mode == "kill") {
      auto c = dist::Mpi::world({.timeout_seconds = mode == "stop" || mode == "kill" ? 3.0 : 120.0});
      my_rank = c->rank();
      if (mode == "collectives") collectives(*c);
      else if (mode == "train") train(c);
      else if (mode == "zero") zero(c);
      else if (mode == "graphs") graphs(c);
      else fault(c, mode == "stop" ? SIGSTOP : SIGKILL);
    } else {
      std::cerr << "usage: dist_test collectives|train|zero|graphs|local|stop|kill, or reshard-save|reshard-load DIR\n";
      return 2;
    }
  } catch (const std::exception& e) {
    std::cerr << "rank " << my_rank << ": error: " << e.what() << "\n";
    return 1;
  }
  if (failures) std::cerr << "rank " << my_rank << ": " << failures << " check(s) failed\n";
  else std::cout << "rank " << my_rank << " (" << mode << "): all checks passed\n";
  return failures ? 1 : 0;
}
