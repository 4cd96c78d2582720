// gpt_elastic: the gpt sample's model and text, trained as an elastic MPI
// job (dist/elastic.hpp). Ranks join and leave while it trains, on a
// schedule (--scale), and a rank it kills (--kill) is recovered from the
// replica of its state on its neighbour.
//
//   scripts/frugal-elastic-run -np 2 gpt_elastic --steps 60 --scale 20:4,40:2
//   scripts/frugal-elastic-run -np 3 gpt_elastic --steps 40 --kill 15:1
//   mpirun -np 2 gpt_elastic --fixed     (the same training without elasticity: the baseline)
//
// The job keeps --global-batch sequences per step at every rank count that
// divides it (each rank takes its share of the sample stream), else the
// nearest multiple with the learning rate scaled by the square-root rule.
// Each sequence is a window of the text, drawn from a shuffled epoch of all
// windows (data::EpochStream), so no window is seen twice in an epoch at
// any rank count. Rank 0 prints one JSON line per step and per change of
// membership (--json), or a line every --log-every steps.
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <frugal/dist/elastic.hpp>
#include <frugal/frugal.hpp>
#include <frugal/io/state_slices.hpp>
#if defined(FRUGAL_SAMPLES_NCCL)
#include <frugal/dist/nccl.hpp>
#endif

#include "../common/cli.hpp"
#include "../common/json_line.hpp"
#include "../gpt/text_data.hpp"

using namespace frugal;

namespace {

struct Options {
  std::int64_t steps = 60, global_batch = 12, max_rank_batch = 0, context = 32, layers = 2, d_model = 64, heads = 4;
  std::int64_t zero = 0, seed = 1, threads = 1, log_every = 10;
  double lr = 2e-3, failure_timeout = 10;
  std::int64_t join_within = 0;
  std::string data = "../shared/data/shakespeare", scale, kill, device = "cpu", lr_rule = "sqrt", checkpoint;
  std::int64_t save_every = 0;
  bool fixed = false, json = false, sync_replicas = false, no_process_watch = false;
};

// "20:4,40:2" -> {(20, 4), (40, 2)}
std::vector<std::pair<std::int64_t, std::int64_t>> pairs(const std::string& s, const samples::Cli& cli,
                                                         const char* flag) {
  std::vector<std::pair<std::int64_t, std::int64_t>> out;
  std::size_t at = 0;
  while (at < s.size()) {
    const std::size_t end = std::min(s.find(',', at), s.size()), colon = s.find(':', at);
    try {
      if (colon >= end) throw std::invalid_argument("no colon");
      out.emplace_back(std::stoll(s.substr(at, colon - at)), std::stoll(s.substr(colon + 1, end - colon - 1)));
    } catch (const std::exception&) {
      cli.usage_error(std::string(flag) + " takes STEP:N pairs separated by commas, e.g. 20:4,40:2; got '" + s + "'");
    }
    at = end + 1;
  }
  return out;
}

// What one membership trains: a fresh optimizer and the step compiled over its ranks.
struct Trainee {
  std::unique_ptr<optim::AdamW> opt;
  std::optional<Step> step;
  Tensor x, y;
};

}  // namespace

int main(int argc, char** argv) try {
  dist::ElasticJob::init_mpi();  // first: ranks that spawn this one wait for it
  Options o;
  samples::Cli cli("gpt_elastic", "Trains the gpt sample's model as an elastic MPI job: ranks join, leave and die.");
  cli.option("--steps", o.steps, "training steps (default 60)");
  cli.option("--global-batch", o.global_batch, "sequences per step over all ranks (default 12)");
  cli.option("--max-rank-batch", o.max_rank_batch, "most sequences one rank's step takes (default: no limit)");
  cli.option("--context", o.context, "characters per sequence (default 32)");
  cli.option("--layers", o.layers, "transformer blocks (default 2)");
  cli.option("--d-model", o.d_model, "model width (default 64)");
  cli.option("--heads", o.heads, "attention heads (default 4)");
  cli.option("--lr", o.lr, "learning rate for --global-batch (AdamW after 10 warm-up steps; default 2e-3)");
  cli.option("--lr-rule", o.lr_rule,
             "where the ranks cannot keep --global-batch: scale the learning rate by sqrt "
             "(default), linear, or none");
  cli.option("--zero", o.zero, "ZeRO stage 0-3 (default 0)");
  cli.option("--seed", o.seed, "seed for initialisation and data order (default 1)");
  cli.option("--threads", o.threads, "threads per rank (default 1)");
  cli.option("--device", o.device, "cpu, or cuda: a GPU per rank, with NCCL over each membership's ranks");
  cli.option("--data", o.data, "directory with input.txt (default ../shared/data/shakespeare; else generated text)");
  cli.option("--scale", o.scale, "STEP:N,...: ask for N ranks from STEP on (rank 0's scheduler)");
  cli.option("--kill", o.kill,
             "STEP:RANK,...: that rank SIGKILLs itself as that step starts (once), the others mid-step");
  cli.option("--failure-timeout", o.failure_timeout,
             "seconds a collective waits before a rank counts as dead (default 10)");
  cli.option("--join-within", o.join_within,
             "steps after which the ranks wait for new ranks to start (default: never)");
  cli.option("--checkpoint", o.checkpoint,
             "a gathered checkpoint saved every --save-every steps, which the job goes "
             "on from where ranks are lost with the replicas of their state");
  cli.option("--save-every", o.save_every, "steps between checkpoints (default: none)");
  cli.option("--log-every", o.log_every, "steps between progress lines (default 10)");
  cli.flag("--fixed", o.fixed, "train without elasticity over mpirun's ranks (the baseline)");
  cli.flag("--sync-replicas", o.sync_replicas,
           "complete each replica exchange before the next step (a lost rank "
           "costs at most the step in flight, not two)");
  cli.flag("--no-process-watch", o.no_process_watch,
           "find a dead rank by --failure-timeout only, as on other "
           "machines, not by its process exiting on this one");
  cli.flag("--json", o.json, "one JSON line per step and per change of membership");
  cli.parse(argc, argv);
  if (o.steps <= 0 || o.global_batch <= 0 || o.context <= 1 || o.d_model % o.heads || o.zero < 0 || o.zero > 3)
    cli.usage_error("--steps, --global-batch positive, --context above 1, --d-model a multiple of --heads, --zero 0-3");
  const auto schedule = pairs(o.scale, cli, "--scale");
  if (o.lr_rule != "sqrt" && o.lr_rule != "linear" && o.lr_rule != "none")
    cli.usage_error("--lr-rule is sqrt, linear or none");
  const dist::ScalingPolicy policy{o.global_batch, o.max_rank_batch,
                                   o.lr_rule == "sqrt"     ? dist::ScalingPolicy::LrRule::sqrt
                                   : o.lr_rule == "linear" ? dist::ScalingPolicy::LrRule::linear
                                                           : dist::ScalingPolicy::LrRule::none};
  const auto kills = pairs(o.kill, cli, "--kill");

  const std::filesystem::path file = std::filesystem::path(o.data) / "input.txt";
  const std::string text = std::filesystem::exists(file) ? data::read_text_file(file)
                                                         : samples::generated_text(std::uint64_t(o.seed), 400000);
  data::CharVocab vocab(text);
  const data::TokenSplit split = data::split_tokens(vocab.encode(text), 0.1);
  const std::int64_t T = o.context, windows = (std::int64_t(split.train.size()) - 1) / T;
  data::EpochStream stream(windows, std::uint64_t(o.seed));

  nn::manual_seed(std::uint64_t(o.seed));  // every rank starts from the same weights
  nn::Gpt model({.vocab = vocab.size(), .context = T, .layers = o.layers, .d_model = o.d_model, .heads = o.heads});
  const optim::AdamWOptions adamw{.lr = o.lr, .beta1 = 0.9, .beta2 = 0.99, .weight_decay = 0.1};
  auto lr_at = [&](std::int64_t s, double scale) { return o.lr * scale * std::min(1.0, double(s + 1) / 10.0); };

  Trainee t;
  auto build = [&](const dist::Membership& m) {
    t.step.reset();  // the last membership's step and optimizer go first
    t.opt = std::make_unique<optim::AdamW>(model.parameters(), adamw);
    CompileOptions c{.backend = o.device, .threads = int(o.threads), .replan = false};
    c.communicator = m.comm;
    if (o.device == "cuda") {  // NCCL over this membership's ranks, bootstrapped through its MPI communicator
#if defined(FRUGAL_SAMPLES_NCCL)
      c.communicator = dist::Nccl::over(*m.comm, {.timeout_seconds = o.failure_timeout});
#else
      fail("--device cuda: this build of the samples has no NCCL (configure where the CUDA toolkit and NCCL are)");
#endif
    }
    c.zero_stage = int(o.zero);
    const std::int64_t rows = m.batch.rank_batch;
    t.step.emplace(compile([&](Var x, Var y) { return model.loss(x, y); },
                           {input<std::int32_t>({rows, T}, "tokens"), input<std::int32_t>({rows, T}, "targets")},
                           *t.opt, Budget{}, c));
    t.x = Tensor({rows, T}, DType::i32);
    t.y = Tensor({rows, T}, DType::i32);
  };
  // Rows [first, first + rows) of the sample stream: windows of the text.
  auto fill = [&](std::int64_t first) {
    const std::int64_t rows = t.x.shape()[0];
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::size_t at = std::size_t(stream.item(first + r) * T);
      std::copy_n(split.train.begin() + std::ptrdiff_t(at), T, t.x.data<std::int32_t>() + r * T);
      std::copy_n(split.train.begin() + std::ptrdiff_t(at) + 1, T, t.y.data<std::int32_t>() + r * T);
    }
  };
  std::int64_t started = -1;  // the last step this process began: a step redone after a failure kills no one
  auto run = [&](int rank, std::int64_t s, std::int64_t first, double lr_scale) {
    fill(first);
    t.opt->set_lr(lr_at(s, lr_scale));
    for (auto& [at, who] : kills)
      if (at == s && who == rank && s > started)
        raise(SIGKILL);  // the others are in this step, and wait in its collectives for this rank's gradients
    started = std::max(started, s);
    return double(t.step->run(t.x, t.y));
  };

  std::int64_t shown = 0;
  auto report = [&](std::int64_t s, double loss, int ranks, double ms) {
    if (o.json) {
      samples::JsonLine j;
      j.add("step", s).add("loss", loss).add("ranks", std::int64_t(ranks)).add("ms", ms);
      std::printf("%s\n", j.str().c_str());
    } else if (++shown % o.log_every == 0 || s + 1 == o.steps) {
      std::printf("step %lld: loss %.4f over %d ranks (%.1f ms)\n", static_cast<long long>(s), loss, ranks, ms);
    }
    std::fflush(stdout);
  };

  if (o.fixed) {  // plain data parallelism over mpirun's ranks, the same batches
    auto comm = dist::Mpi::world();
    dist::Membership m{comm, comm->rank(), comm->size(), 0, policy.at(comm->size())};
    build(m);
    for (std::int64_t s = 0; s < o.steps; ++s) {
      const auto t0 = std::chrono::steady_clock::now();
      const double loss = run(m.rank, s, s * m.batch.global_batch + m.rank * m.batch.rank_batch, m.batch.lr_scale);
      std::vector<double> all(std::size_t(m.ranks));
      comm->all_gather(&loss, all.data(), 1, DType::f64, "the ranks' losses");
      double mean = 0;
      for (double l : all) mean += l;
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (m.rank == 0) report(s, mean / m.ranks, m.ranks, ms);
    }
    return 0;
  }

  dist::ElasticOptions eo;
  eo.scaling = policy;
  eo.failure_timeout_seconds = o.failure_timeout;
  eo.max_steps_to_join = o.join_within;
  eo.overlap_replication = !o.sync_replicas;
  eo.watch_processes = !o.no_process_watch;
  eo.target_ranks = [&](std::int64_t s) {
    for (auto& [at, n] : schedule)
      if (at == s) return int(n);
    return 0;
  };
  auto last = std::chrono::steady_clock::now();
  const dist::ElasticJob* job = nullptr;  // the job the hooks serve
  dist::ElasticHooks hooks;
  hooks.build = build;
  hooks.save = [&](const dist::Membership& m, std::vector<char>& out, std::size_t at) {
    io::capture_encoded_slice(model, *t.opt, m.rank, m.ranks, t.opt->steps(), {}, out, at);
  };
  hooks.load = [&](const dist::Membership& m, const std::vector<std::vector<char>>& blobs) {
    std::vector<io::StateSlice> slices;
    for (const auto& b : blobs) slices.push_back(io::decode_slice(b.data(), b.size(), "gpt_elastic: a rank's state"));
    const io::SafetensorsFile whole = io::assemble_slices(slices, model, *t.opt, "gpt_elastic: the job's state");
    const io::TrainingState st =
        io::load_whole_state(whole, model, *t.opt, m.rank, m.ranks, "gpt_elastic: the job's state");
    t.step->set_steps_run(st.step);
    t.step->parameters_changed();
    return io::state_hash(whole);
  };
  hooks.run = [&](const dist::Membership& m, std::int64_t s, std::int64_t first) {
    return run(m.rank, s, first, m.batch.lr_scale);
  };
  hooks.restore = [&](const dist::Membership& m) -> std::optional<dist::Restored> {
    if (o.checkpoint.empty() || !std::filesystem::exists(o.checkpoint)) return std::nullopt;
    const io::TrainingState st = io::load_gathered_checkpoint(o.checkpoint, model, *t.opt, *m.comm);
    t.step->set_steps_run(st.step);
    t.step->parameters_changed();
    return dist::Restored{st.step, std::stoll(st.metadata.at("samples")),
                          io::state_hash(io::read_safetensors(o.checkpoint))};
  };
  hooks.on_step = [&](std::int64_t s, double loss, const dist::Membership& m) {
    if (!o.checkpoint.empty() && o.save_every > 0 && (s + 1) % o.save_every == 0)
      io::save_gathered_checkpoint(o.checkpoint, model, *t.opt, s + 1, *m.comm,
                                   {{"samples", std::to_string(job->samples_seen())}});
    const auto now = std::chrono::steady_clock::now();
    const double ms = std::chrono::duration<double, std::milli>(now - last).count();
    last = now;
    if (m.rank == 0) report(s, loss, m.ranks, ms);
  };
  dist::ElasticJob elastic(eo, hooks);
  job = &elastic;
  if (!elastic.train(o.steps)) return 0;  // released: the others train on

  // What every rank holds of the state it shares with the others must be
  // the same bits: all of it at stage 0, the parameters at stages 1-3.
  const dist::Membership& m = elastic.membership();
  io::SafetensorsFile held;
  held.metadata["step"] = std::to_string(t.opt->steps());
  if (o.zero == 0) {
    const io::StateSlice all = io::capture_slice(model, *t.opt, 0, 1, t.opt->steps());
    Tensor bytes({std::int64_t(all.bytes.size())}, DType::u8);
    std::memcpy(bytes.raw(), all.bytes.data(), all.bytes.size());
    held.tensors.emplace_back("state", bytes);
  } else {
    t.step->gather_parameters();
    held.tensors = model.named_parameters();
  }
  const auto mine = std::int64_t(io::state_hash(held));
  std::vector<std::int64_t> hashes(std::size_t(m.ranks));
  m.comm->all_gather(&mine, hashes.data(), 1, DType::i64, "gpt_elastic: each rank's state");
  const bool agree = std::all_of(hashes.begin(), hashes.end(), [&](std::int64_t h) { return h == mine; });
  if (m.rank != 0) return agree ? 0 : 1;
  for (const auto& e : elastic.events()) {
    const char* kind = e.kind == dist::ElasticEvent::Kind::grow     ? "grow"
                       : e.kind == dist::ElasticEvent::Kind::shrink ? "shrink"
                                                                    : "failure";
    if (o.json) {
      samples::JsonLine j;
      j.add("event", kind)
          .add("step", e.step)
          .add("from", std::int64_t(e.from))
          .add("to", std::int64_t(e.to))
          .add("seconds", e.seconds)
          .add("build_seconds", e.build_seconds)
          .add("spawn_seconds", e.spawn_seconds)
          .add("steps_while_starting", e.steps_while_starting)
          .add("steps_lost", e.steps_lost)
          .add("detect_seconds", e.detect_seconds)
          .add("state_hash", std::to_string(e.state_hash))
          .add("source", e.source);
      std::printf("%s\n", j.str().c_str());
    } else {
      std::printf("%s %d -> %d ranks at step %lld: %.3f s (%.3f s compiling), state from %s\n", kind, e.from, e.to,
                  static_cast<long long>(e.step), e.seconds, e.build_seconds, e.source.c_str());
    }
  }
  if (o.json) {
    samples::JsonLine j;
    j.add("done", o.steps)
        .add("ranks", std::int64_t(m.ranks))
        .add("samples", elastic.samples_seen())
        .add("replica_bytes", std::int64_t(elastic.replica_bytes()))
        .add("replica_ms_per_step", 1e3 * elastic.replica_seconds_per_step())
        .add("boundary_ms_per_step", 1e3 * elastic.boundary_seconds_per_step())
        .add("state_agrees", agree);
    std::printf("%s\n", j.str().c_str());
  } else {
    std::printf("trained %lld steps, %lld samples; %d ranks hold %s state\n", static_cast<long long>(o.steps),
                static_cast<long long>(elastic.samples_seen()), m.ranks, agree ? "the same" : "DIFFERENT");
  }
  return agree ? 0 : 1;
} catch (const frugal::Error& e) {
  std::fprintf(stderr, "gpt_elastic: %s\n", e.what());
  return 1;
}
