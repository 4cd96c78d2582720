// mnist_mlp: an MLP trained on real MNIST digits with frugal's captured
// training step. Trains on the first 8,000 images of the 10k MNIST set in
// ../shared/data/mnist and reports accuracy on the 2,000 it never saw.
//
//   mnist_mlp [--device cpu|cuda] [--budget BYTES|N%] [--data DIR]
//             [--epochs N | --steps N] [--batch N] [--hidden N]
//             [--lr X] [--seed N] [--threads N] [--log-every N] [--json]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <numeric>
#include <string>

#include <frugal/frugal.hpp>

using namespace frugal;
namespace fs = std::filesystem;

struct Args {
  std::string data = "../shared/data/mnist";
  int epochs = 15;
  long steps = 0;  // overrides epochs when > 0
  int batch = 64;
  int hidden = 256;
  double lr = 1e-3;
  std::uint64_t seed = 1;
  int threads = 2;
  int log_every = 100;
  bool json = false;
  std::string device = "cpu";  // the backend the steps run on
  std::string budget;          // training step's device cap: bytes (64MiB) or N% of its unconstrained need
};

[[noreturn]] void usage(const std::string& why) {
  std::cerr << "mnist_mlp: " << why
            << "\nusage: mnist_mlp [--device cpu|cuda] [--budget BYTES|N%] [--data DIR] [--epochs N | --steps N]"
               " [--batch N] [--hidden N] [--lr X]"
               " [--seed N] [--threads N] [--log-every N] [--json]\n";
  std::exit(2);
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) usage(k + " needs a value");
      return argv[++i];
    };
    try {
      if (k == "--data") a.data = val();
      else if (k == "--epochs") a.epochs = std::stoi(val());
      else if (k == "--steps") a.steps = std::stol(val());
      else if (k == "--batch") a.batch = std::stoi(val());
      else if (k == "--hidden") a.hidden = std::stoi(val());
      else if (k == "--lr") a.lr = std::stod(val());
      else if (k == "--seed") a.seed = std::stoull(val());
      else if (k == "--threads") a.threads = std::stoi(val());
      else if (k == "--log-every") a.log_every = std::stoi(val());
      else if (k == "--json") a.json = true;
      else if (k == "--device") a.device = val();
      else if (k == "--budget") a.budget = val();
      else if (k == "--help" || k == "-h") usage("trains an MLP on MNIST");
      else usage("unknown option " + k);
    } catch (const std::invalid_argument&) {
      usage("bad value for " + k);
    }
  }
  if (a.batch <= 0 || a.hidden <= 0 || a.epochs <= 0 || a.threads <= 0 || a.log_every <= 0)
    usage("--batch, --hidden, --epochs, --threads and --log-every must be positive");
  return a;
}

// With no MNIST files, a stand-in task of the same shape: ten random
// prototype images, each sample a noisy copy of its class's prototype.
data::ImageSet generated_digits(std::int64_t n, std::uint64_t seed) {
  Rng rng(seed, 99);
  std::vector<float> proto(10 * 784);
  for (auto& p : proto) p = float(rng.uniform());
  data::ImageSet s{Tensor({n, 784}), Tensor({n}, DType::i32)};
  for (std::int64_t i = 0; i < n; ++i) {
    int c = int(rng.below(10));
    s.labels.data<std::int32_t>()[i] = c;
    for (int j = 0; j < 784; ++j)
      s.images.data<float>()[i * 784 + j] = std::clamp(proto[std::size_t(c * 784 + j)] + 0.35f * float(rng.normal()), 0.f, 1.f);
  }
  return s;
}

struct Mlp : nn::Module {
  nn::Linear fc1, fc2, fc3;
  explicit Mlp(int hidden) : fc1(784, hidden), fc2(hidden, hidden), fc3(hidden, 10) {
    register_module("fc1", fc1);
    register_module("fc2", fc2);
    register_module("fc3", fc3);
  }
  Var forward(Var x) { return fc3(relu(fc2(relu(fc1(x))))); }
};

// Copies rows idx[first, first+n) of `src` into `dst` (a batch tensor).
void gather_rows(const Tensor& src, const std::vector<std::int64_t>& idx, std::size_t first, Tensor& dst) {
  std::size_t row = dst.nbytes() / std::size_t(dst.shape()[0]);
  auto* out = static_cast<char*>(dst.raw());
  auto* in = static_cast<const char*>(src.raw());
  for (std::int64_t r = 0; r < dst.shape()[0]; ++r)
    std::memcpy(out + std::size_t(r) * row, in + std::size_t(idx[first + std::size_t(r)]) * row, row);
}

int main(int argc, char** argv) try {
  Args args = parse(argc, argv);

  // Data: MNIST's 10k set split 8,000 / 2,000 (only the test set is shipped).
  data::ImageSet all;
  bool real = fs::exists(fs::path(args.data) / "t10k-images-idx3-ubyte");
  if (real) {
    all = data::load_idx_images(fs::path(args.data) / "t10k-images-idx3-ubyte",
                                fs::path(args.data) / "t10k-labels-idx1-ubyte");
  } else {
    std::cerr << "mnist_mlp: no MNIST files in '" << args.data
              << "' (expected t10k-images-idx3-ubyte); training on generated data instead\n";
    all = generated_digits(10000, args.seed);
  }
  const std::int64_t n_train = all.size() * 4 / 5, n_test = all.size() - n_train;

  nn::manual_seed(args.seed);
  Mlp model(args.hidden);
  optim::AdamW opt(model.parameters(), {.lr = args.lr, .weight_decay = 1e-4});
  const std::int64_t B = args.batch;
  CompileOptions copts{.backend = args.device, .threads = args.threads};
  auto loss_fn = [&](Var x, Var y) { return cross_entropy(model.forward(x), y); };
  const std::vector<InputSpec> specs{input<float>({B, 784}, "images"), input<std::int32_t>({B}, "labels")};
  // --budget caps the training step (a percentage is of its unconstrained
  // device bytes, planned first without allocating anything).
  const std::size_t unconstrained = plan_training(loss_fn, specs, opt, {}, copts).plan.total_bytes();
  Budget budget{};
  if (!args.budget.empty()) {
    budget.device = parse_bytes(args.budget, unconstrained);
    budget.host = std::size_t(4) << 30;  // room to swap parameters and optimizer state out
  }
  Step step = compile(loss_fn, specs, opt, budget, copts);
  const std::int64_t EB = 500;  // evaluation batch
  Step eval = compile_inference([&](Var x) { return model.forward(x); }, {input<float>({EB, 784}, "images")}, {},
                                copts);
  if (!args.json) std::cout << "mnist_mlp: " << (real ? "MNIST" : "generated") << " data, " << n_train << " train / "
                            << n_test << " test images, " << model.num_parameters() << " parameters\n"
                            << step.summary();

  const std::int64_t per_epoch = n_train / B;
  const std::int64_t total = args.steps > 0 ? args.steps : per_epoch * args.epochs;
  std::vector<std::int64_t> order(static_cast<std::size_t>(n_train));
  std::iota(order.begin(), order.end(), 0);
  Rng shuffle_rng(args.seed, 7);
  Tensor xb({B, 784}), yb({B}, DType::i32);
  std::vector<double> step_ms;
  float loss = 0;
  auto t_interval = std::chrono::steady_clock::now();
  for (std::int64_t s = 0; s < total; ++s) {
    std::int64_t in_epoch = s % per_epoch;
    if (in_epoch == 0)
      for (std::size_t i = order.size() - 1; i > 0; --i) std::swap(order[i], order[shuffle_rng.below(i + 1)]);
    gather_rows(all.images, order, std::size_t(in_epoch * B), xb);
    gather_rows(all.labels, order, std::size_t(in_epoch * B), yb);
    // Cosine learning-rate decay: hyperparameters are read when the update
    // runs, so changing them needs no recompilation.
    opt.set_lr(args.lr * 0.5 * (1 + std::cos(3.141592653589793 * double(s) / double(total))));
    auto t0 = std::chrono::steady_clock::now();
    loss = step.run(xb, yb);
    step_ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    if (!args.json && ((s + 1) % args.log_every == 0 || s + 1 == total)) {
      auto now = std::chrono::steady_clock::now();
      double secs = std::chrono::duration<double>(now - t_interval).count();
      long done_in_interval = (s + 1) % args.log_every ? long((s + 1) % args.log_every) : args.log_every;
      t_interval = now;
      std::printf("step %6ld/%ld  loss %.4f  %8.0f img/s  arena %s peak live / %s reserved\n", long(s + 1),
                  long(total), double(loss), double(done_in_interval * B) / secs,
                  format_bytes(step.plan().lower_bound_bytes).c_str(), format_bytes(step.arena_bytes()).c_str());
      std::fflush(stdout);
    }
  }

  // Accuracy on the held-out images.
  std::int64_t correct = 0, seen = 0;
  Tensor ex({EB, 784});
  std::vector<std::int64_t> ident(static_cast<std::size_t>(all.size()));
  std::iota(ident.begin(), ident.end(), 0);
  for (std::int64_t first = n_train; first + EB <= all.size(); first += EB) {
    gather_rows(all.images, ident, std::size_t(first), ex);
    eval.run(ex);
    const float* logits = eval.output().data<float>();
    for (std::int64_t r = 0; r < EB; ++r) {
      int pred = int(std::max_element(logits + r * 10, logits + r * 10 + 10) - (logits + r * 10));
      correct += pred == all.labels.data<std::int32_t>()[first + r];
      ++seen;
    }
  }
  double accuracy = seen ? double(correct) / double(seen) : 0.0;
  std::sort(step_ms.begin(), step_ms.end());
  double median = step_ms.empty() ? 0 : step_ms[step_ms.size() / 2];
  // The step's arithmetic, from the ops' own cost (GEMMs dominate).
  double flops = 0;
  for (NodeId n : step.plan().schedule) {
    const Node& node = step.graph().node(n);
    std::vector<TensorMeta> in, out;
    for (ValueId v : node.inputs) in.push_back(step.graph().value(v).meta);
    for (ValueId v : node.results()) out.push_back(step.graph().value(v).meta);
    flops += node.op->cost(in, out).flops;
  }
  if (args.json) {
    std::printf(
        "{\"sample\":\"mnist_mlp\",\"data\":\"%s\",\"steps\":%ld,\"batch\":%ld,\"final_loss\":%.6f,"
        "\"accuracy\":%.4f,\"test_images\":%ld,\"step_ms_median\":%.4f,\"arena_bytes\":%zu,"
        "\"arena_peak_live_bytes\":%zu,\"persistent_bytes\":%zu,\"threads\":%d,\"device\":\"%s\","
        "\"budget_bytes\":%zu,\"unconstrained_bytes\":%zu,\"peak_device_bytes\":%zu,\"images_per_s\":%.1f,"
        "\"step_gflop\":%.4f,\"tflops\":%.4f,\"decisions\":%zu}\n",
        real ? "mnist" : "generated", long(total), long(B), double(loss), accuracy, long(seen), median,
        step.arena_bytes(), step.plan().lower_bound_bytes, step.plan().persistent_bytes, args.threads,
        args.device.c_str(), budget.device, unconstrained, step.measured_device_bytes(),
        median > 0 ? double(B) * 1000.0 / median : 0.0, flops / 1e9, median > 0 ? flops / (median * 1e9) : 0.0,
        step.plan().decisions.size());
  } else {
    std::printf("test accuracy %.2f%% on %ld held-out images; median step %.3f ms\n", 100 * accuracy, long(seen),
                median);
  }
  return 0;
} catch (const frugal::Error& e) {
  std::cerr << "mnist_mlp: " << e.what() << "\n";
  return 1;
}
