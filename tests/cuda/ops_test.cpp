// cuda_ops: every op the CUDA backend implements, forward and backward, run
// through the CUDA backend's kernel table and the CPU backend's on the same
// random, non-zero inputs, element by element. Outputs (and the workspace)
// are poisoned with NaN bytes before the GPU runs, so an element a kernel
// forgets to write fails. Tolerances are derived per op and dtype below;
// where the GPU runs the CPU's own arithmetic (the shared FRUGAL_HD
// functors, compiled with -fmad=false), the tolerance is zero: bitwise.
// Exits 77 without a CUDA device.
#include <cmath>
#include <cstring>
#include <functional>

#include "device.hpp"

using namespace frugal;
using cuda_test::expect;

// A namespace of its own: cuda_tests compiles the three suites as one file.
namespace cuda_ops_test {

constexpr double u32 = 1.0 / (1 << 24);   // unit roundoff of f32
constexpr double u16b = 1.0 / (1 << 8);   // of bf16
constexpr double u64 = 1.0 / 9007199254740992.0;

double at(const Tensor& t, std::int64_t i) {
  switch (t.dtype()) {
    case DType::f32: return t.data<float>()[i];
    case DType::f64: return t.data<double>()[i];
    case DType::bf16: return double(float(t.data<BFloat16>()[i]));
    case DType::f16: return double(float(t.data<Half>()[i]));
    case DType::i32: return t.data<std::int32_t>()[i];
    case DType::i64: return double(t.data<std::int64_t>()[i]);
    default: fail("at: dtype");
  }
}
void put(Tensor& t, std::int64_t i, double v) {
  switch (t.dtype()) {
    case DType::f32: t.data<float>()[i] = float(v); return;
    case DType::f64: t.data<double>()[i] = v; return;
    case DType::bf16: t.data<BFloat16>()[i] = BFloat16(float(v)); return;
    case DType::f16: t.data<Half>()[i] = Half(float(v)); return;
    default: fail("put: dtype");
  }
}

Rng rng(2024, 15);
// Uniform in ±[0.05, 1): never zero, both signs.
Tensor random(Shape s, DType dt = DType::f32, double scale = 1.0) {
  Tensor t(std::move(s), dt);
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    double v = 0.05 + 0.95 * rng.uniform();
    put(t, i, scale * (rng.uniform() < 0.5 ? -v : v));
  }
  return t;
}
Tensor labels(std::int64_t n, std::int64_t classes, DType dt) {
  Tensor t({n}, dt);
  for (std::int64_t i = 0; i < n; ++i) {
    auto l = std::int64_t(rng.below(std::uint64_t(classes)));
    if (dt == DType::i32) t.data<std::int32_t>()[i] = std::int32_t(l);
    else t.data<std::int64_t>()[i] = l;
  }
  return t;
}
Tensor copy_of(const Tensor& t) {
  Tensor c(t.shape(), t.dtype());
  std::memcpy(c.raw(), t.raw(), t.nbytes());
  return c;
}

// The tolerance of element i of result r, given the inputs and the CPU's results.
using Tolerance = std::function<double(std::size_t r, std::int64_t i)>;
Tolerance bitwise() {
  return [](std::size_t, std::int64_t) { return 0.0; };
}

std::shared_ptr<Backend> cpu_backend = make_backend("cpu");
std::shared_ptr<Backend> gpu;

// Runs `op` on both backends and compares its outputs and the inputs it
// mutates. `tol(inputs, cpu_results)` builds the per-element tolerance.
void check_op(const std::string& name, const Op& op, const std::vector<Tensor>& inputs,
              const std::function<Tolerance(const std::vector<Tensor>&, const std::vector<Tensor>&)>& tol) {
  std::vector<TensorMeta> in_meta;
  for (auto& t : inputs) in_meta.push_back({t.dtype(), t.shape()});
  std::vector<TensorMeta> out_meta = op.infer(in_meta);
  const std::vector<int> mutated = op.mutated_inputs();

  // CPU.
  std::vector<Tensor> cin, cout;
  for (auto& t : inputs) cin.push_back(copy_of(t));
  for (auto& m : out_meta) cout.emplace_back(m.shape, m.dtype);
  std::vector<TensorRef> cin_ref, cout_ref;
  for (std::size_t i = 0; i < cin.size(); ++i) cin_ref.push_back({cin[i].raw(), cin[i].dtype(), &in_meta[i].shape});
  for (std::size_t i = 0; i < cout.size(); ++i) cout_ref.push_back({cout[i].raw(), cout[i].dtype(), &out_meta[i].shape});
  const std::size_t cws = cpu_backend->workspace_bytes(op, in_meta, out_meta);
  std::vector<unsigned char> cwork(cws + 1);
  cpu_backend->kernel_for(op)(op, KernelArgs{cin_ref, cout_ref, 7, cws ? cwork.data() : nullptr, cws});

  // GPU: one block for inputs, outputs and workspace; outputs and
  // workspace poisoned (0xFF bytes: NaN in every float dtype).
  const std::size_t gws = gpu->workspace_bytes(op, in_meta, out_meta);
  std::vector<std::size_t> off;
  std::size_t total = 0;
  for (auto& t : inputs) off.push_back(total), total += align_up(std::max<std::size_t>(t.nbytes(), 1));
  for (auto& m : out_meta) off.push_back(total), total += align_up(std::max<std::size_t>(m.nbytes(), 1));
  const std::size_t ws_off = total;
  total += align_up(std::max<std::size_t>(gws, 1));
  auto* block = static_cast<unsigned char*>(gpu->allocate(total));
  gpu->fill(block, 0xFF, total);
  std::vector<TensorRef> gin_ref, gout_ref;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    gpu->copy_to_device(block + off[i], inputs[i].raw(), inputs[i].nbytes());
    gin_ref.push_back({block + off[i], inputs[i].dtype(), &in_meta[i].shape});
  }
  for (std::size_t i = 0; i < out_meta.size(); ++i)
    gout_ref.push_back({block + off[inputs.size() + i], out_meta[i].dtype, &out_meta[i].shape});
  std::string error;
  try {
    gpu->kernel_for(op)(op, KernelArgs{gin_ref, gout_ref, 7, gws ? block + ws_off : nullptr, gws});
    gpu->synchronize();
  } catch (const Error& e) {
    error = e.what();
  }
  expect(error.empty(), name + ": the CUDA kernel failed: " + error);
  std::vector<Tensor> gres, cres;
  for (std::size_t i = 0; i < out_meta.size(); ++i) {
    gres.emplace_back(out_meta[i].shape, out_meta[i].dtype);
    gpu->copy_to_host(gres.back().raw(), gout_ref[i].data, gres.back().nbytes());
    cres.push_back(cout[i]);
  }
  for (int k : mutated) {
    gres.emplace_back(inputs[std::size_t(k)].shape(), inputs[std::size_t(k)].dtype());
    gpu->copy_to_host(gres.back().raw(), gin_ref[std::size_t(k)].data, gres.back().nbytes());
    cres.push_back(cin[std::size_t(k)]);
  }
  gpu->deallocate(block);

  const Tolerance t = tol(inputs, cres);
  int bad = 0;
  double worst = 0;
  for (std::size_t r = 0; r < cres.size(); ++r) {
    for (std::int64_t i = 0; i < cres[r].numel(); ++i) {
      const double c = at(cres[r], i), g = at(gres[r], i), lim = t(r, i);
      const bool ok = (std::isnan(c) && std::isnan(g)) || std::fabs(c - g) <= lim;
      if (!ok) {
        if (bad < 3)
          std::printf("  %s: result %zu element %lld: cpu %.9g gpu %.9g (|diff| %.3g, tolerance %.3g)\n", name.c_str(), r,
                      (long long)i, c, g, std::fabs(c - g), lim);
        ++bad;
      }
      if (!std::isnan(g) && !std::isnan(c)) worst = std::max(worst, std::fabs(c - g));
    }
  }
  expect(bad == 0, name + ": " + std::to_string(bad) + " element(s) outside the tolerance");
  std::printf("%-44s %s (largest |cpu - gpu| %.3g)\n", name.c_str(), bad ? "FAIL" : "ok", worst);
}

// |A|·|B| in f64 for C = op(A)·op(B) of 2-D operands: the scale of a
// product's rounding error (|fl(a·b) - a·b| <= k·u·(|A||B|) for a k-term
// dot product in any order, Higham's gamma_k), so the CPU and the GPU, each
// within it of the exact product, are within twice it of each other.
std::vector<double> abs_product(const Tensor& a, const Tensor& b, bool ta, bool tb, std::int64_t batch_a,
                                std::int64_t batch_b, std::int64_t batch) {
  const Shape &as = a.shape(), &bs = b.shape();
  const std::int64_t m = ta ? as.dim(-1) : as.dim(-2), k = ta ? as.dim(-2) : as.dim(-1), n = tb ? bs.dim(-2) : bs.dim(-1);
  std::vector<double> out(std::size_t(batch * m * n));
  for (std::int64_t z = 0; z < batch; ++z)
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j) {
        double s = 0;
        const std::int64_t za = batch_a > 1 ? z % batch_a : 0, zb = batch_b > 1 ? z % batch_b : 0;
        for (std::int64_t p = 0; p < k; ++p) {
          const double av = at(a, za * m * k + (ta ? p * m + i : i * k + p));
          const double bv = at(b, zb * k * n + (tb ? j * k + p : p * n + j));
          s += std::fabs(av * bv);
        }
        out[std::size_t((z * m + i) * n + j)] = s;
      }
  return out;
}

void matmul_case(const std::string& name, Shape sa, Shape sb, bool ta, bool tb, DType dt, std::int64_t batch_a,
                 std::int64_t batch_b, std::int64_t batch) {
  Tensor a = random(sa, dt), b = random(sb, dt);
  const std::int64_t k = ta ? sa.dim(-2) : sa.dim(-1);
  // f32: 2·gamma_k; bf16/f16 add the one rounding of each result on store
  // (both round an f32 sum that may differ by 2·gamma_k).
  const double store = dt == DType::bf16 ? u16b : dt == DType::f16 ? 1.0 / 2048 : 0.0;
  const double unit = dt == DType::f64 ? u64 : u32;
  auto scale = abs_product(a, b, ta, tb, batch_a, batch_b, batch);
  check_op(name, ops::MatMul(ta, tb), {a, b}, [&](auto&, auto&) -> Tolerance {
    return [=](std::size_t, std::int64_t i) { return scale[std::size_t(i)] * (2.0 * double(k + 1) * unit + 2 * store); };
  });
}


int run() try {
  gpu = cuda_test::cuda_backend_or_skip();

  // Elementwise through the shared functors: relu and its gradient are
  // comparisons and copies, exact in every dtype.
  for (DType dt : {DType::f32, DType::bf16, DType::f64}) {
    Tensor x = random({1000}, dt);
    check_op(std::string("relu ") + dtype_name(dt), ops::Unary<math::Relu>{}, {x},
             [](auto&, auto&) { return bitwise(); });
    Tensor y = random({1000}, dt), dy = random({1000}, dt);
    check_op(std::string("relu_grad ") + dtype_name(dt), ops::UnaryGrad<math::Relu>{}, {dy, y, dy},
             [](auto&, auto&) { return bitwise(); });
  }
  // GELU (tanh form) calls tanhf/expf, whose last bits differ between
  // CUDA's libdevice (within 2 ulp) and glibc (within 1 ulp): the result
  // 0.5x(1 + tanh(.)) then differs by a few ulp of x; 16 ulp bounds it.
  {
    Tensor x = random({2000}, DType::f32, 3.0), dy = random({2000});
    check_op("gelu f32", ops::Unary<math::GeluTanh>{}, {x}, [](const std::vector<Tensor>& in, auto&) -> Tolerance {
      return [&in](std::size_t, std::int64_t i) { return 16 * u32 * std::fabs(at(in[0], i)); };
    });
    check_op("gelu_grad f32", ops::UnaryGrad<math::GeluTanh>{}, {x, dy, dy},
             [](const std::vector<Tensor>& in, auto&) -> Tolerance {
               return [&in](std::size_t, std::int64_t i) { return 32 * u32 * (1 + std::fabs(at(in[0], i))) * std::fabs(at(in[2], i)); };
             });
  }
  // Binary ops with broadcasting: one IEEE operation each, exact.
  {
    Tensor a = random({4, 5, 6}), b = random({5, 1});
    check_op("add f32 [4,5,6]+[5,1]", ops::Binary<math::Add>{}, {a, b}, [](auto&, auto&) { return bitwise(); });
    check_op("mul f32 [4,5,6]*[5,1]", ops::Binary<math::Mul>{}, {a, b}, [](auto&, auto&) { return bitwise(); });
    Tensor c = random({4, 5, 6});
    check_op("div f32 same shape", ops::Binary<math::Div>{}, {a, c}, [](auto&, auto&) { return bitwise(); });
  }
  check_op("fill_like f32", ops::FillLike(1.0), {random({333})}, [](auto&, auto&) { return bitwise(); });
  check_op("fill_like bf16", ops::FillLike(0.1), {random({333}, DType::bf16)}, [](auto&, auto&) { return bitwise(); });
  check_op("reshape f32", ops::Reshape({-1, 8}), {random({4, 6, 8})}, [](auto&, auto&) { return bitwise(); });
  check_op("cast f32->bf16", ops::Cast(DType::bf16), {random({1000})}, [](auto&, auto&) { return bitwise(); });
  check_op("cast bf16->f32", ops::Cast(DType::f32), {random({1000}, DType::bf16)}, [](auto&, auto&) { return bitwise(); });
  check_op("broadcast_to [5,1]->[3,5,4]", ops::BroadcastTo(Shape{3, 5, 4}), {random({5, 1})},
           [](auto&, auto&) { return bitwise(); });

  // Sums: both backends add in f64 and round once to f32; the f64 sums
  // differ by at most n·u64·sum|x| (a different order), which can move the
  // final rounding by one f32 ulp of the result.
  auto sum_tol = [](std::int64_t n) {
    return [n](const std::vector<Tensor>& in, const std::vector<Tensor>& out) -> Tolerance {
      double total = 0;
      for (std::int64_t i = 0; i < in[0].numel(); ++i) total += std::fabs(at(in[0], i));
      return [&out, total, n](std::size_t, std::int64_t i) {
        return 2 * u32 * std::fabs(at(out[0], i)) + double(n) * u64 * total;
      };
    };
  };
  check_op("sum f32 [64,256] axis 0 (bias grad)", ops::Sum({0}, false), {random({64, 256})}, sum_tol(64));
  check_op("sum f32 [5000] all (long row)", ops::Sum({}, false), {random({5000})}, sum_tol(5000));
  check_op("sum f32 [7,3000] axis 1", ops::Sum({1}, true), {random({7, 3000})}, sum_tol(3000));
  check_op("sum f32 [4,5,6] axes 0,2 (scattered)", ops::Sum({0, 2}, false), {random({4, 5, 6})}, sum_tol(24));

  // GEMMs (linear's backward is matmul with transposes, so every flag pair).
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      matmul_case(std::string("matmul f32 ta=") + (ta ? "1" : "0") + " tb=" + (tb ? "1" : "0"),
                  ta ? Shape{77, 64} : Shape{64, 77}, tb ? Shape{50, 77} : Shape{77, 50}, ta, tb, DType::f32, 1, 1, 1);
  matmul_case("matmul f32 [3,33,40]x[40,20] (tall)", {3, 33, 40}, {40, 20}, false, false, DType::f32, 3, 1, 3);
  matmul_case("matmul f32 [3,33,40]x[3,40,20] (batched)", {3, 33, 40}, {3, 40, 20}, false, false, DType::f32, 3, 3, 3);
  matmul_case("matmul f64 [31,45]x[45,29]", {31, 45}, {45, 29}, false, false, DType::f64, 1, 1, 1);
  matmul_case("matmul bf16 [64,128]x[128,48]", {64, 128}, {128, 48}, false, false, DType::bf16, 1, 1, 1);
  {
    // Broadcast batch axes: [3,1,M,K]·[1,2,K,N] -> [3,2,M,N]; item z reads
    // a's z/2 and b's z%2 (broadcast_item).
    Tensor a = random({3, 1, 9, 11}), b = random({1, 2, 11, 7});
    std::vector<double> scale;
    for (std::int64_t z = 0; z < 6; ++z) {
      Tensor az({9, 11}), bz({11, 7});
      std::memcpy(az.raw(), a.data<float>() + (z / 2) * 99, 99 * 4);
      std::memcpy(bz.raw(), b.data<float>() + (z % 2) * 77, 77 * 4);
      auto s = abs_product(az, bz, false, false, 1, 1, 1);
      scale.insert(scale.end(), s.begin(), s.end());
    }
    check_op("matmul f32 [3,1,9,11]x[1,2,11,7] (broadcast)", ops::MatMul(false, false), {a, b},
             [&](auto&, auto&) -> Tolerance {
               return [&](std::size_t, std::int64_t i) { return scale[std::size_t(i)] * 2.0 * 12 * u32; };
             });
  }
  {
    // linear: y = x·wᵀ + b, the bias added first (one more term: k + 1).
    Tensor x = random({64, 784}), w = random({256, 784}, DType::f32, 0.05), b = random({256});
    auto scale = abs_product(x, w, false, true, 1, 1, 1);
    check_op("linear f32 [64,784]x[256,784]+[256]", ops::Linear(true), {x, w, b},
             [&](const std::vector<Tensor>& in, auto&) -> Tolerance {
               return [&](std::size_t, std::int64_t i) {
                 return (scale[std::size_t(i)] + std::fabs(at(in[2], i % 256))) * 2.0 * 786 * u32;
               };
             });
  }

  // Cross-entropy. Per position, the log-sum-exp of C classes in f32: the
  // sum of C exponentials (each within 2 ulp) in another order differs by
  // about (C + 4)·u32 relative, and the loss's terms (max, log z, the
  // label's logit) are each at most max|x| + log C; the mean of the
  // positions adds nothing (f64). So |diff| <= 2(C + 8)·u32·(2 max|x| + log C).
  for (auto [P, C, lt] : {std::tuple{64L, 10L, DType::i32}, std::tuple{37L, 1000L, DType::i64}}) {
    Tensor x = random({P, C}, DType::f32, 4.0), l = labels(P, C, lt);
    const double lim = 2.0 * double(C + 8) * u32 * (2 * 4.0 + std::log(double(C)));
    check_op("cross_entropy f32 [" + std::to_string(P) + "," + std::to_string(C) + "]", ops::CrossEntropy{}, {x, l},
             [lim](auto&, auto&) -> Tolerance { return [lim](std::size_t, std::int64_t) { return lim; }; });
    // The gradient softmax·s - onehot·s, s = dloss/P: each element within
    // (C + 8)·u32 relative of |s| (the sum z's order, exp's last bits).
    Tensor dl({}, DType::f32);
    dl.data<float>()[0] = 1.3f;
    const double s = 1.3 / double(P), glim = 2.0 * double(C + 8) * u32 * s;
    check_op("cross_entropy_grad f32 [" + std::to_string(P) + "," + std::to_string(C) + "]", ops::CrossEntropyGrad{},
             {x, l, dl}, [glim](auto&, auto&) -> Tolerance { return [glim](std::size_t, std::int64_t) { return glim; }; });
  }

  // softmax / log_softmax, one line per thread summed in the CPU's order:
  // only expf/logf's last bits differ (CUDA within 2 ulp, glibc within 1),
  // and each of the n exponentials' errors reaches the sum, so a softmax
  // value is within 4(n + 4)·u32 of itself relative; log_softmax's log(sum)
  // turns that into an absolute error, plus the rounding of |y|.
  for (auto [shape, axis, n] : {std::tuple{Shape{8, 50}, -1, 50L}, std::tuple{Shape{4, 30, 5}, 1, 30L}}) {
    const std::string dims = shape.str();
    Tensor x = random(shape, DType::f32, 3.0);
    const double rel = 4.0 * double(n + 4) * u32;
    check_op("softmax f32 " + dims + " axis " + std::to_string(axis), ops::Softmax(axis), {x},
             [rel](auto&, const std::vector<Tensor>& out) -> Tolerance {
               return [rel, &out](std::size_t, std::int64_t i) { return rel * std::fabs(at(out[0], i)) + 1e-30; };
             });
    check_op("log_softmax f32 " + dims + " axis " + std::to_string(axis), ops::LogSoftmax(axis), {x},
             [rel](auto&, const std::vector<Tensor>& out) -> Tolerance {
               return [rel, &out](std::size_t, std::int64_t i) { return rel + 4 * u32 * std::fabs(at(out[0], i)); };
             });
    // softmax's gradient y·(g - Σ g·y) is + - * in the CPU's order: bitwise.
    Tensor y = random(shape, DType::f32, 0.5), g = random(shape);
    for (std::int64_t i = 0; i < y.numel(); ++i) put(y, i, std::fabs(at(y, i)));
    check_op("softmax_grad f32 " + dims, ops::SoftmaxGrad(axis), {y, g}, [](auto&, auto&) { return bitwise(); });
    // log_softmax's g - exp(y)·Σg: exp's last bits, scaled by Σ|g| <= n.
    Tensor ly = random(shape, DType::f32, 2.0);
    for (std::int64_t i = 0; i < ly.numel(); ++i) put(ly, i, -std::fabs(at(ly, i)));
    check_op("log_softmax_grad f32 " + dims, ops::LogSoftmaxGrad(axis), {ly, g},
             [n](auto&, auto&) -> Tolerance { return [n](std::size_t, std::int64_t) { return 8 * u32 * double(n + 1); }; });
  }
  // permute moves elements: exact, for any element size.
  check_op("permute f32 [2,3,4] (2,0,1)", ops::Permute({2, 0, 1}), {random({2, 3, 4})}, [](auto&, auto&) { return bitwise(); });
  check_op("permute bf16 [3,5,2,4] (0,2,1,3)", ops::Permute({0, 2, 1, 3}), {random({3, 5, 2, 4}, DType::bf16)},
           [](auto&, auto&) { return bitwise(); });

  // Optimizer updates: the shared update functors, host-computed constants,
  // IEEE + - * / sqrt only: bitwise, parameter and state alike. bf16/f16
  // (a model built in 16 bits): the same f32 arithmetic, rounded once on
  // store on both backends: bitwise too.
  for (DType dt : {DType::f32, DType::f64, DType::bf16, DType::f16}) {
    auto h = std::make_shared<ops::AdamWHyper>();
    h->lr = 3e-3;
    h->weight_decay = 0.1;
    h->step = 3;
    Tensor p = random({1000}, dt), g = random({1000}, dt), m = random({1000}, dt, 0.1), v = random({1000}, dt, 0.01);
    for (std::int64_t i = 0; i < v.numel(); ++i) put(v, i, std::fabs(at(v, i)));
    check_op(std::string("adamw_update ") + dtype_name(dt), ops::AdamWUpdate(h), {p, g, m, v},
             [](auto&, auto&) { return bitwise(); });
    auto sh = std::make_shared<ops::SgdHyper>();
    sh->lr = 0.05;
    sh->momentum = 0.9;
    sh->nesterov = true;
    sh->weight_decay = 1e-3;
    sh->step = 2;
    check_op(std::string("sgd_update ") + dtype_name(dt), ops::SgdUpdate(sh), {p, g, m},
             [](auto&, auto&) { return bitwise(); });
  }

  // 16-bit AdamW, plain and on f32 master weights (ops/adamw_master.hpp): the
  // same functors, 16-bit values widened exactly and rounded once on store:
  // bitwise too.
  for (DType dt : {DType::bf16, DType::f16}) {
    auto h = std::make_shared<ops::AdamWHyper>();
    h->lr = 3e-3;
    h->weight_decay = 0.1;
    h->step = 3;
    Tensor p = random({1000}, dt), g = random({1000}, dt), m = random({1000}, dt, 0.1), v = random({1000}, dt, 0.01);
    for (std::int64_t i = 0; i < v.numel(); ++i) put(v, i, std::fabs(at(v, i)));
    check_op(std::string("adamw_update ") + dtype_name(dt), ops::AdamWUpdate(h), {p, g, m, v},
             [](auto&, auto&) { return bitwise(); });
    Tensor master = random({1000}, DType::f32), m32 = random({1000}, DType::f32, 0.1),
           v32 = random({1000}, DType::f32, 0.01);
    for (std::int64_t i = 0; i < v32.numel(); ++i) put(v32, i, std::fabs(at(v32, i)));
    check_op(std::string("adamw_master_update ") + dtype_name(dt), ops::AdamWMasterUpdate(h), {p, g, master, m32, v32},
             [](auto&, auto&) { return bitwise(); });
  }

  // ---- phase 2: the gpt step's ops -----------------------------------------------

  // Embedding moves table rows: exact, for i32 and i64 ids. Its backward
  // adds the rows of dy whose id is v in position order from 0, on both
  // backends (the GPU gives each table row to one block): bitwise, the
  // repeats included, and zero for rows no id names.
  for (DType it : {DType::i32, DType::i64}) {
    Tensor ids = labels(4 * 9, 40, it);
    Tensor ids2({4, 9}, it);
    std::memcpy(ids2.raw(), ids.raw(), ids.nbytes());
    check_op(std::string("embedding f32 ids ") + dtype_name(it) + " [4,9] x [50,24]", ops::Embedding{},
             {ids2, random({50, 24})}, [](auto&, auto&) { return bitwise(); });
    Tensor rep = labels(4 * 33, 12, it);  // ids in [0, 12) of 15 rows: repeats, and 3 rows never named
    Tensor rep2({4, 33}, it);
    std::memcpy(rep2.raw(), rep.raw(), rep.nbytes());
    check_op(std::string("embedding_grad f32 ids ") + dtype_name(it) + " [4,33] -> [15,70]", ops::EmbeddingGrad(15),
             {rep2, random({4, 33, 70})}, [](auto&, auto&) { return bitwise(); });
    // bf16/f16: both backends sum a row in f32 in position order and round
    // once (the CPU in its planned f32 workspace): bitwise.
    for (DType dt : {DType::bf16, DType::f16})
      check_op(std::string("embedding_grad ") + dtype_name(dt) + " ids " + dtype_name(it) + " [4,33] -> [15,70]",
               ops::EmbeddingGrad(15), {rep2, random({4, 33, 70}, dt)}, [](auto&, auto&) { return bitwise(); });
    check_op(std::string("embedding bf16 ids ") + dtype_name(it) + " [4,9] x [50,24]", ops::Embedding{},
             {ids2, random({50, 24}, DType::bf16)}, [](auto&, auto&) { return bitwise(); });
  }
  // Slices and their gradient move elements (and write zeros): exact.
  check_op("slice f32 [3,10,5] axis 1 [2,8)", ops::Slice(1, 2, 8, 1), {random({3, 10, 5})},
           [](auto&, auto&) { return bitwise(); });
  check_op("slice f32 [10,6] axis 0 [1,10) step 3", ops::Slice(0, 1, 10, 3), {random({10, 6})},
           [](auto&, auto&) { return bitwise(); });
  check_op("slice_grad f32 [3,6,5] -> axis 1 of 10", ops::SliceGrad(1, 2, 8, 1, 10), {random({3, 6, 5})},
           [](auto&, auto&) { return bitwise(); });
  check_op("slice_grad f32 [3,6] step 3 -> axis 0 of 10", ops::SliceGrad(0, 1, 10, 3, 10), {random({3, 6})},
           [](auto&, auto&) { return bitwise(); });
  // Dropout: the same Philox bits for the same (key, step, element) and one
  // multiplication each: bitwise, mask and scale alike (check_op runs both
  // at step 7); 1001 elements end in a partial group of four.
  for (DType dt : {DType::f32, DType::f64, DType::bf16, DType::f16}) {  // 16-bit: scaled in f32, rounded once
    check_op(std::string("dropout p=0.3 ") + dtype_name(dt) + " [1001]", ops::Dropout(0.3, 0x1234abcdull),
             {random({1001}, dt)}, [](auto&, auto&) { return bitwise(); });
    check_op(std::string("dropout_grad p=0.3 ") + dtype_name(dt) + " [1001]", ops::DropoutGrad(0.3, 0x1234abcdull),
             {random({1001}, dt)}, [](auto&, auto&) { return bitwise(); });
  }
  check_op("dropout p=1 f32 [100]", ops::Dropout(1.0, 5), {random({100})}, [](auto&, auto&) { return bitwise(); });

  // The erf-polynomial GELU (the transformer's) is + - * / and bit selects
  // only (gelu.hpp): bitwise on the GPU with -fmad=false, value and grad.
  {
    Tensor x = random({2000}, DType::f32, 4.0), dy = random({2000});
    check_op("gelu_erf_poly f32", ops::Unary<math::GeluErfPoly>{}, {x}, [](auto&, auto&) { return bitwise(); });
    check_op("gelu_erf_poly_grad f32", ops::UnaryGrad<math::GeluErfPoly>{}, {x, dy, dy},
             [](auto&, auto&) { return bitwise(); });
  }

  // The fused elementwise op: a bias add broadcast along rows, the
  // erf-polynomial GELU, a product, an affine map and a GELU gradient, two
  // outputs. The same functors in the same order, each step rounded to the
  // storage type (bf16): bitwise in f32 and bf16.
  for (DType dt : {DType::f32, DType::bf16}) {
    ops::FusedProgram prog;
    prog.inputs = 3;  // x [4,8,16], bias [16], r [4,8,16]
    prog.steps.push_back({math::Add{}, {0, 1, -1}});                      // slot 3
    prog.steps.push_back({math::GeluErfPoly{}, {3, -1, -1}});              // slot 4
    prog.steps.push_back({math::Mul{}, {4, 2, -1}});                       // slot 5
    prog.steps.push_back({math::Affine{2.0, 0.5}, {5, -1, -1}});           // slot 6
    prog.steps.push_back({ops::GradOf<math::GeluErfPoly>{}, {3, 3, 2}});   // slot 7
    prog.outputs = {4, 6, 7};
    check_op(std::string("fused add,gelu,mul,affine,gelu_grad ") + dtype_name(dt), ops::FusedElementwise(prog),
             {random({4, 8, 16}, dt), random({16}, dt), random({4, 8, 16}, dt)}, [](auto&, auto&) { return bitwise(); });
  }

  // The CPU's outputs of `op` on `inputs` (a backward's saved statistics,
  // o and lse must be the forward's).
  auto cpu_outputs = [](const Op& op, const std::vector<Tensor>& inputs) {
    std::vector<TensorMeta> in_meta;
    for (auto& t : inputs) in_meta.push_back({t.dtype(), t.shape()});
    const std::vector<TensorMeta> out_meta = op.infer(in_meta);
    std::vector<Tensor> out;
    std::vector<TensorRef> in_ref, out_ref;
    for (std::size_t i = 0; i < inputs.size(); ++i)
      in_ref.push_back({const_cast<void*>(inputs[i].raw()), inputs[i].dtype(), &in_meta[i].shape});
    for (auto& m : out_meta) out.emplace_back(m.shape, m.dtype);
    for (std::size_t i = 0; i < out.size(); ++i) out_ref.push_back({out[i].raw(), out[i].dtype(), &out_meta[i].shape});
    cpu_backend->kernel_for(op)(op, KernelArgs{in_ref, out_ref, 0, nullptr, 0});
    return out;
  };

  // Layer norm. The GPU sums a row in a 32-lane shuffle tree, the CPU in
  // its own lane order: each f32 sum of d terms is within gamma_d·Σ|terms|
  // of the exact one, so the two means differ by at most 2·d·u32·max|x|,
  // the variances likewise (relative), rstd = 1/sqrt(var + eps) by about
  // (d + 4)·u32 relative, and y = (x - mean)·rstd·w + b by
  // (d + 8)·u32·(|xhat·w| + 1) or so: 4·(d + 8)·u32·(1 + |value|) bounds
  // every output with room (d = 100: 2.6e-5 on values of order 1, where a
  // wrong formula is off by 1e-2 or more).
  {
    const std::int64_t rows = 37, d = 100;
    Tensor x = random({rows, d}, DType::f32, 2.0), w = random({d}), b = random({d});
    const double lim = 4.0 * double(d + 8) * u32;
    auto rel = [lim](auto&, const std::vector<Tensor>& out) -> Tolerance {
      return [lim, &out](std::size_t r, std::int64_t i) { return lim * (1 + std::fabs(at(out[r], i))); };
    };
    check_op("layer_norm f32 [37,100] affine", ops::LayerNorm(1e-5, true, true), {x, w, b}, rel);
    check_op("layer_norm f32 [37,100] plain", ops::LayerNorm(1e-5, false, false), {x}, rel);
    // The backward reads the forward's statistics: the CPU's, so both
    // backends see the same inputs.
    Tensor mean({rows}), rstd({rows});
    for (std::int64_t r = 0; r < rows; ++r) {
      double s = 0, v = 0;
      for (std::int64_t j = 0; j < d; ++j) s += at(x, r * d + j);
      s /= double(d);
      for (std::int64_t j = 0; j < d; ++j) v += (at(x, r * d + j) - s) * (at(x, r * d + j) - s);
      put(mean, r, s);
      put(rstd, r, 1.0 / std::sqrt(v / double(d) + 1e-5));
    }
    Tensor dy = random({rows, d});
    // dx = rstd·(g - mean(g) - xhat·mean(g·xhat)): the two row means differ
    // as above (2·d·u32 relative to Σ|g| and Σ|g·xhat|, each <= d·3·max|xhat|),
    // scaled by rstd <= 1/sqrt(var) (max 3 here) and |xhat| <= 3:
    // 4·(d + 8)·u32·rstd·(1 + |xhat|)·3 <= 48·(d + 8)·u32·... bounded by
    // 64·(d + 8)·u32·(1 + |dx|). dweight and dbias: per column, the rows in
    // order, f64 accumulators, the same products: bitwise.
    const double glim = 64.0 * double(d + 8) * u32;
    auto grad_tol = [glim](auto&, const std::vector<Tensor>& out) -> Tolerance {
      return [glim, &out](std::size_t r, std::int64_t i) { return r == 0 ? glim * (1 + std::fabs(at(out[0], i))) : 0.0; };
    };
    check_op("layer_norm_grad f32 [37,100] affine", ops::LayerNormGrad(true, true), {x, mean, rstd, dy, w}, grad_tol);
    check_op("layer_norm_grad f32 [37,100] plain", ops::LayerNormGrad(false, false), {x, mean, rstd, dy}, grad_tol);
    // bf16: the same f32 arithmetic on the bf16 values, mean and rstd f32,
    // each 16-bit output rounded once; two f32 results within the bounds
    // above may round to neighbouring bf16 values: add one bf16 rounding
    // (u16b relative) to the f32 bounds of y, dx, dweight and dbias.
    Tensor xb({rows, d}, DType::bf16), wb({d}, DType::bf16), bb({d}, DType::bf16), dyb({rows, d}, DType::bf16);
    for (std::int64_t i = 0; i < x.numel(); ++i) put(xb, i, at(x, i)), put(dyb, i, at(dy, i));
    for (std::int64_t i = 0; i < d; ++i) put(wb, i, at(w, i)), put(bb, i, at(b, i));
    auto rel16 = [lim](auto&, const std::vector<Tensor>& out) -> Tolerance {
      return [lim, &out](std::size_t r, std::int64_t i) {
        const double v = std::fabs(at(out[r], i));
        return lim * (1 + v) + (r == 0 ? 2 * u16b * v : 0.0);
      };
    };
    check_op("layer_norm bf16 [37,100] affine", ops::LayerNorm(1e-5, true, true), {xb, wb, bb}, rel16);
    auto stats = cpu_outputs(ops::LayerNorm(1e-5, true, true), {xb, wb, bb});  // f32 mean and rstd
    auto grad16 = [glim](auto&, const std::vector<Tensor>& out) -> Tolerance {
      return [glim, &out](std::size_t r, std::int64_t i) {
        const double v = std::fabs(at(out[r], i));
        return r == 0 ? glim * (1 + v) + 2 * u16b * v : 0.0;  // dweight, dbias: bitwise, as in f32
      };
    };
    check_op("layer_norm_grad bf16 [37,100] affine", ops::LayerNormGrad(true, true), {xb, stats[1], stats[2], dyb, wb},
             grad16);
  }

  // Causal attention. Both backends compute o = Σ_j p_j v_j / Σ_j p_j with
  // p_j = exp(s_j - m) through the same exp_poly; they differ in the order
  // of the sums (the GPU: one key at a time with a running max, each dot
  // product in a shuffle tree; the CPU: 64-key tiles and BLAS dot products)
  // and in when the running max rescales. Each p_j and each sum is within
  // (n + hd + 8)·u32 relative of the exact one, n keys, so
  // |o_gpu - o_cpu| <= 8·(n + hd + 8)·u32·max|v|, and lse (m + log Σ p)
  // within 8·(n + hd + 8)·u32·(1 + |lse|).
  // The backward's dS = P·(dP - delta)·scale and its sums over up to n
  // terms: within 16·(n + hd + 8)·u32·(1 + max|grad|) of each other.
  auto attn_fwd_tol = [](double n_hd) {
    return [n_hd](const std::vector<Tensor>& in, const std::vector<Tensor>& out) -> Tolerance {
      double vmax = 0;
      for (const Tensor& t : in)
        for (std::int64_t i = 0; i < t.numel(); ++i) vmax = std::max(vmax, std::fabs(at(t, i)));
      return [n_hd, vmax, &out](std::size_t r, std::int64_t i) {
        return 8.0 * (n_hd + 8) * u32 * (r == 0 ? vmax : 1 + std::fabs(at(out[1], i)));
      };
    };
  };
  auto attn_bwd_tol = [](double n_hd) {
    return [n_hd](auto&, const std::vector<Tensor>& out) -> Tolerance {
      double gmax = 0;
      for (const Tensor& t : out)
        for (std::int64_t i = 0; i < t.numel(); ++i) gmax = std::max(gmax, std::fabs(at(t, i)));
      return [n_hd, gmax](std::size_t, std::int64_t) { return 16.0 * (n_hd + 8) * u32 * (1 + gmax); };
    };
  };
  {
    // The packed GPT layout: qkv [2, 20, 3·4·12], 4 heads of 12.
    const std::int64_t T = 20, hd = 12;
    Tensor qkv = random({2, T, 3 * 4 * hd});
    check_op("causal_attention_qkv f32 [2,20,144] 4 heads", ops::CausalAttentionQkv(4), {qkv},
             attn_fwd_tol(double(T + hd)));
    auto fwd = cpu_outputs(ops::CausalAttentionQkv(4), {qkv});
    const double scale = 1.0 / std::sqrt(double(hd));
    check_op("causal_attention_qkv_grad f32 [2,20,144]", ops::CausalAttentionQkvGrad(4, scale),
             {qkv, fwd[0], fwd[1], random({2, T, 4 * hd})}, attn_bwd_tol(double(T + hd)));
  }
  {
    // Separate q, k, v with fewer queries than keys (the mask aligned to
    // the end) and a value width unlike the key width.
    Tensor q = random({2, 3, 9, 8}), k = random({2, 3, 13, 8}), v = random({2, 3, 13, 6});
    check_op("causal_attention f32 q[2,3,9,8] k[..13,8] v[..13,6]", ops::CausalAttention(), {q, k, v},
             attn_fwd_tol(13.0 + 8));
    auto fwd = cpu_outputs(ops::CausalAttention(), {q, k, v});
    check_op("causal_attention_grad f32 q[2,3,9,8] k[..13,8]", ops::CausalAttentionGrad(1.0 / std::sqrt(8.0)),
             {q, k, v, fwd[0], fwd[1], random({2, 3, 9, 6})}, attn_bwd_tol(13.0 + 8));
  }
  // bf16: the f32 computation on the bf16 values (lse f32), each output
  // rounded once; two f32 results within the bounds above may round to
  // neighbouring bf16 values, so one bf16 rounding (relative) is added.
  {
    const std::int64_t T = 20, hd = 12;
    Tensor qkv = random({2, T, 3 * 4 * hd}, DType::bf16);
    auto plus16 = [](auto base) {
      return [base](const std::vector<Tensor>& in, const std::vector<Tensor>& out) -> Tolerance {
        Tolerance t = base(in, out);
        return [t, &out](std::size_t r, std::int64_t i) {
          return t(r, i) + (out[r].dtype() == DType::f32 ? 0.0 : 2 * u16b * std::fabs(at(out[r], i)));
        };
      };
    };
    check_op("causal_attention_qkv bf16 [2,20,144] 4 heads", ops::CausalAttentionQkv(4), {qkv},
             plus16(attn_fwd_tol(double(T + hd))));
    auto fwd = cpu_outputs(ops::CausalAttentionQkv(4), {qkv});
    check_op("causal_attention_qkv_grad bf16 [2,20,144]", ops::CausalAttentionQkvGrad(4, 1.0 / std::sqrt(double(hd))),
             {qkv, fwd[0], fwd[1], random({2, T, 4 * hd}, DType::bf16)}, plus16(attn_bwd_tol(double(T + hd))));
  }
  // Phase 1's linear and cross-entropy on the gpt's rank-3 shapes (rows
  // flattened from [batch, time]): tolerances as for their rank-2 cases.
  {
    Tensor x = random({4, 32, 64}), w = random({192, 64}, DType::f32, 0.2), b = random({192});
    Tensor x2({128, 64});
    std::memcpy(x2.raw(), x.raw(), x.nbytes());
    auto scale = abs_product(x2, w, false, true, 1, 1, 1);
    check_op("linear f32 [4,32,64]x[192,64]+[192]", ops::Linear(true), {x, w, b},
             [&](const std::vector<Tensor>& in, auto&) -> Tolerance {
               return [&](std::size_t, std::int64_t i) {
                 return (scale[std::size_t(i)] + std::fabs(at(in[2], i % 192))) * 2.0 * 66 * u32;
               };
             });
    Tensor logits = random({4, 32, 64}, DType::f32, 4.0), l = labels(128, 64, DType::i32);
    Tensor l2({4, 32}, DType::i32);
    std::memcpy(l2.raw(), l.raw(), l.nbytes());
    const double lim = 2.0 * double(64 + 8) * u32 * (2 * 4.0 + std::log(64.0));
    check_op("cross_entropy f32 [4,32,64] labels [4,32]", ops::CrossEntropy{}, {logits, l2},
             [lim](auto&, auto&) -> Tolerance { return [lim](std::size_t, std::int64_t) { return lim; }; });
  }
  // An embedding id out of range is a clear error naming it.
  {
    Tensor ids({2, 3}, DType::i32), table = random({5, 4});
    for (int i = 0; i < 6; ++i) ids.data<std::int32_t>()[i] = i % 5;
    ids.data<std::int32_t>()[4] = 9;
    std::vector<TensorMeta> in{{ids.dtype(), ids.shape()}, {table.dtype(), table.shape()}};
    auto out = ops::Embedding{}.infer(in);
    auto* block = static_cast<unsigned char*>(gpu->allocate(4096));
    gpu->copy_to_device(block, ids.raw(), ids.nbytes());
    gpu->copy_to_device(block + 1024, table.raw(), table.nbytes());
    TensorRef ins[2] = {{block, ids.dtype(), &in[0].shape}, {block + 1024, table.dtype(), &in[1].shape}};
    TensorRef outs[1] = {{block + 2048, out[0].dtype, &out[0].shape}};
    std::string error;
    try {
      ops::Embedding op;
      gpu->kernel_for(op)(op, KernelArgs{ins, outs, 0, nullptr, 0});
      gpu->synchronize();
    } catch (const DataError& e) {
      error = e.what();
    }
    gpu->deallocate(block);
    expect(error.find("id 9 at position 4") != std::string::npos, "a bad embedding id is reported, got: '" + error + "'");
    std::printf("%-44s %s\n", "embedding bad id -> DataError", error.empty() ? "FAIL" : "ok");
  }

  // A bad label is a clear error naming the position and the value.
  {
    Tensor x = random({4, 10}), l = labels(4, 10, DType::i32);
    l.data<std::int32_t>()[2] = 12;
    std::vector<TensorMeta> in{{x.dtype(), x.shape()}, {l.dtype(), l.shape()}};
    auto out = ops::CrossEntropy{}.infer(in);
    auto* block = static_cast<unsigned char*>(gpu->allocate(4096));
    gpu->copy_to_device(block, x.raw(), x.nbytes());
    gpu->copy_to_device(block + 1024, l.raw(), l.nbytes());
    TensorRef ins[2] = {{block, x.dtype(), &in[0].shape}, {block + 1024, l.dtype(), &in[1].shape}};
    TensorRef outs[1] = {{block + 2048, out[0].dtype, &out[0].shape}};
    std::string error;
    try {
      ops::CrossEntropy op;
      gpu->kernel_for(op)(op, KernelArgs{ins, outs, 0, block + 3072, 1024});
      gpu->synchronize();
    } catch (const DataError& e) {
      error = e.what();
    }
    gpu->deallocate(block);
    expect(error.find("label 12 at position 2") != std::string::npos, "a bad label is reported, got: '" + error + "'");
    std::printf("%-44s %s\n", "cross_entropy bad label -> DataError", error.empty() ? "FAIL" : "ok");
  }
  return cuda_test::finish("cuda_ops");
} catch (const std::exception& e) {
  std::printf("FAIL: %s\n", e.what());
  return 1;
}

}  // namespace cuda_ops_test
