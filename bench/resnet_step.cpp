// One training step of ResNet-18 for CIFAR (the peer's torch_bench.py
// "resnet" workload: batch 32, 3x32x32, 10 classes, SGD lr 0.01 momentum
// 0.9), timed as the user runs it, then once more op by op to show where
// the time goes.
//
//   g++ -O3 -std=c++20 -fopenmp -Iinclude -I/usr/include/x86_64-linux-gnu/openblas-openmp
//       bench/resnet_step.cpp /usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.so -o /tmp/resnet_step
//   /tmp/resnet_step [--threads 2] [--steps 10] [--warmup 2] [--batch 32] [--model resnet18|resnet20|resnet50] [--profile-reps 3] [--engine blas|avx512] [--algo auto|direct|winograd|winograd-f2|winograd-f4]
//                    [--dtype f32|bf16|f16]
//
// --dtype builds the whole model, its input and its SGD state in that dtype
// (nn::resnet18_cifar's dtype; BatchNorm's running statistics stay f32).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "frugal/frugal.hpp"
#include "frugal/backend/cpu/conv.hpp"  // which engine runs

using namespace frugal;
using Clock = std::chrono::steady_clock;

namespace {

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

// Runs the plan's nodes one by one on a fresh arena, timing each kernel:
// the executor's loop, with a clock around every call.
std::map<std::string, std::pair<double, int>> profile(const Step& step, const std::vector<const Tensor*>& inputs,
                                                      int reps, const BackendOptions& options) {
  const Graph& g = step.graph();
  const Plan& plan = step.plan();
  auto backend = make_backend("cpu", options);  // the step's kernels: their scratch is what the plan sized
  auto* arena = static_cast<std::byte*>(backend->allocate(plan.arena_bytes));
  std::vector<void*> addr(g.num_values(), nullptr);
  for (ValueId v = 0; v < ValueId(g.num_values()); ++v) {
    if (plan.offset_of[std::size_t(v)]) addr[std::size_t(v)] = arena + *plan.offset_of[std::size_t(v)];
    else if (g.value(v).external.defined()) addr[std::size_t(v)] = g.value(v).external.raw();
  }
  auto in_values = g.values_of_kind(ValueKind::input);  // in declaration order
  auto ref = [&](ValueId v) { return TensorRef{addr[std::size_t(v)], g.value(v).meta.dtype, &g.value(v).meta.shape}; };
  std::vector<double> best(g.num_nodes(), 0.0);
  // Rep -1 warms up: it takes the fresh arena's page faults, and is not counted.
  for (int r = -1; r < reps; ++r) {
    // Inputs are staged every step: their arena space is reused once they die.
    for (std::size_t i = 0; i < inputs.size(); ++i)
      std::memcpy(addr[std::size_t(in_values[i])], inputs[i]->raw(), inputs[i]->nbytes());
    for (NodeId n : plan.schedule) {
      const Node& node = g.node(n);
      std::vector<TensorRef> in, out;
      for (ValueId i : node.inputs) in.push_back(ref(i));
      for (ValueId o : node.results()) out.push_back(ref(o));
      KernelArgs a{in, out, 0, nullptr, 0};
      if (node.has_workspace) {
        a.workspace = addr[std::size_t(node.outputs.back())];
        a.workspace_bytes = g.value(node.outputs.back()).meta.nbytes();
      }
      const Kernel& k = backend->kernel_for(*node.op);
      auto t0 = Clock::now();
      k(*node.op, a);
      if (r < 0) continue;
      // Per node, the fastest of the reps (robust on a shared machine).
      const double ms = ms_since(t0);
      best[std::size_t(n)] = r == 0 ? ms : std::min(best[std::size_t(n)], ms);
    }
  }
  backend->deallocate(arena);
  std::map<std::string, std::pair<double, int>> by_op;
  for (NodeId n : plan.schedule) {
    auto& e = by_op[g.node(n).op->name()];
    e.first += best[std::size_t(n)];
    e.second += 1;
  }
  return by_op;
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2, steps = 10, warmup = 2, reps = 3;
  std::int64_t batch = 32;
  std::string model_name = "resnet18";
  std::string engine_name = "auto", algo_name = "auto", dtype_name_arg = "f32";
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? argv[++i] : (std::fprintf(stderr, "%s needs a value\n", a.c_str()), std::exit(2), ""); };
    if (a == "--threads") threads = std::atoi(next());
    else if (a == "--steps") steps = std::atoi(next());
    else if (a == "--warmup") warmup = std::atoi(next());
    else if (a == "--batch") batch = std::atoll(next());
    else if (a == "--model") model_name = next();
    else if (a == "--profile-reps") reps = std::atoi(next());
    else if (a == "--engine") {
      engine_name = next();
    }
    else if (a == "--algo") algo_name = next();
    else if (a == "--dtype") dtype_name_arg = next();
    else {
      std::fprintf(stderr, "usage: resnet_step [--threads N] [--steps N] [--warmup N] [--batch N] [--model resnet18|resnet20|resnet50] [--profile-reps N] [--engine blas|avx512] [--algo auto|direct|winograd|winograd-f2|winograd-f4] [--dtype f32|bf16|f16]\n");
      return 2;
    }
  }
  const DType dtype = dtype_name_arg == "bf16" ? DType::bf16 : dtype_name_arg == "f16" ? DType::f16 : DType::f32;
  if (dtype == DType::f32 && dtype_name_arg != "f32")
    return std::fprintf(stderr, "unknown dtype %s (f32, bf16 or f16)\n", dtype_name_arg.c_str()), 2;
  nn::manual_seed(0);
  std::unique_ptr<nn::Layer> model;
  if (model_name == "resnet18") model = nn::resnet18_cifar(10, 3, dtype);
  else if (model_name == "resnet20") model = nn::resnet20_cifar(10, 3, dtype);
  else if (model_name == "resnet50") model = nn::resnet50_cifar(10, 3, dtype);
  else return std::fprintf(stderr, "unknown model %s\n", model_name.c_str()), 2;
  optim::SGD opt(model->parameters(), {.lr = 0.01, .momentum = 0.9});
  const BackendOptions backend_options{.conv_engine = engine_name, .conv_algorithm = algo_name};
  Step step = compile([&](Var x, Var y) { return cross_entropy((*model)(x), y); },
                      {InputSpec{{dtype, Shape{batch, 3, 32, 32}}, "x"}, input<std::int32_t>({batch})}, opt, {},
                      {.backend_options = backend_options, .threads = threads});
  Tensor x({batch, 3, 32, 32}, dtype), y({batch}, DType::i32);
  Rng r(1);
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    const float v = float(r.normal());
    if (dtype == DType::bf16) x.data<BFloat16>()[i] = BFloat16(v);
    else if (dtype == DType::f16) x.data<Half>()[i] = Half(v);
    else x.data<float>()[i] = v;
  }
  for (std::int64_t i = 0; i < batch; ++i) y.data<std::int32_t>()[i] = std::int32_t(r.below(10));

  float first = 0, last = 0;
  for (int s = 0; s < warmup; ++s) {
    float l = step.run(x, y);
    if (s == 0) first = l;
  }
  std::vector<double> t;
  for (int s = 0; s < steps; ++s) {
    auto t0 = Clock::now();
    last = step.run(x, y);
    t.push_back(ms_since(t0));
  }
  std::sort(t.begin(), t.end());
  std::printf("%s %s batch %lld, %d threads, %s convolutions (%s): median %.1f ms/step (min %.1f, max %.1f) over %d steps; loss %.7g -> %.7g\n",
              model_name.c_str(), dtype_name(dtype), (long long)batch, threads, cpu::conv_engine_from(engine_name) == cpu::ConvEngine::avx512 ? "avx512" : "blas", algo_name.c_str(), t[t.size() / 2], t.front(), t.back(), steps, first, last);
  std::printf("arena %.1f MiB (peak %.1f MiB), parameters and state %.1f MiB\n", step.plan().arena_bytes / 1048576.0,
              step.plan().peak_bytes / 1048576.0, step.plan().persistent_bytes / 1048576.0);

  std::fflush(stdout);
  auto by_op = profile(step, {&x, &y}, reps, backend_options);
  std::vector<std::pair<double, std::string>> rows;
  double total = 0;
  for (auto& [name, e] : by_op) {
    rows.push_back({e.first, name});
    total += e.first;
  }
  std::sort(rows.rbegin(), rows.rend());
  std::printf("\nper op (kernels run one by one, fastest of %d steps per op): %.1f ms in all\n", reps, total);
  for (auto& [ms, name] : rows)
    std::printf("  %-28s %4d calls %8.1f ms %5.1f%%\n", name.c_str(), by_op[name].second, ms, 100 * ms / total);
}
