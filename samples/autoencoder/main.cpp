// autoencoder: a convolutional autoencoder trained on Fashion-MNIST within a
// device memory budget, reporting the reconstruction loss (mean squared
// error per pixel) on the test set. The tutorial sample for the image ops:
//
//   encoder  Conv2d 1->16, 3x3 stride 2 (28 -> 14), GroupNorm, ReLU
//            Conv2d 16->32, 3x3 stride 2 (14 -> 7), GroupNorm, ReLU
//   decoder  ConvTranspose2d 32->16, 3x3 stride 2, output_padding 1 (7 -> 14), BatchNorm2d, ReLU
//            Upsample x2, nearest or bilinear (14 -> 28), Conv2d 16->1 3x3, sigmoid
//
//   autoencoder --epochs 2                       # the full 60k/10k data
//   autoencoder --budget 60% --upsample bilinear # in 60% of its memory
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <frugal/frugal.hpp>

#include "../common/session.hpp"

using namespace frugal;

namespace {

struct Options {
  samples::CommonArgs common;
  std::int64_t batch = 64, eval_batch = 32, test_images = 0, stop_after = 0, width = 16;
  double lr = 2e-3;
  std::string upsample = "nearest";
};

struct Autoencoder : nn::Module {
  nn::Conv2d enc1, enc2;
  nn::GroupNorm gn1, gn2;
  nn::ConvTranspose2d dec1;
  nn::BatchNorm2d bn;
  nn::Upsample up;
  nn::Conv2d out;
  Autoencoder(std::int64_t w, UpsampleMode mode)
      : enc1(1, w, 3, {.stride = 2, .padding = 1}),
        enc2(w, 2 * w, 3, {.stride = 2, .padding = 1}),
        gn1(4, w),
        gn2(8, 2 * w),
        dec1(2 * w, w, 3, {.stride = 2, .padding = 1, .output_padding = 1}),
        bn(w),
        up({.scale_factor = 2.0}, mode),
        out(w, 1, 3, {.padding = 1}) {
    register_module("enc1", enc1);
    register_module("gn1", gn1);
    register_module("enc2", enc2);
    register_module("gn2", gn2);
    register_module("dec1", dec1);
    register_module("bn", bn);
    register_module("up", up);
    register_module("out", out);
  }
  Var forward(Var x) {
    Var h = relu(gn1(enc1(x)));        // [B, w, 14, 14]
    h = relu(gn2(enc2(h)));            // [B, 2w, 7, 7]
    h = relu(bn(dec1(h)));             // [B, w, 14, 14]
    return sigmoid(out(up(h)));        // [B, 1, 28, 28], pixels in (0, 1)
  }
};

// Mean squared error over every pixel.
Var reconstruction_loss(Var y, Var x) { return mse_loss(y, x); }

// With no dataset: ten random blurry prototype images, each sample a noisy
// copy of one of them.
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
            std::clamp(proto[std::size_t(c * 784 + j)] + 0.1f * float(rng.normal()), 0.f, 1.f);
    }
    return s;
  };
  data::TrainTestImages d;
  d.train = make(train);
  d.test = make(test);
  return d;
}

}  // namespace

int main(int argc, char** argv) try {
  Options o;
  samples::Cli cli("autoencoder",
                   "Trains a convolutional autoencoder on Fashion-MNIST within a device memory budget.");
  o.common.declare(cli, "/usr/share/datasets/fashion-mnist");
  cli.option("--batch", o.batch, "images per step (default 64)");
  cli.option("--width", o.width, "channels of the first layer (default 16; a multiple of 4)");
  cli.option("--lr", o.lr, "AdamW learning rate (default 2e-3)");
  cli.option("--upsample", o.upsample, "nearest (default) or bilinear: the decoder's last upsampling");
  cli.option("--eval-batch", o.eval_batch, "images per evaluation step (default 32)");
  cli.option("--test-images", o.test_images, "evaluate on the first N test images (default: all)");
  cli.option("--stop-after", o.stop_after, "stop after this many steps of this run, as if interrupted");
  cli.parse(argc, argv);
  o.common.check(cli);
  if (o.batch <= 0 || o.eval_batch <= 0 || o.test_images < 0)
    cli.usage_error("--batch and --eval-batch must be positive; --test-images non-negative");
  if (o.width <= 0 || o.width % 4 != 0) cli.usage_error("--width must be a positive multiple of 4");
  if (o.upsample != "nearest" && o.upsample != "bilinear") cli.usage_error("--upsample must be nearest or bilinear");
  const samples::CommonArgs& a = o.common;
  samples::Session session("autoencoder", o.common);

  data::TrainTestImages d;
  const bool real = !data::idx_file(a.data, "train-images-idx3-ubyte").empty();
  if (real) {
    d = data::load_idx_train_test(a.data);
  } else {
    std::fprintf(stderr,
                 "autoencoder: no Fashion-MNIST in '%s' (install Debian's dataset-fashion-mnist); training on "
                 "generated images instead\n",
                 a.data.c_str());
    d = generated_images(std::uint64_t(a.seed), 6000, 1000);
  }
  const std::int64_t n_test = o.test_images > 0 ? std::min(o.test_images, d.test.size()) : d.test.size();
  const std::int64_t EB = std::min(o.eval_batch, n_test);

  nn::manual_seed(std::uint64_t(a.seed));
  Autoencoder model(o.width, o.upsample == "bilinear" ? UpsampleMode::bilinear : UpsampleMode::nearest);
  optim::AdamW opt(model.parameters(), {.lr = o.lr});
  const std::int64_t B = o.batch;
  CompileOptions copts{.backend = a.device, .threads = int(a.threads), .replan = !session.brokered_steps()};
  auto train_fn = [&](Var x) { return reconstruction_loss(model.forward(x), x); };
  auto eval_fn = [&](Var x) { return reconstruction_loss(model.forward(x), x); };
  std::vector<InputSpec> train_in{input<float>({B, 1, 28, 28}, "images")};
  std::vector<InputSpec> eval_in{input<float>({EB, 1, 28, 28}, "images")};

  PlannedStep free_train = plan_training(train_fn, train_in, opt, {}, copts);
  PlannedStep free_eval = plan_inference(eval_fn, eval_in, {}, copts);
  samples::SampleSteps steps;
  session.compile_steps(steps, free_train, free_eval, train_fn, train_in, opt, copts, eval_fn, eval_in, copts);
  Step& step = *steps.train;
  Step& eval = *steps.eval;
  const std::size_t budget_total = steps.budget_total;

  data::EpochSampler sampler(d.train.size(), B, std::uint64_t(a.seed));
  const std::int64_t per_epoch = sampler.batches_per_epoch();
  const std::int64_t total = a.steps > 0 ? a.steps : (a.epochs > 0 ? a.epochs : 2) * per_epoch;
  char config[256];
  std::snprintf(config, sizeof config, "data=%s width=%lld upsample=%s batch=%lld lr=%g steps=%lld seed=%lld",
                real ? "fashion-mnist" : "generated", static_cast<long long>(o.width), o.upsample.c_str(),
                static_cast<long long>(B), o.lr, static_cast<long long>(total), static_cast<long long>(a.seed));
  std::fprintf(session.out(),
               "autoencoder: width %lld, %s upsampling, on %s, %lld train / %lld test images, %lld parameters, %lld "
               "steps (%.1f epochs)\n",
               static_cast<long long>(o.width), o.upsample.c_str(), real ? "Fashion-MNIST" : "generated images",
               static_cast<long long>(d.train.size()), static_cast<long long>(n_test),
               static_cast<long long>(model.num_parameters()), static_cast<long long>(total),
               double(total) / double(per_epoch));
  session.print_plan(step, eval, budget_total, free_train.plan.total_bytes());
  const std::int64_t first = session.resume(model, opt, {&step, &eval}, config);
  if (first > total) fail("the checkpoint is at step ", first, ", past --steps ", total);

  // The mean reconstruction loss over the first n_test images (whole batches).
  Tensor ex({EB, 1, 28, 28});
  auto evaluate = [&]() {
    double loss = 0;
    std::int64_t batches = 0;
    for (std::int64_t first_img = 0; first_img + EB <= n_test; first_img += EB) {
      std::memcpy(ex.raw(), d.test.images.data<float>() + first_img * 784, std::size_t(EB * 784) * sizeof(float));
      eval.run(ex);
      loss += double(eval.output().data<float>()[0]);
      ++batches;
    }
    return loss / double(std::max<std::int64_t>(batches, 1));
  };

  Tensor xb({B, 1, 28, 28});
  session.start(first, total, "img", double(B), budget_total);
  std::int64_t s = first;
  const std::int64_t last = o.stop_after > 0 ? std::min(total, first + o.stop_after) : total;
  for (; s < last; ++s) {
    const std::int64_t* idx = sampler.batch(s);
    for (std::int64_t r = 0; r < B; ++r)
      std::memcpy(xb.data<float>() + r * 784, d.train.images.data<float>() + idx[r] * 784, 784 * sizeof(float));
    auto t0 = std::chrono::steady_clock::now();
    float loss = step.run(xb);
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    session.step_done(s, loss, ms, steps.measured_device_bytes(), model, opt);
    if ((s + 1) % per_epoch == 0 && s + 1 < total) {
      const double tl = evaluate();
      char line[128];
      std::snprintf(line, sizeof line, "epoch %lld: test reconstruction loss %.5f",
                    static_cast<long long>((s + 1) / per_epoch), tl);
      session.validation(s + 1, tl, line);
    }
  }
  session.save(model, opt, s);
  const double test_loss = evaluate();

  const std::size_t peak = steps.measured_device_bytes();
  if (!a.json)
    std::printf("test reconstruction loss %.5f (mean squared error per pixel) on %lld images after %lld steps; median "
                "step %.1f ms; device peak %s%s\n",
                test_loss, static_cast<long long>(n_test / EB * EB), static_cast<long long>(s),
                session.step_ms_median(), format_bytes(peak).c_str(),
                budget_total ? (" of a " + format_bytes(budget_total) + " budget").c_str() : "");
  session.write_plot("autoencoder on " + std::string(real ? "Fashion-MNIST" : "generated images"), step.plan(),
                     free_train.plan, budget_total, step.measured_device_bytes(), "test loss",
                     std::make_pair(s, test_loss));
  if (a.json) {
    samples::JsonLine j =
        session.summary_json(s, peak, budget_total, step, free_train.plan.total_bytes() + free_eval.plan.total_bytes());
    j.add("data", real ? "fashion-mnist" : "generated")
        .add("metric", "test_loss")
        .add("test_loss", test_loss)
        .add("test_images", n_test / EB * EB)
        .add("batch", B)
        .add("width", o.width)
        .add("upsample", o.upsample)
        .add("epochs", double(s) / double(per_epoch))
        .add("parameters", model.num_parameters());
    std::printf("%s\n", j.str().c_str());
  }
  return 0;
} catch (const frugal::Error& e) {
  std::fprintf(stderr, "autoencoder: %s\n", e.what());
  return 1;
}
