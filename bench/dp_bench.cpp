// Data-parallel training speed and memory per rank (issue 16): the peer's
// mlp and gpt workloads (../shared/peer/torch_ddp_bench.py: same shapes,
// optimizers and global batch, split evenly over the ranks), run under
//   mpirun -np N dp_bench --workload mlp|gpt [--threads T] [--steps S] [--warmup W]
// Prints one line on rank 0: RESULT {json} with the keys the peer's
// run-ddp-peer prints (ms_step_median on rank 0, ms_step_median_slowest,
// peak_rss_mib_per_rank, optimizer_state_bytes_per_rank, loss_first,
// loss_last as the mean over ranks). bench/dp-vs-peer runs both.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <frugal/dist/mpi.hpp>
#include <frugal/frugal.hpp>
#include <iostream>
#include <string>
#include <vector>

using namespace frugal;

namespace {

Tensor randn(Shape s, Rng& r) {
  Tensor t(std::move(s));
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = float(r.normal());
  return t;
}
Tensor randint(Shape s, std::int64_t hi, Rng& r) {
  Tensor t(std::move(s), DType::i32);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data<std::int32_t>()[i] = std::int32_t(r.below(std::uint64_t(hi)));
  return t;
}

struct Mlp : nn::Module {
  nn::Linear a{784, 1024}, b{1024, 1024}, c{1024, 10};
  Mlp() {
    register_module("fc1", a);
    register_module("fc2", b);
    register_module("fc3", c);
  }
  Var forward(Var x) { return c(relu(b(relu(a(x))))); }
};

double state_bytes(const Optimizer& o) {
  double b = 0;
  for (auto& s : o.state()) b += double(s.tensor.nbytes());
  return b;
}

struct Arguments {
  std::string workload = "gpt";
  int threads = 1, steps = 0, warmup = -1;
};

}  // namespace

int main(int argc, char** argv) {
  Arguments a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--workload") a.workload = v;
    else if (k == "--threads") a.threads = std::stoi(v);
    else if (k == "--steps") a.steps = std::stoi(v);
    else if (k == "--warmup") a.warmup = std::stoi(v);
    else {
      std::cerr << "dp_bench: unknown option " << k << "\n";
      return 2;
    }
  }
  try {
    auto comm = dist::Mpi::world();
    const int n = comm->size(), me = comm->rank();
    CompileOptions o;
    o.threads = a.threads;
    o.communicator = comm;
    std::unique_ptr<nn::Module> model;
    std::unique_ptr<Optimizer> opt;
    std::unique_ptr<Step> step;
    Tensor x, y;
    int steps = 0, warmup = 0;
    Rng r(1);
    if (a.workload == "mlp") {  // 784-1024-1024-10, batch 256, SGD(0.01, momentum 0.9)
      if (256 % n) fail("dp_bench: the global batch 256 does not split over ", n, " ranks");
      const std::int64_t b = 256 / n;
      auto m = std::make_unique<Mlp>();
      opt = std::make_unique<optim::SGD>(m->parameters(), optim::SGDOptions{.lr = 0.01, .momentum = 0.9});
      Tensor gx = randn({256, 784}, r), gy = randint({256}, 10, r);
      x = Tensor({b, 784});
      y = Tensor({b}, DType::i32);
      std::memcpy(x.raw(), gx.data<float>() + me * b * 784, std::size_t(b * 784) * 4);
      std::memcpy(y.raw(), gy.data<std::int32_t>() + me * b, std::size_t(b) * 4);
      Mlp* mp = m.get();
      step = std::make_unique<Step>(compile([mp](Var xv, Var yv) { return cross_entropy(mp->forward(xv), yv); },
                                            {input<float>({b, 784}), input<std::int32_t>({b})}, *opt, {}, o));
      model = std::move(m);
      steps = 30, warmup = 3;
    } else if (a.workload == "gpt") {  // vocab 512, context 128, 4 layers, d 256, 4 heads, batch 8, AdamW
      if (8 % n) fail("dp_bench: the global batch 8 does not split over ", n, " ranks");
      const std::int64_t b = 8 / n;
      auto m = std::make_unique<nn::Gpt>(nn::GptConfig{.vocab = 512, .context = 128, .layers = 4, .d_model = 256, .heads = 4});
      opt = std::make_unique<optim::AdamW>(
          m->parameters(), optim::AdamWOptions{.lr = 3e-4, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1});
      Tensor gx = randint({8, 128}, 512, r), gy = randint({8, 128}, 512, r);
      x = Tensor({b, 128}, DType::i32);
      y = Tensor({b, 128}, DType::i32);
      std::memcpy(x.raw(), gx.data<std::int32_t>() + me * b * 128, std::size_t(b * 128) * 4);
      std::memcpy(y.raw(), gy.data<std::int32_t>() + me * b * 128, std::size_t(b * 128) * 4);
      nn::Gpt* mp = m.get();
      step = std::make_unique<Step>(compile([mp](Var i, Var t) { return mp->loss(i, t); },
                                            {input<std::int32_t>({b, 128}), input<std::int32_t>({b, 128})}, *opt, {}, o));
      model = std::move(m);
      steps = 30, warmup = 3;
    } else {
      fail("dp_bench: unknown workload '", a.workload, "': use mlp or gpt");
    }
    if (a.steps > 0) steps = a.steps;
    if (a.warmup >= 0) warmup = a.warmup;
    std::vector<double> ms;
    std::vector<float> losses;
    for (int s = 0; s < warmup + steps; ++s) {
      comm->barrier("dp_bench: step start");  // every rank starts each step together
      const auto t0 = std::chrono::steady_clock::now();
      const float l = step->run(x, y);
      const double t = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (s >= warmup) ms.push_back(t);
      losses.push_back(l);
    }
    std::sort(ms.begin(), ms.end());
    const double median = ms[ms.size() / 2];
    // Per rank: median, peak RSS, optimizer state; gathered to every rank.
    double mine[3] = {median, double(peak_rss_bytes()) / (1 << 20), state_bytes(*opt)};
    std::vector<double> all(std::size_t(3 * n));
    comm->all_gather(mine, all.data(), 3, DType::f64, "dp_bench: results");
    float ends[2] = {losses.front(), losses.back()};
    std::vector<float> all_ends(std::size_t(2 * n));
    comm->all_gather(ends, all_ends.data(), 2, DType::f32, "dp_bench: losses");
    if (me == 0) {
      double slowest = 0, first = 0, last = 0;
      std::string rss = "[", opt_bytes = "[";
      for (int k = 0; k < n; ++k) {
        slowest = std::max(slowest, all[std::size_t(3 * k)]);
        rss += cat(k ? "," : "", all[std::size_t(3 * k + 1)]);
        opt_bytes += cat(k ? "," : "", std::int64_t(all[std::size_t(3 * k + 2)]));
        first += all_ends[std::size_t(2 * k)] / n;
        last += all_ends[std::size_t(2 * k + 1)] / n;
      }
      std::printf("RESULT {\"workload\":\"%s\",\"world\":%d,\"threads\":%d,\"ms_step_median\":%.3f,"
                  "\"ms_step_median_slowest\":%.3f,\"peak_rss_mib_per_rank\":%s],"
                  "\"optimizer_state_bytes_per_rank\":%s],\"loss_first\":%.6f,\"loss_last\":%.6f,\"steps\":%d}\n",
                  a.workload.c_str(), n, a.threads, median, slowest, rss.c_str(), opt_bytes.c_str(), first, last, steps);
    }
  } catch (const std::exception& e) {
    std::cerr << "dp_bench: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
