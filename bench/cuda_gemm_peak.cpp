// cuda_gemm_peak: the GPU's GEMM rate through frugal's CUDA matmul kernel
// (cuBLASLt with the workspace frugal plans and split-K excluded), so the
// achieved TFLOP/s of a training step can be stated as a fraction of what
// frugal's own GEMM reaches on that GPU. Random operands (zeros run faster).
//   cuda_gemm_peak [N]   -> one JSON line per dtype: {"dtype","n","ms","tflops"}
// Exits 77 without a CUDA device.
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <frugal/frugal.hpp>

using namespace frugal;

int main(int argc, char** argv) try {
  const std::int64_t n = argc > 1 ? std::stoll(argv[1]) : 8192;
  std::shared_ptr<Backend> gpu;
  try {
    gpu = make_backend("cuda");
  } catch (const Error& e) {
    if (std::string(e.what()).find("no CUDA device") != std::string::npos) {
      std::printf("skipped: no CUDA device\n");
      return 77;
    }
    throw;
  }
  Rng rng(1, 2);
  std::vector<float> host(std::size_t(n * n));
  for (auto& v : host) v = float(rng.uniform() - 0.5);
  for (DType dt : {DType::f32, DType::bf16}) {
    const Shape s{n, n};
    const std::size_t bytes = std::size_t(n * n) * dtype_size(dt);
    Tensor h(s, dt);
    for (std::int64_t i = 0; i < n * n; ++i) {
      if (dt == DType::f32) h.data<float>()[i] = host[std::size_t(i)];
      else h.data<BFloat16>()[i] = BFloat16(host[std::size_t(i)]);
    }
    ops::MatMul op(false, false);
    std::vector<TensorMeta> in{{dt, s}, {dt, s}}, out{{dt, s}};
    const std::size_t ws = gpu->workspace_bytes(op, in, out);
    auto* block = static_cast<unsigned char*>(gpu->allocate(3 * align_up(bytes) + ws + 256));
    unsigned char *a = block, *b = block + align_up(bytes), *c = b + align_up(bytes), *w = c + align_up(bytes);
    gpu->copy_to_device(a, h.raw(), bytes);
    gpu->copy_to_device(b, h.raw(), bytes);
    TensorRef ins[2] = {{a, dt, &s}, {b, dt, &s}}, outs[1] = {{c, dt, &s}};
    const KernelArgs args{ins, outs, 0, ws ? w : nullptr, ws};
    const Kernel& k = gpu->kernel_for(op);
    for (int i = 0; i < 3; ++i) k(op, args);
    gpu->synchronize();
    const int reps = dt == DType::f32 ? 5 : 20;
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; ++i) k(op, args);
    gpu->synchronize();
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / reps;
    const double tflops = 2.0 * double(n) * double(n) * double(n) / (ms * 1e9);
    std::printf("{\"dtype\":\"%s\",\"n\":%lld,\"ms\":%.4f,\"tflops\":%.2f,\"workspace_bytes\":%zu}\n", dtype_name(dt),
                (long long)n, ms, tflops, ws);
    gpu->deallocate(block);
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "cuda_gemm_peak: %s\n", e.what());
  return 1;
}
