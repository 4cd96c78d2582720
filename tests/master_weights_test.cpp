// AdamW with f32 master weights for bf16/f16 parameters
// (optim::AdamWOptions::master_weights, ops/adamw_master.hpp): the update
// against the f32 AdamW kernel bit for bit and a float64 reference within a
// stated bound, training against the f32 run, the planner's 2 + 12 + 2
// bytes per parameter (ZeRO's shards included), ZeRO runs over two ranks
// in this process against one, optimizer offload, NVMe homes, and
// checkpoints of the master.
//
// u below is a format's unit roundoff: 2^-24 for f32, 2^-8 for bf16.
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <filesystem>
#include <functional>
#include <set>

#include <frugal/backend/cpu/isa.hpp>  // every instruction set's update loop
#include <frugal/dist/plan_only.hpp>
#include <frugal/frugal.hpp>

#include "bytes_of.hpp"
#include "cpu_isa_scope.hpp"
#include "thread_ranks.hpp"
#include "toy_task.hpp"

using namespace frugal;
using Catch::Matchers::Contains;
using test_support::record_trained;
using test_support::run_two_ranks_ok;

namespace master_test {

// A bf16/f16 value's f32 widening, and a tensor's values as floats.
std::vector<float> floats_of(const Tensor& t) {
  std::vector<float> out(std::size_t(t.numel()));
  for (std::size_t i = 0; i < out.size(); ++i)
    out[i] = t.dtype() == DType::bf16 ? float(t.data<BFloat16>()[i])
             : t.dtype() == DType::f16 ? float(t.data<Half>()[i])
                                       : t.data<float>()[i];
  return out;
}
// x rounded to nearest even in dt's storage, widened back.
float rounded(float x, DType dt) { return dt == DType::bf16 ? float(BFloat16(x)) : float(Half(x)); }
void store(Tensor& t, std::size_t i, float x) {
  if (t.dtype() == DType::bf16) t.data<BFloat16>()[i] = BFloat16(x);
  else if (t.dtype() == DType::f16) t.data<Half>()[i] = Half(x);
  else t.data<float>()[i] = x;
}
// Whether `p` (16-bit) holds exactly `master` rounded to its dtype.
bool is_rounding_of(const Tensor& p, const Tensor& master) {
  const float* want = master.data<float>();
  const auto* bits = static_cast<const std::uint16_t*>(p.raw());
  for (std::int64_t i = 0; i < master.numel(); ++i)
    if (bits[i] != (p.dtype() == DType::bf16 ? BFloat16(want[i]).bits : Half(want[i]).bits)) return false;
  return true;
}
using test_support::same_bits;

// Three layers in `dt` (bf16, f16 or f32); the f32 input is cast to dt, the
// loss is f32.
struct Mlp16 : nn::Module {
  nn::Linear fc1, fc2, fc3;
  DType dt;
  Mlp16(int in, int hidden, int out, DType d)
      : fc1(in, hidden, {.dtype = d}), fc2(hidden, hidden, {.dtype = d}), fc3(hidden, out, {.dtype = d}), dt(d) {
    register_module("fc1", fc1);
    register_module("fc2", fc2);
    register_module("fc3", fc3);
  }
  Var forward(Var x) { return fc3(frugal::tanh(fc2(gelu(fc1(cast(x, dt)))))); }
};

// The model of seed 5 in `dt`, its weights bf16 values whatever dt is, so
// the runs compared start from the same numbers.
std::unique_ptr<Mlp16> make_mlp(DType dt, int in = 15, int hidden = 33, int out = 4) {
  nn::manual_seed(5);
  Mlp16 f32(in, hidden, out, DType::f32);
  auto m = std::make_unique<Mlp16>(in, hidden, out, dt);
  auto from = f32.parameters(), to = m->parameters();
  for (std::size_t k = 0; k < from.size(); ++k)
    for (std::int64_t i = 0; i < from[k].numel(); ++i)
      store(to[k], std::size_t(i), rounded(from[k].data<float>()[i], DType::bf16));
  return m;
}

CompileOptions one_thread() {
  CompileOptions o;
  o.threads = 1;
  return o;
}
Step compile_mlp(Mlp16& m, Optimizer& opt, std::int64_t batch, Budget b = {}, CompileOptions o = one_thread()) {
  return compile([&](Var x, Var y) { return cross_entropy(m.forward(x), y); },
                 {input<float>({batch, m.fc1.weight.shape()[1]}), input<std::int32_t>({batch})}, opt, b, o);
}
float train(Step& step, std::int64_t batch, std::int64_t in, int from, int to) {
  Tensor x({batch, in}), y({batch}, DType::i32);
  float loss = 0;
  for (int s = from; s < to; ++s) {
    toy::make_batch(x, y, std::uint64_t(s));
    loss = step.run(x, y);
  }
  return loss;
}

std::vector<Tensor> clone_each(const std::vector<Tensor>& ts) {
  std::vector<Tensor> out;
  for (const Tensor& t : ts) out.push_back(t.clone());
  return out;
}
std::vector<Tensor> masters(const optim::AdamW& opt) {
  std::vector<Tensor> out;
  for (std::size_t i = 0; i < opt.params().size(); ++i) out.push_back(opt.master(i).clone());
  return out;
}

std::size_t kind_bytes(const std::map<std::string, std::size_t>& m, const std::string& kind) {
  auto it = m.find(kind);
  return it == m.end() ? 0 : it->second;
}

}  // namespace master_test

using namespace master_test;

// ---- the update ------------------------------------------------------------

// The kernel against the f32 AdamW kernel run on the master with the
// gradient widened: the same f32 operations, so the same bits, on every
// instruction-set path this CPU has; the parameter is the master rounded
// once. The plain 16-bit AdamW (no master) is the f32 kernel on the widened
// values, each rounded on store.
TEST_CASE("master weights: the update is f32 AdamW on the master, and the parameter is the master rounded", "[master]") {
  test_support::KeepCpuIsa keep;
  auto backend = std::shared_ptr<Backend>(make_backend("cpu"));
  auto h = std::make_shared<ops::AdamWHyper>(ops::AdamWHyper{3e-3, 0.9, 0.99, 1e-8, 0.05, 4});
  const int widest = int(cpu::widest_cpu_isa());
  const Shape scalar{};
  for (DType dt : {DType::bf16, DType::f16})
    for (bool guarded : {false, true})
      for (std::int64_t n : {std::int64_t(1), std::int64_t(37), std::int64_t(10003)}) {
        INFO(dtype_name(dt) << ", " << (guarded ? "guarded" : "plain") << ", " << n << " elements");
        const Shape sh{n};
        Rng r(std::uint64_t(n) + (guarded ? 7 : 0));
        Tensor master0(sh, DType::f32), m0(sh, DType::f32), v0(sh, DType::f32), p0(sh, dt), g(sh, dt), g32(sh, DType::f32);
        for (std::int64_t i = 0; i < n; ++i) {
          const float small = i % 5 == 0 ? 1e-4f : 1.0f;  // small moments: eps matters
          master0.data<float>()[i] = float(r.normal());
          store(p0, std::size_t(i), master0.data<float>()[i]);
          const float gi = rounded(float(r.normal() * 0.1 * small), dt);
          store(g, std::size_t(i), gi);
          g32.data<float>()[i] = gi;
          m0.data<float>()[i] = float(r.normal() * 0.01 * small);
          v0.data<float>()[i] = float(std::abs(r.normal()) * 0.001 * small);
        }
        Tensor found(scalar, DType::f32), scale(scalar, DType::f32), taken(scalar, DType::i64);
        scale.data<float>()[0] = 1024.0f;
        taken.data<std::int64_t>()[0] = 3;  // step 4, as the host's count
        auto run = [&](const Op& op, std::vector<Tensor> t) {  // runs op on t (and the guard); returns t
          std::vector<TensorRef> in;
          for (Tensor& x : t) in.push_back({x.raw(), x.dtype(), &sh});
          if (guarded)
            for (Tensor* s : {&found, &scale, &taken}) in.push_back({s->raw(), s->dtype(), &scalar});
          KernelArgs args;
          args.in = in;
          backend->kernel_for(op)(op, args);
          return t;
        };
        const ops::AdamWUpdate f32_op(h, guarded);
        const ops::AdamWMasterUpdate master_op(h, guarded);
        const auto want = run(f32_op, {master0.clone(), g32, m0.clone(), v0.clone()});
        // The plain 16-bit path's reference: the f32 kernel on the widened values.
        Tensor m16(sh, dt), v16(sh, dt);
        for (std::int64_t i = 0; i < n; ++i) {
          store(m16, std::size_t(i), m0.data<float>()[i]);
          store(v16, std::size_t(i), v0.data<float>()[i]);
        }
        const Tensor p32 = Tensor::from(floats_of(p0), sh), m16w = Tensor::from(floats_of(m16), sh),
                     v16w = Tensor::from(floats_of(v16), sh);
        const auto want16 = run(f32_op, {p32, g32, m16w, v16w});
        for (int isa = 0; isa <= widest; ++isa) {
          INFO("forced " << cpu::isa_name(cpu::CpuIsa(isa)));
          cpu::forced_cpu_isa = isa;
          found.data<float>()[0] = 0;
          const auto got = run(master_op, {p0.clone(), g, master0.clone(), m0.clone(), v0.clone()});
          CHECK(same_bits(got[2], want[0]));  // the master: f32 AdamW's parameter
          CHECK(same_bits(got[3], want[2]));
          CHECK(same_bits(got[4], want[3]));
          CHECK(is_rounding_of(got[0], got[2]));
          CHECK_FALSE(same_bits(got[2], master0));  // it moved
          const auto plain = run(f32_op, {p0.clone(), g, m16.clone(), v16.clone()});
          CHECK(is_rounding_of(plain[0], want16[0]));
          CHECK(is_rounding_of(plain[2], want16[2]));
          CHECK(is_rounding_of(plain[3], want16[3]));
          if (guarded) {  // an overflowed step writes nothing
            found.data<float>()[0] = 1;
            const auto skipped = run(master_op, {p0.clone(), g, master0.clone(), m0.clone(), v0.clone()});
            CHECK(same_bits(skipped[0], p0));
            CHECK(same_bits(skipped[2], master0));
            CHECK(same_bits(skipped[3], m0));
            CHECK(same_bits(skipped[4], v0));
          }
        }
      }
}

// A step whose gradient is exactly its input c (loss sum(w * c), cast to
// f32: every backward product is 1 * c, exact in bf16), trained beside an
// f32 parameter holding the same values, given the same gradients.
TEST_CASE("master weights: steps of a bf16 parameter are the f32 run's on the master, near the float64 rule",
          "[master]") {
  const std::int64_t n = 257;
  optim::AdamWOptions o{.lr = 0.02, .beta1 = 0.8, .beta2 = 0.95, .eps = 1e-6, .weight_decay = 0.1, .master_weights = true};
  Rng r(11);
  Tensor w16(Shape{n}, DType::bf16), w32(Shape{n}, DType::f32);
  for (std::int64_t i = 0; i < n; ++i) {
    w32.data<float>()[i] = rounded(float(r.normal()), DType::bf16);
    store(w16, std::size_t(i), w32.data<float>()[i]);
  }
  optim::AdamW opt16({w16}, o), opt32({w32}, o);
  Step s16 = compile(
      [&](Var c) { return cast(sum(persistent_var(w16, ValueKind::parameter, "w") * c), DType::f32); },
      {InputSpec{{DType::bf16, Shape{n}}, "c"}}, opt16);
  Step s32 = compile([&](Var c) { return sum(persistent_var(w32, ValueKind::parameter, "w") * c); },
                     {input<float>({n}, "c")}, opt32);
  REQUIRE(opt16.master(0).dtype() == DType::f32);
  CHECK(opt16.master(0).to_vector<float>() == w32.to_vector<float>());  // made exactly from the parameter
  CHECK(opt16.exp_avg(0).dtype() == DType::f32);
  CHECK_FALSE(opt32.master(0).defined());  // an f32 parameter has none
  const std::size_t count = std::size_t(n);
  std::vector<double> ref(count), m(count), v(count), bound(count, 0.0);
  std::vector<double> m_abs(count);  // m's recursion on |g|: what m's roundings are relative to
  for (std::int64_t i = 0; i < n; ++i) ref[std::size_t(i)] = w32.data<float>()[i];
  const double u = 0x1p-24;
  Tensor c16(Shape{n}, DType::bf16), c32(Shape{n}, DType::f32);
  for (int t = 1; t <= 6; ++t) {
    if (t == 4) opt16.set_lr(0.005), opt32.set_lr(0.005);  // read when the update runs
    const double lr = t >= 4 ? 0.005 : o.lr;
    for (std::int64_t i = 0; i < n; ++i) {
      c32.data<float>()[i] = rounded(float(r.normal() * (i % 7 == 0 ? 1e-3 : 1.0)), DType::bf16);
      store(c16, std::size_t(i), c32.data<float>()[i]);
    }
    s16.run(c16);
    s32.run(c32);
    INFO("step " << t);
    CHECK(same_bits(opt16.master(0), w32));  // the f32 run's bits
    CHECK(same_bits(opt16.exp_avg(0), opt32.exp_avg(0)));
    CHECK(same_bits(opt16.exp_avg_sq(0), opt32.exp_avg_sq(0)));
    CHECK(is_rounding_of(w16, opt16.master(0)));
    // torch.optim.AdamW's rule in float64. Each f32 step rounds the decay
    // (the constant lr * wd, 1 minus it, the product: <= 4u |p|) and the
    // subtraction (<= u |p|); old errors are carried on (the decay factor is
    // < 1). The step term lr/b1 * m / (sqrt(v)/b2 + eps): m gathers <= 3u
    // per step of m_abs (its recursion on |g|: the gradients' signs may
    // cancel in m, not in its roundings), v <= 3u t relative (no
    // cancellation), and the constants and the quotient a few u more:
    // within 16 t u lr/b1 m_abs/denom for t <= 6. Summed over the steps.
    std::size_t bad = 0;
    for (std::int64_t k = 0; k < n; ++k) {
      const std::size_t i = std::size_t(k);
      const double g = c32.data<float>()[k];
      ref[i] *= 1 - lr * o.weight_decay;
      m[i] = o.beta1 * m[i] + (1 - o.beta1) * g;
      m_abs[i] = o.beta1 * m_abs[i] + (1 - o.beta1) * std::abs(g);
      v[i] = o.beta2 * v[i] + (1 - o.beta2) * g * g;
      const double denom = std::sqrt(v[i]) / std::sqrt(1 - std::pow(o.beta2, t)) + o.eps;
      const double lr_b1 = lr / (1 - std::pow(o.beta1, t));
      ref[i] -= lr_b1 * m[i] / denom;
      bound[i] += 5 * u * std::abs(ref[i]) + 16.0 * t * u * lr_b1 * m_abs[i] / denom;
      bad += !(std::abs(double(opt16.master(0).data<float>()[k]) - ref[i]) <= bound[i]);
    }
    CHECK(bad == 0);
  }
  // Arithmetic in bf16 would be off by about 2^-9 |p| ~ 2e-3 for |p| ~ 1
  // (normal initial values): the bound is far tighter.
  double widest = 0;
  for (double b : bound) widest = std::max(widest, b);
  INFO("largest bound " << widest);
  CHECK(widest < 1e-4);
}

// ---- training --------------------------------------------------------------

TEST_CASE("master weights: a bf16 MLP trained with them tracks the f32 run; without, small steps round away",
          "[master][train]") {
  // lr 2e-4: an AdamW step moves a weight by about lr, less than half a
  // bf16 ulp (2^-9 |w| >= 2.4e-4) of any weight above 0.125 in magnitude;
  // without master weights such steps round to nothing.
  const int steps = 20;
  const std::int64_t batch = 64, in = 15;
  auto run = [&](DType dt, bool master) {
    auto m = make_mlp(dt);
    optim::AdamW opt(m->parameters(), {.lr = 2e-4, .master_weights = master});
    Step step = compile_mlp(*m, opt, batch);
    std::vector<float> losses;
    Tensor x({batch, in}), y({batch}, DType::i32);
    for (int s = 0; s < steps; ++s) {
      toy::make_batch(x, y, std::uint64_t(s));
      losses.push_back(step.run(x, y));
    }
    std::vector<std::vector<float>> w;
    for (std::size_t i = 0; i < m->parameters().size(); ++i)
      w.push_back(master ? opt.master(i).to_vector<float>() : floats_of(m->parameters()[i]));
    return std::pair{losses, w};
  };
  const auto [l32, w32] = run(DType::f32, false);
  const auto [lm, wm] = run(DType::bf16, true);
  const auto [lp, wp] = run(DType::bf16, false);
  auto init = make_mlp(DType::f32);
  double moved = 0, apart_master = 0, apart_plain = 0;
  for (std::size_t k = 0; k < w32.size(); ++k) {
    const std::vector<float> w0 = floats_of(init->parameters()[k]);
    for (std::size_t i = 0; i < w0.size(); ++i) {
      moved += std::abs(double(w32[k][i]) - w0[i]);
      apart_master += std::abs(double(wm[k][i]) - w32[k][i]);
      apart_plain += std::abs(double(wp[k][i]) - w32[k][i]);
    }
  }
  INFO("sum |f32 step| " << moved << ", sum |master - f32| " << apart_master << ", sum |plain bf16 - f32| " << apart_plain);
  // The bf16 forward and backward round inputs, weights, activations and
  // gradients (relative 2^-8 each), so each master step differs from the f32
  // one by a few percent of lr where the gradient is not near zero; AdamW
  // normalises, so a weight whose gradient is ~0 may step either way in
  // either run. In aggregate, as the mixed-precision test compares: within
  // 5% of how far the f32 run moved (observed: 0.2%).
  CHECK(apart_master <= 0.05 * moved);
  // Without master weights most steps round away: the plain run ends a
  // quarter or more of the f32 run's whole movement away from it (observed:
  // 74%, 340 times the master run's distance).
  CHECK(apart_plain > 0.25 * moved);
  CHECK(apart_plain > 10 * apart_master);
  // Losses: the mixed-precision test's bound for a bf16 forward (0.005).
  for (int s = 0; s < steps; ++s) {
    INFO("step " << s << ": f32 " << l32[std::size_t(s)] << ", master " << lm[std::size_t(s)]);
    CHECK(std::abs(double(lm[std::size_t(s)]) - l32[std::size_t(s)]) <= 0.005);
  }
}

// ---- the planner's bytes -----------------------------------------------------

TEST_CASE("master weights: a bf16 model plans 2 bytes of parameter, 12 of optimizer state, 2 of gradient per element",
          "[master][plan][zero]") {
  const int ranks = 4;
  auto update_gradient_bytes = [](const PlannedStep& ps) {  // what the updates read as gradients
    std::size_t b = 0;
    for (NodeId id : ps.plan.schedule) {
      const Node& n = ps.graph->node(id);
      if (n.phase != Phase::optimizer || n.op->name().find("adamw") == std::string::npos) continue;
      const TensorMeta& g = ps.graph->value(n.inputs[1]).meta;
      CHECK(g.dtype == DType::bf16);
      b += g.nbytes();
    }
    return b;
  };
  for (int stage : {-1, 0, 1, 2, 3})
    for (int rank = 0; rank < (stage < 0 ? 1 : ranks); ++rank) {
      INFO("stage " << stage << " (-1: no communicator), rank " << rank);
      auto m = make_mlp(DType::bf16);
      optim::AdamW opt(m->parameters(), {.master_weights = true});
      CompileOptions o;
      if (stage >= 0) {
        o.communicator = std::make_shared<dist::PlanOnly>(rank, ranks);
        o.zero_stage = stage;
      }
      const PlannedStep ps = plan_training([&](Var x, Var y) { return cross_entropy(m->forward(x), y); },
                                           {input<float>({8, 15}), input<std::int32_t>({8})}, opt, {}, o);
      std::size_t psi = 0, shard = 0;
      for (const Tensor& p : m->parameters()) {
        const ZeroShard s = ZeroShard::of(p.numel(), rank, ranks);
        psi += std::size_t(p.numel());
        shard += std::size_t(stage > 0 && s.every_rank_has_elements() ? s.length : p.numel());
      }
      CHECK(kind_bytes(ps.plan.persistent_by_kind, "optimizer state") == 12 * shard);
      CHECK(kind_bytes(ps.plan.persistent_by_kind, "parameters") == 2 * (stage == 3 ? shard : psi));
      CHECK(update_gradient_bytes(ps) == 2 * shard);
      // And the state really is the master and both moments, in f32.
      std::size_t state = 0;
      for (const auto& s : opt.state()) {
        CHECK(s.tensor.dtype() == DType::f32);
        state += s.tensor.nbytes();
      }
      CHECK(state == 12 * shard);
    }
}

// ---- ZeRO over ranks ----------------------------------------------------------

// Both ranks train on the same batch, so the averaged gradient is each
// rank's own exactly ((g + g) / 2 = g in f32, rounded once to bf16: g), and
// every stage must give the one-rank run's bits: each master element is
// stepped once, on the rank that owns it, by the same arithmetic.
TEST_CASE("master weights: ZeRO stages 0 to 3 over two ranks give the one-rank run's parameters and masters, bit for bit",
          "[master][zero]") {
  const std::int64_t batch = 16, in = 15;
  const int steps = 4;
  auto alone = make_mlp(DType::bf16);
  optim::AdamW opt1(alone->parameters(), {.lr = 3e-3, .master_weights = true});
  Step s1 = compile_mlp(*alone, opt1, batch);
  train(s1, batch, in, 0, steps);
  const std::vector<Tensor> want_p = clone_each(alone->parameters()), want_w = masters(opt1);
  const auto dir = std::filesystem::temp_directory_path() / cat("frugal-master-zero-", ::getpid());
  std::filesystem::create_directories(dir);
  for (int stage : {0, 1, 2, 3}) {
    INFO("stage " << stage);
    std::array<std::unique_ptr<Mlp16>, 2> models{make_mlp(DType::bf16), make_mlp(DType::bf16)};
    std::array<std::vector<Tensor>, 2> got_w;
    run_two_ranks_ok([&](int r, std::shared_ptr<Communicator> comm) {
      Mlp16& m = *models[std::size_t(r)];
      optim::AdamW opt(m.parameters(), {.lr = 3e-3, .master_weights = true});
      CompileOptions o = one_thread();
      o.communicator = comm;
      o.zero_stage = stage;
      Step s = compile_mlp(m, opt, batch, {}, o);
      train(s, batch, in, 0, steps);
      s.gather_parameters();
      got_w[std::size_t(r)] = masters(opt);
      if (stage == 1) io::save_gathered_checkpoint(dir / "gathered.safetensors", m, opt, steps, *comm);
    });
    for (int r = 0; r < 2; ++r) {
      INFO("rank " << r);
      const auto ps = models[std::size_t(r)]->parameters();
      for (std::size_t k = 0; k < ps.size(); ++k) {
        CHECK(same_bits(ps[k], want_p[k]));
        // The rank's master: its shard of the one-rank master (whole at stage 0).
        const Tensor& w = got_w[std::size_t(r)][k];
        const ZeroShard s = stage == 0 ? ZeroShard::of(w.numel(), 0, 1) : ZeroShard::of(want_w[k].numel(), r, 2);
        REQUIRE(w.numel() == s.length);
        CHECK(std::memcmp(w.raw(), want_w[k].data<float>() + s.offset, w.nbytes()) == 0);
      }
    }
  }
  // Stage 1's gathered checkpoint loads into one process: the whole masters.
  auto resumed = make_mlp(DType::bf16);
  optim::AdamW opt(resumed->parameters(), {.lr = 3e-3, .master_weights = true});
  Step s = compile_mlp(*resumed, opt, batch);
  io::load_checkpoint(dir / "gathered.safetensors", *resumed, opt);
  for (std::size_t k = 0; k < want_w.size(); ++k) {
    CHECK(same_bits(opt.master(k), want_w[k]));
    CHECK(same_bits(resumed->parameters()[k], want_p[k]));
  }
  std::filesystem::remove_all(dir);
}

namespace master_test {
// Plans rank `rank` of 2 at ZeRO `stage` with `opt`, as a stage search's
// trial or frugal-plan --ranks does: the state it prepares is that rank's
// shards.
PlannedStep plan_rank_of_2(Mlp16& m, Optimizer& opt, std::int64_t batch, int rank, int stage = 1) {
  CompileOptions o;
  o.communicator = std::make_shared<dist::PlanOnly>(rank, 2);
  o.zero_stage = stage;
  return plan_training([&](Var x, Var y) { return cross_entropy(m.forward(x), y); },
                       {input<float>({batch, m.fc1.weight.shape()[1]}), input<std::int32_t>({batch})}, opt, {}, o);
}

// The bf16 MLP with master weights trained 3 steps, its masters copied
// (`trained`), then rank 0 of 2 planned with its optimizer (`planned`).
struct PlannedAfterTraining {
  std::unique_ptr<Mlp16> m;
  std::unique_ptr<optim::AdamW> opt;
  Step s;
  std::vector<Tensor> trained;
  PlannedStep planned;
};
PlannedAfterTraining train_then_plan_rank0(std::int64_t batch, std::int64_t in) {
  auto m = make_mlp(DType::bf16);
  auto opt = std::make_unique<optim::AdamW>(m->parameters(), optim::AdamWOptions{.lr = 3e-3, .master_weights = true});
  Step s = compile_mlp(*m, *opt, batch);
  train(s, batch, in, 0, 3);
  std::vector<Tensor> trained = masters(*opt);
  PlannedStep planned = plan_rank_of_2(*m, *opt, batch, 0);
  return {std::move(m), std::move(opt), std::move(s), std::move(trained), std::move(planned)};
}
}  // namespace master_test

// Widening the bf16 parameter again would drop the masters' low bits, and a
// step compiled before the plan would then train from other masters than
// one compiled after it.
TEST_CASE("master weights: planning another ZeRO layout keeps the trained masters, and training goes on as if it never "
          "had been planned",
          "[master][zero]") {
  const std::int64_t batch = 16, in = 15;
  auto ref = make_mlp(DType::bf16);
  optim::AdamW ropt(ref->parameters(), {.lr = 3e-3, .master_weights = true});
  Step rs = compile_mlp(*ref, ropt, batch);
  train(rs, batch, in, 0, 3);

  auto f = train_then_plan_rank0(batch, in);
  Mlp16& m = *f.m;
  optim::AdamW& opt = *f.opt;
  // The plan's masters and moments are rank 0's shards: 12 bytes of each element it holds.
  std::size_t held = 0;
  for (const Tensor& p : m.parameters()) {
    const ZeroShard s = ZeroShard::of(p.numel(), 0, 2);
    held += std::size_t(s.every_rank_has_elements() ? s.length : p.numel());
  }
  REQUIRE(kind_bytes(f.planned.plan.persistent_by_kind, "optimizer state") == 12 * held);
  Step again = compile_mlp(m, opt, batch);
  for (std::size_t k = 0; k < f.trained.size(); ++k) {
    INFO("parameter " << k);
    CHECK(same_bits(opt.master(k), f.trained[k]));
  }
  // The step compiled before the plan and the one after, in turns.
  for (int step = 3; step < 9; ++step) {
    INFO("step " << step);
    const float want = train(rs, batch, in, step, step + 1);
    const float got = train(step % 2 ? again : f.s, batch, in, step, step + 1);
    CHECK(std::bit_cast<std::uint32_t>(got) == std::bit_cast<std::uint32_t>(want));
  }
  for (std::size_t k = 0; k < f.trained.size(); ++k) {
    INFO("parameter " << k);
    CHECK(same_bits(m.parameters()[k], ref->parameters()[k]));
    CHECK(same_bits(opt.master(k), ropt.master(k)));
  }
}

TEST_CASE("master weights: a parameter written while another ZeRO layout was planned gets its master made from it "
          "again, the others keep theirs",
          "[master][zero]") {
  const std::int64_t batch = 16, in = 15;
  auto f = train_then_plan_rank0(batch, in);
  Tensor written = f.m->parameters()[2];  // fc2's weight, overwritten as io::load_weights would
  for (std::int64_t i = 0; i < written.numel(); ++i)
    store(written, std::size_t(i), rounded(0.01f * float(i % 17) - 0.08f, DType::bf16));
  Step again = compile_mlp(*f.m, *f.opt, batch);
  for (std::size_t k = 0; k < f.trained.size(); ++k) {
    INFO("parameter " << k);
    if (k == 2) CHECK(f.opt->master(k).to_vector<float>() == floats_of(written));
    else CHECK(same_bits(f.opt->master(k), f.trained[k]));
  }
}

// Over two ranks fc3's weight (4 x 33) and bias (4) split into shards of the
// same length on both ranks (66 and 2 elements): state planned for rank 1
// with rank 0's optimizer has the shape of rank 0's but holds other
// elements, and must be a tensor of its own. Were it rank 0's, rank 1's
// master would be made from rank 1's elements over rank 0's trained one,
// and the two would share their moments.
TEST_CASE("master weights: rank 1 of 2 planned with rank 0's optimizer gets state of its own, and rank 0 trains on as "
          "if it never had been planned",
          "[master][zero]") {
  const std::int64_t batch = 16, in = 15;
  const int steps = 7, plan_at = 3;
  struct Rank {
    std::vector<float> losses;
    std::vector<Tensor> params, state;  // after the last step: the parameters (gathered) and opt.state()
    std::size_t planned = 0, shared = 0;  // rank 1's state and shards in the plan, and of them rank 0's
  };
  for (DType dt : {DType::bf16, DType::f32})
    for (int stage : {1, 3}) {
      INFO(dtype_name(dt) << ", stage " << stage);
      auto run = [&](bool plan_rank1) {
        std::array<std::unique_ptr<Mlp16>, 2> models{make_mlp(dt), make_mlp(dt)};
        std::array<Rank, 2> out;
        run_two_ranks_ok([&](int r, std::shared_ptr<Communicator> comm) {
          Mlp16& m = *models[std::size_t(r)];
          Rank& got = out[std::size_t(r)];
          optim::AdamW opt(m.parameters(), {.lr = 3e-3, .master_weights = true});
          CompileOptions o = one_thread();
          o.communicator = comm;
          o.zero_stage = stage;
          Step s = compile_mlp(m, opt, batch, {}, o);
          for (int k = 0; k < steps; ++k) {
            if (plan_rank1 && r == 0 && k == plan_at) {
              std::set<const void*> trained;
              for (const auto& st : opt.state()) trained.insert(st.tensor.raw());
              for (const auto& st : opt.parameter_shards()) trained.insert(st.tensor.raw());
              const PlannedStep p = plan_rank_of_2(m, opt, batch, 1, stage);
              for (const Value& v : p.graph->values())
                if (v.kind == ValueKind::state || (v.kind == ValueKind::parameter && v.name.ends_with(".shard"))) {
                  ++got.planned;
                  got.shared += trained.count(v.external.raw());
                }
            }
            got.losses.push_back(train(s, batch, in, k, k + 1));
          }
          s.gather_parameters();
          record_trained(got, m.parameters(), opt);
        });
        return out;
      };
      const std::array<Rank, 2> want = run(false), got = run(true);
      CHECK(got[0].planned > 0);
      CHECK(got[0].shared == 0);
      for (std::size_t r = 0; r < 2; ++r) {
        INFO("rank " << r);
        test_support::check_same_training(got[r], want[r]);
      }
    }
}

// ---- where the state lives -------------------------------------------------------

TEST_CASE("master weights: on the host (optimizer offload) and on NVMe the master trains with the same bits",
          "[master][offload]") {
  const std::int64_t batch = 16, in = 32;
  auto run = [&](CompileOptions o, Budget b) {
    auto m = make_mlp(DType::bf16, int(in), 64, 4);  // fc2's 4096 elements: whole pages for NVMe to give back
    optim::AdamW opt(m->parameters(), {.lr = 3e-3, .master_weights = true});
    Step s = compile_mlp(*m, opt, batch, b, o);
    train(s, batch, in, 0, 3);
    s.sync_to_host();
    std::size_t psi = 0;
    for (const Tensor& p : m->parameters()) psi += std::size_t(p.numel());
    return std::tuple{clone_each(m->parameters()), masters(opt), s.plan(), psi};
  };
  const auto [p0, w0, plan0, psi] = run(one_thread(), {});
  CompileOptions host = one_thread();
  host.offload_optimizer = true;
  const auto [p1, w1, plan1, psi1] = run(host, {});
  CHECK(kind_bytes(plan1.offloaded_by_kind, "optimizer state") == 12 * psi);
  CHECK(kind_bytes(plan1.persistent_by_kind, "optimizer state") == 0);
  const auto dir = std::filesystem::temp_directory_path() / cat("frugal-master-nvme-", ::getpid());
  std::filesystem::create_directories(dir);
  CompileOptions nvme = one_thread();
  nvme.plan.nvme_offload.optimizer_state = true;
  nvme.plan.nvme_offload.parameters = true;
  const auto [p2, w2, plan2, psi2] = run(nvme, Budget{.nvme_dir = dir.string()});
  CHECK(kind_bytes(plan2.nvme_home_by_kind, "optimizer state") > 0);
  for (std::size_t k = 0; k < p0.size(); ++k) {
    INFO("parameter " << k);
    CHECK(same_bits(p1[k], p0[k]));
    CHECK(same_bits(w1[k], w0[k]));
    CHECK(same_bits(p2[k], p0[k]));
    CHECK(same_bits(w2[k], w0[k]));
  }
  // A master made while a step keeps the parameters on NVMe (their pages
  // given back read as zeros) is made from their values, brought back.
  auto m = make_mlp(DType::bf16, int(in), 64, 4);
  optim::AdamW first(m->parameters(), {.lr = 3e-3, .master_weights = true});
  Step s = compile_mlp(*m, first, batch, Budget{.nvme_dir = dir.string()}, nvme);
  train(s, batch, in, 0, 2);
  optim::AdamW second(m->parameters(), {.lr = 3e-3, .master_weights = true});
  Step t = compile_mlp(*m, second, batch);
  for (std::size_t k = 0; k < m->parameters().size(); ++k) {
    INFO("parameter " << k);
    const std::vector<float> w = second.master(k).to_vector<float>();
    CHECK(w == floats_of(m->parameters()[k]));
    CHECK(std::count(w.begin(), w.end(), 0.0f) < std::ptrdiff_t(w.size()));  // not a given-back page's zeros
  }
  std::filesystem::remove_all(dir);
}

// ---- checkpoints ---------------------------------------------------------------

TEST_CASE("master weights: a checkpoint saves and restores the master, and a checkpoint without it is refused",
          "[master][io][checkpoint]") {
  const std::int64_t batch = 16, in = 15;
  const auto dir = std::filesystem::temp_directory_path() / cat("frugal-master-ckpt-", ::getpid());
  std::filesystem::create_directories(dir);
  const auto file = dir / "master.safetensors", plain_file = dir / "plain.safetensors";
  auto m = make_mlp(DType::bf16);
  optim::AdamW opt(m->parameters(), {.lr = 3e-3, .master_weights = true});
  Step s = compile_mlp(*m, opt, batch);
  train(s, batch, in, 0, 3);
  io::save_checkpoint(file, *m, opt, 3);
  train(s, batch, in, 3, 6);
  {
    const io::SafetensorsFile f = io::read_safetensors(file);
    bool found = false;
    for (const auto& [name, t] : f.tensors)
      found = found || (name == "optimizer.fc2.weight.master" && t.dtype() == DType::f32 && t.numel() == 33 * 33);
    CHECK(found);
  }
  // Resumed: the same trajectory, bit for bit (the master is not re-derived
  // from the bf16 parameter, which would lose its low bits).
  auto r = make_mlp(DType::bf16);
  optim::AdamW ropt(r->parameters(), {.lr = 3e-3, .master_weights = true});
  Step rs = compile_mlp(*r, ropt, batch);
  const io::TrainingState st = io::load_checkpoint(file, *r, ropt);
  rs.set_steps_run(st.step);
  rs.parameters_changed();
  train(rs, batch, in, 3, 6);
  for (std::size_t k = 0; k < m->parameters().size(); ++k) {
    CHECK(same_bits(r->parameters()[k], m->parameters()[k]));
    CHECK(same_bits(ropt.master(k), opt.master(k)));
  }
  // Saved without master weights, refused by an optimizer that keeps them,
  // and the other way round, each naming the master.
  auto p = make_mlp(DType::bf16);
  optim::AdamW popt(p->parameters(), {.lr = 3e-3});
  Step ps = compile_mlp(*p, popt, batch);
  train(ps, batch, in, 0, 1);
  io::save_checkpoint(plain_file, *p, popt, 1);
  CHECK_THROWS_WITH(io::load_checkpoint(plain_file, *r, ropt),
                    Contains("master copy") && Contains("missing from the file") && Contains("master_weights = false"));
  CHECK_THROWS_WITH(io::load_checkpoint(file, *p, popt), Contains("master copy") && Contains("master_weights = true"));
  // A program that writes the parameters itself refreshes the masters.
  io::save_weights(dir / "weights.safetensors", *p);
  io::load_weights(dir / "weights.safetensors", *r);
  ropt.master_from_params();
  for (std::size_t k = 0; k < r->parameters().size(); ++k)
    CHECK(ropt.master(k).to_vector<float>() == floats_of(p->parameters()[k]));
  std::filesystem::remove_all(dir);
}

TEST_CASE("master weights: parameter groups choose them, f32 parameters never get one, and bad input is named",
          "[master][errors]") {
  auto m = make_mlp(DType::bf16);
  optim::AdamW opt({{m->fc1.parameters(), {.master_weights = false}}, {m->fc2.parameters(), {}}, {m->fc3.parameters(), {}}},
                   {.lr = 1e-3, .master_weights = true});
  Step s = compile_mlp(*m, opt, 8);
  train(s, 8, 15, 0, 1);
  CHECK_FALSE(opt.master(0).defined());  // fc1: a group without
  CHECK(opt.exp_avg(0).dtype() == DType::bf16);
  CHECK(opt.master(2).defined());
  CHECK(opt.exp_avg(2).dtype() == DType::f32);
  int master_updates = 0;
  for (const Node& n : s.graph().nodes()) master_updates += n.op->name() == "adamw_master_update";
  CHECK(master_updates == 4);
  auto f = make_mlp(DType::f32);
  optim::AdamW fopt(f->parameters(), {.master_weights = true});
  Step fs = compile_mlp(*f, fopt, 8);
  for (std::size_t k = 0; k < f->parameters().size(); ++k) CHECK_FALSE(fopt.master(k).defined());
  // The op refuses what it cannot step, naming it.
  auto h = std::make_shared<ops::AdamWHyper>();
  const ops::AdamWMasterUpdate op(h);
  const TensorMeta p16{DType::bf16, Shape{3}}, p32{DType::f32, Shape{3}}, m32{DType::f32, Shape{3}}, m16{DType::bf16, Shape{3}};
  std::vector<TensorMeta> ok{p16, p16, m32, m32, m32}, f32_param{p32, p32, m32, m32, m32}, bf16_master{p16, p16, m16, m32, m32};
  CHECK(op.infer(ok).empty());
  CHECK_THROWS_WITH(op.infer(f32_param), Contains("not bf16 or f16") && Contains("needs no master copy"));
  CHECK_THROWS_WITH(op.infer(bf16_master), Contains("master copy") && Contains("not f32"));
}
