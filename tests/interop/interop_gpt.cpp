// The frugal half of the PyTorch interop tests (tests/interop/torch_interop.py
// is the other): a small nn::Gpt whose weights cross between the two
// frameworks as safetensors files, and the logits both compute for the same
// tokens compared.
//
//   interop_gpt export DIR  trains a seeded Gpt 3 AdamW steps, writes its
//                           weights to DIR/gpt.safetensors and a batch of
//                           tokens with frugal's logits to DIR/gpt-io.safetensors
//   interop_gpt import DIR  loads DIR/torch-gpt.safetensors (written by
//                           PyTorch), runs the tokens of DIR/torch-io.safetensors
//                           and compares with PyTorch's logits there
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <frugal/frugal.hpp>
#include <string>

using namespace frugal;
namespace fs = std::filesystem;

namespace {

constexpr std::int64_t kBatch = 2, kTime = 32;

nn::GptConfig config() { return {.vocab = 65, .context = kTime, .layers = 2, .d_model = 64, .heads = 4}; }

Tensor random_tokens(std::uint64_t seed) {
  Rng r(seed);
  Tensor t({kBatch, kTime}, DType::i64);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data<std::int64_t>()[i] = std::int64_t(r.below(65));
  return t;
}

Tensor logits_of(nn::Gpt& model, const Tensor& tokens) {
  model.eval();
  Step infer = compile_inference([&](Var idx) { return model(idx); }, {input<std::int64_t>({kBatch, kTime})});
  infer.run(tokens);
  return infer.output(0).clone();
}

int export_to(const fs::path& dir) {
  nn::manual_seed(1234);
  nn::Gpt model(config());
  // A few steps, so the weights are not at their initial values (LayerNorm
  // weights no longer all 1, biases no longer 0).
  optim::AdamW opt(model.parameters(), {.lr = 1e-2});
  Step step = compile([&](Var idx, Var tgt) { return model.loss(idx, tgt); },
                      {input<std::int64_t>({kBatch, kTime}), input<std::int64_t>({kBatch, kTime})}, opt);
  for (std::uint64_t s = 0; s < 3; ++s) std::printf("step %d loss %.4f\n", int(s), step.run(random_tokens(10 + s), random_tokens(20 + s)));
  io::save_weights(dir / "gpt.safetensors", model, {{"source", "frugal interop_gpt"}});
  Tensor tokens = random_tokens(7);
  io::write_safetensors(dir / "gpt-io.safetensors", {{"tokens", tokens}, {"logits", logits_of(model, tokens)}});
  std::printf("wrote %s and %s\n", (dir / "gpt.safetensors").c_str(), (dir / "gpt-io.safetensors").c_str());
  return 0;
}

int import_from(const fs::path& dir) {
  nn::manual_seed(99);  // any seed: every weight is overwritten
  nn::Gpt model(config());
  io::load_weights(dir / "torch-gpt.safetensors", model);
  io::SafetensorsFile io_file = io::read_safetensors(dir / "torch-io.safetensors");
  const Tensor& tokens = io_file.at("tokens");
  const Tensor& expected = io_file.at("logits");
  Tensor got = logits_of(model, tokens);
  if (got.shape() != expected.shape() || expected.dtype() != DType::f32) {
    std::fprintf(stderr, "logits are %s here but %s%s in the file\n", got.shape().str().c_str(),
                 dtype_name(expected.dtype()), expected.shape().str().c_str());
    return 1;
  }
  double diff = 0, scale = 0;
  const float* a = got.data<float>();
  const float* b = expected.data<float>();
  for (std::int64_t i = 0; i < got.numel(); ++i) {
    diff = std::max(diff, double(std::fabs(a[i] - b[i])));
    scale = std::max(scale, double(std::fabs(b[i])));
  }
  const double tol = 1e-4 * std::max(1.0, scale);
  std::printf("frugal vs torch logits: max abs difference %.3g (largest |logit| %.3g, tolerance %.3g)\n", diff, scale,
              tol);
  return diff <= tol ? 0 : 1;  // a NaN difference fails too
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = argc == 3 ? argv[1] : "";
  if (mode != "export" && mode != "import") {
    std::fprintf(stderr, "usage: interop_gpt export DIR | interop_gpt import DIR\n");
    return 2;
  }
  try {
    return mode == "export" ? export_to(argv[2]) : import_from(argv[2]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "interop_gpt %s: %s\n", mode.c_str(), e.what());
    return 1;
  }
}
