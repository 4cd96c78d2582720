#pragma once
// Embedding gather and its deterministic scatter-add backward.
#include <cstring>
#include <span>
#include <type_traits>

#include "../../ops/cast.hpp"
#include "../../ops/embedding.hpp"
#include "../../runtime/backend.hpp"
#include "parallel.hpp"

#include "abi.hpp"

namespace frugal::cpu::inline FRUGAL_KERNEL_ABI {

// Every id in [0, rows), checked before any thread starts: an exception must
// not leave an OpenMP region, and nothing reads past the table.
template <class I>
void check_ids(const char* op, const TensorRef& ids, std::int64_t rows, const char* what = "table rows") {
  const I* p = ids.as<I>();
  const std::int64_t n = ids.numel();
  for (std::int64_t i = 0; i < n; ++i)
    if (p[i] < 0 || p[i] >= rows)
      fail<DataError>(op, ": id ", std::int64_t(p[i]), " at position ", i, " (index ", ops::index_str(i, *ids.shape),
                      " of ids ", ids.shape->str(), ") is outside the valid range [0, ", rows, ") (", rows, " ", what,
                      ")");
}

template <class Fn>
void dispatch_ids(DType t, Fn&& fn) {
  if (t == DType::i32)
    fn(std::int32_t{});
  else
    fn(std::int64_t{});
}

inline void embedding_kernel(const ops::Embedding&, const KernelArgs& a) {
  const std::int64_t rows = a.in[1].shape->dim(0), d = a.in[1].shape->dim(1), n = a.in[0].numel();
  const std::size_t row_bytes = std::size_t(d) * dtype_size(a.in[1].dtype);
  dispatch_ids(a.in[0].dtype, [&](auto itag) {
    using I = decltype(itag);
    check_ids<I>("embedding", a.in[0], rows);
    const I* ids = a.in[0].as<I>();
    const auto* table = static_cast<const unsigned char*>(a.in[1].data);
    auto* out = static_cast<unsigned char*>(a.out[0].data);
    parallel_for(n, d, [&](std::int64_t b, std::int64_t e) {
      for (std::int64_t i = b; i < e; ++i)
        std::memcpy(out + std::size_t(i) * row_bytes, table + std::size_t(ids[i]) * row_bytes, row_bytes);
    });
  });
}

// dtable[v, :] = sum over positions i with ids[i] == v of dy[i, :], summed in
// position order in the compute type A. Threads own disjoint blocks of
// columns and each walks all positions: no atomics, no per-thread copies of
// the table, the same bits for any thread count, and balanced however skewed
// the ids are. `acc` is where the sums run: dtable itself when T is A (f32,
// f64), the op's f32 workspace for bf16/f16, rounded into dtable once at the
// end, so a row hit by many positions loses nothing to 16-bit running sums.
template <class T, class A, class I>
void embedding_scatter_add(const I* __restrict ids, const T* __restrict dy, A* __restrict acc, T* __restrict dtable,
                           std::int64_t n, std::int64_t rows, std::int64_t d) {
  constexpr std::int64_t kCols = 64;
  const std::int64_t blocks = (d + kCols - 1) / kCols;
  parallel_for(blocks, (n + rows) * kCols, [&](std::int64_t k0, std::int64_t k1) {
    for (std::int64_t k = k0; k < k1; ++k) {
      const std::int64_t j0 = k * kCols, w = std::min(kCols, d - j0);
      for (std::int64_t v = 0; v < rows; ++v) std::fill(acc + v * d + j0, acc + v * d + j0 + w, A(0));
      for (std::int64_t i = 0; i < n; ++i) {
        A* dst = acc + std::int64_t(ids[i]) * d + j0;
        const T* src = dy + i * d + j0;
        for (std::int64_t j = 0; j < w; ++j) dst[j] += math::convert<A>(src[j]);
      }
      if constexpr (!std::is_same_v<T, A>)
        for (std::int64_t v = 0; v < rows; ++v)
          for (std::int64_t j = 0; j < w; ++j) dtable[v * d + j0 + j] = math::convert<T>(acc[v * d + j0 + j]);
    }
  });
}

// The f32 sums of a bf16/f16 table gradient: [rows, dim] f32, planned by the
// kernel table; none for f32 and f64, which sum in the output.
inline std::size_t embedding_grad_workspace(const ops::EmbeddingGrad&, std::span<const TensorMeta> in,
                                            std::span<const TensorMeta> out) {
  return is_half(in[1].dtype) ? std::size_t(out[0].shape.numel()) * sizeof(float) : 0;
}

inline void embedding_grad_kernel(const ops::EmbeddingGrad& op, const KernelArgs& a) {
  dispatch_precision(a.in[1].dtype, "embedding_grad", [&](auto p) {
    using T = typename decltype(p)::Storage;
    using A = typename decltype(p)::Compute;
    dispatch_ids(a.in[0].dtype, [&](auto itag) {
      using I = decltype(itag);
      check_ids<I>("embedding_grad", a.in[0], op.rows());
      const std::int64_t d = a.in[1].shape->dim(-1);
      T* dtable = a.out[0].as<T>();
      A* acc;
      if constexpr (std::is_same_v<T, A>) {
        acc = dtable;
      } else {
        if (a.workspace_bytes < std::size_t(op.rows() * d) * sizeof(A))
          fail("cpu: embedding_grad: its f32 workspace holds ", a.workspace_bytes, " bytes, ",
               std::size_t(op.rows() * d) * sizeof(A), " needed (the kernel table plans it: embedding_grad_workspace)");
        acc = static_cast<A*>(a.workspace);
      }
      embedding_scatter_add<T, A, I>(a.in[0].as<I>(), a.in[1].as<T>(), acc, dtable, a.in[0].numel(), op.rows(), d);
    });
  });
}

}  // namespace frugal::cpu
