// Fused elementwise chains against the unfused kernels they replace.
//
//   cmake --build build -j2 --target fused_kernels
//   build/bench/fused_kernels [--reps 21] [--threads 1,2] [--only NAME]
//
// Each chain is one FusedProgram (as ops/fusion.hpp would build it). "fused"
// runs the backend's FusedElementwise kernel once; "unfused" runs each
// step's own op (ops::unfused_op) through the backend's kernel, one pass per
// step, into buffers made beforehand (so nothing is allocated while timed).
// Fused and unfused run alternately, rep by rep, so machine noise hits both
// alike; the table shows medians (and minima) in milliseconds per run of
// the chain (a small chain runs several times per timing, 4M elements in
// all). Every rep
// also checks that both wrote the same bits.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <frugal/frugal.hpp>

using namespace frugal;
using Clock = std::chrono::steady_clock;

namespace {

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

Tensor random_tensor(const Shape& s, DType dt, std::uint64_t seed) {
  Tensor f(s);
  Rng r(seed);
  for (std::int64_t i = 0; i < f.numel(); ++i) f.data<float>()[i] = float(r.uniform(-2, 2));
  if (dt == DType::f32) return f;
  Tensor t(s, dt);
  for (std::int64_t i = 0; i < f.numel(); ++i) {
    float v = f.data<float>()[i];
    if (dt == DType::f64) t.data<double>()[i] = v;
    else if (dt == DType::bf16) t.data<BFloat16>()[i] = BFloat16(v);
    else t.data<Half>()[i] = Half(v);
  }
  return t;
}

struct Chain {
  std::string name;
  DType dtype;
  std::vector<Shape> inputs;  // the first has the output's shape
  ops::FusedProgram program;
};

ops::FusedProgram program(int inputs, std::vector<ops::FusedStep> steps, std::vector<int> outputs) {
  ops::FusedProgram p;
  p.inputs = inputs;
  p.steps = std::move(steps);
  p.outputs = std::move(outputs);
  return p;
}

std::vector<Chain> chains() {
  const std::int64_t n = 4 << 20;  // 4M elements
  const Shape flat{n}, rows{4096, 1024}, bias{1024};
  std::vector<Chain> c;
  // slots: inputs 0.., then one per step
  auto relu_mul_add = program(3, {{math::Relu{}, {0}}, {math::Mul{}, {3, 1}}, {math::Add{}, {4, 2}}}, {5});
  for (DType dt : {DType::f32, DType::f64, DType::bf16, DType::f16})
    c.push_back({cat("relu(a)*b+d ", dtype_name(dt)), dt, {flat, flat, flat}, relu_mul_add});
  // The same in cache (64K elements, 256 KB per f32 tensor): what the
  // kernel's own overhead costs when memory does not hide it.
  for (DType dt : {DType::f32, DType::bf16})
    c.push_back({cat("relu(a)*b+d 64K ", dtype_name(dt)), dt, {Shape{1 << 16}, Shape{1 << 16}, Shape{1 << 16}},
                 relu_mul_add});
  // Bias + activation, the bias a broadcast row: Linear without its bias.
  c.push_back({"gelu(x+bias) f32", DType::f32, {rows, bias},
               program(2, {{math::Add{}, {0, 1}}, {math::GeluTanh{}, {2}}}, {3})});
  // A residual block's tail: relu(x + r), and the scaled form x + 0.5 * a.
  c.push_back({"relu(x+r) f32", DType::f32, {flat, flat}, program(2, {{math::Add{}, {0, 1}}, {math::Relu{}, {2}}}, {3})});
  c.push_back({"x+a*0.5 f32", DType::f32, {flat, flat},
               program(2, {{math::Affine{0.5, 0.0}, {1}}, {math::Add{}, {0, 2}}}, {3})});
  // A backward chain: relu_grad(y, dy) then the residual's gradient sum.
  c.push_back({"relu_grad(y,dy)+g f32", DType::f32, {flat, flat, flat},
               program(3, {{ops::GradOf<math::Relu>{}, {0, 0, 1}}, {math::Add{}, {3, 2}}}, {4})});
  // Two outputs (the inner one kept for a backward reader).
  c.push_back({"sigmoid(x)*x, keep sigmoid f32", DType::f32, {flat},
               program(1, {{math::Sigmoid{}, {0}}, {math::Mul{}, {1, 0}}}, {1, 2})});
  return c;
}

struct Bound {
  std::shared_ptr<const Op> op;
  std::vector<TensorRef> in, out;
};

}  // namespace

int main(int argc, char** argv) {
  int reps = 21;
  std::vector<int> threads{1, 2};
  std::string only;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--reps" && i + 1 < argc) reps = std::max(1, std::atoi(argv[++i]));
    else if (a == "--threads" && i + 1 < argc) {
      threads.clear();
      for (std::string s = argv[++i]; !s.empty();) {
        auto k = s.find(',');
        threads.push_back(std::atoi(s.substr(0, k).c_str()));
        s = k == std::string::npos ? "" : s.substr(k + 1);
      }
    } else if (a == "--only" && i + 1 < argc) only = argv[++i];
    else {
      std::fprintf(stderr, "usage: %s [--reps N] [--threads 1,2] [--only NAME]\n", argv[0]);
      return 2;
    }
  }
  auto backend = make_backend("cpu");
  std::printf("| chain | threads | fused ms (median) | unfused ms (median) | fused / unfused | fused min | unfused min |\n");
  std::printf("|---|---:|---:|---:|---:|---:|---:|\n");
  bool all_same = true;
  for (const Chain& ch : chains()) {
    if (!only.empty() && ch.name.find(only) == std::string::npos) continue;
    const ops::FusedProgram& p = ch.program;
    auto fused_op = std::make_shared<ops::FusedElementwise>(p);
    const Shape out = ch.inputs[0];
    std::vector<Tensor> slot;  // unfused: one tensor per slot
    for (int k = 0; k < p.inputs; ++k) slot.push_back(random_tensor(ch.inputs[std::size_t(k)], ch.dtype, 10 + std::uint64_t(k)));
    for (std::size_t s = 0; s < p.steps.size(); ++s) slot.emplace_back(out, ch.dtype);
    std::vector<Tensor> fused_out;
    for (std::size_t o = 0; o < p.outputs.size(); ++o) fused_out.emplace_back(out, ch.dtype);
    std::vector<Shape> shapes;  // kept alive for the refs
    shapes.reserve(slot.size());
    for (auto& t : slot) shapes.push_back(t.shape());
    auto ref = [&](int k) { return TensorRef{slot[std::size_t(k)].raw(), ch.dtype, &shapes[std::size_t(k)]}; };
    std::vector<Bound> unfused;
    for (std::size_t s = 0; s < p.steps.size(); ++s) {
      Bound b{ops::unfused_op(p.steps[s].fn), {}, {ref(p.inputs + int(s))}};
      for (int k = 0; k < ops::arity_of(p.steps[s].fn); ++k) b.in.push_back(ref(p.steps[s].args[std::size_t(k)]));
      unfused.push_back(std::move(b));
    }
    Bound fused{fused_op, {}, {}};
    for (int k = 0; k < p.inputs; ++k) fused.in.push_back(ref(k));
    for (auto& t : fused_out) fused.out.push_back({t.raw(), ch.dtype, &shapes[0]});
    const int iters = int(std::max<std::int64_t>(1, (4 << 20) / out.numel()));
    auto run = [&](const Bound& b) { backend->kernel_for(*b.op)(*b.op, KernelArgs{b.in, b.out}); };
    for (int t : threads) {
      omp_set_num_threads(t);
      std::vector<double> fm, um;
      for (int r = -1; r < reps; ++r) {  // rep -1 warms both up
        auto t0 = Clock::now();
        for (int i = 0; i < iters; ++i) run(fused);
        double f = ms_since(t0) / iters;
        t0 = Clock::now();
        for (int i = 0; i < iters; ++i)
          for (auto& b : unfused) run(b);
        double u = ms_since(t0) / iters;
        if (r >= 0) fm.push_back(f), um.push_back(u);
        for (std::size_t o = 0; o < p.outputs.size(); ++o)
          if (std::memcmp(fused_out[o].raw(), slot[std::size_t(p.outputs[o])].raw(), fused_out[o].nbytes()) != 0) {
            std::fprintf(stderr, "%s: output %zu differs between fused and unfused\n", ch.name.c_str(), o);
            all_same = false;
          }
      }
      double f = median(fm), u = median(um);
      std::printf("| %s | %d | %.3f | %.3f | %.2f | %.3f | %.3f |\n", ch.name.c_str(), t, f, u, f / u,
                  *std::min_element(fm.begin(), fm.end()), *std::min_element(um.begin(), um.end()));
      std::fflush(stdout);
    }
  }
  if (!all_same) std::printf("\nFUSED AND UNFUSED BITS DIFFER\n");
  return all_same ? 0 : 1;
}
