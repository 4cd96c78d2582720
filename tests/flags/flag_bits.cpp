// One training step's bits, written to a file: tests/CMakeLists.txt builds
// this same file into two programs with very different user flags (-O0, and
// -O3 -ffast-math -march=native) and compares what they write. Both link the
// same kernels, compiled once with frugal's own flags, so the user's flags
// must not change one bit of the losses or the trained parameters.
//
// The file also calls the CPU layer-norm kernel directly, as a test or a
// benchmark may: the program then holds a copy of that kernel compiled with
// its own flags (the kernel unit calls its copy out of line), which the
// linker must not keep for the step's layer norm (backend/cpu/abi.hpp keeps
// the two apart).
#include <cmath>
#include <cstdio>
#include <cstring>
#include <frugal/frugal.hpp>
#include <frugal/backend/cpu/layer_norm.hpp>
#include <string>

using namespace frugal;

namespace {

struct Net : nn::Module {
  nn::Conv2d conv{3, 4, 3, {.padding = 1}};
  nn::Linear fc1{4 * 8 * 8, 32}, fc2{32, 10};
  nn::LayerNorm norm{32};
  nn::Dropout drop{0.25};
  Net() {
    register_module("conv", conv);
    register_module("fc1", fc1);
    register_module("fc2", fc2);
    register_module("norm", norm);
    register_module("drop", drop);
  }
  Var forward(Var x) {
    Var h = relu(conv(x));
    h = reshape(h, {x.dim(0), 4 * 8 * 8});
    h = norm(gelu(fc1(drop(h)), false));
    return fc2(softmax(h, -1) * 4.0 + tanh(h));
  }
};

// Values exact in f32 (multiples of 2^-13), from integers only, so the
// initial parameters and inputs cannot depend on the user's flags either.
float exact_value(std::uint64_t i) { return float(std::int64_t((i * 2654435761u) % 2001) - 1000) / 8192.0f; }

void fill_exact(Tensor& t, std::uint64_t salt) {
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = exact_value(std::uint64_t(i) * 7 + salt);
}

// The layer-norm kernel, run directly on a few rows (compiled with this
// file's flags): each normalised row sums to about 0.
float direct_layer_norm_sum() {
  Tensor x({4, 32}), y({4, 32}), mean({4}), rstd({4});
  fill_exact(x, 5);
  TensorRef in{x.raw(), DType::f32, &x.shape()};
  TensorRef out[] = {{y.raw(), DType::f32, &y.shape()}, {mean.raw(), DType::f32, &mean.shape()},
                     {rstd.raw(), DType::f32, &rstd.shape()}};
  KernelArgs args{std::span<const TensorRef>(&in, 1), std::span<const TensorRef>(out, 3)};
  // Through a pointer, so this file emits its own out-of-line copy.
  void (*volatile kernel)(const ops::LayerNorm&, const KernelArgs&) = &cpu::layer_norm_kernel;
  kernel(ops::LayerNorm(1e-5, false, false), args);
  float s = 0;
  for (std::int64_t i = 0; i < y.numel(); ++i) s += y.data<float>()[i];
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUTPUT\n", argv[0]);
    return 2;
  }
  if (!(std::abs(direct_layer_norm_sum()) < 1e-3f)) {
    std::fprintf(stderr, "the directly called layer-norm kernel's rows do not sum to 0\n");
    return 1;
  }
  Net net;
  std::uint64_t salt = 1;
  for (auto& p : net.parameters()) fill_exact(p, salt++);
  optim::AdamW opt(net.parameters(), {.lr = 1e-2});
  Step step = compile([&](Var x, Var y) { return cross_entropy(net.forward(x), y); },
                      {input<float>({8, 3, 8, 8}), input<std::int32_t>({8})}, opt, {}, {.threads = 2});
  Tensor x({8, 3, 8, 8}), y({8}, DType::i32);
  fill_exact(x, 99);
  for (std::int64_t i = 0; i < 8; ++i) y.data<std::int32_t>()[i] = std::int32_t((i * 7) % 10);
  std::FILE* out = std::fopen(argv[1], "w");
  if (!out) return std::perror(argv[1]), 1;
  for (int s = 0; s < 4; ++s) {
    float loss = step.run(x, y);
    std::uint32_t bits;
    std::memcpy(&bits, &loss, 4);
    std::fprintf(out, "loss %d %08x\n", s, bits);
  }
  for (auto& p : net.parameters()) {
    std::uint64_t h = 1469598103934665603ull;  // FNV-1a over the parameter's bytes
    auto* b = static_cast<const unsigned char*>(p.raw());
    for (std::size_t i = 0; i < p.nbytes(); ++i) h = (h ^ b[i]) * 1099511628211ull;
    std::fprintf(out, "param %s %016llx\n", p.shape().str().c_str(), static_cast<unsigned long long>(h));
  }
  return std::fclose(out) == 0 ? 0 : 1;
}
