#pragma once
// The CPU backend: a complete backend, not a test double. Its "device" is
// host memory; GEMMs run on frugal's AVX-512 kernels or OpenBLAS (blas.hpp),
// everything else on frugal's own threads (worker_team.hpp). It is made by
// make_backend("cpu") (units/backend.hpp), and fills its own kernel table
// when constructed.

#include <cstdlib>
#include <cstring>

#include "blas.hpp"
#include "isa.hpp"
#include "register.hpp"

namespace frugal::cpu {

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const BackendOptions& o = {}) { register_cpu_kernels(table_, o); }
  // Not copied: kernels in the table may refer to the table itself (ZeRO's
  // sharded update runs the table's kernel for its inner op).
  CpuBackend(const CpuBackend&) = delete;
  CpuBackend& operator=(const CpuBackend&) = delete;
  std::string name() const override { return "cpu"; }
  std::string kernel_variant() const override {
    return cat("isa ", isa_name(cpu_isa()), ", sgemm ",
               sgemm_engine_name(sgemm_engine(1024)),
               bf16_gemm_direct(1024) ? ", bf16 avx512bf16" : "");
  }
  const KernelTable& kernels() const override { return table_; }
  void* allocate(std::size_t bytes) override {
    void* p = std::aligned_alloc(kAlignment, align_up(bytes));
    if (!p) fail("cpu: cannot allocate an arena of ", format_bytes(bytes));
    return p;
  }
  void deallocate(void* p) override { std::free(p); }
  void copy_to_device(void* dst, const void* src, std::size_t n) override { std::memcpy(dst, src, n); }
  void copy_to_host(void* dst, const void* src, std::size_t n) override { std::memcpy(dst, src, n); }
  void fill(void* dst, unsigned char byte, std::size_t n) override { std::memset(dst, byte, n); }

 private:
  KernelTable table_;
};

}  // namespace frugal::cpu
