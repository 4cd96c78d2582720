#pragma once
// matmul and linear on the float GEMM (blas.hpp). bf16 operands go to the
// bf16 kernel where the CPU has AVX512-BF16 (blas.hpp, bf16_gemm_direct);
// otherwise bf16/f16 operands are converted to f32 in the op's planned
// workspace (f32_images below), multiplied in f32 and rounded once on store.
#include "../../ops/matmul.hpp"
#include "blas.hpp"
#include "convert.hpp"
#include "../../runtime/backend.hpp"
#include "parallel.hpp"

#include "abi.hpp"

namespace frugal::cpu::inline FRUGAL_KERNEL_ABI {

// Where a bf16/f16 product keeps the f32 images of its operands and its
// result inside the workspace: [A | B | C], each at an aligned offset.
struct F32Images {
  std::size_t a = 0, b = 0, c = 0, bytes = 0;
};
inline F32Images f32_images(std::int64_t a_elems, std::int64_t b_elems, std::int64_t c_elems) {
  F32Images w;
  w.b = align_up(std::size_t(a_elems) * 4);
  w.c = w.b + align_up(std::size_t(b_elems) * 4);
  w.bytes = w.c + std::size_t(c_elems) * 4;
  return w;
}

// The workspace the kernel table plans for matmul and linear: none in f32
// and f64; the three f32 images for bf16/f16 (the bias is added into y's).
// A bf16 product that runs on the bf16 kernel (blas.hpp, bf16_gemm_direct)
// needs none: it reads and writes bf16 itself.
inline std::int64_t gemm_depth(const ops::MatMul& op, std::span<const TensorMeta> in) {
  return op.dims(in[0].shape, in[1].shape).k;
}
inline std::int64_t gemm_depth(const ops::Linear&, std::span<const TensorMeta> in) { return in[1].shape[1]; }

template <class OpT>
std::size_t f32_images_workspace(const OpT& op, std::span<const TensorMeta> in, std::span<const TensorMeta> out) {
  if (!is_half(in[0].dtype)) return 0;
  if (in[0].dtype == DType::bf16 && bf16_gemm_direct(gemm_depth(op, in))) return 0;
  return f32_images(in[0].shape.numel(), in[1].shape.numel(), out[0].shape.numel()).bytes;
}

// A batch of independent GEMMs runs one of two ways: one GEMM after another,
// each cut into tiles that the team shares (blas.hpp), or parallel_for over
// the batch items with each GEMM's tiles on one thread. Each GEMM's tiles,
// and so its bits, are the same either way: the choice is only speed.
// Measured with bench/matmul_kernels.cpp on this 2-core machine
// (bench/matmul_kernels.md, with OpenBLAS's own threads then): for
// attention-sized items (B*H = 32 of [128,64]x[64,128], 2 MFLOP each) the
// split ran 2-3x faster. For large items the split is never worse when the
// threads share the batch evenly; with an uneven share (3 items, 2 threads:
// one thread runs two) it wins up to ~64 MFLOP per item and loses beyond.
inline constexpr double kBatchSplitMaxFlops = 64.0 * 1024 * 1024;  // per item, 2*m*n*k

inline bool split_batch(std::int64_t batch, std::int64_t m, std::int64_t n, std::int64_t k, int threads) {
  if (threads <= 1 || batch < 2) return false;
  double flops = 2.0 * double(m) * double(n) * double(k);
  // The share of the threads' time the split keeps busy.
  std::int64_t rounds = (batch + threads - 1) / threads;
  double balance = double(batch) / double(rounds * threads);
  return flops <= kBatchSplitMaxFlops || balance >= 0.9;
}

// C = op(A)·op(B) for every batch item, all row-major in T. Which thread runs
// an item depends only on the sizes and the thread count, and each output
// element comes from exactly one GEMM call, so results are reproducible.
// With broadcast batch axes (d.a_broadcast / d.b_broadcast) each item finds
// its operands' matrices through MatMul::broadcast_item over the shapes.
template <class T>
void matmul_typed(const ops::MatMul::Dims& d, bool ta, bool tb, const T* A, const T* B, T* C,
                  const Shape* as = nullptr, const Shape* bs = nullptr, const Shape* cs = nullptr) {
  if (d.batch == 0 || d.m == 0 || d.n == 0) return;
  if (d.k == 0) {
    std::fill(C, C + d.batch * d.m * d.n, T(0.f));
    return;
  }
  std::int64_t lda = ta ? d.m : d.k, ldb = tb ? d.k : d.n;
  // A batched A against one shared B is a single tall GEMM.
  if (d.a_batched && !d.a_broadcast && !d.b_batched && !ta) {
    gemm(false, tb, d.batch * d.m, d.n, d.k, gemm_scalar_t<T>(1), A, lda, B, ldb, gemm_scalar_t<T>(0), C, d.n);
    return;
  }
  std::int64_t sa = d.a_batched ? d.m * d.k : 0, sb = d.b_batched ? d.k * d.n : 0;
  auto items = [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t i = b; i < e; ++i)
      gemm(ta, tb, d.m, d.n, d.k, gemm_scalar_t<T>(1),
           A + (d.a_broadcast ? ops::MatMul::broadcast_item(*as, *cs, i) : i) * sa, lda,
           B + (d.b_broadcast ? ops::MatMul::broadcast_item(*bs, *cs, i) : i) * sb, ldb, gemm_scalar_t<T>(0),
           C + i * d.m * d.n, d.n);
  };
  if (split_batch(d.batch, d.m, d.n, d.k, team_threads()))
    parallel_for(d.batch, d.m * d.n * d.k, items);
  else
    items(0, d.batch);
}

// y[rows, out] = x[rows, in] · w[out, in]ᵀ (+ y when y_holds_bias).
template <class T>
void linear_typed(std::int64_t rows, std::int64_t in, std::int64_t out, const T* x, const T* w, T* y,
                  bool y_holds_bias) {
  if (rows == 0 || out == 0) return;
  if (in == 0) {
    if (!y_holds_bias) std::fill(y, y + rows * out, T(0.f));
    return;
  }
  using A = gemm_scalar_t<T>;
  gemm(false, true, rows, out, in, A(1), x, in, w, in, y_holds_bias ? A(1) : A(0), y, out);
}

// The f32 images of a bf16/f16 product inside its workspace.
struct F32Views {
  float *a, *b, *c;
};
inline F32Views f32_views(const KernelArgs& k, const char* op) {
  auto w = f32_images(k.in[0].numel(), k.in[1].numel(), k.out[0].numel());
  if (!k.workspace || k.workspace_bytes < w.bytes)
    fail("internal: ", op, " on ", dtype_name(k.in[0].dtype), " needs ", w.bytes, " bytes of workspace, got ",
         k.workspace_bytes);
  auto* base = static_cast<unsigned char*>(k.workspace);
  return {reinterpret_cast<float*>(base + w.a), reinterpret_cast<float*>(base + w.b),
          reinterpret_cast<float*>(base + w.c)};
}

inline void matmul_kernel(const ops::MatMul& op, const KernelArgs& a) {
  dispatch_precision(a.in[0].dtype, "matmul", [&](auto p) {
    using S = typename decltype(p)::Storage;
    auto d = op.dims(*a.in[0].shape, *a.in[1].shape);
    const S *A = a.in[0].as<S>(), *B = a.in[1].as<S>();
    S* C = a.out[0].as<S>();
    if constexpr (std::is_same_v<S, typename decltype(p)::Compute>) {
      matmul_typed(d, op.trans_a(), op.trans_b(), A, B, C, a.in[0].shape, a.in[1].shape, a.out[0].shape);
    } else {
      if constexpr (std::is_same_v<S, BFloat16>)
        if (bf16_gemm_direct(d.k))
          return matmul_typed(d, op.trans_a(), op.trans_b(), A, B, C, a.in[0].shape, a.in[1].shape, a.out[0].shape);
      if (a.out[0].numel() == 0) return;
      F32Views v = f32_views(a, "matmul");
      convert_into(A, v.a, a.in[0].numel());
      convert_into(B, v.b, a.in[1].numel());
      matmul_typed<float>(d, op.trans_a(), op.trans_b(), v.a, v.b, v.c, a.in[0].shape, a.in[1].shape,
                          a.out[0].shape);
      convert_into(v.c, C, a.out[0].numel());
    }
  });
}

inline void linear_kernel(const ops::Linear& op, const KernelArgs& a) {
  dispatch_precision(a.in[0].dtype, "linear", [&](auto p) {
    using S = typename decltype(p)::Storage;
    const Shape &xs = *a.in[0].shape, &ws = *a.in[1].shape;
    std::int64_t in = ws[1], out = ws[0], rows = xs.numel() / std::max<std::int64_t>(in, 1);
    const S *x = a.in[0].as<S>(), *w = a.in[1].as<S>();
    S* y = a.out[0].as<S>();
    if (rows == 0 || out == 0) return;
    // Copies the bias into every row of yt, converting it to Y.
    auto bias_rows = [&](auto* yt) {
      using Y = std::remove_pointer_t<decltype(yt)>;
      const S* bias = a.in[2].as<S>();
      parallel_for(rows, out, [&](std::int64_t b, std::int64_t e) {
        for (std::int64_t r = b; r < e; ++r)
          for (std::int64_t j = 0; j < out; ++j) yt[r * out + j] = math::convert<Y>(bias[j]);
      });
    };
    if constexpr (std::is_same_v<S, typename decltype(p)::Compute>) {
      if (op.has_bias()) bias_rows(y);
      linear_typed(rows, in, out, x, w, y, op.has_bias());
    } else {
      // The bias is bf16 already: y's rows hold it exactly, and the kernel
      // adds it to the f32 sum before its one rounding, as the f32 path does.
      if constexpr (std::is_same_v<S, BFloat16>)
        if (bf16_gemm_direct(in)) {
          if (op.has_bias()) bias_rows(y);
          return linear_typed(rows, in, out, x, w, y, op.has_bias());
        }
      F32Views v = f32_views(a, "linear");
      convert_into(x, v.a, a.in[0].numel());
      convert_into(w, v.b, a.in[1].numel());
      if (op.has_bias()) bias_rows(v.c);
      linear_typed<float>(rows, in, out, v.a, v.b, v.c, op.has_bias());
      convert_into(v.c, y, a.out[0].numel());
    }
  });
}


}  // namespace frugal::cpu
