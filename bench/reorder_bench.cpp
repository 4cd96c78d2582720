// Locality orderings (issue 19): what each vertex ordering of
// data/reorder.hpp does to SpMM forward and backward, breadth-first search
// and a GCN training epoch, on Cora and on a synthetic power-law graph of 2
// million nodes (data/power_law.hpp); and, as a model, the bytes a budget
// that keeps the gathered matrix in a slower tier would fetch per epoch.
//
//   cmake --build build --target reorder_bench
//   nice -n 10 build/bench/reorder_bench [--cora ../shared/data/cora] [--nodes 2000000] [--reps 5]
//       [--small-reps 50] [--epochs 5] [--small-epochs 30] [--threads 1] [--hidden 16] [--cache 0.1] [--no-gcn]
//
// Every ordering is applied to the whole task (data::permute_task: the
// adjacency's rows and columns, features, labels, splits), then the GCN
// matrix is normalised as samples/gcn does. Each cell is a median over
// repetitions, with the ratio original / this (above 1: faster than the
// original order; for the model, fewer bytes). The kernels and searches run
// in rounds, every ordering once per round, so the machine's noise hits them
// alike; the epochs run one ordering after another (one GCN step in memory).
//   SpMM fwd   cpu::spmm_kernel, Y = Â·X with X [n, hidden] f32 (the GCN's
//              first layer: spmm after the linear, as nn::GCNConv runs it)
//   SpMM bwd   cpu::spmm_permuted_kernel, dX = Âᵀ·G read through t_perm (the
//              backward of any spmm; for the GCN's constant symmetric Â the
//              plan runs the forward kernel again, so this is the general case)
//   BFS        a top-down breadth-first search of the 0/1 adjacency from the
//              same source vertices under every order, per search
//   epoch      one training step of samples/gcn's model (dropout, GCNConv,
//              ReLU, dropout, GCNConv; cross-entropy on the train split; Adam)
//   model      data::spmm_pages_fetched: the dense operands of the epoch's
//              four gathers (forward and backward of both layers: [n, hidden]
//              and [n, classes] f32) fetched in 4 KiB pages into an LRU cache
//              holding --cache of each operand's pages; MiB per epoch
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include <frugal/backend/cpu/blas.hpp>
#include <frugal/backend/cpu/spmm.hpp>
#include <frugal/data/power_law.hpp>
#include <frugal/data/reorder.hpp>
#include <frugal/frugal.hpp>

using namespace frugal;
using Clock = std::chrono::steady_clock;

namespace {

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

// Milliseconds of fn(), the median of reps runs after one to warm up.
template <class Fn>
double median_ms(int reps, Fn&& fn) {
  fn();
  std::vector<double> ms;
  for (int r = 0; r < reps; ++r) {
    auto t = Clock::now();
    fn();
    ms.push_back(ms_since(t));
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

struct Options {
  std::string cora = "../shared/data/cora";
  std::int64_t nodes = 2'000'000, hidden = 16, epochs = 5, small_epochs = 30;
  int reps = 5, small_reps = 50, threads = 1;
  double cache = 0.1;
  bool gcn = true;
};

Tensor random_matrix(std::int64_t rows, std::int64_t cols, std::uint64_t seed) {
  Tensor t({rows, cols});
  Rng rng(seed);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = float(rng.uniform(-1, 1));
  return t;
}

// Refs to tensors for calling a kernel directly (as bench/spmm_kernels.cpp).
struct KernelCall {
  std::vector<Shape> shapes;
  std::vector<TensorRef> in, out;
  KernelCall(std::vector<const Tensor*> ins, std::vector<Tensor*> outs) {
    shapes.reserve(ins.size() + outs.size());
    for (auto* t : ins) shapes.push_back(t->shape());
    for (auto* t : outs) shapes.push_back(t->shape());
    std::size_t k = 0;
    for (auto* t : ins) in.push_back({t->raw(), t->dtype(), &shapes[k++]});
    for (auto* t : outs) out.push_back({t->raw(), t->dtype(), &shapes[k++]});
  }
  KernelArgs args() { return KernelArgs{in, out}; }
};

// samples/gcn's model: dropout, GCNConv, ReLU, dropout, GCNConv.
struct Net : nn::Module {
  nn::GCNConv conv1, conv2;
  Net(std::int64_t in, std::int64_t hidden, std::int64_t classes) : conv1(in, hidden), conv2(hidden, classes) {
    register_module("conv1", conv1);
    register_module("conv2", conv2);
  }
  Var forward(Var x, const SparseMatrix& adj) {
    Var h = relu(conv1(dropout(x, 0.5, is_training()), adj));
    return conv2(dropout(h, 0.5, is_training()), adj);
  }
};

double gcn_epoch_ms(const data::NodeClassification& d, const SparseMatrix& adj, const Options& o, std::int64_t epochs) {
  nn::manual_seed(0);
  Net model(d.features.shape()[1], o.hidden, d.classes);
  optim::AdamW opt(model.parameters(), {.lr = 0.01, .weight_decay = 0});
  const auto n_train = std::int64_t(d.train.size());
  Tensor ids({n_train}, DType::i32), labels({n_train}, DType::i32);
  for (std::int64_t i = 0; i < n_train; ++i) {
    ids.data<std::int32_t>()[i] = std::int32_t(d.train[std::size_t(i)]);
    labels.data<std::int32_t>()[i] = d.labels.data<std::int32_t>()[d.train[std::size_t(i)]];
  }
  Step step = compile(
      [&](Var id, Var y) {
        return cross_entropy(index_select(model.forward(constant(d.features, "features"), adj), 0, id), y);
      },
      {input<std::int32_t>({n_train}, "train_ids"), input<std::int32_t>({n_train}, "train_labels")}, opt, {},
      {.threads = o.threads});
  step.run(ids, labels);
  return median_ms(int(epochs), [&] { step.run(ids, labels); });
}

struct Row {
  std::string name;
  double order_ms = 0, gap = 0, fwd = 0, bwd = 0, bfs = 0, epoch = 0, fetched_mib = 0;
};

struct Ordering {
  std::string name;
  std::function<std::vector<std::int64_t>(const data::Csr&)> make;
};

std::vector<Ordering> orderings() {
  return {
      {"original", [](const data::Csr& g) {
         std::vector<std::int64_t> same(static_cast<std::size_t>(g.rows));
         std::iota(same.begin(), same.end(), std::int64_t(0));
         return same;
       }},
      {"random", [](const data::Csr& g) { return data::random_order(g.rows, 1); }},
      {"degree sort", [](const data::Csr& g) { return data::degree_order(g); }},
      {"RCM", [](const data::Csr& g) { return data::rcm_order(g); }},
      {"bisection", [](const data::Csr& g) { return data::bisection_order(g); }},
      {"HALO", [](const data::Csr& g) { return data::halo_order(g); }},
  };
}

// One ordering's graph, kept for the timing rounds: the 0/1 adjacency (for
// the searches), the GCN matrix as spmm reads it, the search sources.
struct Ordered {
  Row row;
  data::Csr adjacency;
  SparseMatrix adj;
  std::vector<std::int64_t> sources;
};

// What is measured once per ordering: the ordering's own time, the gap, the
// page model and (one GCN step alive at a time, for memory) the epoch.
Ordered prepare(const Ordering& ordering, const data::NodeClassification& base, const Options& o,
                std::int64_t epochs) {
  Ordered out;
  out.row.name = ordering.name;
  auto t0 = Clock::now();
  const std::vector<std::int64_t> order = ordering.make(base.adjacency);
  out.row.order_ms = ms_since(t0);
  const data::NodeClassification d = data::permute_task(base, order);
  const data::Csr csr = data::gcn_normalize(d.adjacency);
  out.adj = data::to_sparse(csr);
  const std::int64_t n = d.nodes();
  out.row.gap = data::mean_edge_gap(d.adjacency);
  // The same source vertices under every order: old ids mapped to new ones.
  const std::vector<std::int64_t> rank = data::inverse_order(order), picks = data::random_order(n, 7);
  for (std::int64_t s = 0; s < std::min<std::int64_t>(4, n); ++s)
    out.sources.push_back(rank[std::size_t(picks[std::size_t(s)])]);

  const std::int64_t page = 4096;
  auto fetched = [&](std::int64_t width) {
    const std::int64_t row_bytes = width * 4, pages = (n * row_bytes + page - 1) / page;
    const auto cache = std::max<std::int64_t>(1, std::int64_t(o.cache * double(pages)));
    return double(data::spmm_pages_fetched(csr, row_bytes, page, cache) * page);
  };
  out.row.fetched_mib = 2 * (fetched(o.hidden) + fetched(d.classes)) / (1024.0 * 1024.0);
  if (o.gcn) out.row.epoch = gcn_epoch_ms(d, out.adj, o, epochs);
  out.adjacency = d.adjacency;
  return out;
}

// The kernels and the searches in rounds, every ordering once per round, so
// that noise from the rest of the machine hits them alike.
void time_in_rounds(std::vector<Ordered>& all, const Options& o, int reps) {
  const std::int64_t n = all.front().adjacency.rows;
  Tensor x = random_matrix(n, o.hidden, 1), g = random_matrix(n, o.hidden, 2), y({n, o.hidden}), dx({n, o.hidden});
  ops::Spmm spmm_op;
  ops::SpmmPermuted spmm_t_op;
  data::BreadthFirstSearch bfs(n);
  std::vector<std::vector<double>> fwd(all.size()), bwd(all.size()), search(all.size());
  for (int r = -1; r < reps; ++r)  // round -1 warms up
    for (std::size_t k = 0; k < all.size(); ++k) {
      const SparseMatrix& a = all[k].adj;
      KernelCall f({&a.row_ptr, &a.col, &a.values, &x}, {&y});
      KernelCall b({&a.t_ptr, &a.t_idx, &a.values, &g, &a.t_perm}, {&dx});
      auto t = Clock::now();
      cpu::spmm_kernel(spmm_op, f.args());
      const double f_ms = ms_since(t);
      t = Clock::now();
      cpu::spmm_permuted_kernel(spmm_t_op, b.args());
      const double b_ms = ms_since(t);
      t = Clock::now();
      for (std::int64_t s : all[k].sources) bfs.run(all[k].adjacency, s);
      const double s_ms = ms_since(t) / double(all[k].sources.size());
      if (r < 0) continue;
      fwd[k].push_back(f_ms), bwd[k].push_back(b_ms), search[k].push_back(s_ms);
    }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  for (std::size_t k = 0; k < all.size(); ++k) {
    all[k].row.fwd = median(fwd[k]);
    all[k].row.bwd = median(bwd[k]);
    all[k].row.bfs = median(search[k]);
  }
}

void print_table(const std::string& title, const std::vector<Row>& rows, bool gcn) {
  std::printf("\n**%s**\n\n", title.c_str());
  std::printf("| ordering | ordering time | mean \\|i-j\\| | SpMM fwd ms | SpMM bwd ms | BFS ms | GCN epoch ms | "
              "fetched MiB/epoch (model) |\n|---|---:|---:|---:|---:|---:|---:|---:|\n");
  const Row& base = rows.front();
  auto cell = [](double v, double ref) {
    char s[64];
    std::snprintf(s, sizeof s, v >= 100 ? "%.0f (%.2fx)" : v >= 1 ? "%.2f (%.2fx)" : "%.3f (%.2fx)", v,
                  v > 0 ? ref / v : 0.0);
    return std::string(s);
  };
  for (const Row& r : rows) {
    char t[32];
    const bool seconds = r.order_ms >= 1000;
    std::snprintf(t, sizeof t, seconds ? "%.1f s" : "%.0f ms", seconds ? r.order_ms / 1000 : r.order_ms);
    std::printf("| %s | %s | %.0f | %s | %s | %s | %s | %s |\n", r.name.c_str(), t, r.gap,
                cell(r.fwd, base.fwd).c_str(), cell(r.bwd, base.bwd).c_str(), cell(r.bfs, base.bfs).c_str(),
                gcn ? cell(r.epoch, base.epoch).c_str() : "-", cell(r.fetched_mib, base.fetched_mib).c_str());
  }
  std::fflush(stdout);
}

void run_graph(const std::string& title, const data::NodeClassification& d, const Options& o, int reps,
               std::int64_t epochs) {
  std::vector<Ordered> all;
  for (const Ordering& ordering : orderings()) {
    all.push_back(prepare(ordering, d, o, epochs));
    std::fprintf(stderr, "  %s: prepared\n", ordering.name.c_str());
  }
  time_in_rounds(all, o, reps);
  std::vector<Row> rows;
  for (const Ordered& k : all) rows.push_back(k.row);
  print_table(title, rows, o.gcn);
}

}  // namespace

int main(int argc, char** argv) try {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw std::runtime_error(a + " needs a value");
      return argv[++i];
    };
    if (a == "--cora") o.cora = next();
    else if (a == "--nodes") o.nodes = std::atoll(next().c_str());
    else if (a == "--reps") o.reps = std::atoi(next().c_str());
    else if (a == "--small-reps") o.small_reps = std::atoi(next().c_str());
    else if (a == "--epochs") o.epochs = std::atoll(next().c_str());
    else if (a == "--small-epochs") o.small_epochs = std::atoll(next().c_str());
    else if (a == "--threads") o.threads = std::atoi(next().c_str());
    else if (a == "--hidden") o.hidden = std::atoll(next().c_str());
    else if (a == "--cache") o.cache = std::atof(next().c_str());
    else if (a == "--no-gcn") o.gcn = false;
    else {
      std::fprintf(stderr,
                   "usage: %s [--cora DIR] [--nodes N] [--reps N] [--small-reps N] [--epochs N] [--small-epochs N] "
                   "[--threads N] "
                   "[--hidden N] [--cache FRACTION] [--no-gcn]\n",
                   argv[0]);
      return 2;
    }
  }
  omp_set_num_threads(o.threads);
  cpu::set_blas_threads(o.threads);
  std::printf("reorder_bench: %d thread(s), hidden %lld, %d repetitions (%d on Cora), %lld epochs (%lld on Cora), page "
              "cache %.0f%% of each operand\n",
              o.threads, (long long)o.hidden, o.reps, o.small_reps, (long long)o.epochs, (long long)o.small_epochs,
              100 * o.cache);

  if (std::filesystem::exists(std::filesystem::path(o.cora) / "nodes.tsv")) {
    data::NodeClassification cora = data::load_planetoid(o.cora);
    run_graph("Cora (" + std::to_string(cora.nodes()) + " nodes, " + std::to_string(cora.adjacency.nnz()) +
                  " adjacency entries)",
              cora, o, o.small_reps, o.small_epochs);
  } else {
    std::fprintf(stderr, "reorder_bench: no Cora files in '%s'; skipping Cora\n", o.cora.c_str());
  }

  if (o.nodes > 0) {
    data::PowerLawOptions po;
    po.nodes = o.nodes;
    auto t0 = Clock::now();
    data::NodeClassification big = data::power_law_graph(po);
    const double gen_s = ms_since(t0) / 1000;
    char title[256];
    std::snprintf(title, sizeof title,
                  "synthetic power-law graph (data::power_law_graph, seed 0: %lld nodes, %lld adjacency entries, "
                  "exponent %.1f, %lld communities, blocks of %lld; generated in %.1f s)",
                  (long long)big.nodes(), (long long)big.adjacency.nnz(), po.exponent, (long long)po.communities,
                  (long long)po.block_size, gen_s);
    run_graph(title, big, o, o.reps, o.epochs);
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "reorder_bench: %s\n", e.what());
  return 1;
}
