#pragma once
// resnet --corun N|max: retraining beside live inference on one device
// budget (Corun). The model keeps training on Fashion-MNIST while N serving
// streams, each a thread of its own, answer batches of test images with the
// deployed weights; every --publish-every steps the retrained weights are
// deployed. One MemoryBroker plans the training step and every serving step
// within --budget (the whole process's device memory; a percentage is of the
// training step and one serving step, unconstrained), and how many streams
// run is decided from their plans at admission (--corun max: as many as fit,
// up to --max-streams), never by running out of memory.
//
// Each stream runs closed loop: it asks again as soon as it is answered. A
// query's latency is from asking to the answer, waits for a publish
// included; the percentiles are a t-digest's (frugal::StreamingQuantiles).
// --serial then runs the same work one job after another (the training
// steps alone, then the same query batches on one stream alone) for the
// comparison.
#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <thread>

#include <frugal/frugal.hpp>

#include "../common/session.hpp"

namespace corun {

using namespace frugal;
using Clock = std::chrono::steady_clock;

struct Options {
  std::string streams;  // "", N or "max"
  std::int64_t max_streams = 8, query_batch = 16, publish_every = 20;
  bool serial = false;

  void declare(samples::Cli& cli) {
    cli.option("--corun", streams,
               "N or max: train while N serving streams (threads) answer test queries with the deployed weights, "
               "all within --budget; max: as many as their plans fit (off by default)");
    cli.option("--max-streams", max_streams, "with --corun max: admit at most this many streams (default 8)");
    cli.option("--query-batch", query_batch, "with --corun: images per query (default 16)");
    cli.option("--publish-every", publish_every, "with --corun: deploy the retrained weights every N steps (default 20)");
    cli.flag("--serial", serial, "with --corun: also run the same work one job after another, and compare");
  }
  bool on() const { return !streams.empty(); }
  int wanted(const samples::Cli& cli) const {
    if (streams == "max") {
      if (max_streams < 1) cli.usage_error("--max-streams must be positive");
      return int(max_streams);
    }
    std::int64_t n = 0;
    try {
      std::size_t used = 0;
      n = std::stoll(streams, &used);
      if (used != streams.size()) n = 0;
    } catch (const std::exception&) {
      n = 0;
    }
    if (n < 1) cli.usage_error("--corun takes a positive number of streams or max, got '" + streams + "'");
    return int(n);
  }
};

// One serving stream's record.
struct Stream {
  StreamingQuantiles latency_ms{200};
  std::int64_t queries = 0, images = 0;
  std::map<std::int64_t, std::pair<std::int64_t, std::int64_t>> by_version;  // version -> (correct, seen)
};

struct Data {
  const data::TrainTestImages& d;
  std::int64_t n_test;
  // The test images of query k of stream i: a window that moves through the
  // test set, a different one for each stream.
  std::int64_t first_image(int i, std::int64_t k, std::int64_t Q) const {
    const std::int64_t windows = std::max<std::int64_t>(1, n_test - Q + 1);
    return (std::int64_t(i) * 7919 + k * Q) % windows;
  }
};

// Answers one query on `step` and scores it.
inline void answer(Step& step, const Data& data, std::int64_t first, Tensor& x, std::int64_t& correct) {
  const std::int64_t Q = x.shape()[0];
  std::memcpy(x.raw(), data.d.test.images.data<float>() + first * 784, std::size_t(Q * 784) * sizeof(float));
  step.run(x);
  const float* z = step.output().data<float>();
  for (std::int64_t r = 0; r < Q; ++r)
    correct += samples::row_correct(z + r * 10, 10, data.d.test.labels.data<std::int32_t>()[first + r]);
}

template <class MakeModel, class TrainFn, class NextBatch>
int run(const Options& co, const samples::Cli& cli, samples::Session& session, const Data& data, nn::Layer& model,
        MakeModel&& make_model, Optimizer& opt, TrainFn& train_fn, const std::vector<InputSpec>& train_in,
        CompileOptions copts, std::int64_t total, const std::string& config, NextBatch&& next_batch) {
  const samples::CommonArgs& a = session.args();
  const int wanted = co.wanted(cli);
  if (co.query_batch < 1 || co.query_batch > data.n_test)
    cli.usage_error("--query-batch must be between 1 and the test images (" + std::to_string(data.n_test) + ")");
  if (co.publish_every < 1) cli.usage_error("--publish-every must be positive");
  const std::int64_t Q = co.query_batch;

  // The deployed model: the same architecture, its own tensors, in eval
  // mode for good (batch norm with its running statistics).
  nn::manual_seed(std::uint64_t(a.seed));
  std::unique_ptr<nn::Layer> served = make_model();
  served->eval();
  ServedWeights weights(model, *served);
  weights.publish({});  // deploy what training starts from (a --resume'd model)
  auto serve_fn = [m = served.get()](Var x) { return m->forward(x); };
  const std::vector<InputSpec> query_in{input<float>({Q, 1, 28, 28}, "queries")};
  CompileOptions serve_opts = copts;
  serve_opts.threads = 1;  // a stream is one thread
  // The plans admission counted are the ones that run: no re-plan on
  // measured times (the broker would take one only within each share).
  serve_opts.replan = false;
  copts.replan = false;

  auto train_compile = [&](const Budget& b) { return compile(train_fn, train_in, opt, b, copts); };
  auto train_plan = [&](const Budget& b) { return plan_training(train_fn, train_in, opt, b, copts); };
  auto serve_compile = [&](const Budget& b) { return compile_inference(serve_fn, query_in, b, serve_opts); };
  auto serve_plan = [&](const Budget& b) { return plan_inference(serve_fn, query_in, b, serve_opts); };

  const PlannedStep free_train = train_plan({});
  const PlannedStep free_serve = serve_plan({});
  Budget whole;
  whole.host = a.host.empty() ? 0 : parse_bytes(a.host);
  whole.nvme_dir = a.nvme_dir;
  const std::size_t one_each = free_train.plan.total_bytes() + free_serve.plan.total_bytes();
  // Without --budget: room for every stream asked for, unconstrained.
  whole.device = a.budget.empty()
                     ? free_train.plan.total_bytes() + free_serve.plan.persistent_bytes +
                           std::size_t(wanted) * free_serve.plan.arena_bytes
                     : parse_bytes(a.budget, one_each);
  MemoryBroker broker(whole);
  MemoryBroker::Id train_id;
  try {
    train_id = broker.join("retraining", train_compile, train_plan);
  } catch (const BudgetError& e) {
    throw BudgetError(cat("--budget ", format_bytes(whole.device), " cannot hold the training step: ", e.what()),
                      e.smallest_feasible_bytes);
  }
  StreamAdmission admitted;
  try {
    admitted = admit_streams(broker, "serving", serve_compile, serve_plan, wanted);
  } catch (const BudgetError& e) {
    throw BudgetError(cat("--budget ", format_bytes(whole.device), " holds the training step but not one serving "
                          "stream beside it; use --budget ", e.smallest_feasible_bytes, " (",
                          format_bytes(e.smallest_feasible_bytes), ") or more"),
                      e.smallest_feasible_bytes);
  }
  const int N = int(admitted.ids.size());
  if (co.streams != "max" && N < wanted)
    fail<BudgetError>("--corun ", wanted, ": only ", N, " serving streams fit beside training in --budget ",
                      format_bytes(whole.device), "; ", wanted > N + 1 ? "the next" : "one more", " needs ",
                      format_bytes(admitted.next_needs_bytes), " (", admitted.next_needs_bytes,
                      " bytes). Give more --budget, or --corun max to run as many as fit");
  Step& train = broker.step(train_id);
  std::vector<Step*> serving;
  for (auto id : admitted.ids) serving.push_back(&broker.step(id));
  // --resume: the checkpoint's weights are retrained, and deployed first.
  const std::int64_t first = session.resume(model, opt, {&train}, config);
  if (first > total) fail("the checkpoint is at step ", first, ", past --steps ", total);
  weights.publish(serving);
  std::FILE* out = session.out();
  std::fprintf(out, "corun: %d serving stream%s of %lld images beside training, in %s%s\n%s", N, N == 1 ? "" : "s",
               static_cast<long long>(Q), format_bytes(whole.device).c_str(),
               admitted.refusal.empty() ? " (the cap --max-streams stopped admission)"
                                        : cat(" (one more would need ", format_bytes(admitted.next_needs_bytes), ")").c_str(),
               broker.summary().c_str());
  std::fflush(out);

  // Retraining in this thread, the streams in theirs.
  std::vector<Stream> streams(static_cast<std::size_t>(N));
  std::atomic<bool> done{false};
  std::vector<std::thread> threads;
  const auto t0 = Clock::now();
  for (int i = 0; i < N; ++i)
    threads.emplace_back([&, i] {
      Stream& st = streams[std::size_t(i)];
      Tensor x({Q, 1, 28, 28});
      for (std::int64_t k = 0; !done.load(std::memory_order_relaxed); ++k) {
        const auto asked = Clock::now();
        auto hold = weights.reading();
        std::int64_t correct = 0;
        answer(*serving[std::size_t(i)], data, data.first_image(i, k, Q), x, correct);
        const std::int64_t version = weights.version();
        hold.unlock();
        st.latency_ms.add(std::chrono::duration<double, std::milli>(Clock::now() - asked).count());
        ++st.queries;
        st.images += Q;
        auto& [c, seen] = st.by_version[version];
        c += correct;
        seen += Q;
      }
    });
  std::int64_t s = first;
  std::vector<double> train_ms;
  try {
    session.start(s, total, "img", double(train_in[0].meta.shape[0]), whole.device);
    for (; s < total; ++s) {
      auto [xb, yb] = next_batch(s);
      const auto ts = Clock::now();
      const float loss = train.run(xb, yb);
      const double ms = std::chrono::duration<double, std::milli>(Clock::now() - ts).count();
      train_ms.push_back(ms);
      session.step_done(s, loss, ms, broker.measured_device_bytes(), model, opt);
      if ((s + 1) % co.publish_every == 0 || s + 1 == total) weights.publish(serving);
    }
  } catch (...) {
    done = true;
    for (auto& t : threads) t.join();
    throw;
  }
  const double train_s = std::chrono::duration<double>(Clock::now() - t0).count();
  done = true;
  for (auto& t : threads) t.join();
  const double corun_s = std::chrono::duration<double>(Clock::now() - t0).count();
  session.save(model, opt, s);

  // Together: latency over every stream, accuracy of the first and last
  // deployed weights that answered.
  StreamingQuantiles latency(200);
  std::int64_t queries = 0, images = 0;
  std::map<std::int64_t, std::pair<std::int64_t, std::int64_t>> by_version;
  for (const Stream& st : streams) {
    latency.merge(st.latency_ms);
    queries += st.queries;
    images += st.images;
    for (const auto& [v, cs] : st.by_version) {
      by_version[v].first += cs.first;
      by_version[v].second += cs.second;
    }
  }
  auto accuracy_of = [&](const std::pair<std::int64_t, std::int64_t>& cs) {
    return cs.second ? double(cs.first) / double(cs.second) : 0.0;
  };
  const double acc_first = by_version.empty() ? 0 : accuracy_of(by_version.begin()->second);
  const double acc_last = by_version.empty() ? 0 : accuracy_of(by_version.rbegin()->second);
  const std::size_t measured = broker.measured_device_bytes();

  // The same work one job after another: the training steps alone, then the
  // same queries on one stream alone (training goes on from where it is:
  // only the time is compared, and the checkpoint was saved above).
  double serial_train_s = 0, serial_serve_s = 0;
  if (co.serial) {
    auto ts = Clock::now();
    for (std::int64_t k = 0; k < std::int64_t(train_ms.size()); ++k) {
      auto [xb, yb] = next_batch(total - 1);
      train.run(xb, yb);
    }
    serial_train_s = std::chrono::duration<double>(Clock::now() - ts).count();
    ts = Clock::now();
    Tensor x({Q, 1, 28, 28});
    std::int64_t ignored = 0;
    for (std::int64_t k = 0; k < queries; ++k) answer(*serving[0], data, data.first_image(0, k, Q), x, ignored);
    serial_serve_s = std::chrono::duration<double>(Clock::now() - ts).count();
  }

  std::sort(train_ms.begin(), train_ms.end());
  const double train_ms_median = train_ms.empty() ? 0 : train_ms[train_ms.size() / 2];
  const double qps = corun_s > 0 ? double(images) / corun_s : 0;
  if (!a.json) {
    std::printf("corun: %d streams answered %lld queries (%.0f images/s), latency p50 %.2f ms, p99 %.2f ms; "
                "training %lld steps in %.2f s (median step %.1f ms); served accuracy %.2f%% with the first "
                "weights, %.2f%% with the last (%lld deployed); device %s of %s\n",
                N, static_cast<long long>(queries), qps, latency.quantile(0.5), latency.quantile(0.99),
                static_cast<long long>(train_ms.size()), train_s, train_ms_median, 100 * acc_first, 100 * acc_last,
                static_cast<long long>(weights.version()), format_bytes(measured).c_str(),
                format_bytes(whole.device).c_str());
    if (co.serial)
      std::printf("one job after another: training %.2f s, then the same %lld queries on one stream %.2f s: "
                  "%.2f s against %.2f s together (%.2fx)\n",
                  serial_train_s, static_cast<long long>(queries), serial_serve_s, serial_train_s + serial_serve_s,
                  corun_s, corun_s > 0 ? (serial_train_s + serial_serve_s) / corun_s : 0);
    return 0;
  }
  samples::JsonLine j;
  j.add("sample", "resnet")
      .add("mode", "corun")
      .add("streams", N)
      .add("streams_wanted", wanted)
      .add("next_stream_needs_bytes", admitted.next_needs_bytes)
      .add("budget_bytes", whole.device)
      .add("planned_device_bytes", broker.planned_device_bytes())
      .add("peak_device_bytes", measured)
      .add("train_unconstrained_bytes", free_train.plan.total_bytes())
      .add("serve_unconstrained_bytes", free_serve.plan.total_bytes())
      .add("steps", std::int64_t(train_ms.size()))
      .add("final_loss", double(session.last_loss()))
      .add("train_s", train_s)
      .add("step_ms_median", train_ms_median)
      .add("corun_s", corun_s)
      .add("queries", queries)
      .add("query_batch", Q)
      .add("images_per_s", qps)
      .add("latency_ms_p50", latency.quantile(0.5))
      .add("latency_ms_p99", latency.quantile(0.99))
      .add("latency_ms_max", latency.count() ? latency.max() : 0.0)
      .add("versions", weights.version())
      .add("served_accuracy_first", acc_first)
      .add("served_accuracy_last", acc_last)
      .add("threads", a.threads)
      .add("seed", a.seed);
  if (co.serial)
    j.add("serial_train_s", serial_train_s)
        .add("serial_serve_s", serial_serve_s)
        .add("serial_s", serial_train_s + serial_serve_s);
  std::printf("%s\n", j.str().c_str());
  return 0;
}

}  // namespace corun
