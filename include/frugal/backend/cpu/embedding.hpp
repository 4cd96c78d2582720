#pragma once
// Embedding gather and its deterministic scatter-add backward.
#include <cstring>

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
// position order. Threads own disjoint blocks of columns and each walks all
// positions: no atomics, no per-thread copies of the table, the same bits for
// any thread count, and balanced however skewed the ids are.
template <class T, class I>
void embedding_scatter_add(const I* __restrict ids, const T* __restrict dy, T* __restrict dtable, std::int64_t n,
                           std::int64_t rows, std::int64_t d) {
  constexpr std::int64_t kCols = 64;
  const std::int64_t blocks = (d + kCols - 1) / kCols;
  parallel_for(blocks, (n + rows) * kCols, [&](std::int64_t k0, std::int64_t k1) {
    for (std::int64_t k = k0; k < k1; ++k) {
      const std::int64_t j0 = k * kCols, w = std::min(kCols, d - j0);
      for (std::int64_t v = 0; v < rows; ++v) std::fill(dtable + v * d + j0, dtable + v * d + j0 + w, T(0));
      for (std::int64_t i = 0; i < n; ++i) {
        T* dst = dtable + std::int64_t(ids[i]) * d + j0;
        const T* src = dy + i * d + j0;
        for (std::int64_t j = 0; j < w; ++j) dst[j] += src[j];
      }
    }
  });
}

inline void embedding_grad_kernel(const ops::EmbeddingGrad& op, const KernelArgs& a) {
  dispatch_float(a.in[1].dtype, "embedding_grad", [&](auto tag) {
    using T = decltype(tag);
    dispatch_ids(a.in[0].dtype, [&](auto itag) {
      using I = decltype(itag);
      check_ids<I>("embedding_grad", a.in[0], op.rows());
      embedding_scatter_add<T, I>(a.in[0].as<I>(), a.in[1].as<T>(), a.out[0].as<T>(), a.in[0].numel(), op.rows(),
                                  a.in[1].shape->dim(-1));
    });
  });
}


}  // namespace frugal::cpu
