// gpt: a character-level GPT trained on Tiny Shakespeare under a device
// memory cap. Prints the plan (what the budget made the planner decide),
// trains with progress, reports the validation loss, and writes a passage
// sampled from the model at the end.
//
//   gpt --budget 24MiB --steps 1200
//   mpirun -np 2 gpt --budget 24MiB --steps 1200 [--zero auto|0|1|2|3]   (each rank: --batch sequences)
//   gpt --help
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <frugal/frugal.hpp>

#include "../common/session.hpp"
#include "text_data.hpp"

using namespace frugal;
namespace fs = std::filesystem;

namespace {

struct Options {
  samples::CommonArgs common;
  std::int64_t batch = 16, context = 128, layers = 4, d_model = 128, heads = 4;
  double dropout = 0.0, lr = 2e-3, weight_decay = 0.1, temperature = 0.8;
  std::int64_t eval_every = 250, eval_batches = 8, sample_chars = 500, stop_after = 0;
  std::string prompt = "ROMEO:\n";
};

// Mean next-character cross-entropy of logits [B, T, V] against targets [B, T], in double.
double cross_entropy_of(const Tensor& logits, const Tensor& targets) {
  const std::int64_t V = logits.shape()[2], rows = targets.numel();
  const float* z = logits.data<float>();
  double total = 0;
  for (std::int64_t r = 0; r < rows; ++r) total += samples::row_nll(z + r * V, V, targets.data<std::int32_t>()[r]);
  return total / double(rows);
}

}  // namespace

int main(int argc, char** argv) try {
  Options o;
  samples::Cli cli("gpt", "Trains a character-level GPT on Tiny Shakespeare within a device memory budget.");
  o.common.declare(cli, "../shared/data/shakespeare");
  cli.option("--batch", o.batch, "sequences per step (default 16)");
  cli.option("--context", o.context, "characters per sequence (default 128)");
  cli.option("--layers", o.layers, "transformer blocks (default 4)");
  cli.option("--d-model", o.d_model, "model width (default 128)");
  cli.option("--heads", o.heads, "attention heads (default 4)");
  cli.option("--dropout", o.dropout, "dropout probability (default 0)");
  cli.option("--lr", o.lr, "peak learning rate (AdamW, warm-up then cosine decay; default 2e-3)");
  cli.option("--eval-every", o.eval_every, "steps between validation losses (default 250)");
  cli.option("--eval-batches", o.eval_batches, "validation batches per evaluation (default 8)");
  cli.option("--sample-chars", o.sample_chars, "characters to generate at the end (default 500)");
  cli.option("--temperature", o.temperature, "sampling temperature (default 0.8)");
  cli.option("--prompt", o.prompt, "text the generated passage starts from");
  cli.option("--stop-after", o.stop_after, "stop after this many steps of this run, as if interrupted");
  cli.parse(argc, argv);
  o.common.check(cli);
  if (o.batch <= 0 || o.context <= 1 || o.layers <= 0 || o.d_model <= 0 || o.heads <= 0 || o.d_model % o.heads)
    cli.usage_error("--batch, --layers, --heads must be positive, --context above 1, and --d-model a multiple of --heads");
  if (o.eval_every <= 0 || o.eval_batches <= 0 || o.sample_chars < 0 || !(o.temperature > 0))
    cli.usage_error("--eval-every and --eval-batches must be positive and --temperature above 0");
  const samples::CommonArgs& a = o.common;
  samples::Session session("gpt", o.common);
  const samples::Ranks ranks = samples::join_ranks(a);
  session.set_ranks(ranks);

  // Data: the text, its characters, a 90/10 split.
  const fs::path file = fs::path(a.data) / "input.txt";
  const bool real = fs::exists(file);
  std::string text;
  if (real) {
    text = data::read_text_file(file);
  } else {
    std::fprintf(stderr, "gpt: no text at '%s'; training on generated text instead\n", file.c_str());
    text = samples::generated_text(std::uint64_t(a.seed), 400000);
  }
  data::CharVocab vocab(text);
  data::TokenSplit split = data::split_tokens(vocab.encode(text), 0.1);

  nn::manual_seed(std::uint64_t(a.seed));
  nn::Gpt model({.vocab = vocab.size(), .context = o.context, .layers = o.layers, .d_model = o.d_model,
                 .heads = o.heads, .dropout = o.dropout});
  optim::AdamW opt(model.parameters(), {.lr = o.lr, .beta1 = 0.9, .beta2 = 0.99, .weight_decay = o.weight_decay});
  const std::int64_t B = o.batch, T = o.context, EB = 8;
  CompileOptions copts{.backend = a.device, .threads = int(a.threads), .replan = !session.brokered_steps()};
  CompileOptions train_opts = copts;  // the evaluation step runs on each rank alone
  ranks.apply(train_opts);
  auto train_fn = [&](Var x, Var y) { return model.loss(x, y); };
  auto eval_fn = [&](Var x) { return model.forward(x); };
  std::vector<InputSpec> train_in{input<std::int32_t>({B, T}, "tokens"), input<std::int32_t>({B, T}, "targets")};
  std::vector<InputSpec> eval_in{input<std::int32_t>({EB, T}, "tokens")};

  // The unconstrained plans, for --budget N% and the comparison in the plot.
  // (With --offload nvme, unconstrained means with the state on NVMe, as pinned.)
  PlannedStep free_train = plan_training(train_fn, train_in, opt, Budget{.nvme_dir = a.nvme_dir}, train_opts);
  model.eval();
  PlannedStep free_eval = plan_inference(eval_fn, eval_in, {}, copts);
  model.train();
  samples::SampleSteps steps;
  session.compile_steps(steps, free_train, free_eval, train_fn, train_in, opt, train_opts, eval_fn, eval_in, copts);
  Step& step = *steps.train;
  Step& eval = *steps.eval;
  const std::size_t budget_total = steps.budget_total;

  const std::int64_t per_epoch = std::max<std::int64_t>(1, std::int64_t(split.train.size()) / (B * T));
  const std::int64_t total = a.steps > 0 ? a.steps : a.epochs > 0 ? a.epochs * per_epoch : 1800;
  char config[256];
  std::snprintf(config, sizeof config, "data=%s vocab=%lld context=%lld layers=%lld d_model=%lld heads=%lld batch=%lld "
                "dropout=%g lr=%g steps=%lld seed=%lld", real ? "shakespeare" : "generated",
                static_cast<long long>(vocab.size()), static_cast<long long>(T), static_cast<long long>(o.layers),
                static_cast<long long>(o.d_model), static_cast<long long>(o.heads), static_cast<long long>(B),
                o.dropout, o.lr, static_cast<long long>(total), static_cast<long long>(a.seed));
  std::fprintf(session.out(), "gpt: %s text, %zu characters (%lld distinct), %zu train / %zu validation; %lld parameters\n",
               real ? "Tiny Shakespeare" : "generated", text.size(), static_cast<long long>(vocab.size()),
               split.train.size(), split.val.size(), static_cast<long long>(model.num_parameters()));
  session.print_plan(step, eval, budget_total, free_train.plan.total_bytes());
  const std::int64_t first = session.resume(model, opt, {&step, &eval}, config);
  if (first > total) fail("the checkpoint is at step ", first, ", past --steps ", total);

  // Validation loss over fixed windows of the held-out text.
  Tensor vx({EB, T}, DType::i32), vy({EB, T}, DType::i32);
  auto validation_loss = [&](std::int64_t batches) {
    step.gather_parameters();  // ZeRO stage 3 trained shards: the evaluation step reads the module's tensors
    double sum = 0;
    for (std::int64_t k = 0; k < batches; ++k) {
      data::random_windows(split.val, 0xE7A1, std::uint64_t(k), vx, vy);
      eval.run(vx);
      sum += cross_entropy_of(eval.output(), vy);
    }
    return sum / double(batches);
  };

  // Learning rate: linear warm-up over 100 steps, cosine decay to a tenth.
  auto lr_at = [&](std::int64_t s) {
    const double warm = 100;
    if (double(s) < warm) return o.lr * double(s + 1) / warm;
    double t = (double(s) - warm) / std::max(1.0, double(total) - warm);
    return o.lr * (0.1 + 0.9 * 0.5 * (1 + std::cos(3.141592653589793 * t)));
  };

  Tensor x({B, T}, DType::i32), y({B, T}, DType::i32);
  session.start(first, total, "tok", double(B * T * ranks.size), budget_total);
  std::int64_t s = first;
  const std::int64_t last = o.stop_after > 0 ? std::min(total, first + o.stop_after) : total;
  for (; s < last; ++s) {
    // Under mpirun each rank draws its own windows of the step's global batch.
    data::random_windows(split.train, std::uint64_t(a.seed), std::uint64_t(s * ranks.size + ranks.rank), x, y);
    opt.set_lr(lr_at(s));
    auto t0 = std::chrono::steady_clock::now();
    float loss = step.run(x, y);
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    session.step_done(s, loss, ms, steps.measured_device_bytes(), model, opt);
    if ((s + 1) % o.eval_every == 0 && s + 1 < total) {
      double v = validation_loss(o.eval_batches);
      char line[96];
      std::snprintf(line, sizeof line, "step %lld: validation loss %.4f", static_cast<long long>(s + 1), v);
      session.validation(s + 1, v, line);
    }
  }
  session.save(model, opt, s);
  const double val = validation_loss(o.eval_batches * 2);

  // A passage, sampled with temperature from the model's next-character
  // distribution; the window slides once the text outgrows the context.
  std::string passage;
  if (o.sample_chars > 0 && session.leader()) {  // rank 0 writes it (the evaluation step is each rank's own)
    std::vector<std::int32_t> ctx;
    for (char c : o.prompt) {
      try {
        ctx.push_back(vocab.encode(c));
      } catch (const DataError&) {
      }
    }
    if (ctx.empty()) ctx.push_back(0);
    Rng rng(std::uint64_t(a.seed), 4242);
    Tensor gx({EB, T}, DType::i32);
    std::fill(gx.data<std::int32_t>(), gx.data<std::int32_t>() + gx.numel(), 0);
    const std::int64_t V = vocab.size();
    std::vector<double> p(static_cast<std::size_t>(V));
    for (std::int64_t n = 0; n < o.sample_chars; ++n) {
      const std::int64_t len = std::min<std::int64_t>(std::int64_t(ctx.size()), T);
      std::copy(ctx.end() - len, ctx.end(), gx.data<std::int32_t>());
      eval.run(gx);
      const float* z = eval.output().data<float>() + (len - 1) * V;
      double m = z[0], sum = 0;
      for (std::int64_t v = 1; v < V; ++v) m = std::max(m, double(z[v]));
      for (std::int64_t v = 0; v < V; ++v) sum += p[std::size_t(v)] = std::exp((double(z[v]) - m) / o.temperature);
      double u = rng.uniform() * sum;
      std::int64_t pick = 0;
      while (pick + 1 < V && (u -= p[std::size_t(pick)]) > 0) ++pick;
      ctx.push_back(std::int32_t(pick));
      passage += vocab.decode(pick);
    }
  }

  const std::size_t peak = steps.measured_device_bytes();
  if (!session.leader()) return 0;  // rank 0 reports
  if (!a.json) {
    std::printf("validation loss %.4f after %lld steps; median step %.1f ms; device peak %s%s\n", val,
                static_cast<long long>(s), session.step_ms_median(), format_bytes(peak).c_str(),
                budget_total ? (" of a " + format_bytes(budget_total) + " budget").c_str() : "");
    if (!passage.empty()) std::printf("\n--- sampled at temperature %.2f ---\n%s%s\n", o.temperature, o.prompt.c_str(), passage.c_str());
  } else if (!passage.empty()) {
    std::fprintf(stderr, "\n--- sampled at temperature %.2f ---\n%s%s\n", o.temperature, o.prompt.c_str(), passage.c_str());
  }
  session.write_plot("gpt on " + std::string(real ? "Tiny Shakespeare" : "generated text"), step.plan(), free_train.plan,
                     budget_total, step.measured_device_bytes(), "validation loss", std::make_pair(s, val));
  if (a.json) {
    samples::JsonLine j = session.summary_json(s, peak, budget_total, step, free_train.plan.total_bytes() + free_eval.plan.total_bytes());
    j.add("data", real ? "shakespeare" : "generated")
        .add("metric", "val_loss")
        .add("val_loss", val)
        .add("batch", B)
        .add("context", T)
        .add("parameters", model.num_parameters())
        .add("sample_text", passage);
    std::printf("%s\n", j.str().c_str());
  }
  return 0;
} catch (const frugal::Error& e) {
  std::fprintf(stderr, "gpt: %s\n", e.what());
  return 1;
}
