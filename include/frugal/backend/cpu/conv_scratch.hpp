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

// Winograd F(2x2, 3x3) (conv_winograd.hpp) runs the 3x3 stride-1
// convolutions (ResNet's and VGG's bulk) with 16 multiplications per 2x2
// outputs instead of 36 (F(4x4, 3x3): 36 per 4x4 outputs instead of 144,
// see winograd_tile_size), but adds transforms whose cost the products do
// not share: the weight's (O x I kernels, each call) and the tiles' ((I + O)
// per tile). It is chosen by shape alone, for f32/bf16/f16 (f64 stays
// direct: it is the reference the gradient checks use), pass by pass:
// - forward and data gradient: at least kWinogradMinTiles 2x2 tiles in
//   the batch, so the weight's transform (O x I kernels, each call) is
//   small beside the products (O x I per tile). ResNet-18's 4x4-output
//   layers (512 channels, batch 32: 128 tiles) pay, with the weight and the
//   tiles transformed straight into the product tile's packed operands and
//   the weight's transform vectorised: forward 9.5-9.9 ms against 12.5-12.7
//   direct, data gradient 9.5-11.3 against 13.7-15.3 (2 threads; 1 thread
//   19.7 and 18.7 against 24.9 and 26.4; the AVX2 tile 10.0-10.5 against
//   15-25, bench/conv_kernels --layer @4, alternating, on a Zen 4). On a
//   Zen 5, before those two changes, the same layers took 8.5-9.9 ms
//   against 6.9-7.5 direct, which set this bound at 512 until then;
// - weight gradient: always (at 64 channels 6% slower than direct, at 128
//   to 512 faster: 7.3, 7.4 and 6.9 ms against 9.0, 8.9 and 8.6).
// (ResNet-18's layers, batch 32, 2 threads on a Zen 5 with frugal's
// AVX-512 GEMM, bench/conv_kernels; with OpenBLAS's AVX2 GEMM Winograd
// wins on every 3x3 layer: these rules take the whole network's
// convolutions 1.4x faster there, Winograd on every layer 1.7x; the rules
// stay one for every machine so that a plan is too.)
inline constexpr std::int64_t kWinogradMinChannels = 16;
inline constexpr std::int64_t kWinogradMinTiles = 128;
// A chunk holds about this many 2x2 tiles (whole tile rows), so the 16
// products of a chunk have enough columns and its transformed tiles stay
// near the cache.
inline constexpr std::int64_t kWinogradTargetTiles = 512;
// The 16 planes of each Winograd region sit this many floats (one cache
// line) further apart than their size: planes of power-of-two sizes would
// otherwise start on the same cache sets, and the transforms, which write
// or read all 16 at once, would evict their own lines (this alone made the
// weight transform of a 512x512 layer 8x slower).
inline constexpr std::int64_t kWinogradPlanePad = 16;
inline std::int64_t winograd_plane(std::int64_t floats) { return floats + kWinogradPlanePad; }
inline bool winograd_shape(const ConvGeometry& g) {
  return g.kh == 3 && g.kw == 3 && g.sh == 1 && g.sw == 1 && g.dh == 1 && g.dw == 1 && g.groups == 1 &&
         g.ph <= 2 && g.pw <= 2 && g.cin >= kWinogradMinChannels && g.cout >= kWinogradMinChannels && g.ho >= 2 &&
         g.wo >= 2;
}

// The forward and the data gradient transform and multiply a chunk in
// blocks of about kWinogradBlockTiles tiles (whole tile rows), each on one
// thread from input to output transform (conv_winograd.hpp).
inline constexpr std::int64_t kWinogradBlockTiles = 64;
// Where frugal's AVX-512 GEMM runs them, those blocks' products read their
// operands packed as its micro-kernel does (sgemm_avx512.hpp's MR and NR):
// the transformed weight in slivers of kWinogradSliver rows, each block's
// transformed tiles in panels of kWinogradPanel columns, written so by the
// transforms (no packing per product). The regions are sized for either
// layout, so that a plan does not depend on the machine.
inline constexpr std::int64_t kWinogradSliver = 12, kWinogradPanel = 32;

// Planes at least kWinogradF4MinPlane wide and high use F(4x4, 3x3), every
// pass: 36 multiplications per 4x4 outputs, 2.25 an output instead of
// F(2x2, 3x3)'s 4, and transforms that write 36 floats per 16 outputs
// instead of 64; at the price of transform coefficients up to 8 (and 1/6,
// 1/24), so each rounding is of a larger intermediate (conv_test.cpp
// derives the bounds of both). Smaller planes waste too much of their
// partial tiles. ResNet-18's 32x32, 16x16 and 8x8 layers, batch 32, on a
// Zen 4 (bench/conv_kernels, alternating, ms per call at 2 threads):
// forward 10.2-13.7 -> 8.3-9.3, 11.8-17.0 -> 6.7-9.6, 13.4-13.7 ->
// 10.2-13.7; weight gradient 14.4-14.5 -> 9.4-11.4, 11.6-12.5 -> 7.7-12.6,
// 10.4-11.8 -> 9.0-10.0 (bench/RESULTS.md, "Winograd F(4x4,3x3)").
inline constexpr std::int64_t kWinogradF4MinPlane = 8;
// Which F(m x m, 3x3) a pass whose tiles cover t takes by the rule above.
inline int winograd_tile_size(const ConvGeometry& t) {
  return t.ho >= kWinogradF4MinPlane && t.wo >= kWinogradF4MinPlane ? 4 : 2;
}

// The tiles of a Winograd convolution F(m x m, 3x3): m x m output tiles, tw
// across and th down each image (the last ones partial where m does not
// divide Ho or Wo), each (m + 2) x (m + 2) positions once transformed. A
// tile row is one ty of one image, numbered image * th + ty; a chunk is
// `rows` of them.
struct WinogradTiles {
  int m = 2;
  std::int64_t tw = 0, th = 0, rows = 0;
  int positions() const { return (m + 2) * (m + 2); }
  // Weight gradient only: the tile rows of each chunk are cut into `parts`
  // fixed parts, each summing its own 16 products (conv_winograd.hpp).
  std::int64_t parts = 1;
  // Forward and data gradient: the tile rows of a block.
  std::int64_t block_rows = 1;
  std::int64_t chunk_tiles() const { return rows * tw; }
  std::int64_t blocks() const { return (rows + block_rows - 1) / block_rows; }
  std::int64_t block_panels() const { return (block_rows * tw + kWinogradPanel - 1) / kWinogradPanel; }
};
// The weight gradient of small layers sums in kWinogradParts parts (so
// each thread transforms and multiplies tiles it keeps in its own cache),
// where the parts' 16 O x I sums take at most kWinogradPartFloats floats.
inline constexpr std::int64_t kWinogradParts = 4;
inline constexpr std::int64_t kWinogradPartFloats = std::int64_t(1) << 21;
// `target` counts 2x2 tiles; F(4x4, 3x3) takes a quarter as many (the same
// outputs), and blocks of half as many tiles (36 positions a tile, not 16,
// so a block's transformed tiles stay about as large).
inline WinogradTiles winograd_tiles(const ConvGeometry& g, std::int64_t target = kWinogradTargetTiles, int m = 2) {
  WinogradTiles t;
  t.m = m;
  t.tw = (g.wo + m - 1) / m;
  t.th = (g.ho + m - 1) / m;
  if (m == 4) target = std::max<std::int64_t>(target / 4, 1);
  const std::int64_t all = std::max<std::int64_t>(g.n, 1) * t.th;
  t.rows = std::clamp<std::int64_t>((target + t.tw - 1) / t.tw, 1, all);
  // The chunk's transformed tiles and products: positions * (Cin + Cout) floats a tile.
  const std::int64_t row_bytes = t.positions() * (g.cin + g.cout) * t.tw * 4;
  t.rows = std::clamp<std::int64_t>(kConvMaxColumnBytes / std::max<std::int64_t>(row_bytes, 1), 1, t.rows);
  const std::int64_t block_tiles = m == 4 ? kWinogradBlockTiles / 2 : kWinogradBlockTiles;
  t.block_rows = std::clamp<std::int64_t>(block_tiles / std::max<std::int64_t>(t.tw, 1), 1, t.rows);
  return t;
}
// Floats of one position's packed weight (slivers of O rows by I), and of
// one position's packed tiles of a block (panels of c channels); one cache
// line more, as winograd_plane.
inline std::int64_t winograd_sliver_plane(std::int64_t O, std::int64_t I) {
  return winograd_plane((O + kWinogradSliver - 1) / kWinogradSliver * kWinogradSliver * I);
}
inline std::int64_t winograd_panel_plane(const WinogradTiles& t, std::int64_t c) {
  return winograd_plane(t.block_panels() * kWinogradPanel * c);
}

// Which algorithm a scratch layout is for: the shape's (Winograd where
// winograd_shape and the pass's rule above hold, else direct), or direct
// or Winograd (where winograd_shape holds) whatever the rules say, for
// tests and benchmarks; Winograd with the tile size the rule picks, or
// forced to F(2x2, 3x3) or F(4x4, 3x3).
enum class ConvAlgorithm { by_shape, direct, winograd, winograd_f2, winograd_f4 };

// Whether the pass runs as Winograd by the rules above (dt not f64, and
// winograd_shape).
inline bool winograd_pays(const ConvGeometry& t, ConvPass pass) {
  return pass == ConvPass::backward_weight || t.n * ((t.ho + 1) / 2) * ((t.wo + 1) / 2) >= kWinogradMinTiles;
}

struct ConvScratch {
  // Winograd: only the three w* regions below, no direct-engine region.
  bool winograd = false;
  WinogradTiles tiles;          // Winograd's tiles (of dx's planes for the data gradient)
  std::int64_t images = 1;      // per chunk
  bool one = false;             // one image per chunk in f32/f64: BLAS reads and writes the tensors in place
  std::size_t elem = 4;         // bytes of the compute type (f32, or f64 for f64)
  // Region sizes in compute-type elements; 0 where the kernel works in place.
  std::size_t col = 0;          // [k, P] im2col columns (forward, weight) or their gradient (data)
  std::size_t weight = 0;       // [Cout, k] the weight widened to f32 (bf16/f16)
  std::size_t rows = 0;         // [Cout/groups, P] GEMM output (forward) or gathered dy (backward)
  std::size_t acc = 0;          // f32 accumulator for bf16/f16: dx of a chunk, or dw
  // Winograd's, each P = tiles.positions() planes (winograd_plane apart):
  std::size_t wu = 0;           // [P][Cout, Cin] the transformed weight (or packed), or its gradient (one per part)
  std::size_t wv = 0;           // [P][Cin, T] a chunk's T transformed input tiles (or per block, packed)
  std::size_t wm = 0;           // [P][Cout, T] their products, or dy's transformed tiles
  static constexpr std::size_t kAlign = 256;
  static std::size_t round(std::size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }
  std::size_t col_offset() const { return 0; }
  std::size_t weight_offset() const { return col_offset() + round(col * elem); }
  std::size_t rows_offset() const { return weight_offset() + round(weight * elem); }
  std::size_t acc_offset() const { return rows_offset() + round(rows * elem); }
  std::size_t wu_offset() const { return acc_offset() + round(acc * elem); }
  std::size_t wv_offset() const { return wu_offset() + round(wu * elem); }
  std::size_t wm_offset() const { return wv_offset() + round(wv * elem); }
  // Ends exactly at the last region's last byte, which the kernel writes, so
  // an audit of a step whose peak is this scratch sees every planned byte.
  std::size_t bytes() const {
    if (wm) return wm_offset() + wm * elem;
    if (wv) return wv_offset() + wv * elem;
    if (wu) return wu_offset() + wu * elem;
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

// The Winograd layout of a pass whose tiles cover `t` (g itself, or the
// data gradient's convolution of dy).
inline ConvScratch winograd_scratch(const ConvGeometry& t, ConvPass pass, std::int64_t target_tiles, int m) {
  ConvScratch s;
  s.winograd = true;
  s.tiles = winograd_tiles(t, target_tiles, m);
  const std::size_t P = std::size_t(s.tiles.positions());
  const std::int64_t sums = std::int64_t(P) * winograd_plane(t.cout * t.cin);
  if (pass == ConvPass::backward_weight && kWinogradParts * sums <= kWinogradPartFloats)
    s.tiles.parts = kWinogradParts;
  const auto chunk = std::size_t(s.tiles.chunk_tiles());
  s.wu = std::size_t(s.tiles.parts * sums);
  s.wv = P * std::size_t(winograd_plane(t.cin * std::int64_t(chunk)));
  s.wm = P * std::size_t(winograd_plane(t.cout * std::int64_t(chunk)));
  if (pass != ConvPass::backward_weight) {  // or packed for the AVX-512 GEMM
    s.wu = std::max(s.wu, P * std::size_t(winograd_sliver_plane(t.cout, t.cin)));
    s.wv = std::max(s.wv, std::size_t(s.tiles.blocks()) * P * std::size_t(winograd_panel_plane(s.tiles, t.cin)));
  }
  return s;
}

// `images` overrides the chunk size (for benchmarks; for Winograd, the
// tiles per chunk); 0 keeps the policies above.
inline ConvScratch conv_scratch(const ConvGeometry& g, DType dt, ConvPass pass, std::int64_t images = 0,
                                ConvAlgorithm algo = ConvAlgorithm::by_shape) {
  if (algo != ConvAlgorithm::direct && dt != DType::f64) {
    const std::int64_t target = images > 0 ? images : kWinogradTargetTiles;
    // The data gradient's tiles are those of its convolution of dy.
    const bool as_conv = pass != ConvPass::backward_data || conv_data_grad_is_conv(g);
    const ConvGeometry t = pass == ConvPass::backward_data ? conv_data_grad_geometry(g) : g;
    if (as_conv && winograd_shape(t) && (algo != ConvAlgorithm::by_shape || winograd_pays(t, pass))) {
      const int m = algo == ConvAlgorithm::winograd_f2   ? 2
                    : algo == ConvAlgorithm::winograd_f4 ? 4
                                                         : winograd_tile_size(t);
      return winograd_scratch(t, pass, target, m);
    }
  }
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
