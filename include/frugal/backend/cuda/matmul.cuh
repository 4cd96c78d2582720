#pragma once
// matmul and linear through cuBLASLt. f32 computes in f32 (CUBLAS_COMPUTE_32F:
// never TF32), f64 in f64, bf16/f16 with f32 accumulation and one rounding
// on store, as on the CPU. Row-major C = op(A)·op(B) is computed as the
// column-major Cᵀ = op(B)ᵀ·op(A)ᵀ, so no operand is ever transposed in memory.
//
// Determinism: the algorithm is cuBLASLt's first heuristic answer for the
// shapes, dtypes and the planned workspace (the same answer every run on one
// GPU and library), and split-K reductions are excluded
// (CUBLASLT_REDUCTION_SCHEME_NONE), so no partial sums meet in a varying
// order. The workspace is the op's planned scratch (gemm_workspace_bytes):
// nothing is allocated while a step runs.
#include <map>
#include <memory>
#include <mutex>
#include <tuple>

#include "../../ops/matmul.hpp"
#include "kernel_ops.hpp"
#include "launch.cuh"

namespace frugal::cuda {

struct GemmTypes {
  cudaDataType_t data, scale;
  cublasComputeType_t compute;
};
inline GemmTypes gemm_types(DType t, const std::string& op) {
  switch (t) {
    case DType::f32: return {CUDA_R_32F, CUDA_R_32F, CUBLAS_COMPUTE_32F};
    case DType::f64: return {CUDA_R_64F, CUDA_R_64F, CUBLAS_COMPUTE_64F};
    case DType::bf16: return {CUDA_R_16BF, CUDA_R_32F, CUBLAS_COMPUTE_32F};
    case DType::f16: return {CUDA_R_16F, CUDA_R_32F, CUBLAS_COMPUTE_32F};
    default: fail("cuda: ", op, " has no GEMM for dtype ", dtype_name(t));
  }
}

// One row-major GEMM problem: C[batch][m, n] = op(A)·op(B), strided batches
// (a stride of 0: the operand is shared by every item).
struct GemmShape {
  std::int64_t batch, m, n, k;
  bool ta, tb;
  std::int64_t stride_a, stride_b;
  DType dtype;
  std::size_t workspace;
  // The alignment (bytes, at most 256) every A, B and C pointer the plan
  // runs with has: cuBLASLt's heuristic otherwise assumes 256 and may pick
  // a kernel that faults on a less aligned operand (a broadcast item).
  std::uint32_t align_a = 256, align_b = 256, align_c = 256;
  auto key() const {
    return std::make_tuple(batch, m, n, k, ta, tb, stride_a, stride_b, int(dtype), workspace, align_a, align_b, align_c);
  }
};

// The largest power of two (at most 256) that divides the address. Arena
// values are 256-aligned wherever the planner puts them, so this depends on
// the shapes only (a broadcast item's offset), never on the placement: the
// same algorithm, and the same bits, under every budget.
inline std::uint32_t alignment_of(const void* p) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  if (a == 0) return 256;
  return std::uint32_t(std::min<std::uintptr_t>(256, a & (~a + 1)));
}

// cuBLASLt descriptors and the chosen algorithm, made once per problem and
// kept (the heuristic query costs more than a small GEMM).
class GemmPlan {
 public:
  GemmPlan(cublasLtHandle_t lt, const GemmShape& s, const std::string& what) {
    const GemmTypes t = gemm_types(s.dtype, what);
    check(cublaslt().MatmulDescCreate(&op_, t.compute, t.scale), "cublasLtMatmulDescCreate (" + what + ")");
    // Column-major view: Cᵀ[n, m] = op(B)ᵀ[n, k] · op(A)ᵀ[k, m].
    cublasOperation_t opa = s.tb ? CUBLAS_OP_T : CUBLAS_OP_N, opb = s.ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    check(cublaslt().MatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa), "TRANSA (" + what + ")");
    check(cublaslt().MatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb), "TRANSB (" + what + ")");
    // Stored (before op) column-major shapes: B as [n, k] or [k, n], A as [k, m] or [m, k].
    layout(&a_, t.data, s.tb ? s.k : s.n, s.tb ? s.n : s.k, s.tb ? s.k : s.n, s.batch, s.stride_b, what);
    layout(&b_, t.data, s.ta ? s.m : s.k, s.ta ? s.k : s.m, s.ta ? s.m : s.k, s.batch, s.stride_a, what);
    layout(&c_, t.data, s.n, s.m, s.n, s.batch, s.m * s.n, what);
    check(cublaslt().MatmulPreferenceCreate(&pref_), "cublasLtMatmulPreferenceCreate (" + what + ")");
    std::uint64_t ws = s.workspace;
    check(cublaslt().MatmulPreferenceSetAttribute(pref_, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws),
          "MAX_WORKSPACE_BYTES (" + what + ")");
    // Operands swap roles in the column-major view: cuBLASLt's A is our B.
    const std::pair<cublasLtMatmulPreferenceAttributes_t, std::uint32_t> aligns[] = {
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, s.align_b},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, s.align_a},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, s.align_c},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, s.align_c}};
    for (auto [attr, value] : aligns)
      check(cublaslt().MatmulPreferenceSetAttribute(pref_, attr, &value, sizeof value), "MIN_ALIGNMENT (" + what + ")");
    std::uint32_t scheme = CUBLASLT_REDUCTION_SCHEME_NONE;
    check(cublaslt().MatmulPreferenceSetAttribute(pref_, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &scheme, sizeof scheme),
          "REDUCTION_SCHEME_MASK (" + what + ")");
    int found = 0;
    check(cublaslt().MatmulAlgoGetHeuristic(lt, op_, a_, b_, c_, c_, pref_, 1, &algo_, &found),
          "cublasLtMatmulAlgoGetHeuristic (" + what + ")");
    if (found < 1) fail("cuda: cuBLASLt has no algorithm for ", what, " within ", s.workspace, " bytes of workspace");
  }
  ~GemmPlan() {
    if (pref_) cublaslt().MatmulPreferenceDestroy(pref_);
    if (a_) cublaslt().MatrixLayoutDestroy(a_);
    if (b_) cublaslt().MatrixLayoutDestroy(b_);
    if (c_) cublaslt().MatrixLayoutDestroy(c_);
    if (op_) cublaslt().MatmulDescDestroy(op_);
  }
  GemmPlan(const GemmPlan&) = delete;
  GemmPlan& operator=(const GemmPlan&) = delete;

  // C = A·B + beta·C (beta 0 or 1), scalars in the scale type.
  void run(const Context& ctx, const void* A, const void* B, void* C, bool accumulate, DType dt, void* ws,
           std::size_t ws_bytes, const std::string& what) const {
    const double one_d = 1, zero_d = 0;
    const float one_f = 1, zero_f = 0;
    const bool f64 = dt == DType::f64;
    const void* alpha = f64 ? static_cast<const void*>(&one_d) : &one_f;
    const void* beta = accumulate ? alpha : f64 ? static_cast<const void*>(&zero_d) : &zero_f;
    check(cublaslt().Matmul(ctx.lt, op_, alpha, B, a_, A, b_, beta, C, c_, C, c_, &algo_.algo, ws, ws_bytes, ctx.compute),
          "cublasLtMatmul (" + what + ")");
  }

 private:
  static void layout(cublasLtMatrixLayout_t* l, cudaDataType_t t, std::int64_t rows, std::int64_t cols, std::int64_t ld,
                     std::int64_t batch, std::int64_t stride, const std::string& what) {
    check(cublaslt().MatrixLayoutCreate(l, t, std::uint64_t(rows), std::uint64_t(cols), ld), "cublasLtMatrixLayoutCreate (" + what + ")");
    if (batch > 1) {
      int b = int(batch);
      check(cublaslt().MatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &b, sizeof b), "BATCH_COUNT (" + what + ")");
      check(cublaslt().MatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride),
            "STRIDED_BATCH_OFFSET (" + what + ")");
    }
  }
  cublasLtMatmulDesc_t op_ = nullptr;
  cublasLtMatrixLayout_t a_ = nullptr, b_ = nullptr, c_ = nullptr;
  cublasLtMatmulPreference_t pref_ = nullptr;
  cublasLtMatmulHeuristicResult_t algo_{};
};

// The plans of one backend's GEMMs, shared by its matmul and linear kernels
// (the kernel table copies them, so they hold the cache by pointer).
class GemmCache {
 public:
  const GemmPlan& get(cublasLtHandle_t lt, const GemmShape& s, const std::string& what) {
    std::lock_guard<std::mutex> hold(lock_);
    auto& p = plans_[s.key()];
    if (!p) p = std::make_unique<GemmPlan>(lt, s, what);
    return *p;
  }

 private:
  std::mutex lock_;
  std::map<decltype(GemmShape{}.key()), std::unique_ptr<GemmPlan>> plans_;
};

inline std::size_t elem_bytes(DType t) { return dtype_size(t); }

struct MatMulKernel {
  Context ctx;
  std::shared_ptr<GemmCache> cache;
  void operator()(const ops::MatMul& op, const KernelArgs& a) const {
    const std::string what = describe(op, a);
    const auto d = op.dims(*a.in[0].shape, *a.in[1].shape);
    const DType dt = a.in[0].dtype;
    const std::size_t es = elem_bytes(dt);
    if (d.batch == 0 || d.m == 0 || d.n == 0) return;
    if (d.k == 0) {
      check(cudaMemsetAsync(a.out[0].data, 0, std::size_t(a.out[0].numel()) * es, ctx.compute), "cudaMemsetAsync (" + what + ")");
      return;
    }
    auto* A = static_cast<const char*>(a.in[0].data);
    auto* B = static_cast<const char*>(a.in[1].data);
    auto* C = static_cast<char*>(a.out[0].data);
    if (d.a_broadcast || d.b_broadcast) {  // items found through broadcast_item: one GEMM each
      auto item_a = [&](std::int64_t i) {
        const std::int64_t ia = d.a_batched ? (d.a_broadcast ? ops::MatMul::broadcast_item(*a.in[0].shape, *a.out[0].shape, i) : i) : 0;
        return A + std::size_t(ia * d.m * d.k) * es;
      };
      auto item_b = [&](std::int64_t i) {
        const std::int64_t ib = d.b_batched ? (d.b_broadcast ? ops::MatMul::broadcast_item(*a.in[1].shape, *a.out[0].shape, i) : i) : 0;
        return B + std::size_t(ib * d.k * d.n) * es;
      };
      GemmShape s{1, d.m, d.n, d.k, op.trans_a(), op.trans_b(), 0, 0, dt, a.workspace_bytes};
      for (std::int64_t i = 0; i < d.batch; ++i) {
        s.align_a = std::min(s.align_a, alignment_of(item_a(i)));
        s.align_b = std::min(s.align_b, alignment_of(item_b(i)));
        s.align_c = std::min(s.align_c, alignment_of(C + std::size_t(i * d.m * d.n) * es));
      }
      const GemmPlan& p = cache->get(ctx.lt, s, what);
      for (std::int64_t i = 0; i < d.batch; ++i)
        p.run(ctx, item_a(i), item_b(i), C + std::size_t(i * d.m * d.n) * es, false, dt, a.workspace, a.workspace_bytes, what);
      return;
    }
    GemmShape s{d.batch, d.m, d.n, d.k, op.trans_a(), op.trans_b(), d.a_batched ? d.m * d.k : 0,
                d.b_batched ? d.k * d.n : 0, dt, a.workspace_bytes};
    // A batched A against one shared B is a single tall GEMM (as on the CPU).
    if (d.a_batched && !d.b_batched && !op.trans_a()) s = {1, d.batch * d.m, d.n, d.k, false, op.trans_b(), 0, 0, dt, a.workspace_bytes};
    s.align_a = alignment_of(A);
    s.align_b = alignment_of(B);
    s.align_c = alignment_of(C);
    cache->get(ctx.lt, s, what).run(ctx, A, B, C, false, dt, a.workspace, a.workspace_bytes, what);
  }
};

template <class S>
__global__ void bias_rows_k(const S* bias, S* y, std::int64_t rows, std::int64_t cols) {
  const std::int64_t n = rows * cols;
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n; i += std::int64_t(gridDim.x) * blockDim.x)
    y[i] = bias[i % cols];
}

// y[rows, out] = x[rows, in]·wᵀ (+ b): the bias is written into y first and
// the GEMM accumulates onto it (beta = 1), as the CPU's GEMM does.
struct LinearKernel {
  Context ctx;
  std::shared_ptr<GemmCache> cache;
  void operator()(const ops::Linear& op, const KernelArgs& a) const {
    const std::string what = describe(op, a);
    const Shape &xs = *a.in[0].shape, &ws = *a.in[1].shape;
    const std::int64_t in = ws[1], out = ws[0], rows = xs.numel() / std::max<std::int64_t>(in, 1);
    const DType dt = a.in[0].dtype;
    if (rows == 0 || out == 0) return;
    if (op.has_bias()) {
      dispatch_precision(dt, "linear", [&](auto p) {
        using S = typename decltype(p)::Storage;
        bias_rows_k<<<blocks_for(rows * out), kThreads, 0, ctx.compute>>>(a.in[2].as<const S>(), a.out[0].as<S>(), rows, out);
        check_launch(what);
      });
    } else if (in == 0) {
      check(cudaMemsetAsync(a.out[0].data, 0, std::size_t(rows * out) * dtype_size(dt), ctx.compute), "cudaMemsetAsync (" + what + ")");
    }
    if (in == 0) return;
    GemmShape s{1, rows, out, in, false, true, 0, 0, dt, a.workspace_bytes};
    s.align_a = alignment_of(a.in[0].data);
    s.align_b = alignment_of(a.in[1].data);
    s.align_c = alignment_of(a.out[0].data);
    cache->get(ctx.lt, s, what).run(ctx, a.in[0].data, a.in[1].data, a.out[0].data, op.has_bias(), dt, a.workspace,
                                    a.workspace_bytes, what);
  }
};

}  // namespace frugal::cuda
