#pragma once
// Kernels of the indexing ops. The data-movement ones (concat, split, slice,
// slice_grad, index_select, gather) move elements by size, so they serve any
// dtype; the accumulating ones (index_add, scatter_add) are f32/f64. Ids are
// checked serially before any thread starts. The accumulating kernels split
// the work so that each output element is owned by one task, which adds its
// contributions in id order: deterministic, no atomics.
#include <cstring>

#include "../../ops/indexing.hpp"
#include "embedding.hpp"
#include "../../runtime/backend.hpp"
#include "parallel.hpp"
#include "strided.hpp"

#include "abi.hpp"

namespace frugal::cpu::inline FRUGAL_KERNEL_ABI {

namespace detail {

inline const unsigned char* bytes(const TensorRef& t) { return static_cast<const unsigned char*>(t.data); }
inline unsigned char* wbytes(const TensorRef& t) { return static_cast<unsigned char*>(t.data); }

// Every id of a tensor in [0, n).
inline void check_index(const char* op, const TensorRef& ids, std::int64_t n, const char* what) {
  dispatch_ids(ids.dtype, [&](auto tag) { check_ids<decltype(tag)>(op, ids, n, what); });
}

inline std::int64_t id_at(const TensorRef& ids, std::int64_t i) {
  return ids.dtype == DType::i32 ? std::int64_t(ids.as<std::int32_t>()[i]) : ids.as<std::int64_t>()[i];
}

}  // namespace detail

// ---- concat / split -----------------------------------------------------------

// Walks the pieces of a concat (or split) along the axis: fn(piece, input or
// -1 for zeros, offset along the axis, size).
template <class Fn>
void for_each_piece(const std::vector<std::int64_t>& pieces, std::span<const TensorRef> ins, int axis, Fn&& fn) {
  std::int64_t at = 0;
  std::size_t next = 0;
  for (std::size_t k = 0; k < pieces.size(); ++k) {
    const bool is_input = pieces[k] == ops::Concat::kInput;
    const std::int64_t n = is_input ? (*ins[next].shape)[axis] : pieces[k];
    fn(k, is_input ? int(next) : -1, at, n);
    if (is_input) ++next;
    at += n;
  }
}

inline void concat_kernel(const ops::Concat& op, const KernelArgs& a) {
  const Shape& out = *a.out[0].shape;
  const int axis = out.normalize_axis(op.axis());
  const AxisView v = axis_view(out, axis);
  const std::size_t es = dtype_size(a.out[0].dtype), row = std::size_t(v.n * v.inner) * es;
  parallel_for(v.outer, v.n * v.inner, [&](std::int64_t o0, std::int64_t o1) {
    for (std::int64_t o = o0; o < o1; ++o)
      for_each_piece(op.pieces(), a.in, axis, [&](std::size_t, int input, std::int64_t at, std::int64_t n) {
        unsigned char* dst = detail::wbytes(a.out[0]) + std::size_t(o) * row + std::size_t(at * v.inner) * es;
        const std::size_t len = std::size_t(n * v.inner) * es;
        if (input < 0)
          std::memset(dst, 0, len);
        else
          std::memcpy(dst, detail::bytes(a.in[std::size_t(input)]) + std::size_t(o) * len, len);
      });
  });
}

inline void split_kernel(const ops::Split& op, const KernelArgs& a) {
  const Shape& in = *a.in[0].shape;
  const int axis = in.normalize_axis(op.axis());
  const AxisView v = axis_view(in, axis);
  const std::size_t es = dtype_size(a.in[0].dtype), row = std::size_t(v.n * v.inner) * es;
  const auto& sizes = op.sizes();
  parallel_for(v.outer, v.n * v.inner, [&](std::int64_t o0, std::int64_t o1) {
    for (std::int64_t o = o0; o < o1; ++o) {
      std::int64_t at = 0;
      for (std::size_t k = 0; k < sizes.size(); ++k) {
        const std::size_t len = std::size_t(sizes[k] * v.inner) * es;
        std::memcpy(detail::wbytes(a.out[k]) + std::size_t(o) * len,
                    detail::bytes(a.in[0]) + std::size_t(o) * row + std::size_t(at * v.inner) * es, len);
        at += sizes[k];
      }
    }
  });
}

// ---- slice ----------------------------------------------------------------------

inline void slice_kernel(const ops::Slice& op, const KernelArgs& a) {
  const Shape& in = *a.in[0].shape;
  const int axis = in.normalize_axis(op.axis());
  const AxisView v = axis_view(in, axis);
  const ops::SliceRange r = op.range(v.n);
  const std::size_t es = dtype_size(a.in[0].dtype), len = std::size_t(v.inner) * es;
  parallel_for(v.outer * r.count, v.inner, [&](std::int64_t t0, std::int64_t t1) {
    for (std::int64_t t = t0; t < t1; ++t) {
      const std::int64_t o = t / r.count, i = t % r.count;
      std::memcpy(detail::wbytes(a.out[0]) + std::size_t(t) * len,
                  detail::bytes(a.in[0]) + std::size_t(o * v.n + r.start + i * r.step) * len, len);
    }
  });
}

inline void slice_grad_kernel(const ops::SliceGrad& op, const KernelArgs& a) {
  const Shape& out = *a.out[0].shape;
  const int axis = out.normalize_axis(op.axis());
  const AxisView v = axis_view(out, axis);
  const ops::SliceRange r = op.range(v.n);
  const std::size_t es = dtype_size(a.out[0].dtype), len = std::size_t(v.inner) * es;
  parallel_for(v.outer, v.n * v.inner, [&](std::int64_t o0, std::int64_t o1) {
    for (std::int64_t o = o0; o < o1; ++o) {
      unsigned char* dst = detail::wbytes(a.out[0]) + std::size_t(o * v.n) * len;
      std::memset(dst, 0, std::size_t(v.n) * len);
      for (std::int64_t i = 0; i < r.count; ++i)
        std::memcpy(dst + std::size_t(r.start + i * r.step) * len,
                    detail::bytes(a.in[0]) + std::size_t(o * r.count + i) * len, len);
    }
  });
}

// ---- index_select / index_add ---------------------------------------------------

inline void index_select_kernel(const ops::IndexSelect& op, const KernelArgs& a) {
  const Shape& in = *a.in[0].shape;
  const int axis = in.normalize_axis(op.axis());
  const AxisView v = axis_view(in, axis);
  const TensorRef& ids = a.in[1];
  detail::check_index("index_select", ids, v.n, "entries along the axis");
  const std::int64_t m = ids.numel();
  const std::size_t es = dtype_size(a.in[0].dtype), len = std::size_t(v.inner) * es;
  parallel_for(v.outer * m, v.inner, [&](std::int64_t t0, std::int64_t t1) {
    for (std::int64_t t = t0; t < t1; ++t) {
      const std::int64_t o = t / m, k = t % m;
      std::memcpy(detail::wbytes(a.out[0]) + std::size_t(t) * len,
                  detail::bytes(a.in[0]) + std::size_t(o * v.n + detail::id_at(ids, k)) * len, len);
    }
  });
}

inline void index_add_kernel(const ops::IndexAdd& op, const KernelArgs& a) {
  const TensorRef &ids = a.in[op.has_base() ? 1 : 0], &src = a.in[op.has_base() ? 2 : 1];
  dispatch_float(src.dtype, "index_add", [&](auto tag) {
    using T = decltype(tag);
    const Shape& out = *a.out[0].shape;
    const int axis = out.normalize_axis(op.axis());
    const AxisView v = axis_view(out, axis);
    detail::check_index("index_add", ids, v.n, "entries along the axis");
    const std::int64_t m = ids.numel();
    const T* s = src.as<T>();
    const T* base = op.has_base() ? a.in[0].as<T>() : nullptr;
    T* y = a.out[0].as<T>();
    // Tasks own (outer index, block of inner columns) and add every k in order.
    constexpr std::int64_t kCols = 64;
    const std::int64_t blocks = (v.inner + kCols - 1) / kCols;
    parallel_for(v.outer * blocks, (v.n + m) * kCols, [&](std::int64_t t0, std::int64_t t1) {
      for (std::int64_t t = t0; t < t1; ++t) {
        const std::int64_t o = t / blocks, c0 = (t % blocks) * kCols, w = std::min(kCols, v.inner - c0);
        for (std::int64_t i = 0; i < v.n; ++i) {
          T* dst = y + (o * v.n + i) * v.inner + c0;
          if (base)
            std::copy(base + (o * v.n + i) * v.inner + c0, base + (o * v.n + i) * v.inner + c0 + w, dst);
          else
            std::fill(dst, dst + w, T(0));
        }
        for (std::int64_t k = 0; k < m; ++k) {
          T* dst = y + (o * v.n + detail::id_at(ids, k)) * v.inner + c0;
          const T* from = s + (o * m + k) * v.inner + c0;
          for (std::int64_t j = 0; j < w; ++j) dst[j] += from[j];
        }
      }
    });
  });
}

// ---- gather / scatter_add --------------------------------------------------------

namespace detail {

// The offset in a tensor of strides `st` of the line `line` of `ids_shape`
// (a multi-index over every axis but `axis`, in row-major order), with the
// index on `axis` taken as 0.
inline std::int64_t line_offset(std::int64_t line, const Shape& ids_shape, int axis, const Strides& st) {
  std::int64_t off = 0;
  for (int d = ids_shape.rank() - 1; d >= 0; --d) {
    if (d == axis) continue;
    const std::int64_t n = ids_shape[d];
    off += (line % n) * st[d];
    line /= n;
  }
  return off;
}

}  // namespace detail

// Both walk ids line by line along the axis: line l covers ids[..., :, ...]
// with every other index fixed.
template <std::size_t ES>
void gather_typed(int axis, const KernelArgs& a) {
  using E = std::conditional_t<
      ES == 1, std::uint8_t,
      std::conditional_t<ES == 2, std::uint16_t, std::conditional_t<ES == 4, std::uint32_t, std::uint64_t>>>;
  const Shape &xs = *a.in[0].shape, &is = *a.in[1].shape;
  check_rank(xs, "gather");
  const Strides xst = strides_of(xs), ist = strides_of(is);
  const std::int64_t n = is[axis], lines = n ? is.numel() / n : 0;
  const E* x = a.in[0].as<E>();
  E* y = a.out[0].as<E>();
  const TensorRef& ids = a.in[1];
  parallel_for(lines, n, [&](std::int64_t l0, std::int64_t l1) {
    for (std::int64_t l = l0; l < l1; ++l) {
      const std::int64_t xo = detail::line_offset(l, is, axis, xst), io = detail::line_offset(l, is, axis, ist);
      for (std::int64_t j = 0; j < n; ++j)
        y[io + j * ist[axis]] = x[xo + detail::id_at(ids, io + j * ist[axis]) * xst[axis]];
    }
  });
}

inline void gather_kernel(const ops::Gather& op, const KernelArgs& a) {
  const int axis = a.in[0].shape->normalize_axis(op.axis());
  detail::check_index("gather", a.in[1], (*a.in[0].shape)[axis], "entries along the axis");
  switch (dtype_size(a.in[0].dtype)) {
    case 1:
      return gather_typed<1>(axis, a);
    case 2:
      return gather_typed<2>(axis, a);
    case 4:
      return gather_typed<4>(axis, a);
    default:
      return gather_typed<8>(axis, a);
  }
}

inline void scatter_add_kernel(const ops::ScatterAdd& op, const KernelArgs& a) {
  const TensorRef &ids = a.in[op.has_base() ? 1 : 0], &src = a.in[op.has_base() ? 2 : 1];
  dispatch_float(src.dtype, "scatter_add", [&](auto tag) {
    using T = decltype(tag);
    const Shape &os = *a.out[0].shape, &is = *ids.shape;
    check_rank(os, "scatter_add");
    const int axis = os.normalize_axis(op.axis());
    detail::check_index("scatter_add", ids, os[axis], "entries along the axis");
    T* y = a.out[0].as<T>();
    const T* s = src.as<T>();
    if (op.has_base()) {
      const T* base = a.in[0].as<T>();
      parallel_for(os.numel(), 1, [&](std::int64_t b, std::int64_t e) { std::copy(base + b, base + e, y + b); });
    } else {
      parallel_for(os.numel(), 1, [&](std::int64_t b, std::int64_t e) { std::fill(y + b, y + e, T(0)); });
    }
    // Line l of ids writes only the output line with the same indices off the
    // axis, so lines are independent tasks; within one, j runs in order.
    const Strides ost = strides_of(os), ist = strides_of(is);
    const std::int64_t n = is[axis], lines = n ? is.numel() / n : 0;
    parallel_for(lines, n, [&](std::int64_t l0, std::int64_t l1) {
      for (std::int64_t l = l0; l < l1; ++l) {
        const std::int64_t yo = detail::line_offset(l, is, axis, ost), io = detail::line_offset(l, is, axis, ist);
        for (std::int64_t j = 0; j < n; ++j) {
          const std::int64_t at = io + j * ist[axis];
          y[yo + detail::id_at(ids, at) * ost[axis]] += s[at];
        }
      }
    });
  });
}


}  // namespace frugal::cpu
