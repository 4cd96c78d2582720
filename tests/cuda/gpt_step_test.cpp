// cuda_gpt_step: a small GPT's training step (nn::Gpt: embedding, layer
// norm, packed causal attention, the erf-polynomial GELU, dropout,
// cross-entropy, AdamW; at these sizes the position slice is the whole table
// and fusion finds no chain, so slice and fused_elementwise are covered by
// cuda_ops alone) on the GPU.
//  0. Without a device too: every op of the captured step (fusion on, as
//     compile does it), unconstrained, under the 60% budget (the planner's
//     rewrites) and for inference, has a CUDA kernel in the table the CUDA
//     backend fills, so a missing kernel fails here, on any build machine,
//     instead of at compile on the GPU.
//  1. Two unconstrained GPU runs give identical bits.
//  2. Under 60% of the unconstrained device need (or the least feasible
//     budget the planner names, if that is higher) a step is bitwise the
//     unconstrained GPU step (losses and parameters, 5 steps), the device
//     bytes it touches stay at or under the budget, and the audit's canary
//     beyond the predicted peak is intact.
//  3. 20 steps on the CPU and on the GPU from the same weights, batches and
//     dropout masks: the losses agree within a stated tolerance.
// Exits 77 without a CUDA device (after check 0).
#include <cmath>
#include <cstring>
#include <set>

#include <frugal/backend/cuda/cuda_backend.hpp>

#include "device.hpp"

using namespace frugal;
using cuda_test::expect;
using cuda_test::Run;
using cuda_test::same_bits;

// A namespace of its own: cuda_tests compiles the three suites as one file.
namespace cuda_gpt_step_test {

constexpr std::int64_t kBatch = 4, kT = 32, kVocab = 64, kLayers = 2, kD = 64, kHeads = 4;
constexpr double kDropout = 0.1;

nn::GptConfig config() {
  return {.vocab = kVocab, .context = kT, .layers = kLayers, .d_model = kD, .heads = kHeads, .dropout = kDropout};
}

// Batch s of a stream of four, repeated: token sequences that mostly follow
// t -> (5t + 1) mod V (so there is something to learn in 20 steps), the
// targets the next token.
std::pair<Tensor, Tensor> batch(int s) {
  Rng rng(77, std::uint64_t(s % 4));
  Tensor x({kBatch, kT}, DType::i32), y({kBatch, kT}, DType::i32);
  for (std::int64_t b = 0; b < kBatch; ++b) {
    std::int32_t t = std::int32_t(rng.below(kVocab));
    for (std::int64_t i = 0; i <= kT; ++i) {
      const std::int32_t next = rng.uniform() < 0.8 ? std::int32_t((5 * t + 1) % kVocab) : std::int32_t(rng.below(kVocab));
      if (i < kT) x.data<std::int32_t>()[b * kT + i] = t;
      if (i > 0) y.data<std::int32_t>()[b * kT + i - 1] = t;
      t = next;
    }
  }
  return {x, y};
}

Run train(const std::string& backend, int steps, Budget budget, bool do_audit) {
  nn::manual_seed(5);
  nn::Gpt model(config());
  optim::AdamW opt(model.parameters(), {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.99, .weight_decay = 0.1});
  CompileOptions o;
  o.backend = backend;
  o.threads = 2;
  Step step = compile([&](Var x, Var y) { return model.loss(x, y); },
                      {input<std::int32_t>({kBatch, kT}, "tokens"), input<std::int32_t>({kBatch, kT}, "targets")}, opt,
                      budget, o);
  return cuda_test::record_run(step, model.parameters(), budget, steps, batch, do_audit);
}

// Check 0: the op types of the captured training and inference steps, each
// looked up in the CUDA backend's kernel table (filled without a device:
// the table holds only the kernels' host-side launchers).
void check_kernel_coverage() {
  KernelTable cuda_table;
  cuda::register_cuda_kernels(cuda_table, cuda::Context{}, BackendOptions{});
  nn::manual_seed(5);
  nn::Gpt model(config());
  optim::AdamW opt(model.parameters(), {.lr = 1e-3});
  CompileOptions o;
  o.threads = 2;
  // Planned here on the CPU backend; on the CUDA one optimizer offload is
  // off (its kernels cannot read host memory), so it is here too.
  o.offload_optimizer = false;
  PlannedStep train = plan_training([&](Var x, Var y) { return model.loss(x, y); },
                                    {input<std::int32_t>({kBatch, kT}), input<std::int32_t>({kBatch, kT})}, opt, {}, o);
  // Under a binding budget the planner rewrites the graph (recomputation
  // copies ops): its ops need kernels too.
  Budget tight{.device = train.plan.total_bytes() * 6 / 10, .host = 256u << 20};
  auto plan_tight = [&] {
    return plan_training([&](Var x, Var y) { return model.loss(x, y); },
                         {input<std::int32_t>({kBatch, kT}), input<std::int32_t>({kBatch, kT})}, opt, tight, o);
  };
  PlannedStep budgeted;
  try {
    budgeted = plan_tight();
  } catch (const BudgetError& e) {
    tight.device = e.smallest_feasible_bytes;
    budgeted = plan_tight();
  }
  model.eval();
  PlannedStep eval = plan_inference([&](Var x) { return model.forward(x); }, {input<std::int32_t>({kBatch, kT})}, {}, o);
  std::set<std::string> seen, missing;
  for (const PlannedStep* p : {&train, &budgeted, &eval})
    for (const Node& n : p->graph->nodes()) {
      if (dynamic_cast<const TransferOp*>(n.op.get())) continue;  // the executor's copies, not kernels
      seen.insert(n.op->name());
      if (!cuda_table.find(*n.op)) missing.insert(n.op->name());
    }
  std::string ops;
  for (auto& s : seen) ops += " " + s;
  std::printf("gpt step ops:%s\n", ops.c_str());
  for (auto& m : missing) expect(false, "op '" + m + "' of the gpt step has no CUDA kernel");
  std::printf("%-44s %s\n", "every gpt op has a CUDA kernel", missing.empty() ? "ok" : "FAIL");
}


int run() try {
  check_kernel_coverage();
  if (cuda_test::failures) return cuda_test::finish("cuda_gpt_step");
  cuda_test::cuda_backend_or_skip();
  const int kSteps = 5;

  const Run free_run = train("cuda", kSteps, {}, false);
  const std::size_t need = free_run.total_planned;
  std::printf("unconstrained: %zu device bytes planned, losses %.6f .. %.6f\n", need, double(free_run.losses.front()),
              double(free_run.losses.back()));
  const Run again = train("cuda", kSteps, {}, false);
  expect(same_bits(free_run, again), "two unconstrained GPU runs give the same bits");

  cuda_test::check_budgeted_run([&](const Budget& b, bool audit) { return train("cuda", kSteps, b, audit); }, free_run,
                                Budget{.device = std::size_t(double(need) * 0.6), .host = 256u << 20}, "60% budget", true);

  // CPU against GPU, 20 steps, the same dropout masks (the same Philox
  // stream). Per op the backends differ by a few f32 ulps relative: GEMM
  // sums in another order (no TF32), attention's online softmax per key on
  // the GPU against per 64-key tile on the CPU, layer norm's row sums in a
  // shuffle tree against the CPU's lanes, expf/logf's last bits. That is
  // about 1e-6 relative in the loss at step 0. AdamW moves each weight by
  // about lr = 1e-3 per step whatever the gradient's size, so a gradient
  // element within that noise of zero may step the other way on one
  // backend: one weight off by 2e-3 of ~30k, moving the loss by far less
  // than 1e-3 over 20 steps. 5e-3 absolute on a loss near ln 64 = 4.16
  // leaves a factor of several, while a wrong kernel (no causal mask, a
  // wrong layer-norm gradient, another dropout mask) moves the loss by 0.05
  // or more within 20 steps.
  const Run cpu = train("cpu", 20, {}, false);
  const Run gpu = train("cuda", 20, {}, false);
  cuda_test::check_cpu_matches_gpu(cpu, gpu, 5e-3);
  expect(std::fabs(double(cpu.losses[0]) - double(gpu.losses[0])) <= 1e-4,
         "step 0 (no update yet): cpu and gpu losses within 1e-4");
  return cuda_test::finish("cuda_gpt_step");
} catch (const std::exception& e) {
  std::printf("FAIL: %s\n", e.what());
  return 1;
}

}  // namespace cuda_gpt_step_test
