#pragma once
// The CPU backend: a complete backend, not a test double. Its "device" is
// host memory; GEMM goes to OpenBLAS, everything else is OpenMP.
#include <cstdlib>
#include <cstring>

#include "../../runtime/backend.hpp"
#include "blas.hpp"
#include "cast.hpp"
#include "elementwise.hpp"
#include "loss.hpp"
#include "loss_scaling.hpp"
#include "matmul.hpp"
#include "optimizer.hpp"
#include "reduce.hpp"
#include "shape.hpp"
#include "softmax.hpp"
#include "spmm.hpp"
#include "layer_norm.hpp"
#include "embedding.hpp"
#include "dropout.hpp"
#include "attention.hpp"
#include "indexing.hpp"
#include "gelu.hpp"
#include "conv.hpp"
#include "batch_norm.hpp"
#include "pool.hpp"

namespace frugal::cpu {

class CpuBackend final : public Backend {
 public:
  std::string name() const override { return "cpu"; }
  const KernelTable& kernels() const override { return cpu::kernels(); }
  void* allocate(std::size_t bytes) override {
    void* p = std::aligned_alloc(kAlignment, align_up(bytes));
    if (!p) fail("cpu: cannot allocate an arena of ", format_bytes(bytes));
    return p;
  }
  void deallocate(void* p) override { std::free(p); }
  void copy_to_device(void* dst, const void* src, std::size_t n) override { std::memcpy(dst, src, n); }
  void copy_to_host(void* dst, const void* src, std::size_t n) override { std::memcpy(dst, src, n); }
  void fill(void* dst, unsigned char byte, std::size_t n) override { std::memset(dst, byte, n); }
  // OpenMP regions and OpenBLAS both use n threads.
  void set_threads(int n) override {
    omp_set_num_threads(n);
    set_blas_threads(n);
  }
};

inline const bool cpu_backend_registered =
    register_backend("cpu", [] { return std::unique_ptr<Backend>(new CpuBackend()); });

}  // namespace frugal::cpu
