// Times frugal's CPU convolution kernels on the convolutions of ResNet-18
// for CIFAR (batch 32, 3x32x32, the peer's torch_bench.py model): forward,
// data gradient and weight gradient per layer shape, and the sum over the
// whole network (each shape times how often it occurs).
//
//   g++ -O3 -std=c++20 -fopenmp -Iinclude -I/usr/include/x86_64-linux-gnu/openblas-openmp
//       bench/conv_kernels.cpp /usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.so -o /tmp/conv_kernels
//   /tmp/conv_kernels [--threads 2] [--reps 7] [--images N] [--engine blas|avx512] [--algo auto|direct|winograd|winograd-f2|winograd-f4] [--compare]
//                     [--dtype f32|bf16|both] [--layer NAME-PART]
//
// --dtype bf16 times the kernels on bf16 tensors (widened to f32 inside,
// rounded once on store), as a bf16 ResNet runs them; both times f32 and
// bf16 alternately, call by call, and prints their ratios.
// --images N forces N images per GEMM chunk, or for Winograd about N tiles
// per chunk (default: frugal's policies; the "imgs" column shows which).
// --algo direct runs every layer direct (im2col), --algo winograd every
// 3x3 stride-1 layer as Winograd (conv_winograd.hpp; winograd-f2 and
// winograd-f4 force the tile); the default follows frugal's rules
// (conv_scratch.hpp), pass by pass.
// --engine forces the BLAS or the AVX-512 engine (default: AVX-512 where
// the CPU has it). --compare also times the other way to split the work: one image per
// thread inside a parallel region (private column buffers, single-threaded
// BLAS per image), which needs scratch per thread. --layer times only the
// layers whose name contains its argument (for a profiler: "@4").
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "frugal/backend/cpu/conv.hpp"
#include "frugal/core/rng.hpp"

using namespace frugal;
using Clock = std::chrono::steady_clock;

namespace {

struct Layer {
  const char* name;
  std::int64_t cin, h, cout, k, stride, pad, count;
  bool needs_dx;  // the stem's input (the images) needs no gradient
};

// ResNet-18 (CIFAR): stem, then [2,2,2,2] BasicBlocks of widths 64..512.
const Layer kLayers[] = {
    {"stem 3->64 3x3 @32", 3, 32, 64, 3, 1, 1, 1, false},
    {"l1 64->64 3x3 @32", 64, 32, 64, 3, 1, 1, 4, true},
    {"l2 64->128 3x3 s2 @32", 64, 32, 128, 3, 2, 1, 1, true},
    {"l2 sc 64->128 1x1 s2", 64, 32, 128, 1, 2, 0, 1, true},
    {"l2 128->128 3x3 @16", 128, 16, 128, 3, 1, 1, 3, true},
    {"l3 128->256 3x3 s2 @16", 128, 16, 256, 3, 2, 1, 1, true},
    {"l3 sc 128->256 1x1 s2", 128, 16, 256, 1, 2, 0, 1, true},
    {"l3 256->256 3x3 @8", 256, 8, 256, 3, 1, 1, 3, true},
    {"l4 256->512 3x3 s2 @8", 256, 8, 512, 3, 2, 1, 1, true},
    {"l4 sc 256->512 1x1 s2", 256, 8, 512, 1, 2, 0, 1, true},
    {"l4 512->512 3x3 @4", 512, 4, 512, 3, 1, 1, 3, true},
};

template <class Fn>
double time_ms(int reps, Fn&& fn) {
  fn();  // warm up: pages touched, BLAS buffers allocated
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    auto t0 = Clock::now();
    fn();
    t.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  // The fastest run: on a machine shared with other work, the minimum is the
  // least disturbed estimate of what the kernel costs.
  return *std::min_element(t.begin(), t.end());
}

std::vector<float> random_vec(std::int64_t n, std::uint64_t seed) {
  Rng r(seed);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (auto& e : v) e = float(r.uniform(-1, 1));
  return v;
}

struct Buf {
  std::byte* p = nullptr;
  explicit Buf(std::size_t n) : p(static_cast<std::byte*>(std::aligned_alloc(256, std::max<std::size_t>(256, (n + 255) / 256 * 256)))) {
    std::memset(p, 0, std::max<std::size_t>(n, 1));
  }
  ~Buf() { std::free(p); }
};

// One layer's tensors (T: float or BFloat16, the same values) and planned
// scratch, and its three passes as frugal's kernels run them.
template <class T>
struct LayerRun {
  const ops::ConvGeometry& g;
  cpu::ConvEngine engine;
  std::vector<T> x, w, dy, y, dx, dw;
  cpu::ConvScratch sf, sd, sw;
  Buf bf, bd, bw;
  cpu::conv_detail::Scratch<float> wf, wd, ww;
  static std::vector<T> of(const std::vector<float>& v) {
    std::vector<T> out(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) out[i] = T(v[i]);
    return out;
  }
  static cpu::conv_detail::Scratch<float> carve(const cpu::ConvScratch& s, Buf& b) {
    KernelArgs a;
    a.workspace = b.p;
    a.workspace_bytes = s.bytes();
    return cpu::conv_detail::carve<float>(s, a, "bench");
  }
  LayerRun(const ops::ConvGeometry& geo, cpu::ConvEngine e, std::int64_t images, cpu::ConvAlgorithm algo,
           const std::vector<float>& xv, const std::vector<float>& wv, const std::vector<float>& dyv)
      : g(geo), engine(e), x(of(xv)), w(of(wv)), dy(of(dyv)), y(dy.size()), dx(x.size()), dw(w.size()),
        sf(cpu::conv_scratch(g, dtype_of<T>(), cpu::ConvPass::forward, images, algo)),
        sd(cpu::conv_scratch(g, dtype_of<T>(), cpu::ConvPass::backward_data, images, algo)),
        sw(cpu::conv_scratch(g, dtype_of<T>(), cpu::ConvPass::backward_weight, images, algo)),
        bf(sf.bytes()), bd(sd.bytes()), bw(sw.bytes()), wf(carve(sf, bf)), wd(carve(sd, bd)), ww(carve(sw, bw)) {}
  void forward() { cpu::conv2d_forward<T>(engine, g, sf, wf, x.data(), w.data(), nullptr, y.data()); }
  void data() { cpu::conv2d_backward_data<T>(engine, g, sd, wd, dy.data(), w.data(), dx.data()); }
  void weight() { cpu::conv2d_backward_weight<T>(engine, g, sw, ww, x.data(), dy.data(), dw.data(), nullptr); }
};

// The fastest of `reps` runs of a and of b, run alternately, which goes
// first alternating too (a shared machine's noise hits both alike).
template <class A, class B>
std::pair<double, double> time_pair(int reps, A&& a, B&& b) {
  a(), b();  // warm up
  double t[2] = {1e300, 1e300};
  for (int r = 0; r < reps; ++r)
    for (int k = 0; k < 2; ++k) {
      const int which = (r + k) % 2;
      auto t0 = Clock::now();
      which == 0 ? a() : b();
      t[which] = std::min(t[which], std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    }
  return {t[0], t[1]};
}

// The alternative split: images over threads, one private column buffer per
// thread, BLAS single-threaded inside the parallel region.
struct PerImage {
  const ops::ConvGeometry& g;
  std::vector<std::vector<float>> col, dwp;
  explicit PerImage(const ops::ConvGeometry& geo, int threads) : g(geo) {
    col.assign(std::size_t(threads), std::vector<float>(std::size_t(g.k() * g.hw_out())));
    dwp.assign(std::size_t(threads), std::vector<float>(std::size_t(g.cout * g.k())));
  }
  void cols(const float* x, float* c, std::int64_t b) {
    cpu::conv_detail::im2col(x, c, g, b, g.hw_out(), 0, 0, g.k(), 0, g.ho);
  }
  void forward(const float* x, const float* w, float* y) {
#pragma omp parallel
    {
      float* c = col[std::size_t(omp_get_thread_num())].data();
#pragma omp for schedule(static)
      for (std::int64_t b = 0; b < g.n; ++b) {
        cols(x, c, b);
        cpu::gemm(false, false, g.cout, g.hw_out(), g.k(), 1.f, w, g.k(), c, g.hw_out(), 0.f,
                  y + b * g.cout * g.hw_out(), g.hw_out());
      }
    }
  }
  void backward_data(const float* dy, const float* w, float* dx) {
#pragma omp parallel
    {
      float* c = col[std::size_t(omp_get_thread_num())].data();
#pragma omp for schedule(static)
      for (std::int64_t b = 0; b < g.n; ++b) {
        cpu::gemm(true, false, g.k(), g.hw_out(), g.cout, 1.f, w, g.k(), dy + b * g.cout * g.hw_out(), g.hw_out(), 0.f,
                  c, g.hw_out());
        // col2im of one image, single-threaded (we are inside a parallel region).
        for (std::int64_t ci = 0; ci < g.cin; ++ci) {
          float* out = dx + (b * g.cin + ci) * g.hw();
          std::fill(out, out + g.hw(), 0.f);
          for (std::int64_t i = 0; i < g.kh; ++i)
            for (std::int64_t j = 0; j < g.kw; ++j) {
              const float* src = c + ((ci * g.kh + i) * g.kw + j) * g.hw_out();
              std::int64_t offh = i * g.dh - g.ph, offw = j * g.dw - g.pw, lo, hi;
              cpu::conv_detail::tap_range(offw, g.sw, g.w, g.wo, lo, hi);
              for (std::int64_t oh = 0; oh < g.ho; ++oh) {
                std::int64_t iy = oh * g.sh + offh;
                if (iy < 0 || iy >= g.h) continue;
                for (std::int64_t ow = lo; ow < hi; ++ow) out[iy * g.w + ow * g.sw + offw] += src[oh * g.wo + ow];
              }
            }
        }
      }
    }
  }
  void backward_weight(const float* x, const float* dy, float* dw) {
    int used = 1;
#pragma omp parallel
    {
      int t = omp_get_thread_num();
      float* c = col[std::size_t(t)].data();
      float* acc = dwp[std::size_t(t)].data();
      std::int64_t nt = omp_get_num_threads(), b0 = g.n * t / nt, b1 = g.n * (t + 1) / nt;
      for (std::int64_t b = b0; b < b1; ++b) {
        cols(x, c, b);
        cpu::gemm(false, true, g.cout, g.k(), g.hw_out(), 1.f, dy + b * g.cout * g.hw_out(), g.hw_out(), c,
                  g.hw_out(), b == b0 ? 0.f : 1.f, acc, g.k());
      }
#pragma omp single
      used = int(nt);
    }
    std::int64_t n = g.cout * g.k();
    std::copy(dwp[0].begin(), dwp[0].end(), dw);
    for (int t = 1; t < used; ++t)
      for (std::int64_t i = 0; i < n; ++i) dw[i] += dwp[std::size_t(t)][std::size_t(i)];
  }
};

}  // namespace

int main(int argc, char** argv) {
  int threads = 2, reps = 7;
  std::int64_t images = 0, batch = 32;
  bool compare = false;
  std::string only;
  std::string engine_name = "auto";
  cpu::ConvAlgorithm algo = cpu::ConvAlgorithm::by_shape;
  DType dtype = DType::f32;
  bool both = false;
  double pair_sum[2][3] = {};  // --dtype both: f32 and bf16 forward, data, weight sums
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--threads" && i + 1 < argc) threads = std::atoi(argv[++i]);
    else if (a == "--reps" && i + 1 < argc) reps = std::atoi(argv[++i]);
    else if (a == "--images" && i + 1 < argc) images = std::atoll(argv[++i]);
    else if (a == "--batch" && i + 1 < argc) batch = std::atoll(argv[++i]);
    else if (a == "--compare") compare = true;
    else if (a == "--layer" && i + 1 < argc) only = argv[++i];
    else if (a == "--algo" && i + 1 < argc) {
      const std::string v = argv[++i];
      try {
        algo = cpu::conv_algorithm_from(v);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "conv_kernels: --algo: %s\n", e.what());
        return 2;
      }
    }
    else if (a == "--engine" && i + 1 < argc) {
      engine_name = argv[++i];
    }
    else if (a == "--dtype" && i + 1 < argc) {
      const std::string v = argv[++i];
      if (v != "f32" && v != "bf16" && v != "both") {
        std::fprintf(stderr, "conv_kernels: --dtype takes f32, bf16 or both\n");
        return 2;
      }
      dtype = v == "bf16" ? DType::bf16 : DType::f32;
      both = v == "both";
    }
    else {
      std::fprintf(stderr, "usage: conv_kernels [--threads N] [--reps N] [--images N] [--batch N] [--engine blas|avx512] [--algo auto|direct|winograd|winograd-f2|winograd-f4] [--compare] [--dtype f32|bf16|both] [--layer NAME-PART]\n");
      return 2;
    }
  }
  if (compare && (dtype != DType::f32 || both)) {
    std::fprintf(stderr, "conv_kernels: --compare times the f32 kernels only\n");
    return 2;
  }
  const cpu::ConvEngine engine = cpu::conv_engine_from(engine_name);
  omp_set_num_threads(threads);
  cpu::set_blas_threads(threads);
  std::printf("ResNet-18 CIFAR convolutions, %s, batch %lld, %d threads, %s engine, fastest of %d; ms per call\n",
              both ? "f32 and bf16 alternately" : dtype_name(dtype), (long long)batch, threads, engine == cpu::ConvEngine::avx512 ? "avx512" : "blas", reps);
  if (both)
    std::printf("%-24s %5s  f32 %7s %7s %7s | bf16 %7s %7s %7s | bf16/f32\n", "layer", "count", "fwd", "bwd-dat", "bwd-wt",
                "fwd", "bwd-dat", "bwd-wt");
  else
    std::printf("%-24s %5s %7s %7s %7s %7s | %7s %7s %7s\n", "layer", "count", "imgs", "fwd", "bwd-dat", "bwd-wt",
                "GF/s f", "GF/s d", "GF/s w");
  double sum_f = 0, sum_d = 0, sum_w = 0, alt_f = 0, alt_d = 0, alt_w = 0, flops_total = 0;
  for (const Layer& L : kLayers) {
    if (!only.empty() && std::string(L.name).find(only) == std::string::npos) continue;
    Shape xs{batch, L.cin, L.h, L.h}, ws{L.cout, L.cin, L.k, L.k};
    Conv2dOptions o{.stride = L.stride, .padding = L.pad};
    auto g = ops::conv_geometry("bench", xs, ws, o);
    auto x = random_vec(xs.numel(), 1), w = random_vec(ws.numel(), 2);
    auto dy = random_vec(g.n * g.cout * g.hw_out(), 3);
    std::vector<float> y, dx, dw;
    double tf = 0, td = 0, tw = 0;
    if (both) {
      LayerRun<float> a(g, engine, images, algo, x, w, dy);
      LayerRun<BFloat16> b(g, engine, images, algo, x, w, dy);
      auto [af, bf] = time_pair(reps, [&] { a.forward(); }, [&] { b.forward(); });
      auto [ad, bd] = L.needs_dx ? time_pair(reps, [&] { a.data(); }, [&] { b.data(); }) : std::pair<double, double>{0, 0};
      auto [aw, bw] = time_pair(reps, [&] { a.weight(); }, [&] { b.weight(); });
      std::printf("%-24s %5lld  f32 %7.2f %7.2f %7.2f | bf16 %7.2f %7.2f %7.2f | bf16/f32 %5.2f %5.2f %5.2f\n", L.name,
                  (long long)L.count, af, ad, aw, bf, bd, bw, bf / af, ad > 0 ? bd / ad : 0.0, bw / aw);
      for (int k = 0; k < 2; ++k) {
        const double c = double(L.count);
        pair_sum[k][0] += c * (k ? bf : af), pair_sum[k][1] += c * (k ? bd : ad), pair_sum[k][2] += c * (k ? bw : aw);
      }
      continue;
    }
    const auto time_all = [&](auto tag) {
      LayerRun<decltype(tag)> r(g, engine, images, algo, x, w, dy);
      tf = time_ms(reps, [&] { r.forward(); });
      td = L.needs_dx ? time_ms(reps, [&] { r.data(); }) : 0;
      tw = time_ms(reps, [&] { r.weight(); });
      y = std::vector<float>(r.y.size()), dx = std::vector<float>(r.dx.size()), dw = std::vector<float>(r.dw.size());
      for (std::size_t i = 0; i < y.size(); ++i) y[i] = float(r.y[i]);
      for (std::size_t i = 0; i < dx.size(); ++i) dx[i] = float(r.dx[i]);
      for (std::size_t i = 0; i < dw.size(); ++i) dw[i] = float(r.dw[i]);
      return r.sf;
    };
    const cpu::ConvScratch sf = dtype == DType::bf16 ? time_all(BFloat16{}) : time_all(float{});
    double gf = g.flops() / 1e6;
    std::printf("%-24s %5lld %7lld %7.2f %7.2f %7.2f | %7.1f %7.1f %7.1f\n", L.name, (long long)L.count,
                (long long)(sf.winograd ? sf.tiles.chunk_tiles() : sf.images), tf, td, tw, gf / tf, td > 0 ? gf / td : 0.0, gf / tw);
    sum_f += tf * double(L.count);
    sum_d += td * double(L.count);
    sum_w += tw * double(L.count);
    flops_total += g.flops() * double(L.count) * (L.needs_dx ? 3 : 2);
    if (compare) {
      PerImage alt(g, threads);
      std::vector<float> y2(y.size()), dx2(dx.size()), dw2(dw.size());
      double af = time_ms(reps, [&] { alt.forward(x.data(), w.data(), y2.data()); });
      double ad = L.needs_dx ? time_ms(reps, [&] { alt.backward_data(dy.data(), w.data(), dx2.data()); }) : 0;
      double aw = time_ms(reps, [&] { alt.backward_weight(x.data(), dy.data(), dw2.data()); });
      double diff = 0;
      for (std::size_t i = 0; i < y.size(); ++i) diff = std::max(diff, double(std::abs(y[i] - y2[i])));
      for (std::size_t i = 0; i < dx.size() && L.needs_dx; ++i) diff = std::max(diff, double(std::abs(dx[i] - dx2[i])));
      for (std::size_t i = 0; i < dw.size(); ++i) diff = std::max(diff, double(std::abs(dw[i] - dw2[i])) / 100);
      std::printf("%-24s %5s %7s %7.2f %7.2f %7.2f | %7.1f %7.1f %7.1f  (per-image threads; max diff %.1e)\n", "",
                  "", "1/thr", af, ad, aw, gf / af, ad > 0 ? gf / ad : 0.0, gf / aw, diff);
      alt_f += af * double(L.count);
      alt_d += ad * double(L.count);
      alt_w += aw * double(L.count);
    }
  }
  if (both) {
    const double* a = pair_sum[0];
    const double* b = pair_sum[1];
    std::printf("\nwhole network: f32 %.1f + %.1f + %.1f = %.1f ms; bf16 %.1f + %.1f + %.1f = %.1f ms; bf16/f32 %.3f\n",
                a[0], a[1], a[2], a[0] + a[1] + a[2], b[0], b[1], b[2], b[0] + b[1] + b[2],
                (b[0] + b[1] + b[2]) / (a[0] + a[1] + a[2]));
    return 0;
  }
  double total = sum_f + sum_d + sum_w;
  std::printf("\nwhole network: forward %.1f ms, backward-data %.1f ms, backward-weight %.1f ms; total %.1f ms "
              "(%.1f GFLOP, %.1f GF/s)\n",
              sum_f, sum_d, sum_w, total, flops_total / 1e9, flops_total / 1e6 / total);
  if (compare)
    std::printf("per-image threads:  forward %.1f ms, backward-data %.1f ms, backward-weight %.1f ms; total %.1f ms\n",
                alt_f, alt_d, alt_w, alt_f + alt_d + alt_w);
}
