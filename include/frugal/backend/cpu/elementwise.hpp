#pragma once
// Unary, binary (broadcasting) and fill kernels over the shared functors.
// bf16/f16 tensors are read into f32, computed in f32 and rounded on store.
#include "../../ops/binary.hpp"
#include "../../ops/fill.hpp"
#include "convert.hpp"
#include "isa.hpp"
#include "../../runtime/backend.hpp"
#include "parallel.hpp"
#include "strided.hpp"

#include <type_traits>

#include "abi.hpp"

namespace frugal::cpu::inline FRUGAL_KERNEL_ABI {

// The f32 loops of the 16-bit paths, one copy per functor: bf16 and f16
// both compute in f32, so they share it instead of compiling the same loop
// once per storage type in each instruction set.
template <class F>
void unary_block(const F& f, float* buf, int m) {
  run_widest([&] {
    for (int j = 0; j < m; ++j) buf[j] = f(buf[j]);
  });
}
template <class F>
void unary_grad_block(const F& f, const float* bx, const float* by, float* bd, int m) {
  run_widest([&] {
    for (int j = 0; j < m; ++j) bd[j] = f.grad(F::uses_x ? bx[j] : bd[j], F::uses_y ? by[j] : bd[j], bd[j]);
  });
}
template <class F>
void binary_block(const F& f, float* bx, const float* bz, int m) {
  run_widest([&] {
    for (int j = 0; j < m; ++j) bx[j] = f(bx[j], bz[j]);
  });
}

template <class F>
void unary_kernel(const ops::Unary<F>& op, const KernelArgs& a) {
  dispatch_precision(a.in[0].dtype, F::name, [&](auto p) {
    using S = typename decltype(p)::Storage;
    using C = typename decltype(p)::Compute;
    const S* x = a.in[0].as<S>();
    S* y = a.out[0].as<S>();
    const F f = op.functor();
    if constexpr (std::is_same_v<S, C>) {
      // run_widest: the same bits as the baseline build, in AVX-512 or AVX2
      // registers (GELU's polynomials ran in SSE's four lanes, 2.5% of the
      // gpt step).
      parallel_for(a.in[0].numel(), 8, [&](std::int64_t b, std::int64_t e) {
        run_widest_unless_f64<S>([&] {
          for (std::int64_t i = b; i < e; ++i) y[i] = f(x[i]);
        });
      });
    } else {
      // 16-bit storage: a block at a time through an f32 buffer, so the
      // conversions and f vectorise separately. y may be x (in place): each
      // block is read whole before it is written.
      parallel_for(a.in[0].numel(), 8, [&](std::int64_t b, std::int64_t e) {
        C buf[bulk::kBlock];
        for (std::int64_t i = b; i < e; i += bulk::kBlock) {
          int m = int(std::min<std::int64_t>(bulk::kBlock, e - i));
          convert_block(x + i, buf, m);
          unary_block(f, buf, m);
          convert_block(buf, y + i, m);
        }
      });
    }
  });
}

template <class F>
void unary_grad_kernel(const ops::UnaryGrad<F>& op, const KernelArgs& a) {
  dispatch_precision(a.in[0].dtype, F::name, [&](auto p) {
    using S = typename decltype(p)::Storage;
    using C = typename decltype(p)::Compute;
    const S *x = a.in[0].as<S>(), *y = a.in[1].as<S>(), *dy = a.in[2].as<S>();
    S* dx = a.out[0].as<S>();
    const F f = op.functor();
    if constexpr (std::is_same_v<S, C>) {
      parallel_for(a.in[0].numel(), 8, [&](std::int64_t b, std::int64_t e) {
        run_widest_unless_f64<S>([&] {
          for (std::int64_t i = b; i < e; ++i) dx[i] = f.grad(x[i], y[i], dy[i]);
        });
      });
    } else {
      parallel_for(a.in[0].numel(), 8, [&](std::int64_t b, std::int64_t e) {
        C bx[bulk::kBlock], by[bulk::kBlock], bd[bulk::kBlock];
        for (std::int64_t i = b; i < e; i += bulk::kBlock) {
          int m = int(std::min<std::int64_t>(bulk::kBlock, e - i));
          // Only what F reads (an unread input is passed as dy).
          if constexpr (F::uses_x) convert_block(x + i, bx, m);
          if constexpr (F::uses_y) convert_block(y + i, by, m);
          convert_block(dy + i, bd, m);
          unary_grad_block(f, bx, by, bd, m);
          convert_block(bd, dx + i, m);
        }
      });
    }
  });
}

// f(x, z) in the compute type of the storage type S.
template <class S, class C, class F>
struct OnStorage {
  F f;
  S operator()(S x, S z) const { return math::convert<S>(f(math::convert<C>(x), math::convert<C>(z))); }
};

template <class F>
void binary_kernel(const ops::Binary<F>&, const KernelArgs& a) {
  dispatch_precision(a.in[0].dtype, F::name, [&](auto p) {
    using T = typename decltype(p)::Storage;
    const T *x = a.in[0].as<T>(), *z = a.in[1].as<T>();
    T* y = a.out[0].as<T>();
    const Shape& out = *a.out[0].shape;
    const OnStorage<T, typename decltype(p)::Compute, F> f{};
    if (*a.in[0].shape == out && *a.in[1].shape == out) {
      if constexpr (std::is_same_v<T, typename decltype(p)::Compute>) {
        parallel_for(out.numel(), 1, [&](std::int64_t b, std::int64_t e) {
          run_widest_unless_f64<T>([&] {
            for (std::int64_t i = b; i < e; ++i) y[i] = f(x[i], z[i]);
          });
        });
      } else {  // 16-bit storage: blocks through f32 buffers, as in unary_kernel
        parallel_for(out.numel(), 1, [&](std::int64_t b, std::int64_t e) {
          float bx[bulk::kBlock], bz[bulk::kBlock];
          for (std::int64_t i = b; i < e; i += bulk::kBlock) {
            int m = int(std::min<std::int64_t>(bulk::kBlock, e - i));
            convert_block(x + i, bx, m);
            convert_block(z + i, bz, m);
            binary_block(f.f, bx, bz, m);
            convert_block(bx, y + i, m);
          }
        });
      }
      return;
    }
    if (out.rank() == 0) {
      y[0] = f(x[0], z[0]);
      return;
    }
    auto sx = broadcast_strides(*a.in[0].shape, out), sz = broadcast_strides(*a.in[1].shape, out);
    std::int64_t cols = out.dim(-1), rows = out.numel() / std::max<std::int64_t>(cols, 1);
    std::int64_t cx = sx[out.rank() - 1], cz = sz[out.rank() - 1];
    parallel_for(rows, cols, [&](std::int64_t b, std::int64_t e) {
      run_widest_unless_f64<T>([&] {
        for (std::int64_t r = b; r < e; ++r) {
          const T* xr = x + row_offset(r, out, sx);
          const T* zr = z + row_offset(r, out, sz);
          T* yr = y + r * cols;
          // The common layouts get loops the compiler can vectorise.
          if (cx == 1 && cz == 1)
            for (std::int64_t j = 0; j < cols; ++j) yr[j] = f(xr[j], zr[j]);
          else if (cx == 1 && cz == 0)
            for (std::int64_t j = 0; j < cols; ++j) yr[j] = f(xr[j], zr[0]);
          else if (cx == 0 && cz == 1)
            for (std::int64_t j = 0; j < cols; ++j) yr[j] = f(xr[0], zr[j]);
          else
            for (std::int64_t j = 0; j < cols; ++j) yr[j] = f(xr[j * cx], zr[j * cz]);
        }
      });
    });
  });
}

inline void fill_kernel(const ops::FillLike& op, const KernelArgs& a) {
  dispatch_storage(a.out[0].dtype, "fill_like", [&](auto tag) {
    using T = decltype(tag);
    T* y = a.out[0].as<T>();
    const T v = math::convert<T>(op.value());
    parallel_for(a.out[0].numel(), 1, [&](std::int64_t b, std::int64_t e) { std::fill(y + b, y + e, v); });
  });
}

// One kernel per functor in the lists (ops/elementwise_math.hpp).
template <class... F>
void add_unary_kernels(KernelTable& t, ops::FunctorList<F...>) {
  (t.add<ops::Unary<F>>(unary_kernel<F>), ...);
  (t.add<ops::UnaryGrad<F>>(unary_grad_kernel<F>), ...);
}
template <class... F>
void add_binary_kernels(KernelTable& t, ops::FunctorList<F...>) {
  (t.add<ops::Binary<F>>(binary_kernel<F>), ...);
}


}  // namespace frugal::cpu
