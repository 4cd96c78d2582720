#pragma once
// The four training workloads of the PyTorch peer (../shared/peer/
// torch_bench.py), built with frugal: same shapes, optimizers and
// hyper-parameters. The data is synthetic and fixed, like the peer's; the
// random numbers differ (frugal's Philox, not torch's generator), so the
// losses agree in scale, not in digits.
#include <memory>
#include <string>

#include <frugal/frugal.hpp>

namespace bench {

using namespace frugal;

struct Workload {
  virtual ~Workload() = default;
  virtual float step() = 0;
  virtual std::size_t arena_bytes() const = 0;
  std::int64_t batch = 0;
  std::int64_t params = 0;
  std::string unit = "samples";
  int default_warmup = 3, default_steps = 30;
};

inline Tensor randn(Shape s, Rng& r) {
  Tensor t(std::move(s), DType::f32);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = float(r.normal());
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
  std::unique_ptr<Step> s;

  explicit MlpWorkload(int threads) {
    Rng r(1);
    x = randn({256, 784}, r);
    y = randint({256}, 10, r);
    s = std::make_unique<Step>(compile([&](Var xv, Var yv) { return cross_entropy(net.forward(xv), yv); },
                                       {input<float>({256, 784}), input<std::int32_t>({256})}, opt, {},
                                       {.threads = threads}));
    batch = 256;
    params = net.num_parameters();
    default_warmup = 5;
    default_steps = 50;
  }
  float step() override { return s->run(x, y); }
  std::size_t arena_bytes() const override { return s->arena_bytes(); }
};

inline std::unique_ptr<Workload> make_workload(const std::string& name, int threads) {
  if (name == "mlp") return std::make_unique<MlpWorkload>(threads);
  fail("train_bench: unknown workload '", name, "': use mlp, resnet, gpt or gcn");
}

}  // namespace bench
