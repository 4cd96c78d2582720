#pragma once
// The one place frugal calls BLAS: row-major GEMM in float and double.
#include <cblas.h>

#include <cstdint>

namespace frugal::cpu {

// C[m,n] = alpha * op(A) op(B) + beta * C, all row-major.
inline void gemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* A,
                 std::int64_t lda, const float* B, std::int64_t ldb, float beta, float* C, std::int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, blasint(m), blasint(n),
              blasint(k), alpha, A, blasint(lda), B, blasint(ldb), beta, C, blasint(ldc));
}
inline void gemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, double alpha, const double* A,
                 std::int64_t lda, const double* B, std::int64_t ldb, double beta, double* C, std::int64_t ldc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, blasint(m), blasint(n),
              blasint(k), alpha, A, blasint(lda), B, blasint(ldb), beta, C, blasint(ldc));
}

inline void set_blas_threads(int n) { openblas_set_num_threads(n); }

}  // namespace frugal::cpu
