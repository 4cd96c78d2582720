#pragma once
// Mini-batches of a graph too large for the device: neighbour-sampled blocks
// (neighbor_sampler.hpp) turned into step inputs of a few fixed shapes, so a
// compiled, planned step runs them within the budget.
//
// Why inputs and why buckets. A sampled batch has its own node and edge
// counts, and a frugal step is planned for fixed shapes. The batch's blocks
// and its gathered features therefore enter the step as inputs (not as
// constants bound at capture, as a full-graph adjacency is), padded up to a
// size bucket: every count rounds up to the next of 64·r^k (a BucketRule,
// as batches of many graphs use), so all batches of a run fall into a few shapes, each planned once
// and cached (ShapeCache plans one step per shape within one shared budget).
//
// Why padding changes nothing. Padding nodes get zero features and no
// sampled edges; padding entries have value 0 and sit in the last row of a
// block, pointing at a padding column. A destination's output reads only its
// own row of each block, and its real entries point at real sources, so the
// outputs of real nodes, the loss over the seeds and every gradient are what
// the unpadded batch computes (padding sources receive gradients no real node
// reads). Row order is kept: the padding of each layer's newly reached nodes
// sits after them, so every layer's destinations still lead its sources.
//
// Where the features live. The feature matrix stays in host memory, outside
// any step; a batch gathers its rows on the host (as PyG's NeighborLoader and
// DGL's samplers do) and only the gathered rows enter the device budget, as
// the step's input. Prefetch overlaps that gather, and the sampling, with
// the step that runs the batch before (and, with several workers, each
// batch's with the next's).
//
// Reproducible: the seeds of a step come from an EpochSampler (a
// permutation per (seed, epoch)) and its neighbours from a seed mixed of
// (seed, step), so a resumed run sees the same batches from any step on.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "../core/error.hpp"
#include "../core/rng.hpp"
#include "../core/tensor.hpp"
#include "../runtime/compile.hpp"
#include "bucket_padding.hpp"
#include "graph.hpp"
#include "neighbor_sampler.hpp"
#include "sampler.hpp"

namespace frugal::data {

// A sampled subgraph padded to bucket sizes.
struct PaddedSubgraph {
  std::vector<std::int64_t> nodes;  // [sources of the input layer]: global id, or -1 for padding
  std::vector<Csr> blocks;          // as SampledSubgraph::blocks, padded; blocks[l] is [rows, cols]
  std::int64_t seeds = 0;           // the first `seeds` nodes are the batch's seeds (never padded)
  std::int64_t real_nodes = 0;      // before padding, for reports
};

// Pads s: the seeds stay as they are; each layer's newly reached nodes are
// followed by padding nodes up to the bucket of the layer's source count
// (always at least one, so padding entries have a column to point at); each
// block's entries are padded to the bucket of its entry count.
inline PaddedSubgraph pad_subgraph(const SampledSubgraph& s, const BucketRule& rule) {
  const std::size_t L = s.blocks.size();
  if (L == 0) fail<DataError>("pad_subgraph: the subgraph has no layers");
  // real[k]: nodes reached within k hops of the seeds (real[0] = the seeds),
  // padded[k] the same with padding.
  std::vector<std::int64_t> real(L + 1), padded(L + 1);
  real[0] = padded[0] = s.blocks[L - 1].rows;
  for (std::size_t k = 1; k <= L; ++k) {
    real[k] = s.blocks[L - k].cols;
    if (real[k] < real[k - 1] || s.blocks[L - k].rows != real[k - 1])
      fail<DataError>("pad_subgraph: block ", L - k, " is [", s.blocks[L - k].rows, ", ", s.blocks[L - k].cols,
                      "]; its destinations must be the sources of the block after it, and lead its own sources");
    padded[k] = rule.bucket(padded[k - 1] + (real[k] - real[k - 1]) + 1);
  }
  if (std::int64_t(s.nodes.size()) != real[L])
    fail<DataError>("pad_subgraph: ", s.nodes.size(), " nodes, but the input layer's block has ", real[L], " sources");
  auto position = [&](std::int64_t p) {  // real position -> padded position
    std::size_t k = 0;
    while (p >= real[k]) ++k;  // p is in the segment of nodes first reached at hop k
    return k == 0 ? p : padded[k - 1] + (p - real[k - 1]);
  };
  PaddedSubgraph out;
  out.seeds = real[0];
  out.real_nodes = real[L];
  out.nodes.assign(std::size_t(padded[L]), -1);
  for (std::int64_t p = 0; p < real[L]; ++p) out.nodes[std::size_t(position(p))] = s.nodes[std::size_t(p)];
  for (std::size_t l = 0; l < L; ++l) {
    const Csr& b = s.blocks[l];
    const std::int64_t rows = padded[L - 1 - l], cols = padded[L - l];
    Csr c;
    c.rows = rows;
    c.cols = cols;
    c.row_ptr.assign(std::size_t(rows + 1), 0);
    for (std::int64_t i = 0; i < b.rows; ++i)
      c.row_ptr[std::size_t(position(i) + 1)] = b.row_ptr[std::size_t(i + 1)] - b.row_ptr[std::size_t(i)];
    for (std::int64_t i = 0; i < rows; ++i) c.row_ptr[std::size_t(i + 1)] += c.row_ptr[std::size_t(i)];
    // Positions keep the order of rows and columns, so entries stay sorted.
    c.col.reserve(std::size_t(rule.bucket(b.nnz())));
    for (std::int64_t p = 0; p < b.nnz(); ++p) c.col.push_back(position(b.col[std::size_t(p)]));
    c.values = b.values;
    const std::int64_t entries = rule.bucket(b.nnz());
    while (c.nnz() < entries) {  // value 0, last row, last (a padding) column: sorted, and adds nothing
      c.col.push_back(cols - 1);
      c.values.push_back(0.0);
    }
    c.row_ptr.back() = c.nnz();
    out.blocks.push_back(std::move(c));
  }
  return out;
}

// How a sampled batch enters a step: the gathered features x [sources, f],
// the seeds' labels y [seeds] (i32), then per block, input layer first, the
// seven tensors of its SparseMatrix with transpose (row_ptr i64, col i32,
// values f32, t_ptr i64, t_idx i32, t_perm i32, t_values f32).
inline constexpr std::size_t tensors_per_block = 7;

// The step's inputs for `layers` blocks, named, with placeholder shapes (a
// ShapeCache reads names and dtypes; each run brings its shapes).
inline std::vector<InputSpec> sampled_input_specs(std::size_t layers, DType features = DType::f32) {
  std::vector<InputSpec> s{{{features, Shape{1, 1}}, "x"}, {{DType::i32, Shape{1}}, "y"}};
  const std::pair<const char*, DType> parts[tensors_per_block] = {
      {"row_ptr", DType::i64}, {"col", DType::i32},    {"values", features}, {"t_ptr", DType::i64},
      {"t_idx", DType::i32},   {"t_perm", DType::i32}, {"t_values", features}};
  for (std::size_t l = 0; l < layers; ++l)
    for (const auto& [name, dt] : parts) s.push_back({{dt, Shape{1}}, cat("block", l, ".", name)});
  return s;
}

// Block l of a step's inputs (vars as sampled_input_specs orders them) as
// the SparseVar a graph layer reads.
inline SparseVar block_var(std::span<const Var> vars, std::size_t l) {
  const std::size_t at = 2 + l * tensors_per_block;
  if (vars.size() < at + tensors_per_block)
    fail<ShapeError>("block_var: block ", l, " needs inputs ", at, " to ", at + tensors_per_block - 1, ", the step has ",
                     vars.size());
  SparseVar a;
  a.row_ptr = vars[at];
  a.col = vars[at + 1];
  a.values = vars[at + 2];
  a.t_ptr = vars[at + 3];
  a.t_idx = vars[at + 4];
  a.t_perm = vars[at + 5];
  a.t_values = vars[at + 6];
  a.rows = a.row_ptr.dim(0) - 1;
  a.cols = a.t_ptr->dim(0) - 1;
  return a;
}

namespace sampled_detail {
template <std::size_t>
using AnyVar = Var;
template <class F, class Seq>
struct StepOverBlocks;
// A step function with one named Var per input (compile reads how many
// inputs a step takes from its signature) that hands f the features, the
// labels and the blocks as SparseVars.
template <class F, std::size_t... I>
struct StepOverBlocks<F, std::index_sequence<I...>> {
  F f;
  Var operator()(AnyVar<I>... v) const {
    const std::array<Var, sizeof...(I)> all{v...};
    std::vector<SparseVar> blocks;
    for (std::size_t l = 0; l < (sizeof...(I) - 2) / tensors_per_block; ++l) blocks.push_back(block_var(all, l));
    return f(all[0], all[1], blocks);
  }
};
}  // namespace sampled_detail

// A step function over the inputs of sampled_input_specs(Layers) from
// f(Var x, Var y, const std::vector<SparseVar>& blocks), for compile,
// plan_training or cache_shapes.
template <std::size_t Layers, class F>
auto step_over_blocks(F f) {
  return sampled_detail::StepOverBlocks<F, std::make_index_sequence<2 + tensors_per_block * Layers>>{std::move(f)};
}

// The step inputs of a padded batch: the rows of `features` (host memory,
// [graph nodes, f]) for its nodes, zero for padding; `labels` (i32 [graph
// nodes]) of its seeds; the blocks.
inline std::vector<Tensor> sampled_step_inputs(const PaddedSubgraph& p, const Tensor& features, const Tensor& labels) {
  if (features.shape().rank() != 2 || (features.dtype() != DType::f32 && features.dtype() != DType::f64))
    fail<DataError>("sampled_step_inputs: features must be an f32 or f64 matrix [nodes, f], got ",
                    features.shape().str(), " ", dtype_name(features.dtype()));
  if (labels.dtype() != DType::i32 || labels.shape() != Shape{features.shape()[0]})
    fail<DataError>("sampled_step_inputs: labels must be i32 [", features.shape()[0], "] (one per node), got ",
                    labels.shape().str(), " ", dtype_name(labels.dtype()));
  const std::int64_t f = features.shape()[1];
  const std::size_t row_bytes = std::size_t(f) * dtype_size(features.dtype());
  std::vector<Tensor> in;
  Tensor x({std::int64_t(p.nodes.size()), f}, features.dtype());
  auto* dst = static_cast<std::byte*>(x.raw());
  const auto* src = static_cast<const std::byte*>(features.raw());
  for (std::size_t i = 0; i < p.nodes.size(); ++i) {
    const std::int64_t g = p.nodes[i];
    if (g >= features.shape()[0])
      fail<DataError>("sampled_step_inputs: node ", g, " is outside the ", features.shape()[0], " rows of the features");
    if (g < 0) std::memset(dst + i * row_bytes, 0, row_bytes);
    else std::memcpy(dst + i * row_bytes, src + std::size_t(g) * row_bytes, row_bytes);
  }
  in.push_back(std::move(x));
  Tensor y({p.seeds}, DType::i32);
  for (std::int64_t i = 0; i < p.seeds; ++i) y.data<std::int32_t>()[i] = labels.data<std::int32_t>()[p.nodes[std::size_t(i)]];
  in.push_back(std::move(y));
  for (const Csr& b : p.blocks) {
    SparseMatrix m = to_sparse(b, features.dtype());
    for (Tensor* t : {&m.row_ptr, &m.col, &m.values, &m.t_ptr, &m.t_idx, &m.t_perm, &m.t_values}) in.push_back(*t);
  }
  return in;
}

struct NeighborLoaderOptions {
  std::int64_t batch_size = 1024;             // seeds per batch; an epoch drops its last partial batch
  std::vector<std::int64_t> fanouts{10, 5};  // per layer, the input layer first (PyG's num_neighbors)
  BucketRule bucket{.ratio = 1.1};           // the size buckets (bucket_padding.hpp)
  std::uint64_t seed = 0;
};

// One sampled batch, ready for a step.
struct SampledBatch {
  std::int64_t step = 0;
  PaddedSubgraph graph;
  std::vector<Tensor> inputs;  // sampled_step_inputs(graph, ...)
};

// GraphSAGE-style mini-batches over the nodes `targets` of `graph` (row i:
// the nodes i aggregates from), by global step: step s is batch
// s % steps_per_epoch() of epoch s / steps_per_epoch().
class NeighborLoader {
 public:
  // graph, features and labels are read, not copied: they must outlive the loader.
  NeighborLoader(const Csr& graph, const Tensor& features, const Tensor& labels, std::vector<std::int64_t> targets,
                 NeighborLoaderOptions o)
      : graph_(graph), features_(features), labels_(labels), targets_(std::move(targets)), o_(std::move(o)),
        epochs_(checked_targets(targets_, o_), o_.batch_size, o_.seed) {
    if (o_.fanouts.empty()) fail<DataError>("NeighborLoader: needs at least one layer's fanout");
    if (features.shape().rank() != 2 || features.shape()[0] != graph.rows)
      fail<DataError>("NeighborLoader: features ", features.shape().str(), " must have one row per graph node (",
                      graph.rows, ")");
    for (std::int64_t t : targets_)
      if (t < 0 || t >= graph.rows) fail<DataError>("NeighborLoader: target node ", t, " is outside [0, ", graph.rows, ")");
  }
  std::int64_t steps_per_epoch() const { return epochs_.batches_per_epoch(); }
  const NeighborLoaderOptions& options() const { return o_; }

  // The seeds of global step s. Safe to call from several threads at once,
  // as sample() and batch() are (a Prefetch with several workers).
  std::vector<std::int64_t> seeds(std::int64_t s) {
    std::lock_guard<std::mutex> lock(epochs_mutex_);  // EpochSampler keeps the current epoch's order
    const std::int64_t* b = epochs_.batch(s);
    std::vector<std::int64_t> out;
    for (std::int64_t i = 0; i < o_.batch_size; ++i) out.push_back(targets_[std::size_t(b[i])]);
    return out;
  }
  SampledSubgraph sample(std::int64_t s) {
    const std::vector<std::int64_t> sd = seeds(s);
    // The draw's seed: Philox keyed by the loader's seed at counter (tag,
    // step), as dropout keys its masks, so neighbouring steps draw unrelated
    // streams.
    const Philox::Block k = Philox(o_.seed)(0x6e65696768626f72ull /* "neighbor" */, std::uint64_t(s));
    return sample_neighbors(graph_, sd, o_.fanouts, std::uint64_t(k.v[0]) | std::uint64_t(k.v[1]) << 32);
  }
  SampledBatch batch(std::int64_t s) {
    SampledBatch b;
    b.step = s;
    b.graph = pad_subgraph(sample(s), o_.bucket);
    b.inputs = sampled_step_inputs(b.graph, features_, labels_);
    return b;
  }

 private:
  static std::int64_t checked_targets(const std::vector<std::int64_t>& t, const NeighborLoaderOptions& o) {
    if (o.batch_size <= 0 || std::int64_t(t.size()) < o.batch_size)
      fail<DataError>("NeighborLoader: ", t.size(), " target nodes cannot make a batch of ", o.batch_size,
                      " seeds; lower batch_size (an epoch drops its last partial batch)");
    return std::int64_t(t.size());
  }

  const Csr& graph_;
  const Tensor& features_;
  const Tensor& labels_;
  std::vector<std::int64_t> targets_;
  NeighborLoaderOptions o_;
  EpochSampler epochs_;
  std::mutex epochs_mutex_;
};

// A loader's prefetch: items first, first+1, ... handed out in order, the
// next `ahead` of them made meanwhile on threads of their own, so making
// them (sampling, gathering) overlaps the caller's work on the current one
// and, with ahead > 1, each other. make(k) is called from those threads,
// several at once when ahead > 1, so it must be safe to call concurrently
// (NeighborLoader::batch is) and beside the caller's work.
template <class T>
class Prefetch {
 public:
  Prefetch(std::function<T(std::int64_t)> make, std::int64_t first, int ahead = 1)
      : make_(std::move(make)), next_(first) {
    if (ahead < 1) fail<DataError>("Prefetch: ahead must be at least 1, got ", ahead);
    for (int k = 0; k < ahead; ++k) start();
  }
  ~Prefetch() {
    for (auto& f : pending_)
      if (f.valid()) f.wait();  // what they read must outlive them
  }
  Prefetch(const Prefetch&) = delete;
  Prefetch& operator=(const Prefetch&) = delete;
  // The next item in order; starts making another. An exception make threw
  // for this item is rethrown here.
  T next() {
    T item = pending_.front().get();
    pending_.pop_front();
    start();
    return item;
  }

 private:
  void start() { pending_.push_back(std::async(std::launch::async, make_, next_++)); }

  std::function<T(std::int64_t)> make_;
  std::int64_t next_;
  std::deque<std::future<T>> pending_;
};

}  // namespace frugal::data
