#pragma once
// Winograd's tile transforms for planes of a few tiles a row, one tile a
// lane (conv_winograd_tiles.hpp has the row-segment ones they stand in
// for; conv_winograd.hpp chooses).
#include <algorithm>
#include <cstring>

#include "conv_winograd_tiles.hpp"

#include "abi.hpp"

namespace frugal::cpu::inline FRUGAL_KERNEL_ABI::winograd {

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"  // see Vec in conv_winograd_tiles.hpp

// Small planes: a tile row has a few tiles (F(4x4, 3x3) at 8x8: 2; F(2x2,
// 3x3) at 4x4: 2), so the row-segment transforms (conv_winograd_tiles.hpp)
// fill a few lanes of each vector and store a few floats per plane per
// row, read back from their lines just after those were written as whole
// vectors. Where a row has
// fewer than kGatherBelow tiles (gathered), the transforms take kLanes
// consecutive columns of a channel instead (tiles of successive tile rows,
// and images), one tile a lane: each lane gathers its tile's values, and
// each plane's transformed values are one vector, stored whole. The
// arithmetic is the item transforms', in the same order: the same bits.
// Gathering reads each input value about 1.5 times as often (tiles
// overlap), so at 8 tiles a row (ResNet-18's 32x32 layers by F(4x4, 3x3))
// the items stay faster: forward 12.1 ms against 13.5 gathered; at 4 and 2
// tiles a row gathering took the forward from 11.3 to 9.5 ms (16x16), 12.9
// to 10.4 (8x8) and 19.3 to 16.3 (4x4, F(2x2, 3x3)) (1 thread, Zen 4,
// bench/conv_kernels).
inline constexpr std::int64_t kGatherBelow = 8;
// F(Mt x Mt, 3x3)'s transforms on a row or column, by tile size.
template <int Mt>
inline void input_f(const Vec (&d)[Mt + 2], Vec (&r)[Mt + 2]) {
  if constexpr (Mt == 4) input_f4(d, r);
  else input_f2(d, r);
}
template <int Mt>
inline void output_f(const Vec (&m)[Mt + 2], Vec (&o)[Mt]) {
  if constexpr (Mt == 4) output_f4(m, o);
  else output_f2(m, o);
}
template <int Mt>
inline void dy_f(const Vec (&y)[Mt], Vec (&e)[Mt + 2]) {
  if constexpr (Mt == 4) dy_f4(y, e);
  else dy_f2(y, e);
}
inline bool gathered(const WinogradTiles& t) { return t.tw < kGatherBelow; }

// The gathered transforms' lines: d[e][lane] the tiles' values (an E x E
// tile's element e = E a + b), o the output transform's Mt x Mt values.
struct Gather {
  alignas(64) float d[36][kLanes];
  alignas(64) float o[16][kLanes];
};

// A tile that crosses the plane's edge (zero outside), into lane q: scalar
// work of no instruction set, out of line so that each one's transforms do
// not carry a copy.
template <int E, class T>
[[gnu::noinline]] void gather_edge_tile(const T* p, std::int64_t h, std::int64_t w, std::int64_t y0, std::int64_t x0,
                                        std::int64_t q, Gather& G) {
  for (int a = 0; a < E; ++a)
    for (int b = 0; b < E; ++b) {
      const std::int64_t iy = y0 + a, ix = x0 + b;
      G.d[a * E + b][q] = iy >= 0 && iy < h && ix >= 0 && ix < w ? to_f32(p[iy * w + ix]) : 0.f;
    }
}

// G.d[E a + b][q] for q < n = src at row Mt ty - oy + a, column Mt tx - ox + b
// (zero outside the plane) of channel c's plane ([n][C][h][w]), where column
// col0 + q of the chunk from tile row r0 is tile tx of tile row ty; the
// lanes past n are zero.
template <int E, int Mt, class T>
void gather_tiles(const T* src, std::int64_t C, std::int64_t c, std::int64_t h, std::int64_t w, std::int64_t oy,
                  std::int64_t ox, const WinogradTiles& t, std::int64_t r0, std::int64_t col0, std::int64_t n,
                  Gather& G) {
  for (std::int64_t q = 0; q < n; ++q) {
    const std::int64_t col = col0 + q;
    const TileRow tr = tile_row(t, r0 + col / t.tw);
    const std::int64_t y0 = Mt * tr.ty - oy, x0 = Mt * (col % t.tw) - ox;
    const T* p = src + (tr.img * C + c) * h * w;
    if (y0 >= 0 && y0 + E <= h && x0 >= 0 && x0 + E <= w) {
      for (int a = 0; a < E; ++a)
        for (int b = 0; b < E; ++b) G.d[a * E + b][q] = to_f32(p[(y0 + a) * w + x0 + b]);
    } else {
      gather_edge_tile<E>(p, h, w, y0, x0, q, G);
    }
  }
  for (int e = 0; e < E * E; ++e) std::fill(G.d[e] + n, G.d[e] + kLanes, 0.f);
}

// The gathered transforms' vector work on G's kLanes tiles, by the widest
// instruction set, out of line: compiled once per tile size, whatever the
// tensors' type and wherever it is called; the gathers and scatters around
// it (input_gathered, output_gathered, dy_gathered) are scalar work, out of
// line too. Flattened into each caller (the forward's and the weight
// gradient's, per type and instruction set), they made the kernel unit's
// code 40% larger and its compile a third slower.
//
// Bᵀ d B of G.d's tiles, stored in layout `to` as channel c's n columns
// from column at.
template <int Mt>
[[gnu::noinline]] void input_lanes(const Gather& G, const TileLayout& to, std::int64_t c, std::int64_t at,
                                   std::int64_t n) {
  run_widest([&] {
    constexpr int E = Mt + 2;
    Vec r[E][E];  // r[a]: row a's Bᵀ d
    for (int a = 0; a < E; ++a) {
      Vec d[E];
      for (int b = 0; b < E; ++b) d[b] = load16(G.d[a * E + b]);
      input_f<Mt>(d, r[a]);
    }
    for (int j = 0; j < E; ++j) {
      Vec d[E], v[E];
      for (int a = 0; a < E; ++a) d[a] = r[a][j];
      input_f<Mt>(d, v);
      for (int i = 0; i < E; ++i) to.store_lanes(i * E + j, c, at, v[i], n);
    }
  });
}
// Aᵀ M A plus the bias of the kLanes tiles from m (M's planes pm apart),
// into G.o.
template <int Mt>
[[gnu::noinline]] void output_lanes(const float* m, std::int64_t pm, float bias, Gather& G) {
  run_widest([&] {
    constexpr int E = Mt + 2;
    const Vec vb = Vec{} + bias;
    Vec s[E][Mt];  // M A along each row i
    for (int i = 0; i < E; ++i) {
      Vec v[E];
      for (int j = 0; j < E; ++j) v[j] = load16(m + (i * E + j) * pm);
      output_f<Mt>(v, s[i]);
    }
    for (int b = 0; b < Mt; ++b) {  // Aᵀ down the columns
      Vec v[E], o[Mt];
      for (int i = 0; i < E; ++i) v[i] = s[i][b];
      output_f<Mt>(v, o);
      for (int a = 0; a < Mt; ++a) store16(G.o[a * Mt + b], o[a] + vb);
    }
  });
}
// A dY Aᵀ of G.d's tiles, stored in layout `to` as channel c's n columns
// from column at.
template <int Mt>
[[gnu::noinline]] void dy_lanes(const Gather& G, const TileLayout& to, std::int64_t c, std::int64_t at,
                                std::int64_t n) {
  run_widest([&] {
    constexpr int E = Mt + 2;
    Vec r[Mt][E];  // r[a]: dY's row a times Aᵀ
    for (int a = 0; a < Mt; ++a) {
      Vec v[Mt];
      for (int b = 0; b < Mt; ++b) v[b] = load16(G.d[a * Mt + b]);
      dy_f<Mt>(v, r[a]);
    }
    for (int j = 0; j < E; ++j) {  // A down the columns
      Vec v[Mt], e[E];
      for (int a = 0; a < Mt; ++a) v[a] = r[a][j];
      dy_f<Mt>(v, e);
      for (int i = 0; i < E; ++i) to.store_lanes(i * E + j, c, at, e[i], n);
    }
  });
}

// Bᵀ d B of columns [col0, col0 + n) (n <= kLanes) of channel c of x, for
// the chunk from tile row r0, stored in layout `to` from column at.
template <int Mt, class T>
[[gnu::noinline]] void input_gathered(const T* x, const ops::ConvGeometry& g, const WinogradTiles& t, std::int64_t c, std::int64_t r0,
                    std::int64_t col0, std::int64_t n, const TileLayout& to, std::int64_t at, Gather& G) {
  gather_tiles<Mt + 2, Mt>(x, g.cin, c, g.h, g.w, g.ph, g.pw, t, r0, col0, n, G);
  input_lanes<Mt>(G, to, c, at, n);
}

// Aᵀ M A of columns [col0, col0 + n) of output channel c (M[ξ][c][col],
// planes pm apart, rows of ld), plus the bias, stored into y; outputs past
// the plane's edge are dropped. M's planes are read a whole vector at a
// time, past column col0 + n too (into the next channel's, or the plane's
// padding).
template <int Mt, class T>
[[gnu::noinline]] void output_gathered(const float* M, std::int64_t pm, std::int64_t ld, const ops::ConvGeometry& g,
                     const WinogradTiles& t, std::int64_t c, std::int64_t r0, std::int64_t col0, std::int64_t n,
                     float bias, T* y, Gather& G) {
  output_lanes<Mt>(M + c * ld + col0, pm, bias, G);
  for (std::int64_t q = 0; q < n; ++q) {
    const std::int64_t col = col0 + q;
    const TileRow tr = tile_row(t, r0 + col / t.tw);
    const std::int64_t oy = Mt * tr.ty, ox = Mt * (col % t.tw);
    const std::int64_t rows = std::min<std::int64_t>(Mt, g.ho - oy), cols = std::min<std::int64_t>(Mt, g.wo - ox);
    T* out = y + ((tr.img * g.cout + c) * g.ho + oy) * g.wo + ox;
    for (std::int64_t a = 0; a < rows; ++a)
      for (std::int64_t b = 0; b < cols; ++b) out[a * g.wo + b] = from_f32<T>(G.o[a * Mt + b][q]);
  }
}

// A dY Aᵀ of columns [col0, col0 + n) of channel c of dy (outputs past the
// edge count as zero), stored at D[ξ][c][at + q] (rows of ld).
template <int Mt, class T>
[[gnu::noinline]] void dy_gathered(const T* dy, const ops::ConvGeometry& g, const WinogradTiles& t, std::int64_t c, std::int64_t r0,
                 std::int64_t col0, std::int64_t n, float* D, std::int64_t ld, std::int64_t at, Gather& G) {
  gather_tiles<Mt, Mt>(dy, g.cout, c, g.ho, g.wo, 0, 0, t, r0, col0, n, G);
  dy_lanes<Mt>(G, TileLayout{D, winograd_plane(g.cout * ld), ld, false}, c, at, n);
}

#pragma GCC diagnostic pop

}  // namespace frugal::cpu::winograd
