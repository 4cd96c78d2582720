#pragma once
// Embedding lookup and its deterministic backward, slices and their
// backward, and dropout with the CPU's Philox stream. Every kernel moves or
// sums elements in a fixed order: the embedding backward gives each table
// row to one block, whose threads (one per column) add the rows of dy whose
// id is that row in position order, exactly the CPU's order, so the two
// backends agree bit for bit. No atomics anywhere.
#include "../../ops/dropout.hpp"
#include "../../ops/embedding.hpp"
#include "../../ops/indexing.hpp"
#include "launch.cuh"

namespace frugal::cuda {

template <class Fn>
void dispatch_ids(DType t, const char* op, Fn&& fn) {
  if (t == DType::i32) fn(std::int32_t{});
  else if (t == DType::i64) fn(std::int64_t{});
  else fail("cuda: ", op, ": ids must be i32 or i64, got ", dtype_name(t));
}

// An id outside [0, rows): flagged to the host (first one wins), reported by
// the next synchronize() as the CPU reports it (a DataError naming it).
__device__ inline void flag_bad_id(long long* status, long long pos, long long value, long long rows) {
  volatile long long* s = status;
  if (s[0] != 0) return;
  s[1] = pos;
  s[2] = value;
  s[3] = rows;
  __threadfence_system();
  s[0] = kBadId;
}

// out[i, j] = table[ids[i], j], moved as elements of the table's size.
template <class T, class I>
__global__ void embedding_k(const I* ids, const T* table, T* out, std::int64_t n, std::int64_t rows, std::int64_t d,
                            long long* status) {
  const std::int64_t total = n * d;
  for (std::int64_t t = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; t < total; t += std::int64_t(gridDim.x) * blockDim.x) {
    const std::int64_t i = t / d, j = t % d;
    const std::int64_t id = std::int64_t(ids[i]);
    if (id < 0 || id >= rows) {
      if (j == 0) flag_bad_id(status, i, id, rows);
      // Written anyway, so nothing downstream reads poison; the step fails.
      out[t] = T{};
      continue;
    }
    out[t] = table[id * d + j];
  }
}

template <class Fn>
void dispatch_bytes(DType t, const std::string& what, Fn&& fn) {
  switch (dtype_size(t)) {
    case 1: fn(std::uint8_t{}); return;
    case 2: fn(std::uint16_t{}); return;
    case 4: fn(std::uint32_t{}); return;
    case 8: fn(std::uint64_t{}); return;
    default: fail("cuda: ", what, " cannot move elements of dtype ", dtype_name(t));
  }
}

struct EmbeddingKernel {
  Context ctx;
  void operator()(const ops::Embedding& op, const KernelArgs& a) const {
    const std::string what = describe(op, a);
    const std::int64_t rows = a.in[1].shape->dim(0), d = a.in[1].shape->dim(1), n = a.in[0].numel();
    if (n * d == 0) return;
    dispatch_ids(a.in[0].dtype, "embedding", [&](auto itag) {
      using I = decltype(itag);
      dispatch_bytes(a.in[1].dtype, what, [&](auto ttag) {
        using T = decltype(ttag);
        embedding_k<T, I><<<blocks_for(n * d), kThreads, 0, ctx.compute>>>(a.in[0].as<const I>(), a.in[1].as<const T>(),
                                                                           a.out[0].as<T>(), n, rows, d, ctx.status_device);
      });
    });
    check_launch(what);
  }
};

// dtable[v, j] = sum over positions i with ids[i] == v of dy[i, j], in
// position order, from 0 (the CPU's sum, term for term). Block v (grid
// stride over rows), thread j (block stride over columns). bf16/f16 sum in
// an f32 register and round once, as the CPU's sums in its f32 workspace.
template <class S, class C, class I>
__global__ void embedding_grad_k(const I* ids, const S* dy, S* dtable, std::int64_t n, std::int64_t rows, std::int64_t d) {
  for (std::int64_t v = blockIdx.x; v < rows; v += gridDim.x)
    for (std::int64_t j = threadIdx.x; j < d; j += blockDim.x) {
      C acc = C(0);
      for (std::int64_t i = 0; i < n; ++i)
        if (std::int64_t(ids[i]) == v) acc += load<C>(dy[i * d + j]);
      dtable[v * d + j] = store<S>(acc);
    }
}

struct EmbeddingGradKernel {
  Context ctx;
  void operator()(const ops::EmbeddingGrad& op, const KernelArgs& a) const {
    const std::string what = describe(op, a);
    const std::int64_t rows = op.rows(), d = a.in[1].shape->dim(-1), n = a.in[0].numel();
    if (rows * d == 0) return;
    dispatch_precision(a.in[1].dtype, "embedding_grad", [&](auto p) {
      using S = typename decltype(p)::Storage;
      using C = typename decltype(p)::Compute;
      dispatch_ids(a.in[0].dtype, "embedding_grad", [&](auto itag) {
        using I = decltype(itag);
        const unsigned grid = unsigned(std::min<std::int64_t>(rows, 65535));
        const int threads = int(std::min<std::int64_t>(kThreads, (d + 31) / 32 * 32));
        embedding_grad_k<S, C, I><<<grid, threads, 0, ctx.compute>>>(a.in[0].as<const I>(), a.in[1].as<const S>(),
                                                                     a.out[0].as<S>(), n, rows, d);
      });
    });
    check_launch(what);
  }
};

// ---- slices ---------------------------------------------------------------------

// The input viewed as [outer, n, inner]; out [outer, count, inner] takes
// rows start, start + step, ... of the middle axis.
template <class T>
__global__ void slice_k(const T* x, T* y, AxisView v, ops::SliceRange r) {
  const std::int64_t total = v.outer * r.count * v.inner;
  for (std::int64_t t = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; t < total; t += std::int64_t(gridDim.x) * blockDim.x) {
    const std::int64_t k = t % v.inner, oi = t / v.inner, i = oi % r.count, o = oi / r.count;
    y[t] = x[(o * v.n + r.start + i * r.step) * v.inner + k];
  }
}
// The slice's gradient: [outer, n, inner], zero where the slice took nothing.
template <class T>
__global__ void slice_grad_k(const T* dy, T* dx, AxisView v, ops::SliceRange r) {
  const std::int64_t total = v.outer * v.n * v.inner;
  for (std::int64_t t = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; t < total; t += std::int64_t(gridDim.x) * blockDim.x) {
    const std::int64_t k = t % v.inner, on = t / v.inner, m = on % v.n, o = on / v.n;
    const std::int64_t rel = m - r.start;
    const bool hit = rel >= 0 && rel % r.step == 0 && rel / r.step < r.count;
    dx[t] = hit ? dy[(o * r.count + rel / r.step) * v.inner + k] : T{};
  }
}

struct SliceKernel {
  Context ctx;
  void operator()(const ops::Slice& op, const KernelArgs& a) const {
    const std::string what = describe(op, a);
    const Shape& in = *a.in[0].shape;
    const AxisView v = axis_view(in, in.normalize_axis(op.axis()));
    const ops::SliceRange r = op.range(v.n);
    const std::int64_t n = v.outer * r.count * v.inner;
    if (n == 0) return;
    dispatch_bytes(a.in[0].dtype, what, [&](auto tag) {
      using T = decltype(tag);
      slice_k<T><<<blocks_for(n), kThreads, 0, ctx.compute>>>(a.in[0].as<const T>(), a.out[0].as<T>(), v, r);
    });
    check_launch(what);
  }
};

struct SliceGradKernel {
  Context ctx;
  void operator()(const ops::SliceGrad& op, const KernelArgs& a) const {
    const std::string what = describe(op, a);
    const Shape& out = *a.out[0].shape;
    const AxisView v = axis_view(out, out.normalize_axis(op.axis()));
    const ops::SliceRange r = op.range(v.n);
    const std::int64_t n = out.numel();
    if (n == 0) return;
    if (r.step <= 0) fail("cuda: ", what, ": a slice step of ", r.step, " has no CUDA kernel");
    dispatch_bytes(a.out[0].dtype, what, [&](auto tag) {
      using T = decltype(tag);
      slice_grad_k<T><<<blocks_for(n), kThreads, 0, ctx.compute>>>(a.in[0].as<const T>(), a.out[0].as<T>(), v, r);
    });
    check_launch(what);
  }
};

// ---- dropout --------------------------------------------------------------------

// One thread per group of four elements: the Philox block at counter
// (step, group) under the op's key, word l for element 4·group + l, as the
// CPU kernel draws them (ops::DropoutMask, FRUGAL_HD). y may be x. bf16/f16
// are scaled in f32 and rounded once, as on the CPU.
template <class S, class C>
__global__ void dropout_k(ops::DropoutMask mask, C scale, std::uint64_t step, const S* x, S* y, std::int64_t n) {
  const std::int64_t groups = (n + 3) / 4;
  for (std::int64_t g = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; g < groups; g += std::int64_t(gridDim.x) * blockDim.x) {
    const Philox::Block bits = mask.bits(step, std::uint64_t(g));
    const std::int64_t i0 = 4 * g, w = n - i0 < 4 ? n - i0 : 4;
    for (std::int64_t l = 0; l < w; ++l) y[i0 + l] = store<S>(load<C>(x[i0 + l]) * (mask.keep(bits.v[l]) ? scale : C(0)));
  }
}
// p >= 1: everything dropped, as x * 0 (a NaN stays NaN).
template <class S, class C>
__global__ void dropout_all_k(const S* x, S* y, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n; i += std::int64_t(gridDim.x) * blockDim.x)
    y[i] = store<S>(load<C>(x[i]) * C(0));
}

struct DropoutKernel {
  Context ctx;
  void operator()(const ops::DropoutOp& op, const KernelArgs& a) const {
    const std::string what = describe(op, a);
    const std::int64_t n = a.in[0].numel();
    if (n == 0) return;
    dispatch_precision(a.in[0].dtype, "dropout", [&](auto p) {
      using S = typename decltype(p)::Storage;
      using C = typename decltype(p)::Compute;
      if (op.p() >= 1) {
        dropout_all_k<S, C><<<blocks_for(n), kThreads, 0, ctx.compute>>>(a.in[0].as<const S>(), a.out[0].as<S>(), n);
      } else {
        const ops::DropoutMask mask(op.key(), op.p());
        const C scale = C(1.0 / (1.0 - op.p()));
        dropout_k<S, C><<<blocks_for((n + 3) / 4), kThreads, 0, ctx.compute>>>(mask, scale, a.step, a.in[0].as<const S>(),
                                                                               a.out[0].as<S>(), n);
      }
    });
    check_launch(what);
  }
};

}  // namespace frugal::cuda
