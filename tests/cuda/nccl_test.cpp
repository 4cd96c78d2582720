// cuda_nccl: NCCL's communicator (dist/nccl.hpp) and the rank-order sum it
// adds with on the device. The sum kernel must give the host's bits
// (dist::sum_in_rank_order, the one MPI's communicator uses) for every
// dtype and rank count; the communicator, over one rank (a GPU per rank:
// one device here), must move bytes as each collective says. Exits 77
// without a CUDA device. More ranks need more GPUs: where there are, run
// it under mpirun (each rank on its own device).
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

// Not frugal.hpp: this test needs the tensors, the communicators and the
// CUDA kernels' declaration only, and compiles in a third of the time.
#include <frugal/core/rng.hpp>
#include <frugal/core/tensor.hpp>
#include <frugal/dist/local.hpp>
#include <frugal/dist/nccl.hpp>

using namespace frugal;

namespace {

int failures = 0;
void expect(bool ok, const std::string& what) {
  if (!ok) {
    ++failures;
    std::printf("FAIL: %s\n", what.c_str());
  }
}

void skip_without_device() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("skipped: no CUDA device\n");
    std::exit(77);
  }
}

// Random rows of every dtype a collective sums, the sum on the device
// against the host's, bit for bit.
void check_sum_kernel() {
  Rng rng(17);
  for (DType dt : {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32, DType::i64})
    for (int n : {1, 2, 3, 5}) {
      const std::size_t len = 1000 + 7 * std::size_t(n), es = dtype_size(dt);
      Tensor rows(Shape{std::int64_t(len) * n}, dt), host(Shape{std::int64_t(len)}, dt), dev(Shape{std::int64_t(len)}, dt);
      for (std::int64_t i = 0; i < rows.numel(); ++i) {
        const double v = rng.uniform() * 8 - 4;
        switch (dt) {
          case DType::f32: rows.data<float>()[i] = float(v); break;
          case DType::f64: rows.data<double>()[i] = v; break;
          case DType::bf16: rows.data<BFloat16>()[i] = BFloat16(float(v)); break;
          case DType::f16: rows.data<Half>()[i] = Half(float(v)); break;
          case DType::i32: rows.data<std::int32_t>()[i] = std::int32_t(v * 1000); break;
          default: rows.data<std::int64_t>()[i] = std::int64_t(v * 1e12); break;
        }
      }
      dist::sum_in_rank_order(rows.raw(), len, n, dt, host.raw());
      void *d_rows = nullptr, *d_out = nullptr;
      cuda::check(cudaMalloc(&d_rows, rows.nbytes()), "cudaMalloc");
      cuda::check(cudaMalloc(&d_out, len * es), "cudaMalloc");
      cuda::check(cudaMemcpy(d_rows, rows.raw(), rows.nbytes(), cudaMemcpyHostToDevice), "cudaMemcpy");
      cuda::sum_in_rank_order(d_rows, len, n, dt, d_out, nullptr);
      cuda::check(cudaMemcpy(dev.raw(), d_out, len * es, cudaMemcpyDeviceToHost), "cudaMemcpy");
      cudaFree(d_rows);
      cudaFree(d_out);
      expect(std::memcmp(host.raw(), dev.raw(), len * es) == 0,
             cat("the device's rank-order sum of ", n, " rows of ", dtype_name(dt), " is the host's, bit for bit"));
    }
  std::printf("%-60s %s\n", "rank-order sum on the device: the host's bits", failures ? "FAIL" : "ok");
}

// One rank: every collective moves what it says, on device memory.
void check_one_rank() {
  auto local = dist::local();
  auto nccl = dist::Nccl::over(*local);
  expect(nccl->rank() == 0 && nccl->size() == 1 && nccl->name() == "nccl", "one rank named nccl");
  const std::size_t n = 4099;
  std::vector<float> x(n), back(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = float(i) * 0.5f - 7;
  float *a = nullptr, *b = nullptr;
  cuda::check(cudaMalloc(&a, n * 4), "cudaMalloc");
  cuda::check(cudaMalloc(&b, n * 4), "cudaMalloc");
  cuda::check(cudaMemcpy(a, x.data(), n * 4, cudaMemcpyHostToDevice), "cudaMemcpy");
  nccl->all_reduce_sum(a, n, DType::f32, nullptr, "test: all_reduce");
  nccl->all_gather(a, b, n, DType::f32, "test: all_gather");
  cuda::check(cudaMemcpy(back.data(), b, n * 4, cudaMemcpyDeviceToHost), "cudaMemcpy");
  expect(back == x, "one rank's all_reduce leaves the data, its all_gather copies it");
  cuda::check(cudaMemset(b, 0, n * 4), "cudaMemset");
  nccl->reduce_scatter_sum(a, b, n, DType::f32, nullptr, "test: reduce_scatter");
  cuda::check(cudaMemcpy(back.data(), b, n * 4, cudaMemcpyDeviceToHost), "cudaMemcpy");
  expect(back == x, "one rank's reduce_scatter copies its only chunk");
  nccl->broadcast(a, n, DType::f32, 0, "test: broadcast");
  nccl->barrier("test: barrier");
  cuda::check(cudaMemcpy(back.data(), a, n * 4, cudaMemcpyDeviceToHost), "cudaMemcpy");
  expect(back == x, "a broadcast from the only rank keeps the data");
  bool refused = false;
  try {
    nccl->broadcast(a, n, DType::f32, 1, "test: bad root");
  } catch (const Error& e) {
    refused = std::string(e.what()).find("root 1 is not a rank of 1") != std::string::npos;
  }
  expect(refused, "a broadcast from a rank that does not exist is refused, naming it");
  cudaFree(a);
  cudaFree(b);
  std::printf("%-60s %s\n", "one rank over NCCL", failures ? "FAIL" : "ok");
}

}  // namespace

int main() {
  skip_without_device();
  try {
    check_sum_kernel();
    check_one_rank();
  } catch (const std::exception& e) {
    expect(false, e.what());
  }
  if (failures) std::printf("cuda_nccl: %d check(s) failed\n", failures);
  else std::printf("cuda_nccl: all checks passed\n");
  return failures ? 1 : 0;
}
