// One training step's bits, written to a file: tests/CMakeLists.txt builds
// this same file into two programs with very different user flags (-O0, and
// -O3 -ffast-math -march=native) and compares what they write. Both link the
// same kernels, compiled once with frugal's own flags, so the user's flags
// must not change one bit of the losses or the trained parameters.
#include <cstdio>
#include <cstring>
#include <frugal/frugal.hpp>
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

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUTPUT\n", argv[0]);
    return 2;
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
