#pragma once
#include "../../ops/matmul.hpp"
#include "blas.hpp"
#include "kernel_table.hpp"
#include "parallel.hpp"

namespace frugal::cpu {

inline void matmul_kernel(const ops::MatMul& op, const KernelArgs& a) {
  dispatch_float(a.in[0].dtype, "matmul", [&](auto tag) {
    using T = decltype(tag);
    auto d = op.dims(*a.in[0].shape, *a.in[1].shape);
    const T *A = a.in[0].as<T>(), *B = a.in[1].as<T>();
    T* C = a.out[0].as<T>();
    bool ta = op.trans_a(), tb = op.trans_b();
    std::int64_t lda = ta ? d.m : d.k, ldb = tb ? d.k : d.n;
    if (d.m == 0 || d.n == 0) return;
    if (d.k == 0) {
      std::fill(C, C + d.batch * d.m * d.n, T(0));
      return;
    }
    // A batched A against one shared B is a single tall GEMM.
    if (d.a_batched && !d.b_batched && !ta) {
      gemm(false, tb, d.batch * d.m, d.n, d.k, T(1), A, lda, B, ldb, T(0), C, d.n);
      return;
    }
    std::int64_t sa = d.a_batched ? d.m * d.k : 0, sb = d.b_batched ? d.k * d.n : 0;
    for (std::int64_t i = 0; i < d.batch; ++i)
      gemm(ta, tb, d.m, d.n, d.k, T(1), A + i * sa, lda, B + i * sb, ldb, T(0), C + i * d.m * d.n, d.n);
  });
}

inline void linear_kernel(const ops::Linear& op, const KernelArgs& a) {
  dispatch_float(a.in[0].dtype, "linear", [&](auto tag) {
    using T = decltype(tag);
    const Shape &xs = *a.in[0].shape, &ws = *a.in[1].shape;
    std::int64_t in = ws[1], out = ws[0], rows = xs.numel() / std::max<std::int64_t>(in, 1);
    const T *x = a.in[0].as<T>(), *w = a.in[1].as<T>();
    T* y = a.out[0].as<T>();
    if (rows == 0 || out == 0) return;
    T beta = T(0);
    if (op.has_bias()) {
      const T* bias = a.in[2].as<T>();
      parallel_for(rows, out, [&](std::int64_t b, std::int64_t e) {
        for (std::int64_t r = b; r < e; ++r) std::copy(bias, bias + out, y + r * out);
      });
      beta = T(1);
    }
    if (in == 0) {
      if (!op.has_bias()) std::fill(y, y + rows * out, T(0));
      return;
    }
    gemm(false, true, rows, out, in, T(1), x, in, w, in, beta, y, out);
  });
}

inline const bool matmul_registered =
    kernels().add<ops::MatMul>(matmul_kernel) && kernels().add<ops::Linear>(linear_kernel);

}  // namespace frugal::cpu
