// Data parallelism over MPI (issue 16, phase 1), run by ctest under mpirun:
//   dist_test collectives   every collective against a plain reference, bit for bit (any rank count)
//   dist_test train         mlp (SGD) and gpt (AdamW) trained on N ranks: the same bits on every rank,
//                           and the single-process run on the global batch within a derived tolerance
//   dist_test local         one process: dist::local() trains bit for bit as no communicator
//   dist_test stop|kill     rank 1 stops (SIGSTOP) or dies (SIGKILL) before its first step: rank 0's
//                           gradient all-reduce fails naming itself within the timeout, and the job ends
// A plain program (ranks print their own failures); exit status 1 on a failed check.
#include <csignal>
#include <cstdio>
#include <cstring>
#include <frugal/dist/local.hpp>
#include <frugal/dist/mpi.hpp>
#include <frugal/frugal.hpp>
#include <iostream>
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
  nn::Linear fc1{16, 32}, fc2{32, 4};
  Mlp() {
    register_module("fc1", fc1);
    register_module("fc2", fc2);
  }
  Var forward(Var x) { return fc2(relu(fc1(x))); }
};

constexpr std::int64_t kGlobalBatch = 16;

// Rows [first, first + rows) of step s's global batch.
std::vector<Tensor> mlp_batch(int s, std::int64_t first, std::int64_t rows) {
  Rng g(7000 + std::uint64_t(s));
  Tensor x({kGlobalBatch, 16}), y({kGlobalBatch}, DType::i32);
  for (std::int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = float(g.normal());
  for (std::int64_t i = 0; i < kGlobalBatch; ++i) y.data<std::int32_t>()[i] = std::int32_t(g.below(4));
  Tensor xs({rows, 16}), ys({rows}, DType::i32);
  std::memcpy(xs.raw(), x.data<float>() + first * 16, std::size_t(rows * 16) * 4);
  std::memcpy(ys.raw(), y.data<std::int32_t>() + first, std::size_t(rows) * 4);
  return {xs, ys};
}

struct Trained {
  std::vector<float> losses;
  std::vector<Tensor> params;
  std::size_t planned = 0, least = 0;  // the plan's total bytes; its smallest feasible budget
  Step::Audit audit;                   // of the last step, where asked
};

Trained train_mlp(std::shared_ptr<Communicator> comm, std::int64_t first, std::int64_t rows, int steps,
                  Budget budget = {}, bool audit_last = false) {
  nn::manual_seed(11);
  Mlp m;
  optim::SGD opt(m.parameters(), {.lr = 0.05, .momentum = 0.9});
  CompileOptions o;
  o.threads = 1;
  o.communicator = std::move(comm);
  Step step = compile([&](Var x, Var y) { return cross_entropy(m.forward(x), y); },
                      {input<float>({rows, 16}), input<std::int32_t>({rows})}, opt, budget, o);
  Trained t;
  t.planned = step.plan().total_bytes();
  t.least = step.plan().min_feasible_bytes;
  for (int s = 0; s < steps; ++s) {
    auto b = mlp_batch(s, first, rows);
    if (audit_last && s + 1 == steps) t.audit = step.audit(b[0], b[1]);
    else t.losses.push_back(step.run(b[0], b[1]));
  }
  t.params = m.parameters();
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

Trained train_gpt(std::shared_ptr<Communicator> comm, std::int64_t first, std::int64_t rows, int steps) {
  nn::manual_seed(12);
  nn::Gpt m({.vocab = kVocab, .context = kSeq, .layers = 2, .d_model = 16, .heads = 2});
  optim::AdamW opt(m.parameters(), {.lr = 3e-3});
  CompileOptions o;
  o.threads = 1;
  o.communicator = std::move(comm);
  Step step = compile([&](Var x, Var y) { return m.loss(x, y); },
                      {input<std::int32_t>({rows, kSeq}), input<std::int32_t>({rows, kSeq})}, opt, {}, o);
  Trained t;
  for (int s = 0; s < steps; ++s) {
    auto b = gpt_batch(s, first, rows);
    t.losses.push_back(step.run(b[0], b[1]));
  }
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
    const std::size_t least = train_mlp(c, me * rows, rows, 1, Budget{.device = dp.planned - 1}).least;
    check(least > 0 && least < dp.planned, cat("mlp: a budget below the unconstrained ", dp.planned, " bytes binds (least ", least, ")"));
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
}

// Rank 1 stops or dies before its first step; rank 0 must fail in the
// gradient all-reduce within the timeout, and say so.
void fault(const std::shared_ptr<dist::Mpi>& c, int signal) {
  if (c->rank() == 1) raise(signal);
  try {
    train_mlp(c, c->rank() * 8, 8, 1);
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
    } else if (mode == "collectives" || mode == "train" || mode == "stop" || mode == "kill") {
      auto c = dist::Mpi::world({.timeout_seconds = mode == "stop" || mode == "kill" ? 3.0 : 120.0});
      my_rank = c->rank();
      if (mode == "collectives") collectives(*c);
      else if (mode == "train") train(c);
      else fault(c, mode == "stop" ? SIGSTOP : SIGKILL);
    } else {
      std::cerr << "usage: dist_test collectives|train|local|stop|kill\n";
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
