// resnet: CIFAR-style ResNets (ResNet-20 by default; ResNet-18, or ResNet-50
// with Bottleneck blocks) trained on Fashion-MNIST within a device memory
// budget, reporting test accuracy.
//
//   resnet --epochs 12                      # ResNet-20, the full 60k/10k data
//   resnet --model resnet18 --budget 60%    # ResNet-18 in 60% of its memory
//   mpirun -np 2 resnet --zero auto         # 2 ranks, each --batch images of every step
//   resnet --corun max --budget 150%        # training beside as many serving streams as fit (corun.hpp)
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <frugal/frugal.hpp>

#include "../common/session.hpp"
#include "corun.hpp"

using namespace frugal;
namespace fs = std::filesystem;

namespace {

struct Options {
  samples::CommonArgs common;
  std::string model = "resnet20";
  std::int64_t batch = 128, eval_batch = 250, test_images = 0, stop_after = 0, warmup = 200;
  double lr = 0.1, momentum = 0.9, weight_decay = 5e-4;
  bool no_augment = false;
  corun::Options corun;
};

// With no dataset: ten random prototype images, each sample a shifted noisy
// copy of its class's prototype.
data::TrainTestImages generated_images(std::uint64_t seed, std::int64_t train, std::int64_t test) {
  Rng rng(seed, 99);
  std::vector<float> proto(10 * 784);
  for (auto& p : proto) p = float(rng.uniform());
  auto make = [&](std::int64_t n) {
    data::ImageSet s{Tensor({n, 784}), Tensor({n}, DType::i32)};
    for (std::int64_t i = 0; i < n; ++i) {
      int c = int(rng.below(10));
      s.labels.data<std::int32_t>()[i] = c;
      for (int j = 0; j < 784; ++j)
        s.images.data<float>()[i * 784 + j] =
            std::clamp(proto[std::size_t(c * 784 + j)] + 0.4f * float(rng.normal()), 0.f, 1.f);
    }
    return s;
  };
  data::TrainTestImages d;
  d.train = make(train);
  d.test = make(test);
  return d;
}

std::unique_ptr<nn::Layer> make_model(const std::string& name) {
  if (name == "resnet20") return nn::resnet20_cifar(10, 1);
  if (name == "resnet18") return nn::resnet18_cifar(10, 1);
  if (name == "resnet50") return nn::resnet50_cifar(10, 1);
  fail("--model '", name, "': use resnet20, resnet18 or resnet50");
}

}  // namespace

int main(int argc, char** argv) try {
  Options o;
  samples::Cli cli("resnet", "Trains a CIFAR-style ResNet on Fashion-MNIST within a device memory budget.");
  o.common.declare(cli, "/usr/share/datasets/fashion-mnist");
  cli.option("--model", o.model, "resnet20 (default), resnet18 or resnet50 (Bottleneck blocks)");
  cli.option("--batch", o.batch, "images per step (default 128)");
  cli.option("--lr", o.lr, "peak learning rate (SGD with momentum, warm-up then cosine decay; default 0.1)");
  cli.option("--weight-decay", o.weight_decay, "L2 weight decay (default 5e-4)");
  cli.option("--warmup", o.warmup, "warm-up steps (default 200)");
  cli.option("--eval-batch", o.eval_batch, "images per evaluation step (default 250)");
  cli.option("--test-images", o.test_images, "evaluate on the first N test images (default: all)");
  cli.flag("--no-augment", o.no_augment, "train without random crops and flips");
  cli.option("--stop-after", o.stop_after, "stop after this many steps of this run, as if interrupted");
  o.corun.declare(cli);
  cli.parse(argc, argv);
  o.common.check(cli);
  if (o.batch <= 0 || o.eval_batch <= 0 || o.test_images < 0 || o.warmup < 0)
    cli.usage_error("--batch and --eval-batch must be positive; --test-images and --warmup non-negative");
  const samples::CommonArgs& a = o.common;
  samples::Session session("resnet", o.common);
  const samples::Ranks ranks = samples::join_ranks(a);
  session.set_ranks(ranks);

  data::TrainTestImages d;
  const bool real = !data::idx_file(a.data, "train-images-idx3-ubyte").empty();
  if (real) {
    d = data::load_idx_train_test(a.data);
  } else {
    std::fprintf(stderr,
                 "resnet: no Fashion-MNIST in '%s' (install Debian's dataset-fashion-mnist); training on generated "
                 "images instead\n",
                 a.data.c_str());
    d = generated_images(std::uint64_t(a.seed), 6000, 1000);
  }
  // Normalise with the training set's mean and standard deviation.
  double mean = 0, sq = 0;
  const std::int64_t train_px = d.train.images.numel();
  for (std::int64_t i = 0; i < train_px; ++i) mean += d.train.images.data<float>()[i];
  mean /= double(train_px);
  for (std::int64_t i = 0; i < train_px; ++i) sq += std::pow(d.train.images.data<float>()[i] - mean, 2);
  const double stdev = std::sqrt(sq / double(train_px));
  for (Tensor* t : {&d.train.images, &d.test.images})
    for (std::int64_t i = 0; i < t->numel(); ++i) t->data<float>()[i] = float((t->data<float>()[i] - mean) / stdev);
  const std::int64_t n_test = o.test_images > 0 ? std::min(o.test_images, d.test.size()) : d.test.size();
  const std::int64_t EB = std::min(o.eval_batch, n_test);

  nn::manual_seed(std::uint64_t(a.seed));
  auto model = make_model(o.model);
  optim::SGD opt(model->parameters(),
                 {.lr = o.lr, .momentum = o.momentum, .weight_decay = o.weight_decay, .nesterov = true});
  const std::int64_t B = o.batch;
  CompileOptions copts{.backend = a.device, .threads = int(a.threads), .replan = !session.brokered_steps()};
  CompileOptions train_opts = copts;  // the evaluation step runs on each rank alone
  ranks.apply(train_opts);
  auto train_fn = [&](Var x, Var y) { return cross_entropy(model->forward(x), y); };
  auto eval_fn = [&](Var x) { return model->forward(x); };
  std::vector<InputSpec> train_in{input<float>({B, 1, 28, 28}, "images"), input<std::int32_t>({B}, "labels")};
  std::vector<InputSpec> eval_in{input<float>({EB, 1, 28, 28}, "images")};

  // A global batch of B images per rank; rank r trains on its r-th B of them
  // (batch norm's statistics are each rank's own, as under DDP without SyncBN).
  data::EpochSampler sampler(d.train.size(), B * ranks.size, std::uint64_t(a.seed));
  const std::int64_t per_epoch = sampler.batches_per_epoch();
  const std::int64_t total = a.steps > 0 ? a.steps : (a.epochs > 0 ? a.epochs : 12) * per_epoch;
  char config[256];
  std::snprintf(config, sizeof config, "data=%s model=%s batch=%lld lr=%g wd=%g augment=%d steps=%lld seed=%lld",
                real ? "fashion-mnist" : "generated", o.model.c_str(), static_cast<long long>(B), o.lr,
                o.weight_decay, int(!o.no_augment), static_cast<long long>(total), static_cast<long long>(a.seed));
  auto lr_at = [&](std::int64_t s) {
    if (s < o.warmup) return o.lr * double(s + 1) / double(o.warmup);
    double t = double(s - o.warmup) / std::max(1.0, double(total - o.warmup));
    return o.lr * 0.5 * (1 + std::cos(3.141592653589793 * t));
  };
  // Step s's batch (augmented) into xb, yb, and its learning rate.
  Tensor xb({B, 1, 28, 28}), yb({B}, DType::i32);
  auto next_batch = [&](std::int64_t s) {
    const std::int64_t* idx = sampler.batch(s) + ranks.rank * B;
    for (std::int64_t r = 0; r < B; ++r) {
      const float* src = d.train.images.data<float>() + idx[r] * 784;
      float* dst = xb.data<float>() + r * 784;
      const std::uint64_t row = std::uint64_t(ranks.rank * B + r);  // in the global batch
      if (o.no_augment) std::memcpy(dst, src, 784 * sizeof(float));
      else data::random_crop_flip(dst, src, 1, 28, 28, 2, std::uint64_t(a.seed), std::uint64_t(s), row);
      yb.data<std::int32_t>()[r] = d.train.labels.data<std::int32_t>()[idx[r]];
    }
    opt.set_lr(lr_at(s));
    return std::make_pair(xb, yb);
  };
  if (o.corun.on()) {
    if (ranks.size > 1) cli.usage_error("--corun runs in one process, not under mpirun");
    return corun::run(o.corun, cli, session, corun::Data{d, n_test}, *model, [&] { return make_model(o.model); },
                      opt, train_fn, train_in, copts, total, config, next_batch);
  }

  // (With --offload nvme, unconstrained means with the state on NVMe, as pinned.)
  PlannedStep free_train = plan_training(train_fn, train_in, opt, Budget{.nvme_dir = a.nvme_dir}, train_opts);
  model->eval();
  PlannedStep free_eval = plan_inference(eval_fn, eval_in, {}, copts);
  model->train();
  samples::SampleSteps steps;
  session.compile_steps(steps, free_train, free_eval, train_fn, train_in, opt, train_opts, eval_fn, eval_in, copts);
  Step& step = *steps.train;
  Step& eval = *steps.eval;
  const std::size_t budget_total = steps.budget_total;

  std::fprintf(session.out(), "resnet: %s on %s, %lld train / %lld test images, %lld parameters, %lld steps (%.1f epochs)\n",
               o.model.c_str(), real ? "Fashion-MNIST" : "generated images", static_cast<long long>(d.train.size()),
               static_cast<long long>(n_test), static_cast<long long>(model->num_parameters()),
               static_cast<long long>(total), double(total) / double(per_epoch));
  session.print_plan(step, eval, budget_total, free_train.plan.total_bytes());
  const std::int64_t first = session.resume(*model, opt, {&step, &eval}, config);
  if (first > total) fail("the checkpoint is at step ", first, ", past --steps ", total);

  // Test loss and accuracy over the first n_test images (whole batches).
  Tensor ex({EB, 1, 28, 28});
  auto evaluate = [&]() {
    step.gather_parameters();  // ZeRO stage 3 trained shards: the evaluation step reads the module's tensors
    std::int64_t correct = 0, seen = 0;
    double loss = 0;
    for (std::int64_t first_img = 0; first_img + EB <= n_test; first_img += EB) {
      std::memcpy(ex.raw(), d.test.images.data<float>() + first_img * 784, std::size_t(EB * 784) * sizeof(float));
      eval.run(ex);
      const float* z = eval.output().data<float>();
      for (std::int64_t r = 0; r < EB; ++r) {
        const float* row = z + r * 10;
        const int label = d.test.labels.data<std::int32_t>()[first_img + r];
        loss += samples::row_nll(row, 10, label);
        correct += samples::row_correct(row, 10, label);
        ++seen;
      }
    }
    return std::make_pair(loss / double(seen), double(correct) / double(seen));
  };

  session.start(first, total, "img", double(B * ranks.size), budget_total);
  std::int64_t s = first;
  const std::int64_t last = o.stop_after > 0 ? std::min(total, first + o.stop_after) : total;
  for (; s < last; ++s) {
    next_batch(s);
    auto t0 = std::chrono::steady_clock::now();
    float loss = step.run(xb, yb);
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    session.step_done(s, loss, ms, steps.measured_device_bytes(), *model, opt);
    if ((s + 1) % per_epoch == 0 && s + 1 < total) {
      auto [tl, acc] = evaluate();
      char line[128];
      std::snprintf(line, sizeof line, "epoch %lld: test loss %.4f, test accuracy %.2f%%",
                    static_cast<long long>((s + 1) / per_epoch), tl, 100 * acc);
      session.validation(s + 1, tl, line);
    }
  }
  session.save(*model, opt, s);
  auto [test_loss, accuracy] = evaluate();

  const std::size_t peak = steps.measured_device_bytes();
  if (!session.leader()) return 0;  // rank 0 reports
  if (!a.json)
    std::printf("test accuracy %.2f%% (test loss %.4f) on %lld images after %lld steps; median step %.1f ms; device "
                "peak %s%s\n",
                100 * accuracy, test_loss, static_cast<long long>(n_test / EB * EB), static_cast<long long>(s),
                session.step_ms_median(), format_bytes(peak).c_str(),
                budget_total ? (" of a " + format_bytes(budget_total) + " budget").c_str() : "");
  session.write_plot(o.model + " on " + (real ? "Fashion-MNIST" : "generated images"), step.plan(), free_train.plan,
                     budget_total, step.measured_device_bytes(), "test loss", std::make_pair(s, test_loss));
  if (a.json) {
    samples::JsonLine j = session.summary_json(s, peak, budget_total, step, free_train.plan.total_bytes() + free_eval.plan.total_bytes());
    j.add("data", real ? "fashion-mnist" : "generated")
        .add("model", o.model)
        .add("metric", "accuracy")
        .add("accuracy", accuracy)
        .add("test_loss", test_loss)
        .add("test_images", n_test / EB * EB)
        .add("batch", B)
        .add("epochs", double(s) / double(per_epoch))
        .add("parameters", model->num_parameters());
    std::printf("%s\n", j.str().c_str());
  }
  return 0;
} catch (const frugal::Error& e) {
  std::fprintf(stderr, "resnet: %s\n", e.what());
  return 1;
}
