#pragma once
// conv_transpose2d and its two backward ops on the CPU: conv2d's kernels run
// on the convolution the transposed one is the adjoint of (see
// ops/conv_transpose.hpp), over the same planned scratch layouts, so both
// engines, the chunking and the determinism come with them.
#include "../../ops/conv_transpose.hpp"
#include "conv.hpp"

#include "abi.hpp"

namespace frugal::cpu::inline FRUGAL_KERNEL_ABI {

namespace conv_transpose_detail {

// Per channel c of the output planes y [N, C, HW]: y[n, c, :] += b[c].
template <class T>
void add_bias(const ops::ConvGeometry& g, const T* b, T* y) {
  const std::int64_t hw = g.hw();
  parallel_for(g.n * g.cin, hw, [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t plane = lo; plane < hi; ++plane) {
      const T bv = b[plane % g.cin];
      T* __restrict row = y + plane * hw;
      for (std::int64_t q = 0; q < hw; ++q) row[q] += bv;
    }
  });
}

// db[c] = sum over images and positions of dy[n, c, :], image by image in
// double (as conv2d's bias gradient).
template <class T>
void bias_grad(const ops::ConvGeometry& g, const T* dy, T* db) {
  const std::int64_t hw = g.hw();
  parallel_for(g.cin, g.n * hw, [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t c = lo; c < hi; ++c) {
      double acc = 0;
      for (std::int64_t img = 0; img < g.n; ++img) {
        const T* row = dy + (img * g.cin + c) * hw;
        for (std::int64_t q = 0; q < hw; ++q) acc += double(row[q]);
      }
      db[c] = T(acc);
    }
  });
}

}  // namespace conv_transpose_detail

inline void conv_transpose2d_kernel(ConvEngine e, ConvAlgorithm algo, const ops::ConvTranspose2d& op, const KernelArgs& a) {
  dispatch_float(a.in[0].dtype, "conv_transpose2d", [&](auto tag) {
    using T = decltype(tag);
    auto g = op.geometry(*a.in[0].shape, *a.in[1].shape);
    auto s = conv_scratch(g, a.in[0].dtype, ConvPass::backward_data, 0, algo);
    T* y = a.out[0].as<T>();
    conv2d_backward_data<T>(e, g, s, conv_detail::carve<T>(s, a, "conv_transpose2d"), a.in[0].as<T>(),
                            a.in[1].as<T>(), y);
    if (op.has_bias()) conv_transpose_detail::add_bias(g, a.in[2].as<T>(), y);
  });
}

inline void conv_transpose2d_backward_data_kernel(ConvEngine e, ConvAlgorithm algo, const ops::ConvTranspose2dBackwardData& op,
                                                  const KernelArgs& a) {
  dispatch_float(a.in[0].dtype, "conv_transpose2d_backward_data", [&](auto tag) {
    using T = decltype(tag);
    auto g = op.geometry(*a.in[1].shape);
    auto s = conv_scratch(g, a.in[0].dtype, ConvPass::forward, 0, algo);
    conv2d_forward<T>(e, g, s, conv_detail::carve<T>(s, a, "conv_transpose2d_backward_data"), a.in[0].as<T>(),
                      a.in[1].as<T>(), static_cast<const T*>(nullptr), a.out[0].as<T>());
  });
}

inline void conv_transpose2d_backward_weight_kernel(ConvEngine e, ConvAlgorithm algo, const ops::ConvTranspose2dBackwardWeight& op,
                                                    const KernelArgs& a) {
  dispatch_float(a.in[0].dtype, "conv_transpose2d_backward_weight", [&](auto tag) {
    using T = decltype(tag);
    auto g = op.geometry(*a.in[0].shape);
    auto s = conv_scratch(g, a.in[0].dtype, ConvPass::backward_weight, 0, algo);
    // The convolution's input is dy, its output gradient is x.
    const T *x = a.in[0].as<T>(), *dy = a.in[1].as<T>();
    conv2d_backward_weight<T>(e, g, s, conv_detail::carve<T>(s, a, "conv_transpose2d_backward_weight"), dy, x,
                              a.out[0].as<T>(), nullptr);
    if (op.with_bias()) conv_transpose_detail::bias_grad(g, dy, a.out[1].as<T>());
  });
}

inline std::size_t conv_transpose2d_workspace(const ops::ConvTranspose2d& op, std::span<const TensorMeta> in,
                                ConvAlgorithm algo = ConvAlgorithm::by_shape) {
  return conv_scratch(op.geometry(in), in[0].dtype, ConvPass::backward_data, 0, algo).bytes();
}
inline std::size_t conv_transpose2d_backward_data_workspace(const ops::ConvTranspose2dBackwardData& op,
                                                            std::span<const TensorMeta> in,
                                ConvAlgorithm algo = ConvAlgorithm::by_shape) {
  return conv_scratch(op.geometry(in), in[0].dtype, ConvPass::forward, 0, algo).bytes();
}
inline std::size_t conv_transpose2d_backward_weight_workspace(const ops::ConvTranspose2dBackwardWeight& op,
                                                              std::span<const TensorMeta> in,
                                ConvAlgorithm algo = ConvAlgorithm::by_shape) {
  return conv_scratch(op.geometry(in), in[0].dtype, ConvPass::backward_weight, 0, algo).bytes();
}

}  // namespace frugal::cpu
