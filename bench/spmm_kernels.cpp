// SpMM kernel timings at the PyTorch peer's GCN shapes, and the whole GCN
// training step (the peer's gcn workload: 20,000 nodes, 200,000 random
// undirected edges, symmetrised with self loops, 128 features, hidden 128,
// 16 classes, full batch, Adam).
//
// Build and run from the repository root (not part of the CMake build):
//   g++ -O3 -std=c++20 -fopenmp -Iinclude -I/usr/include/x86_64-linux-gnu/openblas-openmp
//       bench/spmm_kernels.cpp /usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.so -o /tmp/spmm_kernels
//   /tmp/spmm_kernels [--threads 2] [--reps 40] [--steps 30] [--no-step] [--no-kernels] [--only NAME] [--profile]
//
// Each kernel is timed in rounds (every kernel once per round, so machine
// noise hits them alike); the table shows the minimum and the median.
#include <omp.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <frugal/frugal.hpp>

using namespace frugal;
using Clock = std::chrono::steady_clock;

namespace {

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

struct Args {
  std::vector<TensorRef> in, out;
  std::vector<Shape> shapes;  // kept alive for the refs
};

Args refs(std::vector<const Tensor*> in, std::vector<Tensor*> out) {
  Args a;
  a.shapes.reserve(in.size() + out.size());
  for (auto* t : in) a.shapes.push_back(t->shape());
  for (auto* t : out) a.shapes.push_back(t->shape());
  std::size_t k = 0;
  for (auto* t : in) a.in.push_back({t->raw(), t->dtype(), &a.shapes[k++]});
  for (auto* t : out) a.out.push_back({t->raw(), t->dtype(), &a.shapes[k++]});
  return a;
}

Tensor random_tensor(Shape s, std::uint64_t seed) {
  Tensor t(std::move(s));
  Rng rng(seed);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = float(rng.uniform(-1, 1));
  return t;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Milliseconds per op kind over one step: the plan's schedule run kernel by
// kernel on a second arena, each kernel timed (medians over `steps`).
void profile_step(const Step& step, const Tensor& x, const Tensor& y, int steps) {
  const Graph& g = step.graph();
  const Plan& plan = step.plan();
  auto backend = make_backend("cpu");
  std::vector<std::byte> arena(plan.arena_bytes + 4096);
  auto address = [&](ValueId v) -> void* {
    if (plan.offset_of[std::size_t(v)]) return arena.data() + *plan.offset_of[std::size_t(v)];
    return g.value(v).external.raw();
  };
  struct Bound {
    const Node* node;
    std::vector<TensorRef> in, out;
    void* ws = nullptr;
    std::size_t ws_bytes = 0;
    std::vector<double> ms;
  };
  std::vector<Bound> bound;
  for (NodeId n : plan.schedule) {
    const Node& node = g.node(n);
    Bound b{&node, {}, {}};
    for (ValueId i : node.inputs) b.in.push_back({address(i), g.value(i).meta.dtype, &g.value(i).meta.shape});
    for (ValueId o : node.results()) b.out.push_back({address(o), g.value(o).meta.dtype, &g.value(o).meta.shape});
    if (node.has_workspace) {
      b.ws = address(node.outputs.back());
      b.ws_bytes = g.value(node.outputs.back()).meta.nbytes();
    }
    bound.push_back(std::move(b));
  }
  // Inputs: the first two input values, in declaration order.
  auto inputs = g.values_of_kind(ValueKind::input);
  for (int s = 0; s < steps + 2; ++s) {
    // Inputs die at their last reader, so they are staged every step.
    std::memcpy(address(inputs[0]), x.raw(), x.nbytes());
    std::memcpy(address(inputs[1]), y.raw(), y.nbytes());
    for (auto& b : bound) {
      auto t = Clock::now();
      backend->kernel_for(*b.node->op)(*b.node->op, KernelArgs{b.in, b.out, std::uint64_t(s), b.ws, b.ws_bytes});
      if (s >= 2) b.ms.push_back(ms_since(t));
    }
  }
  std::map<std::string, std::pair<double, int>> by;
  double total = 0;
  for (auto& b : bound) {
    std::string key = b.node->op->name() + " " + (b.out.empty() ? b.in[0].shape->str() : b.out[0].shape->str());
    double m = median(b.ms);
    by[key].first += m;
    by[key].second += 1;
    total += m;
  }
  std::vector<std::pair<double, std::string>> rows;
  for (auto& [k, v] : by) rows.push_back({v.first, k + (v.second > 1 ? cat(" (x", v.second, ")") : std::string())});
  std::sort(rows.rbegin(), rows.rend());
  std::printf("\nper-op medians (sum %.2f ms):\n", total);
  for (auto& [m, k] : rows)
    if (m >= 0.05) std::printf("  %7.2f ms  %s\n", m, k.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2, reps = 40, steps = 30;
  bool step_bench = true, profile = false, kernel_bench = true;
  std::string only;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--threads" && i + 1 < argc) threads = std::atoi(argv[++i]);
    else if (a == "--reps" && i + 1 < argc) reps = std::atoi(argv[++i]);
    else if (a == "--steps" && i + 1 < argc) steps = std::atoi(argv[++i]);
    else if (a == "--no-step") step_bench = false;
    else if (a == "--profile") profile = true;
    else if (a == "--no-kernels") kernel_bench = false;
    else if (a == "--only" && i + 1 < argc) only = argv[++i];
    else {
      std::fprintf(stderr, "usage: %s [--threads N] [--reps N] [--steps N] [--no-step] [--no-kernels] [--only NAME] [--profile]\n", argv[0]);
      return 2;
    }
  }
  omp_set_num_threads(threads);
  cpu::set_blas_threads(threads);

  const std::int64_t n = 20000, e = 200000, fin = 128, hidden = 128, classes = 16;
  auto t0 = Clock::now();
  data::Csr csr = data::gcn_adjacency(n, data::random_edges(n, e, 0));
  SparseMatrix adj = data::to_sparse(csr);
  std::printf("graph: %lld nodes, %lld nonzeros (built in %.0f ms), %d threads\n", (long long)n,
              (long long)csr.nnz(), ms_since(t0), threads);

  // Kernels at the step's shapes: forward A·X, backward Aᵀ·G (the
  // permuted-values form), and the values gradient.
  struct Kernel {
    std::string name;
    double gathered_bytes;
    std::function<void()> run;
    std::vector<double> ms;
  };
  std::vector<Kernel> ks;
  std::vector<Tensor> keep;
  std::vector<std::shared_ptr<Args>> args;
  ops::Spmm spmm_op;
  ops::SpmmPermuted spmm_t_op;
  ops::SpmmValuesGrad vgrad_op;
  for (std::int64_t f : {hidden, classes}) {
    Tensor x = random_tensor({n, f}, 1 + std::uint64_t(f)), g = random_tensor({n, f}, 2 + std::uint64_t(f));
    Tensor y({n, f}), dx({n, f}), dv({csr.nnz()});
    keep.insert(keep.end(), {x, g, y, dx, dv});
    auto fa = std::make_shared<Args>(refs({&adj.row_ptr, &adj.col, &adj.values, &x}, {&y}));
    auto ba = std::make_shared<Args>(refs({&adj.t_ptr, &adj.t_idx, &adj.values, &g, &adj.t_perm}, {&dx}));
    auto va = std::make_shared<Args>(refs({&adj.row_ptr, &adj.col, &g, &x}, {&dv}));
    args.insert(args.end(), {fa, ba, va});
    double bytes = double(csr.nnz()) * double(f) * 4;
    ks.push_back({"spmm forward      f=" + std::to_string(f), bytes,
                  [&, fa] { cpu::spmm_kernel(spmm_op, KernelArgs{fa->in, fa->out}); }, {}});
    ks.push_back({"spmm backward dX  f=" + std::to_string(f), bytes,
                  [&, ba] { cpu::spmm_permuted_kernel(spmm_t_op, KernelArgs{ba->in, ba->out}); }, {}});
    ks.push_back({"spmm dValues      f=" + std::to_string(f), bytes,
                  [&, va] { cpu::spmm_values_grad_kernel(vgrad_op, KernelArgs{va->in, va->out}); }, {}});
  }
  if (!kernel_bench) ks.clear();
  if (!only.empty())
    ks.erase(std::remove_if(ks.begin(), ks.end(),
                            [&](const Kernel& k) { return k.name.find(only) == std::string::npos; }),
             ks.end());
  for (auto& k : ks) k.run();  // warm up
  for (int r = 0; r < reps; ++r)
    for (auto& k : ks) {
      auto t = Clock::now();
      k.run();
      k.ms.push_back(ms_since(t));
    }
  if (!ks.empty()) std::printf("\n| kernel | min ms | median ms | gathered GB/s (at min) |\n|---|---:|---:|---:|\n");
  for (auto& k : ks) {
    double mn = *std::min_element(k.ms.begin(), k.ms.end());
    std::printf("| %s | %.3f | %.3f | %.1f |\n", k.name.c_str(), mn, median(k.ms), k.gathered_bytes / mn / 1e6);
  }

  if (!step_bench) return 0;
  // The whole training step, as the peer runs it.
  nn::manual_seed(0);
  nn::Gcn model(fin, hidden, classes);
  optim::AdamW opt(model.parameters(), {.lr = 0.01, .weight_decay = 0});
  Step step = compile([&](Var x, Var y) { return cross_entropy(model(x, adj), y); },
                      {input<float>({n, fin}), input<std::int32_t>({n})}, opt, {}, {.threads = threads});
  Tensor x = random_tensor({n, fin}, 7), y({n}, DType::i32);
  Rng rng(8);
  for (std::int64_t i = 0; i < n; ++i) y.data<std::int32_t>()[i] = std::int32_t(rng.below(classes));
  std::vector<double> ms;
  float first = 0, last = 0;
  for (int s = 0; s < 3; ++s) first = s == 0 ? step.run(x, y) : (step.run(x, y), first);
  for (int s = 0; s < steps; ++s) {
    auto t = Clock::now();
    last = step.run(x, y);
    ms.push_back(ms_since(t));
  }
  std::printf("\nGCN step (Gcn %lld-%lld-%lld, Adam): median %.2f ms, min %.2f ms over %d steps; loss %.4f -> %.4f; "
              "arena %s, persistent %s\n",
              (long long)fin, (long long)hidden, (long long)classes, median(ms),
              *std::min_element(ms.begin(), ms.end()), steps, first, last,
              format_bytes(step.plan().arena_bytes).c_str(), format_bytes(step.plan().persistent_bytes).c_str());
  if (profile) profile_step(step, x, y, steps);
  return 0;
}
