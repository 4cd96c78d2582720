#pragma once
// The one place frugal calls BLAS: row-major GEMM in float and double.
#include <cblas.h>

#include <cstdint>
#include <limits>

#include "../../core/error.hpp"

#include "abi.hpp"

namespace frugal::cpu::inline FRUGAL_KERNEL_ABI {

// BLAS takes sizes and strides as blasint (32-bit in Debian's OpenBLAS): a
// value that does not fit would wrap into a wrong (or negative) size, so it
// is an error naming the product, before BLAS is called.
inline void check_gemm_dims(std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t lda, std::int64_t ldb,
                            std::int64_t ldc) {
  constexpr std::int64_t lo = std::numeric_limits<blasint>::min(), hi = std::numeric_limits<blasint>::max();
  const std::int64_t v[] = {m, n, k, lda, ldb, ldc};
  const char* names[] = {"m", "n", "k", "lda", "ldb", "ldc"};
  for (int i = 0; i < 6; ++i)
    if (v[i] < lo || v[i] > hi)
      fail("gemm (m=", m, ", n=", n, ", k=", k, ", lda=", lda, ", ldb=", ldb, ", ldc=", ldc, "): ", names[i], " = ",
           v[i], " does not fit BLAS's ", sizeof(blasint) * 8, "-bit integer (at most ", hi, ")");
}

// C[m,n] = alpha * op(A) op(B) + beta * C, all row-major.
inline void gemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* A,
                 std::int64_t lda, const float* B, std::int64_t ldb, float beta, float* C, std::int64_t ldc) {
  check_gemm_dims(m, n, k, lda, ldb, ldc);
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, blasint(m), blasint(n),
              blasint(k), alpha, A, blasint(lda), B, blasint(ldb), beta, C, blasint(ldc));
}
inline void gemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, double alpha, const double* A,
                 std::int64_t lda, const double* B, std::int64_t ldb, double beta, double* C, std::int64_t ldc) {
  check_gemm_dims(m, n, k, lda, ldb, ldc);
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, blasint(m), blasint(n),
              blasint(k), alpha, A, blasint(lda), B, blasint(ldb), beta, C, blasint(ldc));
}

inline void set_blas_threads(int n) { openblas_set_num_threads(n); }

}  // namespace frugal::cpu
