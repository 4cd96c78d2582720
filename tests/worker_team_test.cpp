// The CPU kernels' team of threads (backend/cpu/worker_team.hpp): every
// chunk runs once, errors come back, callers on different threads keep to
// their own helpers, and a step's bits do not depend on its thread count.
#include <omp.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <mutex>
#include <set>

#include <atomic>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <frugal/backend/cpu/blas.hpp>
#include <frugal/backend/cpu/conv_avx512.hpp>
#include <frugal/backend/cpu/parallel.hpp>
#include <frugal/frugal.hpp>
#include <random>
#include <stdexcept>
#include <thread>
#include <vector>

#include "thread_count_scope.hpp"
#include "uniform_floats.hpp"

using namespace frugal;

namespace {

std::vector<std::uint32_t> bits_of(const std::vector<float>& v) {
  std::vector<std::uint32_t> b(v.size());
  std::memcpy(b.data(), v.data(), v.size() * 4);
  return b;
}


}  // namespace

TEST_CASE("team: every chunk runs exactly once, at any thread and chunk count", "[team][threads]") {
  for (int threads : {1, 2, 3, 5})
    for (std::int64_t chunks : {1, 2, 3, 7, 64, 1000}) {
      INFO(threads << " threads, " << chunks << " chunks");
      std::vector<std::atomic<int>> runs(static_cast<std::size_t>(chunks));
      for (int rep = 0; rep < 20; ++rep)
        cpu::WorkerTeam::mine().run(chunks, threads, [&](std::int64_t c) { runs[std::size_t(c)]++; });
      int wrong = 0;
      for (auto& r : runs) wrong += r.load() != 20;
      CHECK(wrong == 0);
    }
}

TEST_CASE("team: the helpers do take chunks (the work is shared)", "[team][threads]") {
  // Each chunk waits until two different threads have entered some chunk,
  // so the run finishes only if a helper takes part; a bounded wait keeps a
  // broken team from hanging the suite.
  std::atomic<int> entered{0};
  std::atomic<bool> shared{false};
  cpu::WorkerTeam::mine().run(2, 2, [&](std::int64_t) {
    entered++;
    for (int i = 0; i < 2000 && entered.load() < 2; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (entered.load() >= 2) shared = true;
  });
  CHECK(shared.load());
}

TEST_CASE("team: an exception in a chunk reaches the caller after the others finish", "[team][threads]") {
  std::atomic<int> ran{0};
  auto boom = [&] {
    cpu::WorkerTeam::mine().run(40, 2, [&](std::int64_t c) {
      ran++;
      if (c == 17) throw std::runtime_error("chunk 17 failed");
    });
  };
  CHECK_THROWS_WITH(boom(), "chunk 17 failed");
  CHECK(ran.load() <= 40);
  // The team still works afterwards.
  std::atomic<int> again{0};
  cpu::WorkerTeam::mine().run(40, 2, [&](std::int64_t) { again++; });
  CHECK(again.load() == 40);
}

TEST_CASE("team: a region inside a chunk runs inline, in chunk order", "[team][threads]") {
  std::vector<std::vector<std::int64_t>> order(8);
  cpu::WorkerTeam::mine().run(8, 2, [&](std::int64_t c) {
    cpu::WorkerTeam::mine().run(5, 2, [&](std::int64_t i) { order[std::size_t(c)].push_back(i); });
  });
  for (auto& o : order) CHECK(o == std::vector<std::int64_t>{0, 1, 2, 3, 4});
}

TEST_CASE("team: callers on different threads each run on their own helpers", "[team][threads]") {
  constexpr int kCallers = 3, kRuns = 300;
  std::atomic<int> wrong{0};
  std::vector<std::thread> callers;
  for (int t = 0; t < kCallers; ++t)
    callers.emplace_back([&, t] {
      for (int r = 0; r < kRuns; ++r) {
        std::vector<int> hit(static_cast<std::size_t>(10 + t));
        cpu::WorkerTeam::mine().run(std::int64_t(hit.size()), 2, [&](std::int64_t c) { hit[std::size_t(c)]++; });
        for (int h : hit) wrong += h != 1;
      }
    });
  for (auto& c : callers) c.join();
  CHECK(wrong.load() == 0);
}

TEST_CASE("parallel_sum adds the same chunks in the same order at any thread count", "[team][threads]") {
  const std::int64_t n = 3'000'017;
  std::vector<float> v = test_support::uniform_floats(std::size_t(n), 5);
  auto sum = [&] {
    return cpu::parallel_sum(n, 1, [&](std::int64_t b, std::int64_t e) {
      double s = 0;
      for (std::int64_t i = b; i < e; ++i) s += double(v[std::size_t(i)]) * 1e-3;
      return s;
    });
  };
  double at[3];
  for (int t = 1; t <= 3; ++t) {
    test_support::ThreadCount ts(t);
    at[t - 1] = sum();
  }
  CHECK(std::memcmp(&at[0], &at[1], sizeof(double)) == 0);
  CHECK(std::memcmp(&at[0], &at[2], sizeof(double)) == 0);
}

// (Each engine's accuracy against float64 is tests/gemm_test.cpp's.)
TEST_CASE("gemm: the same bits at any thread count", "[team][threads][blas]") {
  struct Case {
    bool ta, tb;
    std::int64_t m, n, k;
  };
  const Case cases[] = {{false, false, 1024, 128, 128}, {false, true, 200, 700, 96},  {true, false, 333, 257, 190},
                        {true, true, 64, 2048, 64},      {false, false, 7, 3000, 300}, {false, true, 3000, 5, 200}};
  for (const Case& c : cases) {
    INFO("ta " << c.ta << " tb " << c.tb << " m " << c.m << " n " << c.n << " k " << c.k);
    const std::int64_t lda = c.ta ? c.m : c.k, ldb = c.tb ? c.k : c.n;
    auto A = test_support::uniform_floats(std::size_t(c.m * c.k), 1), B = test_support::uniform_floats(std::size_t(c.k * c.n), 2);
    auto C0 = test_support::uniform_floats(std::size_t(c.m * c.n), 3);
    // The product at 1, 2 and 3 threads: C's bytes must not change.
    auto same_at_every_count = [&](const auto& a, const auto& b, const auto& c0, const char* dtype) {
      auto first = c0;
      for (int t : {1, 2, 3}) {
        test_support::ThreadCount ts(t);
        auto C = c0;
        cpu::gemm(c.ta, c.tb, c.m, c.n, c.k, 0.5f, a.data(), lda, b.data(), ldb, 2.f, C.data(), c.n);
        if (t == 1) {
          first = C;
        } else {
          INFO(t << " threads, " << dtype);
          CHECK(std::memcmp(C.data(), first.data(), C.size() * sizeof(C[0])) == 0);
        }
      }
    };
    same_at_every_count(A, B, C0, "f32");
    // The bf16 kernel's tiles follow the team's size too (gemm_tiles).
    if (cpu::bf16_gemm_direct(c.k)) {
      auto to_bf16 = [](const std::vector<float>& v) { return std::vector<BFloat16>(v.begin(), v.end()); };
      same_at_every_count(to_bf16(A), to_bf16(B), to_bf16(C0), "bf16");
    }
  }
}

namespace {

// Losses of `steps` steps and then every parameter, as bits.
template <class Model, class Loss>
std::vector<std::uint32_t> train_bits(Model& model, Loss loss, std::vector<InputSpec> specs,
                                      const std::vector<std::vector<Tensor>>& batches, int threads,
                                      const std::string& conv_engine = "auto") {
  optim::AdamW opt(model.parameters(), {.lr = 1e-2});
  CompileOptions o{.threads = threads};
  o.backend_options.conv_engine = conv_engine;
  Step step = compile(loss, std::move(specs), opt, Budget{}, o);
  std::vector<float> all;
  for (const auto& b : batches) all.push_back(step.run(b[0], b[1]));
  for (const Tensor& p : model.parameters()) all.insert(all.end(), p.data<float>(), p.data<float>() + p.numel());
  return bits_of(all);
}

}  // namespace

TEST_CASE("a step's parameters and losses are bitwise the same at 1, 2 and 3 threads", "[team][threads][step]") {
  SECTION("gpt: linear, attention, layer norm, GELU, cross-entropy, AdamW") {
    std::vector<std::vector<Tensor>> batches;
    for (int s = 0; s < 3; ++s) {
      Tensor idx({4, 64}, DType::i32), tgt({4, 64}, DType::i32);
      std::mt19937 g(std::uint32_t(s + 1));
      for (std::int64_t i = 0; i < idx.numel(); ++i) {
        idx.data<std::int32_t>()[i] = std::int32_t(g() % 64);
        tgt.data<std::int32_t>()[i] = std::int32_t(g() % 64);
      }
      batches.push_back({idx, tgt});
    }
    std::vector<std::uint32_t> first;
    for (int threads : {1, 2, 3}) {
      INFO(threads << " threads");
      nn::manual_seed(3);
      nn::Gpt model({.vocab = 64, .context = 64, .layers = 2, .d_model = 128, .heads = 4});
      auto bits = train_bits(
          model, [&](Var idx, Var tgt) { return model.loss(idx, tgt); },
          {input<std::int32_t>({4, 64}), input<std::int32_t>({4, 64})}, batches, threads);
      if (threads == 1) first = bits;
      else CHECK(bits == first);
    }
  }
  SECTION("resnet: convolutions of both engines, batch norm, pooling") {
    std::vector<std::vector<Tensor>> batches;
    for (int s = 0; s < 2; ++s) {
      Tensor x({8, 3, 16, 16}), y({8}, DType::i32);
      auto v = test_support::uniform_floats(std::size_t(x.numel()), std::uint32_t(10 + s));
      std::copy(v.begin(), v.end(), x.data<float>());
      for (int i = 0; i < 8; ++i) y.data<std::int32_t>()[i] = (i * 7 + s) % 10;
      batches.push_back({x, y});
    }
    std::vector<std::string> engines{"blas"};
    if (cpu::conv_fast::available()) engines.push_back("avx512");
    for (const std::string& engine : engines) {
      std::vector<std::uint32_t> first;
      for (int threads : {1, 2, 3}) {
        INFO(engine << " engine, " << threads << " threads");
        nn::manual_seed(5);
        nn::ResNet<nn::BasicBlock> model(16, {{16, 1, 1}, {32, 1, 2}}, 10);
        auto bits = train_bits(
            model, [&](Var x, Var y) { return cross_entropy(model(x), y); },
            {input<float>({8, 3, 16, 16}), input<std::int32_t>({8})}, batches, threads, engine);
        if (threads == 1) first = bits;
        else CHECK(bits == first);
      }
    }
  }
}

// A forked child has only the thread that forked: the team's helpers from
// before the fork do not exist there. The child's team must make new ones
// (before, it ran every chunk on the caller alone) and exit cleanly.
TEST_CASE("a forked child's team makes new helpers and exits cleanly", "[team]") {
  test_support::ThreadCount ts(2);
  cpu::WorkerTeam::mine().run(64, 2, [](std::int64_t) {});  // the parent's helper exists
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    std::mutex mu;
    std::set<std::thread::id> ids;
    std::atomic<int> started{0};
    // Two chunks, each waiting (up to 10 s, not a timing bound: a team
    // without a helper never starts the second while the first waits) until
    // both have started: they can only both start on two threads.
    cpu::WorkerTeam::mine().run(2, 2, [&](std::int64_t) {
      {
        std::lock_guard<std::mutex> lock(mu);
        ids.insert(std::this_thread::get_id());
      }
      started.fetch_add(1);
      for (int i = 0; i < 10000 && started.load() < 2; ++i) usleep(1000);
    });
    std::exit(int(ids.size()));  // runs the team's destructor: it must not hang
  }
  int status = 0;
  bool exited = false;
  for (int i = 0; i < 600 && !exited; ++i) {  // up to 30 s
    if (waitpid(pid, &status, WNOHANG) == pid) exited = true;
    else usleep(50000);
  }
  if (!exited) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
  }
  REQUIRE(exited);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 2);  // the chunks ran on two threads
}
