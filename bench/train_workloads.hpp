#pragma once
// The four training workloads of the PyTorch peer (../shared/peer/
// torch_bench.py), built with frugal: same shapes, optimizers and
// hyper-parameters. The data is synthetic and fixed, like the peer's; the
// random numbers differ (frugal's Philox, not torch's generator), so the
// losses agree in scale, not in digits.
//
// A workload is built in two stages so a benchmark can ask what a budget
// means before it commits to one: plan(budget) answers without allocating
// the arena (the unconstrained bytes, the smallest feasible budget), and
// compile(budget) builds the step that step() runs.
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include <frugal/frugal.hpp>

namespace bench {

using namespace frugal;

// Data parallelism (bench/dp_bench under mpirun): this rank's share of the
// global batch, and the communicator that averages the gradients. The
// default is one process with the whole batch.
struct Shard {
  int rank = 0, ranks = 1;
  std::shared_ptr<Communicator> comm;
  std::optional<int> zero_stage;  // CompileOptions::zero_stage; unset: the planner's choice
};

struct Workload {
  virtual ~Workload() = default;
  virtual float step() = 0;
  // Runs the step twice with the arena pattern-filled and reports the bytes
  // it actually wrote (Step::audit): the measured device high-water mark.
  virtual Step::Audit audit() = 0;

  // What compile(budget) would plan, without allocating the arena.
  PlannedStep plan(const Budget& budget) { return plan_(budget); }
  // Builds the step within `budget` (Budget{} is unconstrained).
  void compile(const Budget& budget) { s = std::make_unique<Step>(compile_(budget)); }
  const Step& compiled() const {
    if (!s) fail("train_bench: the workload was not compiled");
    return *s;
  }
  std::size_t arena_bytes() const { return compiled().arena_bytes(); }
  // What the step is planned and compiled with (threads, planner switches).
  CompileOptions& plan_options() { return plan_options_; }
  const Optimizer& optimizer() const { return *opt_; }

  std::int64_t batch = 0;
  std::int64_t params = 0;
  std::string unit = "samples";
  int default_warmup = 3, default_steps = 30;

 protected:
  // The step function and its inputs, kept so the step can be planned and
  // compiled under any budget. fn may capture `this`: workloads do not move.
  template <class Fn>
  void define(Fn fn, std::vector<InputSpec> specs, Optimizer& opt, int threads, const Shard& shard = {}) {
    plan_options_.threads = threads;
    plan_options_.communicator = shard.comm;
    plan_options_.zero_stage = shard.zero_stage;
    opt_ = &opt;
    // The options are read when the step is planned, so a caller may change
    // them (plan_options()) after the workload is made.
    plan_ = [this, fn, specs, &opt](const Budget& b) { return frugal::plan_training(fn, specs, opt, b, plan_options_); };
    compile_ = [this, fn, specs, &opt](const Budget& b) { return frugal::compile(fn, specs, opt, b, plan_options_); };
  }
  std::unique_ptr<Step> s;

 private:
  CompileOptions plan_options_;
  const Optimizer* opt_ = nullptr;
  std::function<PlannedStep(const Budget&)> plan_;
  std::function<Step(const Budget&)> compile_;
};

// Normal draws in f32, stored as dt (bf16/f16: the f32 draws rounded once).
inline Tensor randn(Shape s, Rng& r, DType dt = DType::f32) {
  Tensor t(std::move(s), dt);
  auto fill = [&](auto* p) {
    using T = std::remove_pointer_t<decltype(p)>;
    for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = math::convert<T>(float(r.normal()));
  };
  switch (dt) {
    case DType::f32: fill(t.data<float>()); break;
    case DType::bf16: fill(t.data<BFloat16>()); break;
    case DType::f16: fill(t.data<Half>()); break;
    default: fail("train_workloads: randn makes f32, bf16 or f16, not ", dtype_name(dt));
  }
  return t;
}
inline Tensor randint(Shape s, std::int64_t hi, Rng& r, DType dt = DType::i32) {
  Tensor t(std::move(s), dt);
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    auto v = std::int64_t(r.below(std::uint64_t(hi)));
    if (dt == DType::i32) t.data<std::int32_t>()[i] = std::int32_t(v);
    else t.data<std::int64_t>()[i] = v;
  }
  return t;
}


// Rows [rank * n / ranks, (rank + 1) * n / ranks) of t's first dimension.
inline Tensor rows_of(const Tensor& t, const Shard& s) {
  const std::int64_t n = t.shape()[0];
  if (n % s.ranks) fail("train_workloads: a batch of ", n, " does not split evenly over ", s.ranks, " ranks");
  const std::int64_t rows = n / s.ranks;
  std::vector<std::int64_t> dims = t.shape().dims();
  dims[0] = rows;
  Tensor out(Shape(dims), t.dtype());
  const std::size_t row_bytes = t.nbytes() / std::size_t(n);
  std::memcpy(out.raw(), static_cast<const char*>(t.raw()) + std::size_t(s.rank * rows) * row_bytes,
              std::size_t(rows) * row_bytes);
  return out;
}

// 784-1024-1024-10, ReLU, cross-entropy, batch 256, SGD(lr 0.01, momentum 0.9).
struct MlpWorkload final : Workload {
  struct Net : nn::Module {
    nn::Linear fc1{784, 1024}, fc2{1024, 1024}, fc3{1024, 10};
    Net() {
      register_module("fc1", fc1);
      register_module("fc2", fc2);
      register_module("fc3", fc3);
    }
    Var forward(Var x) { return fc3(relu(fc2(relu(fc1(x))))); }
  } net;
  optim::SGD opt{net.parameters(), {.lr = 0.01, .momentum = 0.9}};
  Tensor x, y;

  explicit MlpWorkload(int threads, const Shard& shard = {}) {
    Rng r(1);
    x = rows_of(randn({256, 784}, r), shard);
    y = rows_of(randint({256}, 10, r), shard);
    define([&](Var xv, Var yv) { return cross_entropy(net.forward(xv), yv); },
           {input<float>({x.shape()[0], 784}), input<std::int32_t>({x.shape()[0]})}, opt, threads, shard);
    batch = 256;
    params = net.num_parameters();
    default_warmup = 5;
    default_steps = 50;
  }
  float step() override { return s->run(x, y); }
  Step::Audit audit() override { return s->audit(x, y); }
};

// CIFAR-style ResNet-18 (BasicBlock [2,2,2,2], BatchNorm), 3x32x32, batch
// 32, 10 classes, SGD(lr 0.01, momentum 0.9).
// "resnet-bf16": the same model with its input, parameters, activations,
// gradients and momentum in bf16, BatchNorm's running statistics in f32
// (nn::resnet18_cifar's dtype; kernels compute in f32 and round once on
// store), as gpt-bf16 is to gpt.
struct ResnetWorkload final : Workload {
  std::unique_ptr<nn::ResNet<nn::BasicBlock>> net;
  optim::SGD opt;
  Tensor x, y;

  explicit ResnetWorkload(int threads, const Shard& shard = {}, DType dtype = DType::f32)
      : net(nn::resnet18_cifar(10, 3, dtype)), opt(net->parameters(), {.lr = 0.01, .momentum = 0.9}) {
    Rng r(2);
    x = rows_of(randn({32, 3, 32, 32}, r, dtype), shard);
    y = rows_of(randint({32}, 10, r), shard);
    net->train();
    define([&](Var xv, Var yv) { return cross_entropy(net->forward(xv), yv); },
           {InputSpec{{dtype, Shape{x.shape()[0], 3, 32, 32}}, ""}, input<std::int32_t>({x.shape()[0]})}, opt, threads,
           shard);
    batch = 32;
    params = net->num_parameters();
    default_warmup = 2;
    default_steps = 15;
  }
  float step() override { return s->run(x, y); }
  Step::Audit audit() override { return s->audit(x, y); }
};

// Decoder-only transformer: vocab 512, context 128, 4 layers, d 256, 4 heads,
// MLP 4x, pre-norm, GELU, causal attention, batch 8, AdamW(lr 3e-4, betas
// 0.9/0.95, eps 1e-8, weight decay 0.1).
// "gpt-bf16": the same model with every parameter and activation in bf16
// (nn::GptConfig::dtype; kernels compute in f32 and round once on store).
struct GptWorkload final : Workload {
  nn::Gpt net;
  optim::AdamW opt{net.parameters(), {.lr = 3e-4, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1}};
  Tensor idx, tgt;

  explicit GptWorkload(int threads, const Shard& shard = {}, DType dtype = DType::f32)
      : net(nn::GptConfig{.vocab = 512, .context = 128, .layers = 4, .d_model = 256, .heads = 4, .dtype = dtype}) {
    Rng r(3);
    idx = rows_of(randint({8, 128}, 512, r), shard);
    tgt = rows_of(randint({8, 128}, 512, r), shard);
    define([&](Var i, Var t) { return net.loss(i, t); },
           {input<std::int32_t>({idx.shape()[0], 128}), input<std::int32_t>({idx.shape()[0], 128})}, opt, threads, shard);
    batch = 8;
    params = net.num_parameters();
    unit = "sequences";
    default_warmup = 3;
    default_steps = 30;
  }
  float step() override { return s->run(idx, tgt); }
  Step::Audit audit() override { return s->audit(idx, tgt); }
};

// Two-layer GCN (hidden 128) on a random graph of 20,000 nodes and 200,000
// undirected edges, D^-1/2 (A + I) D^-1/2, 128 features, 16 classes, full
// batch, Adam(lr 0.01).
struct GcnWorkload final : Workload {
  static constexpr std::int64_t kNodes = 20000, kEdges = 200000;
  nn::Gcn net{128, 128, 16};
  optim::AdamW opt{net.parameters(), {.lr = 0.01, .weight_decay = 0}};  // Adam: no decay
  SparseMatrix adj;
  Tensor x, y;

  explicit GcnWorkload(int threads) {
    Rng r(4);
    adj = data::to_sparse(data::gcn_adjacency(kNodes, data::random_edges(kNodes, kEdges, 4)));
    x = randn({kNodes, 128}, r);
    y = randint({kNodes}, 16, r);
    define([&](Var xv, Var yv) { return cross_entropy(net(xv, adj), yv); },
           {input<float>({kNodes, 128}), input<std::int32_t>({kNodes})}, opt, threads);
    batch = kNodes;
    params = net.num_parameters();
    unit = "nodes";
    default_warmup = 3;
    default_steps = 30;
  }
  float step() override { return s->run(x, y); }
  Step::Audit audit() override { return s->audit(x, y); }
};

// `batch` stays the global batch; with shard.ranks > 1 each rank's step
// runs on its rows of it.
inline std::unique_ptr<Workload> make_workload(const std::string& name, int threads, const Shard& shard = {}) {
  if (name == "mlp") return std::make_unique<MlpWorkload>(threads, shard);
  if (name == "resnet") return std::make_unique<ResnetWorkload>(threads, shard);
  if (name == "resnet-bf16") return std::make_unique<ResnetWorkload>(threads, shard, DType::bf16);
  if (name == "gpt") return std::make_unique<GptWorkload>(threads, shard);
  if (name == "gpt-bf16") return std::make_unique<GptWorkload>(threads, shard, DType::bf16);
  if (name == "gcn") {
    if (shard.ranks > 1) fail("train_workloads: gcn trains on the whole graph at once; it has no batch to split over ranks");
    return std::make_unique<GcnWorkload>(threads);
  }
  fail("train_bench: unknown workload '", name, "': use mlp, resnet, resnet-bf16, gpt, gpt-bf16 or gcn");
}

}  // namespace bench
