#pragma once
// The model families the tools plan and the benchmarks measure, built from
// frugal's public API: an MLP, a GPT-style transformer and a GCN. Until the
// dedicated Embedding, LayerNorm and SpMM ops land, the transformer embeds
// tokens as a one-hot matmul and composes layer norm from primitives, and the
// GCN multiplies by a dense normalised adjacency; the memory they plan is
// the memory those forms really use.
#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <frugal/frugal.hpp>

namespace zoo {

using namespace frugal;

struct Config {
  std::string family = "mlp";  // mlp | gpt | gcn
  int batch = 64;              // samples (mlp), sequences (gpt), nodes (gcn)
  int layers = 2;              // hidden layers (mlp), blocks (gpt), graph convolutions (gcn)
  int width = 256;             // hidden width (mlp, gcn), model dimension (gpt)
  DType dtype = DType::f32;
  std::string optimizer = "adamw";  // adamw | sgd
  int seq = 64;                     // gpt context
  int heads = 4;                    // gpt heads
  int vocab = 256;                  // gpt vocabulary
  int features = 128;               // mlp inputs, gcn node features
  int classes = 10;                 // mlp, gcn

  std::string name() const {
    return cat(family, " layers=", layers, " width=", width, " batch=", batch, " dtype=", dtype_name(dtype));
  }
};

// Layer norm over the last axis, composed from primitives.
class LayerNorm : public nn::Module {
 public:
  LayerNorm(int d, DType dt) {
    gamma = register_parameter("weight", Tensor({d}, dt));
    beta = register_parameter("bias", Tensor({d}, dt));
    auto ones = [&](auto* p) {
      for (int i = 0; i < d; ++i) p[i] = 1;
    };
    if (dt == DType::f64) ones(gamma.data<double>());
    else ones(gamma.data<float>());
  }
  Var operator()(Var x) {
    Var centred = x - mean(x, {-1}, true);
    Var inv_std = rsqrt(mean(centred * centred, {-1}, true) + 1e-5);
    return centred * inv_std * var(gamma) + var(beta);
  }
  Tensor gamma, beta;
};

class Block : public nn::Module {
 public:
  Block(int d, int heads, DType dt)
      : d_(d), heads_(heads), ln1(d, dt), ln2(d, dt), q(d, d, {.dtype = dt}), k(d, d, {.dtype = dt}),
        v(d, d, {.dtype = dt}), proj(d, d, {.dtype = dt}), fc1(d, 4 * d, {.dtype = dt}), fc2(4 * d, d, {.dtype = dt}) {
    register_module("ln1", ln1);
    register_module("ln2", ln2);
    register_module("q", q);
    register_module("k", k);
    register_module("v", v);
    register_module("proj", proj);
    register_module("fc1", fc1);
    register_module("fc2", fc2);
  }
  // x: [B, T, d]; mask: [T, T] with -1e9 above the diagonal.
  Var operator()(Var x, Var mask) {
    std::int64_t B = x.dim(0), T = x.dim(1), H = heads_, D = d_ / heads_;
    Var h = ln1(x);
    auto split = [&](Var t) { return permute(reshape(t, {B, T, H, D}), {0, 2, 1, 3}); };  // [B, H, T, D]
    Var att = softmax(matmul(split(q(h)), split(k(h)), false, true) * (1.0 / std::sqrt(double(D))) + mask);
    Var o = reshape(permute(matmul(att, split(v(h))), {0, 2, 1, 3}), {B, T, d_});
    x = x + proj(o);
    return x + fc2(gelu(fc1(ln2(x))));
  }

 private:
  std::int64_t d_, heads_;

 public:
  LayerNorm ln1, ln2;
  nn::Linear q, k, v, proj, fc1, fc2;
};

// A workload: a model, its inputs, its loss and a source of batches.
struct Workload {
  Config cfg;
  std::unique_ptr<nn::Module> model;
  std::vector<InputSpec> inputs;
  std::function<Var(const std::vector<Var>&)> loss;
  std::function<std::vector<Tensor>(std::uint64_t)> batch;
  std::unique_ptr<Optimizer> opt;
};

inline void fill_normal(Tensor& t, Rng& r) {
  if (t.dtype() == DType::f64)
    for (std::int64_t i = 0; i < t.numel(); ++i) t.data<double>()[i] = r.normal();
  else
    for (std::int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = float(r.normal());
}

inline void fill_labels(Tensor& t, Rng& r, int classes) {
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data<std::int32_t>()[i] = std::int32_t(r.below(std::uint64_t(classes)));
}

class Mlp : public nn::Module {
 public:
  Mlp(const Config& c) {
    int in = c.features;
    for (int i = 0; i <= c.layers; ++i) {
      int out = i == c.layers ? c.classes : c.width;
      fc.push_back(std::make_unique<nn::Linear>(in, out, nn::LinearOptions{.dtype = c.dtype}));
      register_module(std::string("fc") + std::to_string(i), *fc.back());
      in = out;
    }
  }
  Var forward(Var x) {
    for (std::size_t i = 0; i < fc.size(); ++i) x = i + 1 < fc.size() ? relu((*fc[i])(x)) : (*fc[i])(x);
    return x;
  }
  std::vector<std::unique_ptr<nn::Linear>> fc;
};

class Gpt : public nn::Module {
 public:
  Gpt(const Config& c)
      : embed(c.vocab, c.width, {.bias = false, .dtype = c.dtype}), ln_f(c.width, c.dtype),
        head(c.width, c.vocab, {.dtype = c.dtype}) {
    register_module("embed", embed);
    pos = register_parameter("pos", Tensor({c.seq, c.width}, c.dtype));
    Rng r(7);
    fill_normal(pos, r);
    for (int i = 0; i < c.layers; ++i) {
      blocks.push_back(std::make_unique<Block>(c.width, c.heads, c.dtype));
      register_module(std::string("block") + std::to_string(i), *blocks.back());
    }
    register_module("ln_f", ln_f);
    register_module("head", head);
    mask = register_parameter("mask", Tensor({c.seq, c.seq}, c.dtype));  // constant: no optimizer owns it
    for (int i = 0; i < c.seq; ++i)
      for (int j = 0; j < c.seq; ++j) {
        double m = j > i ? -1e9 : 0.0;
        if (c.dtype == DType::f64) mask.data<double>()[i * c.seq + j] = m;
        else mask.data<float>()[i * c.seq + j] = float(m);
      }
  }
  // onehot: [B, T, V]
  Var forward(Var onehot) {
    Var x = embed(onehot) + var(pos);
    Var m = var(mask);
    for (auto& b : blocks) x = (*b)(x, m);
    return head(ln_f(x));
  }
  nn::Linear embed;
  Tensor pos, mask;
  std::vector<std::unique_ptr<Block>> blocks;
  LayerNorm ln_f;
  nn::Linear head;
};

class Gcn : public nn::Module {
 public:
  Gcn(const Config& c) {
    int in = c.features;
    for (int i = 0; i < c.layers; ++i) {
      int out = i + 1 == c.layers ? c.classes : c.width;
      lin.push_back(std::make_unique<nn::Linear>(in, out, nn::LinearOptions{.dtype = c.dtype}));
      register_module(std::string("conv") + std::to_string(i), *lin.back());
      in = out;
    }
  }
  // x: [N, F] node features; adj: [N, N] normalised adjacency D^-1/2 (A + I) D^-1/2.
  Var forward(Var x, Var adj) {
    for (std::size_t i = 0; i < lin.size(); ++i) {
      x = matmul(adj, (*lin[i])(x));
      if (i + 1 < lin.size()) x = relu(x);
    }
    return x;
  }
  std::vector<std::unique_ptr<nn::Linear>> lin;
};

inline Workload make(const Config& c) {
  nn::manual_seed(1);
  Workload w{c, nullptr, {}, {}, {}, nullptr};
  if (c.family == "mlp") {
    auto m = std::make_unique<Mlp>(c);
    Mlp* mp = m.get();
    w.inputs = {{{c.dtype, Shape{c.batch, c.features}}, "x"}, input<std::int32_t>({c.batch}, "labels")};
    w.loss = [mp](const std::vector<Var>& v) { return cross_entropy(mp->forward(v[0]), v[1]); };
    w.batch = [c](std::uint64_t seed) {
      Rng r(seed);
      Tensor x({c.batch, c.features}, c.dtype), y({c.batch}, DType::i32);
      fill_normal(x, r);
      fill_labels(y, r, c.classes);
      return std::vector<Tensor>{x, y};
    };
    w.model = std::move(m);
  } else if (c.family == "gpt") {
    if (c.width % c.heads) fail("gpt: width ", c.width, " is not a multiple of heads ", c.heads);
    auto m = std::make_unique<Gpt>(c);
    Gpt* mp = m.get();
    w.inputs = {{{c.dtype, Shape{c.batch, c.seq, c.vocab}}, "tokens (one-hot)"},
                input<std::int32_t>({c.batch, c.seq}, "next tokens")};
    w.loss = [mp](const std::vector<Var>& v) { return cross_entropy(mp->forward(v[0]), v[1]); };
    w.batch = [c](std::uint64_t seed) {
      Rng r(seed);
      Tensor x({c.batch, c.seq, c.vocab}, c.dtype), y({c.batch, c.seq}, DType::i32);
      for (std::int64_t p = 0; p < std::int64_t(c.batch) * c.seq; ++p) {
        auto tok = r.below(std::uint64_t(c.vocab));
        if (c.dtype == DType::f64) x.data<double>()[p * c.vocab + std::int64_t(tok)] = 1;
        else x.data<float>()[p * c.vocab + std::int64_t(tok)] = 1;
        y.data<std::int32_t>()[p] = std::int32_t(r.below(std::uint64_t(c.vocab)));
      }
      return std::vector<Tensor>{x, y};
    };
    w.model = std::move(m);
  } else if (c.family == "gcn") {
    auto m = std::make_unique<Gcn>(c);
    Gcn* mp = m.get();
    std::int64_t n = c.batch;
    w.inputs = {{{c.dtype, Shape{n, c.features}}, "features"},
                {{c.dtype, Shape{n, n}}, "adjacency"},
                input<std::int32_t>({n}, "labels")};
    w.loss = [mp](const std::vector<Var>& v) { return cross_entropy(mp->forward(v[0], v[1]), v[2]); };
    w.batch = [c, n](std::uint64_t seed) {
      Rng r(seed);
      Tensor x({n, c.features}, c.dtype), a({n, n}, c.dtype), y({n}, DType::i32);
      fill_normal(x, r);
      // A ring with random chords and self-loops, normalised D^-1/2 (A + I) D^-1/2.
      std::vector<std::pair<std::int64_t, std::int64_t>> edges;
      for (std::int64_t i = 0; i < n; ++i) {
        edges.push_back({i, (i + 1) % n});
        edges.push_back({i, std::int64_t(r.below(std::uint64_t(n)))});
      }
      std::vector<std::vector<std::int64_t>> nbr(static_cast<std::size_t>(n));
      for (std::int64_t i = 0; i < n; ++i) nbr[std::size_t(i)].push_back(i);
      for (auto [i, j] : edges) {
        auto& ni = nbr[std::size_t(i)];
        if (i == j || std::find(ni.begin(), ni.end(), j) != ni.end()) continue;
        ni.push_back(j);
        nbr[std::size_t(j)].push_back(i);
      }
      for (std::int64_t i = 0; i < n; ++i)
        for (std::int64_t j : nbr[std::size_t(i)]) {
          double v = 1.0 / std::sqrt(double(nbr[std::size_t(i)].size() * nbr[std::size_t(j)].size()));
          if (c.dtype == DType::f64) a.data<double>()[i * n + j] = v;
          else a.data<float>()[i * n + j] = float(v);
        }
      fill_labels(y, r, c.classes);
      return std::vector<Tensor>{x, a, y};
    };
    w.model = std::move(m);
  } else {
    fail("unknown model family '", c.family, "': use mlp, gpt or gcn");
  }
  // The optimizer trains everything but constants (the attention mask).
  std::vector<Tensor> params;
  for (auto& [name, t] : w.model->named_parameters())
    if (name != "mask") params.push_back(t);
  if (c.optimizer == "sgd") w.opt = std::make_unique<optim::SGD>(params, optim::SGDOptions{.lr = 0.01, .momentum = 0.9});
  else if (c.optimizer == "adamw") w.opt = std::make_unique<optim::AdamW>(params, optim::AdamWOptions{.lr = 1e-3});
  else fail("unknown optimizer '", c.optimizer, "': use adamw or sgd");
  return w;
}

// The workload's step function with the fixed arity compile() wants.
template <class Then>
auto with_step_fn(Workload& w, Then&& then) {
  auto& f = w.loss;
  if (w.inputs.size() == 2) return then([&f](Var a, Var b) { return f({a, b}); });
  if (w.inputs.size() == 3) return then([&f](Var a, Var b, Var c) { return f({a, b, c}); });
  fail("workload with ", w.inputs.size(), " inputs");
}

inline PlannedStep plan(Workload& w, CompileOptions o = {}) {
  return with_step_fn(w, [&](auto fn) { return plan_training(fn, w.inputs, *w.opt, o); });
}

inline Step compile(Workload& w, Budget b = {}, CompileOptions o = {}) {
  return with_step_fn(w, [&](auto fn) { return frugal::compile(fn, w.inputs, *w.opt, b, o); });
}

}  // namespace zoo
