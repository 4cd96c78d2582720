// Operator fusion (ops/fusion.hpp): merged elementwise chains compute the
// unfused bits in every precision, train bit for bit as the unfused step,
// have gradients that match finite differences, keep what the backward
// reads, and take fewer bytes where a chain's intermediates would have been
// live together.
#include <catch2/catch.hpp>

#include <cstring>
#include <frugal/frugal.hpp>
#include <frugal/ops/fusion.hpp>
#include <frugal/plan/verify.hpp>

#include "../tools/model_zoo.hpp"
#include "op_harness.hpp"
#include "random_net.hpp"
#include "reference_conv.hpp"
#include "bytes_of.hpp"

using namespace frugal;

namespace {

CompileOptions fusing(bool on) {
  CompileOptions o;
  o.plan.fuse = on;
  return o;
}


int fused_nodes_in(const Graph& g, const Plan& p) {
  int n = 0;
  for (NodeId id : p.schedule) n += dynamic_cast<const ops::FusedElementwise*>(g.node(id).op.get()) != nullptr;
  return n;
}

// Every functor a program can hold, a broadcast bias, rows longer than one
// CPU block (300 > 256 columns) and a second, broadcast-free chain.
std::vector<Var> every_functor(Var x, Var b) {
  Var t = x * 0.7 + b;
  Var u = gelu(t) + gelu(t, false) - tanh(t) * sigmoid(t);
  Var v = exp(relu(u) * 0.1) / (1.5 + gelu_erf_poly(x));
  Var w = log(v + 2.0) * rsqrt(v + 1.0) + x;
  Var z = sigmoid(x) * tanh(x) - x / (x * x + 1.0);
  return {w, z};
}

Tensor normal(Shape s, DType dt, std::uint64_t seed) {
  Tensor f(s);
  Rng r(seed);
  zoo::fill_normal(f, r);
  if (dt == DType::f32) return f;
  Tensor t(s, dt);
  for (std::int64_t i = 0; i < f.numel(); ++i) {
    float v = f.data<float>()[i];
    switch (dt) {
      case DType::f64: t.data<double>()[i] = v; break;
      case DType::bf16: t.data<BFloat16>()[i] = BFloat16(v); break;
      case DType::f16: t.data<Half>()[i] = Half(v); break;
      default: FAIL("unexpected dtype");
    }
  }
  return t;
}

}  // namespace

TEST_CASE("a fused chain computes the unfused bits in f32, f64, bf16 and f16", "[fusion]") {
  for (DType dt : {DType::f32, DType::f64, DType::bf16, DType::f16}) {
    INFO("dtype " << dtype_name(dt));
    Tensor x = normal({7, 300}, dt, 11), b = normal({300}, dt, 12);
    auto run = [&](bool fuse) {
      Step s = compile_inference(
          [&] {
            return every_functor(persistent_var(x, ValueKind::state, "x"), persistent_var(b, ValueKind::state, "b"));
          },
          {}, {}, fusing(fuse));
      s.run();
      return std::tuple{bytes_of(s.output(0)), bytes_of(s.output(1)), s.plan().fused_chains};
    };
    auto [w0, z0, chains0] = run(false);
    auto [w1, z1, chains1] = run(true);
    CHECK(chains0 == 0);
    CHECK(chains1 >= 2);  // both chains were fused, not passed vacuously
    CHECK(w0 == w1);
    CHECK(z0 == z1);
  }
}

TEST_CASE("the fused kernel equals the unfused kernels on every layout, in place or not", "[fusion]") {
  // x + b, relu, * x, - b, tanh; outputs relu's and tanh's. Layouts: a
  // long broadcast row (blocks cut at row ends, the row read in place),
  // short rows (many per block, gathered), a column (stride 0 along the
  // last axis), a rank-3 middle axis, and no broadcast at all; each stored
  // beside the inputs, then over x (in place: stores wait for the block's
  // last step).
  ops::FusedProgram p;
  p.inputs = 2;
  p.steps = {{math::Add{}, {0, 1}}, {math::Relu{}, {2}}, {math::Mul{}, {3, 0}}, {math::Sub{}, {4, 1}}, {math::Tanh{}, {5}}};
  p.outputs = {3, 6};
  const ops::FusedElementwise fused(p);
  auto backend = make_backend("cpu");
  const std::vector<std::pair<Shape, Shape>> layouts{
      {{5, 1300}, {1300}}, {{37, 20}, {20}}, {{6, 2100}, {6, 1}}, {{3, 5, 70}, {5, 1}}, {{3000}, {3000}}};
  for (DType dt : {DType::f32, DType::f64, DType::bf16, DType::f16})
    for (const auto& [xs, bs] : layouts)
      for (bool in_place : {false, true}) {
        INFO(dtype_name(dt) << " x " << xs.str() << " b " << bs.str() << (in_place ? " in place" : ""));
        Tensor x = normal(xs, dt, 21), b = normal(bs, dt, 22);
        // Unfused: each step's own kernel into its own tensor.
        std::vector<Tensor> slot{x, b};
        std::vector<Shape> shapes{xs, bs};
        for (std::size_t s = 0; s < p.steps.size(); ++s) slot.emplace_back(xs, dt), shapes.push_back(xs);
        auto ref = [&](std::size_t k) { return TensorRef{slot[k].raw(), dt, &shapes[k]}; };
        for (std::size_t s = 0; s < p.steps.size(); ++s) {
          auto op = ops::unfused_op(p.steps[s].fn);
          std::vector<TensorRef> in, out{ref(std::size_t(p.inputs) + s)};
          for (int k = 0; k < ops::arity_of(p.steps[s].fn); ++k) in.push_back(ref(std::size_t(p.steps[s].args[std::size_t(k)])));
          backend->kernel_for(*op)(*op, KernelArgs{in, out});
        }
        Tensor xc(xs, dt), o0(xs, dt), o1(xs, dt);
        std::memcpy(xc.raw(), x.raw(), x.nbytes());
        std::vector<TensorRef> in{{xc.raw(), dt, &shapes[0]}, {b.raw(), dt, &shapes[1]}};
        std::vector<TensorRef> out{{o0.raw(), dt, &shapes[0]}, {in_place ? xc.raw() : o1.raw(), dt, &shapes[0]}};
        backend->kernel_for(fused)(fused, KernelArgs{in, out});
        CHECK(bytes_of(o0) == bytes_of(slot[3]));
        CHECK(bytes_of(in_place ? xc : o1) == bytes_of(slot[6]));
      }
}

TEST_CASE("the fused op's gradients match float64 finite differences", "[fusion][ops]") {
  using namespace optest;
  // x + b, gelu, * r, tanh, + x: a bias, an activation, a gate and a residual.
  auto program = [](std::vector<int> outputs) {
    ops::FusedProgram p;
    p.inputs = 3;  // x, b (broadcast row), r
    p.steps = {{math::Add{}, {0, 1}}, {math::GeluTanh{}, {3}}, {math::Mul{}, {4, 2}},
               {math::Tanh{}, {5}},   {math::Add{}, {6, 0}}};
    p.outputs = std::move(outputs);
    return p;
  };
  auto reference = [](const Arrays& a) {
    ref::Array g = ref::gelu_tanh(ref::add(a[0], a[1]));
    return std::pair{g, ref::add(ref::tanh(ref::mul(g, a[2])), a[0])};
  };
  check_op(Case{"fused x+b, gelu, *r, tanh, +x",
                {x({3, 5}), x({5}), x({3, 5})},
                [&](const Vars& v) {
                  return frugal::apply(std::make_shared<ops::FusedElementwise>(program({7})), v).at(0);
                },
                [&](const Arrays& a) { return reference(a).second; }});
  // Two outputs, the inner one (gelu's) kept as a fused node would keep it
  // for a backward reader: gradients flow in through both.
  check_op(Case{"fused chain with two outputs",
                {x({4, 6}), x({6}), x({4, 6})},
                [&](const Vars& v) {
                  auto out = frugal::apply(std::make_shared<ops::FusedElementwise>(program({4, 7})), v);
                  return out[0] * 0.5 + out[1];
                },
                [&](const Arrays& a) {
                  auto [g, y] = reference(a);
                  ref::Array half = g;
                  for (auto& e : half.v) e *= 0.5;
                  return ref::add(half, y);
                }});
}

TEST_CASE("a fused program names what is wrong with it", "[fusion]") {
  ops::FusedProgram p;
  p.inputs = 1;
  p.steps = {{math::Relu{}, {1}}};  // reads its own result
  p.outputs = {1};
  CHECK_THROWS_WITH(ops::FusedElementwise(p), Catch::Contains("step 0 reads slot 1"));
  p.steps = {{math::Relu{}, {0}}};
  p.outputs = {0};
  CHECK_THROWS_WITH(ops::FusedElementwise(p), Catch::Contains("output slot 0 is not a step's result"));
}

namespace {

// Blocks of bias + gelu (+ relu) + scaled residual: the chains fusion is for.
struct ResidualMlp : nn::Module {
  nn::Linear in, head;
  std::vector<std::unique_ptr<nn::Linear>> fc;
  std::vector<Tensor*> bias;
  ResidualMlp(int features, int width, int blocks, int classes, DType dt)
      : in(features, width, {.dtype = dt}), head(width, classes, {.dtype = dt}) {
    register_module("in", in);
    register_module("head", head);
    for (int i = 0; i < blocks; ++i) {
      fc.push_back(std::make_unique<nn::Linear>(width, width, nn::LinearOptions{.bias = false, .dtype = dt}));
      register_module(cat("fc", i), *fc.back());
      Tensor b({width}, dt);
      Rng r(std::uint64_t(100 + i));
      for (std::int64_t k = 0; k < width; ++k) {
        double v = 0.1 * (r.uniform() - 0.5);
        if (dt == DType::f64) b.data<double>()[k] = v;
        else b.data<float>()[k] = float(v);
      }
      bias.push_back(&register_parameter(cat("bias", i), b));
    }
  }
  Var forward(Var x) {
    x = in(x);
    for (std::size_t i = 0; i < fc.size(); ++i) {
      Var h = (*fc[i])(x) + var(*bias[i]);
      Var a = i % 2 ? relu(h) : gelu(h);
      x = x + a * 0.5;
    }
    return head(x);
  }
};

struct TrainedMlp {
  std::vector<float> losses;
  std::vector<std::vector<char>> params;
  Plan plan;
};

TrainedMlp train_mlp(DType dt, bool fuse, Budget budget = {}) {
  nn::manual_seed(5);
  ResidualMlp net(12, 32, 4, 5, dt);
  optim::AdamW opt(net.parameters(), {.lr = 1e-2});
  const int batch = 16;
  Step step = compile([&](Var x, Var y) { return cross_entropy(net.forward(x), y); },
                      {{{dt, {batch, 12}}, "x"}, input<std::int32_t>({batch})}, opt, budget, fusing(fuse));
  TrainedMlp t;
  t.plan = step.plan();
  for (int s = 0; s < 4; ++s) {
    Tensor x = normal({batch, 12}, dt, std::uint64_t(1000 + s)), y({batch}, DType::i32);
    Rng d(std::uint64_t(2000 + s));
    zoo::fill_labels(y, d, 5);
    t.losses.push_back(step.run(x, y));
  }
  for (auto& [name, p] : net.named_parameters()) t.params.push_back(bytes_of(p));
  return t;
}

}  // namespace

TEST_CASE("an MLP with bias, gelu and residual chains trains bit for bit fused and unfused", "[fusion]") {
  for (DType dt : {DType::f32, DType::f64}) {
    INFO("dtype " << dtype_name(dt));
    TrainedMlp plain = train_mlp(dt, false), fused = train_mlp(dt, true);
    CHECK(plain.plan.fused_chains == 0);
    CHECK(fused.plan.fused_chains >= 4);  // at least one chain per block
    CHECK(fused.losses == plain.losses);
    CHECK(fused.params == plain.params);
    // Under a budget that binds, the fused graph's recomputations and
    // swaps change nothing either.
    TrainedMlp tight = train_mlp(dt, true, Budget{.device = fused.plan.total_bytes() * 7 / 10});
    CHECK(tight.plan.total_bytes() <= fused.plan.total_bytes() * 7 / 10);
    CHECK(tight.losses == plain.losses);
    CHECK(tight.params == plain.params);
  }
}

TEST_CASE("the fused MLP's plans pass the verifier and keep what the backward reads", "[fusion]") {
  nn::manual_seed(5);
  ResidualMlp net(12, 32, 4, 5, DType::f32);
  optim::AdamW opt(net.parameters(), {.lr = 1e-2});
  auto fn = [&](Var x, Var y) { return cross_entropy(net.forward(x), y); };
  std::vector<InputSpec> specs{input<float>({16, 12}), input<std::int32_t>({16})};
  PlannedStep plain = plan_training(fn, specs, opt, {}, fusing(false));
  PlannedStep fused = plan_training(fn, specs, opt, {}, fusing(true));
  CHECK(plan::verify(*fused.graph, fused.plan, fused.roots).ok());
  REQUIRE(fused_nodes_in(*fused.graph, fused.plan) == fused.plan.fused_chains);
  CHECK(fused.plan.schedule.size() < plain.plan.schedule.size());
  CHECK(fused.plan.fused_away_bytes > 0);
  // Every value a fused node stores is read by some scheduled node or is a
  // root; every value a scheduled node reads has a scheduled producer (or
  // none: inputs and persistents).
  std::vector<char> scheduled(fused.graph->num_nodes(), 0), read(fused.graph->num_values(), 0);
  for (NodeId n : fused.plan.schedule) {
    scheduled[std::size_t(n)] = 1;
    for (ValueId v : fused.graph->node(n).inputs) read[std::size_t(v)] = 1;
  }
  for (ValueId r : fused.roots) read[std::size_t(r)] = 1;
  for (NodeId n : fused.plan.schedule) {
    const Node& node = fused.graph->node(n);
    for (ValueId v : node.inputs) {
      NodeId p = fused.graph->value(v).producer;
      CHECK((p < 0 || scheduled[std::size_t(p)]));
    }
    if (dynamic_cast<const ops::FusedElementwise*>(node.op.get()))
      for (ValueId v : node.outputs) CHECK(read[std::size_t(v)]);
  }
}

TEST_CASE("fusing a branching chain removes its intermediates from the plan's peak", "[fusion]") {
  // relu(x) and sigmoid(x) are live together while x still is: unfused, the
  // peak holds x and both; fused, only x and the result exist.
  auto fn = [](Var x) { return relu(x) * sigmoid(x) + x; };
  const std::vector<InputSpec> specs{input<float>({64, 256})};
  const std::size_t x_bytes = 64 * 256 * sizeof(float);
  PlannedStep plain = plan_inference(fn, specs, {}, fusing(false));
  PlannedStep fused = plan_inference(fn, specs, {}, fusing(true));
  CHECK(fused.plan.fused_chains == 1);
  CHECK(fused.plan.fused_away_bytes == 2 * x_bytes);  // relu(x) and sigmoid(x); the product went in place
  CHECK(fused.plan.peak_bytes + x_bytes <= plain.plan.peak_bytes);
  CHECK(plan::verify(*fused.graph, fused.plan, fused.roots).ok());
}

TEST_CASE("the budget test's random graphs train bit for bit fused and unfused", "[fusion][property]") {
  int chains = 0;
  for (std::uint64_t seed = 1; seed <= 40; ++seed) {
    INFO("seed " << seed);
    Rng r(seed * 7 + 1);
    const int in = 4 + int(r.below(20)), width = 8 + int(r.below(40)), depth = 2 + int(r.below(6)),
              classes = 2 + int(r.below(6)), batch = 1 + int(r.below(12));
    auto train = [&](bool fuse, Budget budget) {
      testnets::RandomNet net(seed, in, width, depth, classes);
      optim::SGD opt(net.parameters(), {.lr = 0.05, .momentum = 0.9});
      Step step = compile([&](Var x, Var y) { return cross_entropy(net.forward(x), y); },
                          {input<float>({batch, in}), input<std::int32_t>({batch})}, opt, budget, fusing(fuse));
      TrainedMlp t;
      t.plan = step.plan();
      for (int s = 0; s < 2; ++s) {
        Rng d(seed * 1000 + std::uint64_t(s));
        Tensor x({batch, in}), y({batch}, DType::i32);
        zoo::fill_normal(x, d);
        zoo::fill_labels(y, d, classes);
        t.losses.push_back(step.run(x, y));
      }
      for (auto& [name, p] : net.named_parameters()) t.params.push_back(bytes_of(p));
      return t;
    };
    TrainedMlp plain = train(false, {}), fused = train(true, {});
    CHECK(fused.losses == plain.losses);
    CHECK(fused.params == plain.params);
    chains += fused.plan.fused_chains;
    // A binding budget over the fused graph: still the unfused bits.
    const std::size_t budget = fused.plan.total_bytes() * 8 / 10;
    try {
      TrainedMlp tight = train(true, Budget{.device = budget});
      CHECK(tight.losses == plain.losses);
      CHECK(tight.params == plain.params);
    } catch (const BudgetError&) {
      // Below this graph's smallest feasible budget: nothing to compare.
    }
  }
  CHECK(chains > 20);  // the property was exercised
}

// ---- BatchNorm + ReLU -------------------------------------------------------

namespace {

int bn_relu_nodes_in(const Graph& g, const Plan& p) {
  int n = 0;
  for (NodeId id : p.schedule) {
    const std::string name = g.node(id).op->name();
    n += name == "batch_norm2d_relu" || name == "batch_norm2d_eval_relu";
  }
  return n;
}

zoo::Config small_resnet(DType dt) {
  zoo::Config c;
  c.family = "resnet";
  c.layers = 1;
  c.width = 4;
  c.image = 8;
  c.batch = 3;
  c.classes = 5;
  c.dtype = dt;
  c.optimizer = "sgd";
  return c;
}

struct TrainedResnet {
  std::vector<float> losses;
  std::vector<std::vector<char>> state;  // parameters, then running statistics
  Plan plan;
  int bn_relu = 0;
};

TrainedResnet train_resnet(DType dt, bool fuse, Budget budget = {}) {
  nn::manual_seed(9);
  zoo::Workload w = zoo::make(small_resnet(dt));
  Step step = zoo::compile(w, budget, fusing(fuse));
  TrainedResnet t;
  t.plan = step.plan();
  t.bn_relu = bn_relu_nodes_in(step.graph(), step.plan());
  for (std::uint64_t s = 0; s < 3; ++s) {
    auto batch = w.batch(100 + s);
    t.losses.push_back(step.run(batch[0], batch[1]));
  }
  for (auto& p : w.model->parameters()) t.state.push_back(bytes_of(p));
  for (auto& b : w.model->buffers()) t.state.push_back(bytes_of(b));
  return t;
}

}  // namespace

TEST_CASE("BatchNorm with a ReLU epilogue: forward and gradients against float64", "[fusion][bn]") {
  using namespace optest;
  // The op itself (what fuse_batch_norm_relu makes), in training and eval
  // mode, against the reference normalisation followed by relu.
  check_op(Case{"batch_norm2d_relu [2,3,4,4]",
                {x({2, 3, 4, 4}), x({3}), x({3})},
                [](const Vars& v) {
                  return frugal::apply(std::make_shared<ops::BatchNorm2dTrain>(1e-5, true), {v[0], v[1], v[2]}).at(0);
                },
                [](const Arrays& a) { return ref::relu(ref::batch_norm_train(a[0], a[1], a[2])); }, 4});
  Tensor rm = Tensor::from(std::vector<double>{0.25, -0.5, 0.125}, Shape{3});
  Tensor rv = Tensor::from(std::vector<double>{0.5, 1.5, 2.0}, Shape{3});
  Tensor rm32 = Tensor::from(std::vector<float>{0.25f, -0.5f, 0.125f}, Shape{3});
  Tensor rv32 = Tensor::from(std::vector<float>{0.5f, 1.5f, 2.0f}, Shape{3});
  ref::Array rma{{3}, {0.25, -0.5, 0.125}}, rva{{3}, {0.5, 1.5, 2.0}};
  check_op(Case{"batch_norm2d_eval_relu [2,3,3,4]",
                {x({2, 3, 3, 4}), x({3}), x({3})},
                [&](const Vars& v) {
                  bool f64 = v[0].dtype() == DType::f64;
                  Var m = persistent_var(f64 ? rm : rm32, ValueKind::state, "running_mean");
                  Var s = persistent_var(f64 ? rv : rv32, ValueKind::state, "running_var");
                  return frugal::apply(std::make_shared<ops::BatchNorm2dEval>(1e-5, true), {v[0], v[1], v[2], m, s}).at(0);
                },
                [&](const Arrays& a) { return ref::relu(ref::batch_norm_eval(a[0], a[1], a[2], rma, rva)); }});
}

// f32, and bf16 (a model wholly in bf16, BatchNorm's statistics f32); the
// op test above covers f64.
TEST_CASE("a ResNet trains bit for bit with BatchNorm + ReLU merged and residual chains fused", "[fusion][bn]") {
  for (DType dt : {DType::f32, DType::bf16}) {
    INFO("dtype " << dtype_name(dt));
    TrainedResnet plain = train_resnet(dt, false), fused = train_resnet(dt, true);
    CHECK(plain.bn_relu == 0);
    // Every BasicBlock's bn1 + relu (and the stem's) merged; its residual
    // add + relu fused as a chain.
    CHECK(fused.bn_relu >= 4);
    CHECK(fused.plan.fused_chains > fused.bn_relu);
    CHECK(fused.losses == plain.losses);
    CHECK(fused.state == plain.state);  // parameters and running statistics
    // 70% of the unconstrained bytes, or the smallest feasible budget where
    // that is more (in bf16 the tensors halve, the convolutions' f32
    // scratch does not).
    const std::size_t full = fused.plan.total_bytes();
    const std::size_t budget =
        std::max(full * 7 / 10, train_resnet(dt, true, Budget{.device = full - 1}).plan.min_feasible_bytes);
    REQUIRE(budget < full);
    TrainedResnet tight = train_resnet(dt, true, Budget{.device = budget});
    CHECK(tight.plan.total_bytes() <= budget);
    CHECK(tight.losses == plain.losses);
    CHECK(tight.state == plain.state);
  }
}

TEST_CASE("a ResNet in eval mode infers bit for bit with BatchNorm + ReLU merged", "[fusion][bn]") {
  for (DType dt : {DType::f32}) {
    INFO("dtype " << dtype_name(dt));
    auto infer = [&](bool fuse) {
      nn::manual_seed(9);
      zoo::Workload w = zoo::make(small_resnet(dt));
      w.model->eval();
      auto* net = dynamic_cast<nn::ResNet<nn::BasicBlock>*>(w.model.get());
      REQUIRE(net);
      // Running statistics away from 0 and 1, so eval differs from a fresh net.
      Rng r(4);
      for (auto& b : w.model->buffers())
        if (b.dtype() == dt && b.numel() > 1)
          for (std::int64_t i = 0; i < b.numel(); ++i) {
            double v = 0.5 + r.uniform();
            if (dt == DType::f64) b.data<double>()[i] = v;
            else b.data<float>()[i] = float(v);
          }
      auto batch = w.batch(7);
      Step s = compile_inference([&](Var x) { return net->forward(x); }, {w.inputs[0]}, {}, fusing(fuse));
      s.run(batch[0]);
      return std::pair{bytes_of(s.output(0)), bn_relu_nodes_in(s.graph(), s.plan())};
    };
    auto [plain, n0] = infer(false);
    auto [fused, n1] = infer(true);
    CHECK(n0 == 0);
    CHECK(n1 >= 4);
    CHECK(plain == fused);
  }
}
