// The elementwise functors, half-precision conversions and Philox, run on
// the GPU and compared with the same code on the host: the arithmetic the
// CPU backend tests is the arithmetic the device runs. Exits 77 (skipped)
// when there is no CUDA device.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "frugal/core/half.hpp"
#include "frugal/core/rng.hpp"
#include "frugal/ops/elementwise_math.hpp"

using namespace frugal;

template <class F>
__global__ void unary_on_device(F f, const double* x, double* y, double* dx, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    y[i] = f(x[i]);
    dx[i] = f.grad(x[i], y[i], 1.0);
  }
}

template <class F>
__global__ void binary_on_device(F f, const double* a, const double* b, double* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = f(a[i], b[i]);
}

__global__ void halves_on_device(const float* x, unsigned short* bf, unsigned short* h, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    bf[i] = BFloat16(x[i]).bits;
    h[i] = Half(x[i]).bits;
  }
}

__global__ void philox_on_device(std::uint32_t* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = Philox(1234)(7, std::uint64_t(i)).v[i % 4];
}

static int failures = 0;
#define CUDA_OK(call)                                                                  \
  do {                                                                                 \
    cudaError_t e = (call);                                                            \
    if (e != cudaSuccess) {                                                            \
      std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e), __FILE__, __LINE__); \
      std::exit(1);                                                                    \
    }                                                                                  \
  } while (0)

template <class F>
void check_unary(F f, const char* name, bool positive_only = false) {
  const int n = 1000;
  std::vector<double> x(n), y(n), dx(n);
  for (int i = 0; i < n; ++i) x[i] = 0.05 + 4.0 * i / n - (i % 2 ? 2.0 : 0.0);  // positive half for log
  double *dx_, *dy_, *ddx_;
  CUDA_OK(cudaMalloc(&dx_, n * 8));
  CUDA_OK(cudaMalloc(&dy_, n * 8));
  CUDA_OK(cudaMalloc(&ddx_, n * 8));
  CUDA_OK(cudaMemcpy(dx_, x.data(), n * 8, cudaMemcpyHostToDevice));
  unary_on_device<<<(n + 255) / 256, 256>>>(f, dx_, dy_, ddx_, n);
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaMemcpy(y.data(), dy_, n * 8, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(dx.data(), ddx_, n * 8, cudaMemcpyDeviceToHost));
  for (int i = 0; i < n; ++i) {
    if (positive_only && x[i] <= 0) continue;
    double hy = f(x[i]), hdx = f.grad(x[i], hy, 1.0);
    // Device libm may differ from glibc in the last ulps.
    if (std::abs(hy - y[i]) > 1e-14 * (1 + std::abs(hy)) || std::abs(hdx - dx[i]) > 1e-14 * (1 + std::abs(hdx))) {
      std::printf("FAIL %s at x=%g: host %g/%g device %g/%g\n", name, x[i], hy, hdx, y[i], dx[i]);
      ++failures;
      break;
    }
  }
  cudaFree(dx_);
  cudaFree(dy_);
  cudaFree(ddx_);
}

// Binary functors are exact (selects), so host and device agree bit for
// bit, ties and NaN included.
template <class F>
void check_binary(F f, const char* name) {
  const int n = 1000;
  std::vector<double> a(n), b(n), y(n);
  for (int i = 0; i < n; ++i) {
    a[i] = (i % 7) * 0.5 - 1.0;
    b[i] = (i % 5) * 0.5 - 1.0;  // ties where the two agree
    if (i % 97 == 3) a[i] = NAN;
    if (i % 89 == 5) b[i] = NAN;
  }
  double *ad, *bd, *yd;
  CUDA_OK(cudaMalloc(&ad, n * 8));
  CUDA_OK(cudaMalloc(&bd, n * 8));
  CUDA_OK(cudaMalloc(&yd, n * 8));
  CUDA_OK(cudaMemcpy(ad, a.data(), n * 8, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(bd, b.data(), n * 8, cudaMemcpyHostToDevice));
  binary_on_device<<<(n + 255) / 256, 256>>>(f, ad, bd, yd, n);
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaMemcpy(y.data(), yd, n * 8, cudaMemcpyDeviceToHost));
  for (int i = 0; i < n; ++i) {
    const double h = f(a[i], b[i]);
    if (!(h == y[i] || (std::isnan(h) && std::isnan(y[i])))) {
      std::printf("FAIL %s at (%g, %g): host %g device %g\n", name, a[i], b[i], h, y[i]);
      ++failures;
      break;
    }
  }
  cudaFree(ad);
  cudaFree(bd);
  cudaFree(yd);
}

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("SKIPPED: no CUDA device\n");
    return 77;
  }
  check_unary(math::Relu{}, "relu");
  check_unary(math::GeluTanh{}, "gelu_tanh");
  check_unary(math::GeluErf{}, "gelu_erf");
  check_unary(math::Tanh{}, "tanh");
  check_unary(math::Sigmoid{}, "sigmoid");
  check_unary(math::Exp{}, "exp");
  check_unary(math::Log{}, "log", true);
  check_unary(math::Rsqrt{}, "rsqrt", true);
  check_unary(math::Affine{2.5, -1.0}, "affine");
  check_unary(math::Abs{}, "abs");
  check_unary(math::Sqrt{}, "sqrt", true);
  check_unary(math::Square{}, "square");
  check_unary(math::Sin{}, "sin");
  check_unary(math::Cos{}, "cos");
  check_unary(math::Pow{2.5}, "pow", true);
  check_unary(math::Pow{0.0}, "pow 0");
  check_unary(math::Clamp{-0.5, 1.5}, "clamp");
  check_unary(math::SmoothL1{0.7}, "smooth_l1");
  check_unary(math::Huber{0.7}, "huber");
  check_unary(math::Log1pExp{}, "log1p_exp");
  check_binary(math::Maximum{}, "maximum");
  check_binary(math::Minimum{}, "minimum");
  check_binary(math::MaxShare{}, "max_share");

  const int n = 4096;
  std::vector<float> x(n);
  for (int i = 0; i < n; ++i) x[i] = (i - n / 2) * 0.37f + (i % 7) * 1e-5f;
  std::vector<unsigned short> bf(n), h(n);
  float* xd;
  unsigned short *bfd, *hd;
  CUDA_OK(cudaMalloc(&xd, n * 4));
  CUDA_OK(cudaMalloc(&bfd, n * 2));
  CUDA_OK(cudaMalloc(&hd, n * 2));
  CUDA_OK(cudaMemcpy(xd, x.data(), n * 4, cudaMemcpyHostToDevice));
  halves_on_device<<<(n + 255) / 256, 256>>>(xd, bfd, hd, n);
  CUDA_OK(cudaMemcpy(bf.data(), bfd, n * 2, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(h.data(), hd, n * 2, cudaMemcpyDeviceToHost));
  for (int i = 0; i < n; ++i)
    if (bf[i] != BFloat16(x[i]).bits || h[i] != Half(x[i]).bits) {
      std::printf("FAIL half conversion of %g\n", x[i]);
      ++failures;
      break;
    }

  std::vector<std::uint32_t> r(n);
  std::uint32_t* rd;
  CUDA_OK(cudaMalloc(&rd, n * 4));
  philox_on_device<<<(n + 255) / 256, 256>>>(rd, n);
  CUDA_OK(cudaMemcpy(r.data(), rd, n * 4, cudaMemcpyDeviceToHost));
  for (int i = 0; i < n; ++i)
    if (r[i] != Philox(1234)(7, std::uint64_t(i)).v[i % 4]) {
      std::printf("FAIL philox at %d\n", i);
      ++failures;
      break;
    }
  std::printf(failures ? "device functors: FAILED\n" : "device functors: all match the host\n");
  return failures ? 1 : 0;
}
