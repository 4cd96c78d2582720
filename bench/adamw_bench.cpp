// The CPU optimizer updates (issues 16 and 17): frugal's fused kernel (the
// backend's table entry for ops::AdamWUpdate, one pass over p, g, m, v, or
// ops::SgdUpdate with momentum, one pass over p, g, buf; vectorised for the
// widest ISA this CPU has, or the one FRUGAL_CPU_ISA forces; split over the
// threads in fixed chunks) against a plain loop (the same arithmetic,
// scalar, one thread), on N million f32 parameters. bench/adamw-vs-peer
// runs it beside torch.optim.AdamW(foreach=True).
//
//   adamw_bench [--millions N] [--threads T] [--steps S] [--update adamw|sgd]
//
// Memory bandwidth: in the same process, the stream rate the calibration
// measures (runtime/calibrate.hpp, stream_bytes: the backend's f32 add,
// c = a + b) over N elements on the same threads. Prints RESULT {json}:
// median ms per update of each, the ratio, GB/s of the update and of the
// add, and whether both gave the same bits (they must: the kernel's vector
// paths round as the scalar loop does).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <frugal/backend/cpu/isa.hpp>
#include <frugal/frugal.hpp>
#include <iostream>
#include <omp.h>
#include <string>
#include <vector>

using namespace frugal;

namespace {

// The plain loop: AdamWMath element by element, as the kernel's scalar
// reference, kept scalar (no auto-vectorisation) and on one thread.
__attribute__((optimize("no-tree-vectorize"))) void plain_adamw(const ops::AdamWMath<float>& m, float* p,
                                                                 const float* g, float* mo, float* v, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) m(p[i], g[i], mo[i], v[i]);
}
__attribute__((optimize("no-tree-vectorize"))) void plain_sgd(const ops::SgdMomentumMath<float>& m, float* p,
                                                               const float* g, float* buf, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) m(p[i], g[i], buf[i]);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  double millions = 10;
  int threads = 2, steps = 10;
  std::string update = "adamw";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], val = argv[i + 1];
    if (k == "--millions") millions = std::stod(val);
    else if (k == "--threads") threads = std::stoi(val);
    else if (k == "--steps") steps = std::stoi(val);
    else if (k == "--update" && (val == "adamw" || val == "sgd")) update = val;
    else {
      std::cerr << "adamw_bench: unknown option " << k << "\n";
      return 2;
    }
  }
  try {
    const std::int64_t n = std::int64_t(millions * 1e6);
    omp_set_num_threads(threads);
    auto backend = std::shared_ptr<Backend>(make_backend("cpu"));
    const bool adamw = update == "adamw";
    auto hyper = std::make_shared<ops::AdamWHyper>(ops::AdamWHyper{1e-3, 0.9, 0.999, 1e-8, 1e-2, 0});
    auto sgd_hyper = std::make_shared<ops::SgdHyper>(ops::SgdHyper{.lr = 1e-2, .momentum = 0.9, .weight_decay = 1e-4});
    std::shared_ptr<Op> op;
    if (adamw) op = std::make_shared<ops::AdamWUpdate>(hyper);
    else op = std::make_shared<ops::SgdUpdate>(sgd_hyper);
    const Kernel& kernel = backend->kernel_for(*op);
    // Two copies of the state, one per contender, from the same start.
    Tensor p(Shape{n}), g(Shape{n}), m(Shape{n}), v(Shape{n});
    Rng r(5);
    for (std::int64_t i = 0; i < n; ++i) {
      p.data<float>()[i] = float(r.normal());
      g.data<float>()[i] = float(r.normal() * 1e-2);
    }
    Tensor p2 = p.clone(), m2 = m.clone(), v2 = v.clone();
    const Shape shape{n};
    std::vector<TensorRef> in{{p.raw(), DType::f32, &shape}, {g.raw(), DType::f32, &shape},
                              {m.raw(), DType::f32, &shape}};
    if (adamw) in.push_back({v.raw(), DType::f32, &shape});
    KernelArgs args;
    args.in = in;
    std::vector<double> fused, plain;
    for (int s = 0; s < steps + 1; ++s) {  // the first of each is a warm-up
      hyper->step = sgd_hyper->step = s + 1;
      auto t0 = std::chrono::steady_clock::now();
      kernel(*op, args);
      auto t1 = std::chrono::steady_clock::now();
      if (adamw)
        plain_adamw(static_cast<const ops::AdamWUpdate&>(*op).math<float>(), p2.data<float>(), g.data<float>(),
                    m2.data<float>(), v2.data<float>(), n);
      else
        plain_sgd(static_cast<const ops::SgdUpdate&>(*op).math<float>(), p2.data<float>(), g.data<float>(),
                  m2.data<float>(), n);
      auto t2 = std::chrono::steady_clock::now();
      if (s > 0) {
        fused.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
        plain.push_back(std::chrono::duration<double, std::milli>(t2 - t1).count());
      }
    }
    const bool same = std::memcmp(p.raw(), p2.raw(), std::size_t(n) * 4) == 0 &&
                      std::memcmp(m.raw(), m2.raw(), std::size_t(n) * 4) == 0 &&
                      (!adamw || std::memcmp(v.raw(), v2.raw(), std::size_t(n) * 4) == 0);
    // The stream rate as the calibration measures it: the f32 add kernel,
    // c = a + b, 12 bytes an element, over the same n on the same threads.
    double add_ms;
    {
      ops::Binary<math::Add> add;
      const Kernel& add_kernel = backend->kernel_for(add);
      Tensor c(Shape{n});
      std::vector<TensorRef> add_in{{p.raw(), DType::f32, &shape}, {g.raw(), DType::f32, &shape}};
      std::vector<TensorRef> add_out{{c.raw(), DType::f32, &shape}};
      KernelArgs add_args;
      add_args.in = add_in;
      add_args.out = add_out;
      std::vector<double> t;
      for (int s = 0; s < steps + 1; ++s) {
        auto t0 = std::chrono::steady_clock::now();
        add_kernel(add, add_args);
        if (s > 0) t.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      }
      add_ms = median(t);
    }
    const double f = median(fused), pl = median(plain);
    // Bytes moved per update: AdamW reads p, g, m, v and writes p, m, v;
    // SGD reads p, g, buf and writes p, buf.
    const double bytes_per = adamw ? 28.0 : 20.0;
    const double gbs = bytes_per * double(n) / (f * 1e-3) / 1e9, stream = 12.0 * double(n) / (add_ms * 1e-3) / 1e9;
    std::printf("RESULT {\"update\":\"%s\",\"params\":%lld,\"threads\":%d,\"isa\":\"%s\",\"frugal_ms\":%.3f,"
                "\"plain_ms\":%.3f,\"speedup\":%.2f,\"frugal_gb_per_s\":%.2f,\"stream_gb_per_s\":%.2f,"
                "\"of_stream\":%.2f,\"same_bits\":%s}\n",
                update.c_str(), (long long)n, threads, cpu::isa_name(cpu::cpu_isa()), f, pl, pl / f, gbs, stream,
                gbs / stream, same ? "true" : "false");
    return same ? 0 : 1;
  } catch (const std::exception& e) {
    std::cerr << "adamw_bench: " << e.what() << "\n";
    return 1;
  }
}
