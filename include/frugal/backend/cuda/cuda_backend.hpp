#pragma once
// The CUDA backend: one arena from a single cudaMalloc per step, one compute
// stream every kernel runs on, a copy stream for the host tier's transfers,
// and a cuBLASLt handle whose workspace is the op's planned scratch (the
// KernelTable's workspace function sizes it; nothing is allocated while a
// step runs). Host-only code: the kernels it registers are compiled by nvcc
// in units/kernels.cuh, which defines make_cuda_backend.
#include <cstring>

#include "../../runtime/backend.hpp"
#include "check.hpp"

namespace frugal::cuda {

// What every CUDA kernel of one backend shares: the device, the streams,
// cuBLASLt, and a word in host memory the device can write (mapped, pinned)
// where a kernel flags a data error (a label out of range) for the host to
// report at the next synchronize().
struct Context {
  int device = 0;
  cudaStream_t compute = nullptr;
  cudaStream_t copy = nullptr;
  cublasLtHandle_t lt = nullptr;
  long long* status_host = nullptr;    // pinned, mapped: {code, position, value, limit}
  long long* status_device = nullptr;  // the same words as the device sees them
};

// Codes a kernel writes to Context::status (first error wins).
// kBadId: an embedding id outside [0, limit) (the table's rows).
enum Status : long long { kOk = 0, kBadLabel = 1, kBadId = 2 };

class CudaBackend final : public Backend {
 public:
  // Fails with "no CUDA device: ..." where no device (or no driver) is found.
  explicit CudaBackend(const BackendOptions& o);
  ~CudaBackend() override {
    // No check: a destructor must not throw, and a failing driver here has
    // already failed the call that matters.
    if (ctx_.lt) cublaslt().Destroy(ctx_.lt);
    if (ctx_.compute) cudaStreamDestroy(ctx_.compute);
    if (ctx_.copy) cudaStreamDestroy(ctx_.copy);
    if (ctx_.status_host) cudaFreeHost(ctx_.status_host);
  }
  std::string name() const override { return "cuda"; }
  const KernelTable& kernels() const override { return table_; }
  bool host_addressable() const override { return false; }
  const Context& context() const { return ctx_; }

  // The arena: asked for once, when the step is compiled. Out of memory is a
  // BudgetError there, naming the bytes asked and what the device has free
  // (another process may hold the rest), never a failure mid-step.
  void* allocate(std::size_t bytes) override {
    set_device();
    void* p = nullptr;
    cudaError_t e = cudaMalloc(&p, std::max<std::size_t>(bytes, 1));
    if (e != cudaSuccess) {
      cudaGetLastError();  // clear the sticky-free error so later calls work
      std::size_t free_b = 0, total_b = 0;
      cudaMemGetInfo(&free_b, &total_b);
      fail<BudgetError>("cuda: cannot allocate the step's device arena of ", format_bytes(bytes), " (", bytes,
                        " bytes): ", cudaGetErrorString(e), "; the device has ", format_bytes(free_b), " free of ",
                        format_bytes(total_b), " (another process may hold the rest): lower the budget or free "
                        "device memory");
    }
    return p;
  }
  void deallocate(void* p) override {
    if (!p) return;
    cudaStreamSynchronize(ctx_.compute);  // nothing may still run in memory given back
    cudaFree(p);
  }
  // Host <-> device copies on the compute stream (so they are ordered with
  // the kernels); a copy to the host waits for it, since the caller reads
  // the bytes next.
  void copy_to_device(void* dst, const void* src, std::size_t n) override {
    if (!n) return;
    check(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, ctx_.compute), "cudaMemcpyAsync to the device");
    // A pageable source may be reused by the caller at once: finish the copy.
    check(cudaStreamSynchronize(ctx_.compute), "cudaStreamSynchronize after a copy to the device");
  }
  void copy_to_host(void* dst, const void* src, std::size_t n) override {
    if (!n) return;
    check(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, ctx_.compute), "cudaMemcpyAsync to the host");
    check(cudaStreamSynchronize(ctx_.compute), "cudaStreamSynchronize after a copy to the host");
    report_status();
  }
  void fill(void* dst, unsigned char byte, std::size_t n) override {
    if (!n) return;
    check(cudaMemsetAsync(dst, byte, n, ctx_.compute), "cudaMemsetAsync");
  }
  void synchronize() override {
    check(cudaStreamSynchronize(ctx_.compute), "a kernel of the step (cudaStreamSynchronize)");
    report_status();
  }

  // The host tier: a transfer is issued after the compute that produced its
  // source, so the executor's thread waits for the compute stream first (a
  // simple, correct order; an event per slot would let later kernels overlap
  // more). The worker thread then copies on the copy stream.
  void before_transfer() override { synchronize(); }
  // The host pool, page-locked (cudaHostRegister): its copies then run at
  // full speed and beside compute. Where the system refuses (a locked-memory
  // limit), the copies still work from pageable memory, only slower.
  bool pin_host(void* p, std::size_t bytes) override {
    set_device();
    if (cudaHostRegister(p, bytes, cudaHostRegisterDefault) == cudaSuccess) return true;
    cudaGetLastError();
    return false;
  }
  void unpin_host(void* p) noexcept override {
    cudaHostUnregister(p);
    cudaGetLastError();
  }
  void transfer(void* dst, const void* src, std::size_t n, bool to_device) override {
    if (!n) return;
    set_device();  // the copy engine's worker thread starts with device 0
    // cudaMemcpyDefault: the addresses say which side each is on (unified
    // addressing), so a transfer between a home the kernels also use (a
    // device copy) and the arena is right too.
    (void)to_device;
    check(cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, ctx_.copy),
          cat("cudaMemcpyAsync of a host-tier transfer (", format_bytes(n), ")"));
    check(cudaStreamSynchronize(ctx_.copy), "cudaStreamSynchronize of the copy stream");
  }

 private:
  void set_device() const { check(cudaSetDevice(ctx_.device), "cudaSetDevice"); }
  // A data error a kernel flagged on the device (first one wins).
  void report_status() {
    volatile long long* s = ctx_.status_host;
    if (s[0] == kOk) return;
    const long long code = s[0], pos = s[1], value = s[2], limit = s[3];
    s[0] = kOk;
    if (code == kBadLabel)
      fail<DataError>("cross_entropy: label ", value, " at position ", pos,
                      " is outside [0, classes) for the logits' classes");
    if (code == kBadId)
      fail<DataError>("embedding: id ", value, " at position ", pos, " is outside the valid range [0, ", limit, ") (",
                      limit, " table rows)");
    fail("cuda: a kernel flagged error code ", code);
  }

  Context ctx_;
  KernelTable table_;
};

// Defined in units/kernels.cuh (compiled by nvcc, once per program).
void register_cuda_kernels(KernelTable& t, const Context& ctx, const BackendOptions& o);
// Defined in units/transformer.cuh (its own nvcc unit, compiled in parallel
// with kernels.cuh): embedding, slices, layer norm, the fused elementwise
// op, causal attention and dropout; register_cuda_kernels calls it.
void add_transformer_kernels(KernelTable& t, const Context& ctx);

inline CudaBackend::CudaBackend(const BackendOptions& o) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    cudaGetLastError();
    fail("no CUDA device: ", e != cudaSuccess ? cat(cudaGetErrorName(e), ": ", cudaGetErrorString(e))
                                              : std::string("the driver reports 0 devices"),
         " (backend 'cuda' needs an NVIDIA GPU and its driver; use backend 'cpu' here)");
  }
  set_device();
  check(cudaStreamCreateWithFlags(&ctx_.compute, cudaStreamNonBlocking), "cudaStreamCreate (compute)");
  check(cudaStreamCreateWithFlags(&ctx_.copy, cudaStreamNonBlocking), "cudaStreamCreate (copy)");
  check(cublaslt().Create(&ctx_.lt), "cublasLtCreate");
  void* status = nullptr;
  check(cudaHostAlloc(&status, 4 * sizeof(long long), cudaHostAllocMapped), "cudaHostAlloc (status words)");
  ctx_.status_host = static_cast<long long*>(status);
  std::memset(status, 0, 4 * sizeof(long long));
  void* dev = nullptr;
  check(cudaHostGetDevicePointer(&dev, status, 0), "cudaHostGetDevicePointer (status words)");
  ctx_.status_device = static_cast<long long*>(dev);
  register_cuda_kernels(table_, ctx_, o);
}

}  // namespace frugal::cuda
