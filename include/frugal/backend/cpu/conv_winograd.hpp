#pragma once
// Winograd F(2x2, 3x3) and F(4x4, 3x3) for the 3x3 stride-1 convolutions
// (conv_scratch.hpp, winograd_shape, says which, and winograd_tile_size
// which tile): forward, data gradient and weight gradient. F(4x4, 3x3)
// has 36 positions per 4x4 outputs, with Lavin & Gray's transforms (points
// 0, ±1, ±2, ∞); the formulas below are F(2x2, 3x3)'s, the same in form.
//
// Why: those layers are nearly all of ResNet's and VGG's arithmetic, and a
// direct (im2col) convolution spends 36 multiplications on each 2x2 block
// of outputs where Winograd spends 16. With the tile transforms
// (Lavin & Gray 2016):
//
//   forward   Y = Aᵀ [ Σ_ci (G g Gᵀ) ⊙ (Bᵀ d B) ] A      per 2x2 output tile
//   weight    dg = Gᵀ [ Σ_tiles (A dY Aᵀ) ⊙ (Bᵀ d B) ] G
//   data      the forward of dy by the flipped weight (conv_data_grad_geometry)
//
// the sums over channels (forward) and over tiles (weight gradient) become
// 16 matrix products, one per position ξ of the 4x4 transformed tile, run
// by the float GEMM engine (blas.hpp: frugal's AVX-512 kernel or OpenBLAS),
// so the AVX2 machines gain too (more: bench/RESULTS.md).
//
// Numerics: F(2x2, 3x3)'s transforms use only 0, ±1 and ±1/2, so the
// result differs from a direct convolution by a few float roundings;
// F(4x4, 3x3)'s use coefficients up to 8 (and 1/6, 1/24), so its roundings
// are of larger intermediate values (the tests bound both against float64).
//
// Determinism: chunks, blocks and parts are cut by shape alone
// (conv_scratch.hpp); each product is one single-threaded GEMM call
// whatever thread runs it, and each transform writes its own elements; the
// weight gradient adds a part's chunks in chunk order and the parts in part
// order. So the bits do not depend on the thread count.
#include <algorithm>
#include <cstdint>

#include "../../ops/conv.hpp"
#include "blas.hpp"
#include "conv_scratch.hpp"
#include "conv_winograd_gathered.hpp"
#include "conv_winograd_tiles.hpp"
#include "isa.hpp"
#include "parallel.hpp"
#include "sgemm_avx2_tile.hpp"

#include "abi.hpp"

namespace frugal::cpu::inline FRUGAL_KERNEL_ABI::winograd {

static_assert(kWinogradSliver == sgemm512::MR && kWinogradPanel == sgemm512::NR,
              "conv_scratch.hpp sizes the packed Winograd operands for the AVX-512 micro-kernel's tile");

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"  // see Vec in conv_winograd_tiles.hpp

// The P products of a chunk, one GEMM per position, spread over the team.
template <class Product>
void each_position(int P, Product&& product) {
  run_chunks(P, [&](std::int64_t xi) { product(xi); });
}

// The forward works each chunk in blocks of about kWinogradBlockTiles
// tiles (whole tile rows), each on one thread from its input transform
// through its 16 products to its output transform, so a block's
// transformed tiles stay in that core's cache; done phase by phase over the
// whole chunk, the transforms of one core and the products of the other
// moved every line between them, and 2 threads ran no faster than 1. A
// thread keeps the same blocks (the same columns of the regions, in the
// layout of a full chunk) through every chunk, unsynchronised. The blocks
// are cut by shape alone.
//
// Where frugal's own GEMM tile runs (AVX-512, or its AVX2 twin), the weight
// is transformed straight into the tile's slivers and each block's tiles
// into its own panels, so the products call the tile directly: packing them
// per product cost a quarter of the products' time. Each output is the same
// chain of fused multiply-adds as the AVX-512 engine's GEMM computes, so the
// bits are the same on both tiles.

// Which tile runs the forward's products of depth I: the AVX-512 engine's
// wherever the CPU has AVX-512 (frugal's engine for the float GEMMs or not:
// what the packed operands save is OpenBLAS packing a whole U_ξ again for
// every product of a block, which F(4x4, 3x3)'s 36 positions made costly),
// its AVX2 twin on the same packed operands where the CPU has AVX2 and FMA
// (or FRUGAL_CPU_ISA=avx2), else OpenBLAS on the unpacked operands, as also
// where FRUGAL_SGEMM=openblas asks for it or the depth is past the AVX-512
// engine's. On a Zen 4, whose OpenBLAS runs AVX-512 kernels of its own, the
// packed tile took ResNet-18's 16x16 and 8x8 layers' forward and data
// gradient from 8.1-10.4 to 6.1-7.7 ms per call (bench/RESULTS.md, "Winograd
// F(4x4,3x3)").
enum class ProductTile { blas, avx512, avx2 };
inline ProductTile product_tile(std::int64_t depth) {
  if (gemm_detail::openblas_forced() || depth > sgemm512::kMaxDepth) return ProductTile::blas;
  if (cpu_isa() >= CpuIsa::avx512 && sgemm512::available()) return ProductTile::avx512;
  return cpu_isa() >= CpuIsa::avx2 && sgemm_avx2::available() ? ProductTile::avx2 : ProductTile::blas;
}

// M_ξ[:, col0 + (0..cols)] = U_ξ V_ξ for position xi of a block whose
// packed tiles start at Vb (positions vplane apart).
inline void packed_products(ProductTile tile, std::int64_t xi, std::int64_t O, std::int64_t I, const float* U,
                            const WeightLayout& ul, const float* Vb, std::int64_t vplane, std::int64_t cols, float* M,
                            std::int64_t pm, std::int64_t ld, std::int64_t col0) {
  constexpr std::int64_t mr = kWinogradSliver, nr = kWinogradPanel;
  const auto kernel = tile == ProductTile::avx512 ? sgemm512::micro_kernel : sgemm_avx2::micro_kernel;
  for (std::int64_t o0 = 0; o0 < O; o0 += mr)
    for (std::int64_t q = 0; q * nr < cols; ++q)
      kernel(I, U + ul.at(xi, o0, 0), Vb + xi * vplane + q * I * nr, M + xi * pm + o0 * ld + col0 + q * nr, ld,
             int(std::min(mr, O - o0)), int(std::min(nr, cols - q * nr)), 1.f, 0.f);
}

// y = conv(x, w) + bias over the tiles of g (the forward, or with
// `flipped` the data gradient's convolution of dy, g its geometry), by
// F(Mt x Mt, 3x3).
template <int Mt, class T>
void forward_tiles(const ops::ConvGeometry& g, const ConvScratch& s, float* U, float* V, float* M, const T* x,
                   const T* w, bool flipped, const T* bias, T* y) {
  constexpr int P = kPositionsOf<Mt>;
  using LinesM = std::conditional_t<Mt == 4, Lines4, Lines>;
  const WinogradTiles& t = s.tiles;
  const std::int64_t O = g.cout, I = g.cin, all = g.n * t.th;
  const std::int64_t ld = t.chunk_tiles(), pm = winograd_plane(O * ld);
  const SgemmEngine engine = sgemm_engine(I);
  const ProductTile tile = product_tile(I);
  const bool packed = tile != ProductTile::blas;
  const WeightLayout ul = weight_layout(O, I, packed);
  transform_weights<Mt>(w, O, I, flipped, U, ul);
  const std::int64_t blocks = t.blocks();  // of a full chunk
  const std::int64_t vplane = packed ? winograd_panel_plane(t, I) : winograd_plane(I * ld);
  // Block blk of the chunk from tile row r0 (nr rows): tile rows
  // r0 + [b0, b1), columns [col0, col0 + cols); packed, its own panels from
  // its first column, else the chunk's rows.
  struct Block {
    std::int64_t b0, b1, cols, col0, first;
    float* Vb;
    TileLayout to;
  };
  const auto block = [&](std::int64_t nr, std::int64_t blk) {
    Block k;
    k.b0 = blk * t.block_rows, k.b1 = std::min(nr, k.b0 + t.block_rows);
    k.cols = (k.b1 - k.b0) * t.tw, k.col0 = k.b0 * t.tw;
    k.Vb = packed ? V + blk * P * vplane : V;
    k.to = TileLayout{k.Vb, vplane, packed ? I : ld, packed};
    k.first = packed ? k.col0 : 0;
    return k;
  };
  // The block's input channels [c0, c1) transformed.
  const auto transform_in = [&](std::int64_t r0, std::int64_t nr, const Block& k, std::int64_t c0, std::int64_t c1,
                                LinesM& L, Gather& G) {
    run_widest([&] {
      if (gathered(t)) {
        for (std::int64_t c = c0; c < c1; ++c)
          for (std::int64_t q = k.col0; q < k.col0 + k.cols; q += kLanes)
            input_gathered<Mt>(x, g, t, c, r0, q, std::min(kLanes, k.col0 + k.cols - q), k.to, q - k.first, G);
        return;
      }
      each_item(c0, c1, nr, t.tw, k.b0, k.b1, [&](std::int64_t it_k) {
        const Item it = item(it_k, nr, r0, t.tw);
        input_tiles(x, g, t, it, k.to, column(it, r0, t.tw) - k.first, L);
      });
    });
    if (packed && k.cols % kWinogradPanel) {  // the last panel's columns past the block: as U's rows past O
      const std::int64_t last = k.cols / kWinogradPanel * I * kWinogradPanel, j0 = k.cols % kWinogradPanel;
      for (std::int64_t xi = 0; xi < P; ++xi)
        for (std::int64_t c = c0; c < c1; ++c) {
          float* p = k.Vb + xi * vplane + last + c * kWinogradPanel;
          std::fill(p + j0, p + kWinogradPanel, 0.f);
        }
    }
  };
  // The block's products at positions [xi0, xi1).
  const auto multiply = [&](const Block& k, std::int64_t xi0, std::int64_t xi1) {
    for (std::int64_t xi = xi0; xi < xi1; ++xi) {
      if (packed) {
        packed_products(tile, xi, O, I, U, ul, k.Vb, vplane, k.cols, M, pm, ld, k.col0);
      } else {
        gemm_serial(engine, false, false, O, k.cols, I, 1.f, U + ul.at(xi, 0, 0), I, V + xi * vplane + k.col0, ld,
                    0.f, M + xi * pm + k.col0, ld);
      }
    }
  };
  // The block's output channels [o0, o1) transformed into y.
  const auto transform_out = [&](std::int64_t r0, std::int64_t nr, const Block& k, std::int64_t o0, std::int64_t o1,
                                 LinesM& L, Gather& G) {
    run_widest([&] {
      if (gathered(t)) {
        for (std::int64_t c = o0; c < o1; ++c) {
          const float b = bias ? to_f32(bias[c]) : 0.f;
          for (std::int64_t q = k.col0; q < k.col0 + k.cols; q += kLanes)
            output_gathered<Mt>(M, pm, ld, g, t, c, r0, q, std::min(kLanes, k.col0 + k.cols - q), b, y, G);
        }
        return;
      }
      each_item(o0, o1, nr, t.tw, k.b0, k.b1, [&](std::int64_t it_k) {
        const Item it = item(it_k, nr, r0, t.tw);
        const float b = bias ? to_f32(bias[it.c]) : 0.f;
        output_tiles(M, ld, column(it, r0, t.tw), g, t, it, b, y, L);
      });
    });
  };
  const std::int64_t team = team_threads();
  if (blocks >= team) {
    run_chunks(team, [&](std::int64_t share) {
      LinesM L{};
      Gather G;
      for (std::int64_t r0 = 0; r0 < all; r0 += t.rows) {
        const std::int64_t nr = std::min(t.rows, all - r0);
        for (std::int64_t blk = blocks * share / team; blk < blocks * (share + 1) / team; ++blk) {
          const Block k = block(nr, blk);
          if (k.b0 >= k.b1) break;
          transform_in(r0, nr, k, 0, I, L, G);
          multiply(k, 0, P);
          transform_out(r0, nr, k, 0, O, L, G);
        }
      }
    });
    return;
  }
  // Fewer blocks than threads (few tiles, or many cores): each block's
  // three phases in turn, each over the whole team (channels, positions,
  // channels). Each element is computed the same whichever thread takes
  // it, so the bits do not change. ResNet-18's 8x8 layers at batch 8 (one
  // block): forward 3.7-4.0 -> 2.1-2.5 ms at 2 threads (bench/conv_kernels
  // --batch 8, alternating); on a machine of many cores far more layers
  // have fewer blocks than threads.
  const std::int64_t np = std::min<std::int64_t>(team, P);
  for (std::int64_t r0 = 0; r0 < all; r0 += t.rows) {
    const std::int64_t nr = std::min(t.rows, all - r0);
    for (std::int64_t blk = 0; blk < blocks; ++blk) {
      const Block k = block(nr, blk);
      if (k.b0 >= k.b1) break;
      run_chunks(team, [&](std::int64_t share) {
        LinesM L{};
        Gather G;
        transform_in(r0, nr, k, I * share / team, I * (share + 1) / team, L, G);
      });
      run_chunks(np, [&](std::int64_t share) { multiply(k, P * share / np, P * (share + 1) / np); });
      run_chunks(team, [&](std::int64_t share) {
        LinesM L{};
        Gather G;
        transform_out(r0, nr, k, O * share / team, O * (share + 1) / team, L, G);
      });
    }
  }
}

// The forward (or data gradient) by the tile size its scratch was laid out for.
template <class T>
void forward(const ops::ConvGeometry& g, const ConvScratch& s, float* U, float* V, float* M, const T* x, const T* w,
             bool flipped, const T* bias, T* y) {
  if (s.tiles.m == 4) return forward_tiles<4>(g, s, U, V, M, x, w, flipped, bias, y);
  forward_tiles<2>(g, s, U, V, M, x, w, flipped, bias, y);
}

// Transforms item k of the weight gradient's chunk from r0: its channels
// are [0, I) of x (into V), then [0, O) of dy (into D).
template <class T, class LinesM>
void weight_item(std::int64_t k, const ops::ConvGeometry& g, const WinogradTiles& t, std::int64_t r0,
                 std::int64_t nr, std::int64_t ld, float* V, float* D, const T* x, const T* dy, LinesM& L) {
  Item it = item(k, nr, r0, t.tw);
  const std::int64_t col = column(it, r0, t.tw);
  if (it.c < g.cin) {
    input_tiles(x, g, t, it, TileLayout{V, winograd_plane(g.cin * ld), ld, false}, col, L);
  } else {
    it.c -= g.cin;
    dy_tiles(dy, g, t, it, D, ld, col, L);
  }
}

// The gathered twin of weight_item: columns [col0, col0 + n) of channel k
// of x (k < I, into V) or of dy (k - I, into D).
template <int Mt, class T>
void weight_gathered(std::int64_t k, const ops::ConvGeometry& g, const WinogradTiles& t, std::int64_t r0,
                     std::int64_t col0, std::int64_t n, std::int64_t ld, float* V, float* D, const T* x, const T* dy,
                     Gather& G) {
  if (k < g.cin)
    input_gathered<Mt>(x, g, t, k, r0, col0, n, TileLayout{V, winograd_plane(g.cin * ld), ld, false}, col0, G);
  else
    dy_gathered<Mt>(dy, g, t, k - g.cin, r0, col0, n, D, ld, col0, G);
}

// Transforms tile rows [a, b) of the chunk from r0 (all of x's channels
// into V, all of dy's into D, rows of ld columns) and adds their P
// products into dU.
template <int Mt, class T, class LinesM>
void weight_rows(const ops::ConvGeometry& g, const WinogradTiles& t, std::int64_t r0, std::int64_t nr,
                 std::int64_t ld, std::int64_t a, std::int64_t b, float* dU, bool first, float* V, float* D,
                 const T* x, const T* dy, LinesM& L) {
  const std::int64_t O = g.cout, I = g.cin;
  const std::int64_t col0 = a * t.tw, cols = (b - a) * t.tw, plane = winograd_plane(O * I);
  run_widest([&] {
    if (!gathered(t))
      return each_item(0, I + O, nr, t.tw, a, b, [&](std::int64_t k) { weight_item(k, g, t, r0, nr, ld, V, D, x, dy, L); });
    Gather G;
    for (std::int64_t c = 0; c < I + O; ++c)
      for (std::int64_t q = col0; q < col0 + cols; q += kLanes)
        weight_gathered<Mt>(c, g, t, r0, q, std::min(kLanes, col0 + cols - q), ld, V, D, x, dy, G);
  });
  // dU_ξ (+)= D_ξ V_ξᵀ: the rows' tiles are the products' depth.
  const SgemmEngine engine = sgemm_engine(cols);
  for (std::int64_t xi = 0; xi < kPositionsOf<Mt>; ++xi)
    gemm_serial(engine, false, true, O, I, cols, 1.f, D + xi * winograd_plane(O * ld) + col0, ld,
                V + xi * winograd_plane(I * ld) + col0, ld, first ? 0.f : 1.f, dU + xi * plane, I);
}

// dw = the gradient of conv(x, w) given dy, over the F(Mt x Mt, 3x3) tiles of g.
template <int Mt, class T>
void backward_weight_tiles(const ops::ConvGeometry& g, const ConvScratch& s, float* dU, float* V, float* D,
                           const T* x, const T* dy, T* dw) {
  constexpr int P = kPositionsOf<Mt>;
  using LinesM = std::conditional_t<Mt == 4, Lines4, Lines>;
  const WinogradTiles& t = s.tiles;
  const std::int64_t O = g.cout, I = g.cin, all = g.n * t.th;
  const std::int64_t plane = winograd_plane(O * I), sums = P * plane;
  if (t.parts > 1) {
    // Part p takes its share of every chunk's tile rows, on one thread for
    // the whole call: its transformed tiles and its sums stay in that core's
    // cache (phase by phase, the transforms of one thread and the products
    // of another moved every line between cores: 1.4x slower than direct
    // at 64 channels). The parts run through the chunks unsynchronised, so
    // each keeps its own columns of the regions in every chunk (the layout
    // of a full chunk, the last one's too). The parts add up in part order.
    const std::int64_t nt = std::min<std::int64_t>(team_threads(), t.parts), ld = t.chunk_tiles();
    run_chunks(nt, [&](std::int64_t share) {
      LinesM L{};
      for (std::int64_t p = t.parts * share / nt; p < t.parts * (share + 1) / nt; ++p) {
        float* dUp = dU + p * sums;
        bool first = true;
        for (std::int64_t r0 = 0; r0 < all; r0 += t.rows) {
          const std::int64_t nr = std::min(t.rows, all - r0);
          const std::int64_t a = std::min(nr, t.rows * p / t.parts), b = std::min(nr, t.rows * (p + 1) / t.parts);
          if (a == b) continue;
          weight_rows<Mt>(g, t, r0, nr, ld, a, b, dUp, first, V, D, x, dy, L);
          first = false;
        }
        if (first) std::fill(dUp, dUp + sums, 0.f);
      }
    });
    parallel_for(sums, t.parts, [&](std::int64_t b, std::int64_t e) {
      for (std::int64_t p = 1; p < t.parts; ++p)
        for (std::int64_t k = b; k < e; ++k) dU[k] += dU[p * sums + k];
    });
  } else {
    const std::int64_t ns = segments(t.tw);
    if (all == 0) std::fill(dU, dU + sums, 0.f);
    for (std::int64_t r0 = 0; r0 < all; r0 += t.rows) {
      const std::int64_t nr = std::min(t.rows, all - r0), ld = nr * t.tw;
      if (gathered(t)) {
        const std::int64_t groups = (ld + kLanes - 1) / kLanes;  // of kLanes columns a channel
        parallel_for((I + O) * groups, P * kLanes, [&](std::int64_t b, std::int64_t e) {
          Gather G;
          run_widest([&] {
            for (std::int64_t k = b; k < e; ++k) {
              const std::int64_t q = k % groups * kLanes;
              weight_gathered<Mt>(k / groups, g, t, r0, q, std::min(kLanes, ld - q), ld, V, D, x, dy, G);
            }
          });
        });
      } else {
        parallel_for((I + O) * nr * ns, P * kSegment, [&](std::int64_t b, std::int64_t e) {
          LinesM L{};
          run_widest([&] {
            for (std::int64_t k = b; k < e; ++k) weight_item(k, g, t, r0, nr, ld, V, D, x, dy, L);
          });
        });
      }
      // dU_ξ (+)= D_ξ V_ξᵀ, a position per task: the chunk's tiles are the products' depth.
      const SgemmEngine engine = sgemm_engine(ld);
      each_position(P, [&](std::int64_t xi) {
        gemm_serial(engine, false, true, O, I, ld, 1.f, D + xi * winograd_plane(O * ld), ld,
                    V + xi * winograd_plane(I * ld), ld, r0 == 0 ? 0.f : 1.f, dU + xi * plane, I);
      });
    }
  }
  // dw from dU, 16 kernels at a time across a vector (one at a time, its
  // P reads a plane apart each, cost more than the products at 512
  // channels).
  parallel_for(O * I, 64, [&](std::int64_t b, std::int64_t e) {
    run_widest([&] {
      alignas(64) float part[P][kLanes], d9[9][kLanes];
      for (std::int64_t k0 = b; k0 < e; k0 += kLanes) {
        const std::int64_t n = std::min(kLanes, e - k0);
        Vec u[P], d[9];
        for (int xi = 0; xi < P; ++xi) {
          if (n == kLanes) {
            u[xi] = load16(dU + xi * plane + k0);
          } else {
            std::fill(part[xi], part[xi] + kLanes, 0.f);
            std::copy(dU + xi * plane + k0, dU + xi * plane + k0 + n, part[xi]);
            u[xi] = load16(part[xi]);
          }
        }
        weight_grad_tile(u, d);
        for (int j = 0; j < 9; ++j) store16(d9[j], d[j]);
        T* out = dw + k0 * 9;
        for (std::int64_t q = 0; q < n; ++q)
          for (int j = 0; j < 9; ++j) out[q * 9 + j] = from_f32<T>(d9[j][q]);
      }
    });
  });
}

// The weight gradient by the tile size its scratch was laid out for.
template <class T>
void backward_weight(const ops::ConvGeometry& g, const ConvScratch& s, float* dU, float* V, float* D, const T* x,
                     const T* dy, T* dw) {
  if (s.tiles.m == 4) return backward_weight_tiles<4>(g, s, dU, V, D, x, dy, dw);
  backward_weight_tiles<2>(g, s, dU, V, D, x, dy, dw);
}

#pragma GCC diagnostic pop

}  // namespace frugal::cpu::winograd
