#pragma once
// How the CPU's convolution kernels lay out their planned scratch space: the
// kernel table sizes each conv op's workspace from this (the op layer knows
// nothing of it), and the kernels carve the same regions out of it.
#include <algorithm>

#include "../../ops/conv.hpp"

#include "abi.hpp"

namespace frugal::cpu::inline FRUGAL_KERNEL_ABI {

using ops::ConvGeometry;

// The CPU kernels lower a convolution to matrix products over a chunk of
// images at a time: the chunk's im2col columns [k, images * Ho*Wo] (as a
// matrix for BLAS, or as 32-column panels for the AVX-512 engine), one
// product per group, then scatter (forward) or col2im (data gradient). A
// chunk has enough images that the product has about kConvTargetColumns
// columns (late ResNet layers have 4x4 outputs: one image would give 16
// columns, too few to split over threads or to run BLAS near its peak),
// capped so the column buffer stays small. The layout depends only on the
// shapes, never on the thread count or the engine, so a plan is the same on
// every machine. bf16/f16 operands are widened to f32 into this space too.
inline constexpr std::int64_t kConvTargetColumns = 512;
inline constexpr std::int64_t kConvMaxColumnBytes = std::int64_t(16) << 20;
// The CPU's AVX-512 engine packs columns in panels of 32; the regions it
// packs into are rounded up to whole panels.
inline constexpr std::int64_t kConvPanel = 32;

enum class ConvPass { forward, backward_data, backward_weight };

// With stride 1 (and padding no wider than the dilated kernel) the data
// gradient is itself a convolution: dx = conv(dy, w flipped in space with
// in/out channels swapped, padding (k - 1) * d - p), mapping the Ho x Wo
// planes of dy back to H x W. The CPU's AVX-512 engine runs it so, with no
// column gradient and no col2im.
inline bool conv_data_grad_is_conv(const ConvGeometry& g) {
  return g.sh == 1 && g.sw == 1 && g.ph <= (g.kh - 1) * g.dh && g.pw <= (g.kw - 1) * g.dw;
}
inline ConvGeometry conv_data_grad_geometry(const ConvGeometry& g) {
  ConvGeometry f = g;
  f.cin = g.cout, f.h = g.ho, f.w = g.wo, f.cout = g.cin;
  f.ph = (g.kh - 1) * g.dh - g.ph, f.pw = (g.kw - 1) * g.dw - g.pw;
  f.ho = g.h, f.wo = g.w;
  return f;
}

struct ConvScratch {
  std::int64_t images = 1;      // per chunk
  bool one = false;             // one image per chunk in f32/f64: BLAS reads and writes the tensors in place
  std::size_t elem = 4;         // bytes of the compute type (f32, or f64 for f64)
  // Region sizes in compute-type elements; 0 where the kernel works in place.
  std::size_t col = 0;          // [k, P] im2col columns (forward, weight) or their gradient (data)
  std::size_t weight = 0;       // [Cout, k] the weight widened to f32 (bf16/f16)
  std::size_t rows = 0;         // [Cout/groups, P] GEMM output (forward) or gathered dy (backward)
  std::size_t acc = 0;          // f32 accumulator for bf16/f16: dx of a chunk, or dw
  static constexpr std::size_t kAlign = 256;
  static std::size_t round(std::size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }
  std::size_t col_offset() const { return 0; }
  std::size_t weight_offset() const { return col_offset() + round(col * elem); }
  std::size_t rows_offset() const { return weight_offset() + round(weight * elem); }
  std::size_t acc_offset() const { return rows_offset() + round(rows * elem); }
  // Ends exactly at the last region's last byte, which the kernel writes, so
  // an audit of a step whose peak is this scratch sees every planned byte.
  std::size_t bytes() const {
    if (acc) return acc_offset() + acc * elem;
    if (rows) return rows_offset() + rows * elem;
    if (weight) return weight_offset() + weight * elem;
    return col * elem;
  }
};

inline bool is_half_storage(DType t) { return t == DType::bf16 || t == DType::f16; }

inline std::int64_t conv_chunk_images(const ConvGeometry& g, std::size_t elem,
                                      std::int64_t target_columns = kConvTargetColumns) {
  std::int64_t hw = std::max<std::int64_t>(g.hw_out(), 1);
  std::int64_t b = std::clamp<std::int64_t>((target_columns + hw - 1) / hw, 1, std::max<std::int64_t>(g.n, 1));
  std::int64_t col_bytes_per_image = g.k() * hw * std::int64_t(elem);
  while (b > 1 && b * col_bytes_per_image > kConvMaxColumnBytes) --b;
  return b;
}

// `images` overrides the chunk size (for benchmarks); 0 keeps the policy above.
inline ConvScratch conv_scratch(const ConvGeometry& g, DType dt, ConvPass pass, std::int64_t images = 0) {
  ConvScratch s;
  s.elem = dt == DType::f64 ? 8 : 4;
  // The weight gradient sums over the chunk's columns: longer chunks mean
  // fewer synchronised steps and deeper sums per output.
  const std::int64_t target = pass == ConvPass::backward_weight ? 4 * kConvTargetColumns : kConvTargetColumns;
  s.images = images > 0 ? std::min(images, std::max<std::int64_t>(g.n, 1)) : conv_chunk_images(g, s.elem, target);
  const bool half = is_half_storage(dt);
  const bool one = s.one = s.images == 1 && !half;
  const std::size_t p = std::size_t(s.images * g.hw_out()), k = std::size_t(g.k());
  const std::size_t cout_g = std::size_t(g.cout_g());
  auto panels = [](std::size_t n) { return (n + kConvPanel - 1) / kConvPanel * kConvPanel; };
  if (half) s.weight = std::size_t(g.cout) * k;
  // Each region serves both CPU engines (BLAS: row-major matrices; AVX-512:
  // 32-column panels), so a plan does not depend on which one runs.
  switch (pass) {
    case ConvPass::forward:
      s.col = k * panels(p);            // im2col columns / their panels
      s.rows = one ? 0 : cout_g * p;    // BLAS: the product before its scatter into y
      break;
    case ConvPass::backward_data:
      s.col = one && g.pointwise() ? 0 : k * p;  // the columns' gradient, for col2im
      s.rows = cout_g * panels(p);               // dy gathered / packed in panels
      if (half) s.acc = std::size_t(s.images * g.cin_g() * g.hw());
      if (conv_data_grad_is_conv(g)) {
        // As a convolution: dy's im2col panels, and the flipped weight in f32.
        const ConvGeometry f = conv_data_grad_geometry(g);
        s.col = std::max(s.col, std::size_t(f.k()) * panels(std::size_t(s.images * f.hw_out())));
        s.weight = std::size_t(g.cout) * k;
      }
      break;
    case ConvPass::backward_weight:
      s.col = one && g.pointwise() ? 0 : k * p;  // im2col columns
      s.rows = panels(cout_g) * p;               // dy gathered / packed transposed in panels
      if (half) s.acc = std::size_t(g.cout) * k;
      break;
  }
  return s;
}

}  // namespace frugal::cpu
