#pragma once
// Winograd's tile transforms (conv_winograd.hpp says what they compute, and
// why): the weight's and its gradient's, and the input, output and dy
// transforms of a segment of a tile row, F(2x2, 3x3) and F(4x4, 3x3), each
// across 16 tiles (or kernels) at once in GCC vectors, in the same order of
// operations on every instruction set. conv_winograd_gathered.hpp has their
// twins for planes of a few tiles a row.
#include <algorithm>
#include <bit>
#include <cstring>

#include "../../ops/conv.hpp"
#include "conv_scratch.hpp"
#include "convert.hpp"
#include "isa.hpp"
#include "parallel.hpp"

#include "abi.hpp"

namespace frugal::cpu::inline FRUGAL_KERNEL_ABI::winograd {

// F(m x m, 3x3)'s positions: ξ = (m + 2) i + j of its (m + 2)^2 transformed tile.
template <int M>
inline constexpr int kPositionsOf = (M + 2) * (M + 2);

// A value read as f32 and one rounded once to T (bf16/f16: branch-free,
// convert.hpp, so the transforms' gathers and stores vectorise).
template <class T>
inline float to_f32(T v) {
  return widen_as<float>(v);
}
template <class T>
inline T from_f32(float v) {
  return narrow_as<T>(v);
}
// Elements 2q and 2q + 1 of a row (q < n) into ev[q] and od[q] as f32,
// and back, rounded once. bf16 reads and writes each pair as one 32-bit
// word (as f32 bits the even element is the word shifted up 16, the odd one
// the word with its low half cleared), which vectorises; f16 goes through
// a contiguous f32 line, `wide`; f32 is split and interleaved in place.
template <class T>
inline void split_pairs(const T* __restrict src, float* __restrict ev, float* __restrict od, std::int64_t n,
                        float* __restrict wide) {
  if constexpr (std::is_same_v<T, BFloat16>) {
    for (std::int64_t q = 0; q < n; ++q) {
      std::uint32_t w;
      std::memcpy(&w, src + 2 * q, sizeof w);
      ev[q] = std::bit_cast<float>(w << 16);
      od[q] = std::bit_cast<float>(w & 0xffff0000u);
    }
  } else if constexpr (std::is_same_v<T, Half>) {
    for (std::int64_t e = 0; e < 2 * n; ++e) wide[e] = to_f32(src[e]);
    for (std::int64_t q = 0; q < n; ++q) {
      ev[q] = wide[2 * q];
      od[q] = wide[2 * q + 1];
    }
  } else {
    for (std::int64_t q = 0; q < n; ++q) {
      ev[q] = to_f32(src[2 * q]);
      od[q] = to_f32(src[2 * q + 1]);
    }
  }
}
template <class T>
inline void join_pairs(const float* __restrict ev, const float* __restrict od, T* __restrict dst, std::int64_t n,
                       float* __restrict wide) {
  if constexpr (std::is_same_v<T, BFloat16>) {
    for (std::int64_t q = 0; q < n; ++q) {
      const std::uint32_t w = std::uint32_t(from_f32<T>(ev[q]).bits) | std::uint32_t(from_f32<T>(od[q]).bits) << 16;
      std::memcpy(static_cast<void*>(dst + 2 * q), &w, sizeof w);
    }
  } else if constexpr (std::is_same_v<T, Half>) {
    for (std::int64_t q = 0; q < n; ++q) {
      wide[2 * q] = ev[q];
      wide[2 * q + 1] = od[q];
    }
    for (std::int64_t e = 0; e < 2 * n; ++e) dst[e] = from_f32<T>(wide[e]);
  } else {
    for (std::int64_t q = 0; q < n; ++q) {
      dst[2 * q] = from_f32<T>(ev[q]);
      dst[2 * q + 1] = from_f32<T>(od[q]);
    }
  }
}

// Where U_ξ[o][i] lives: rows of I (plane ξ at winograd_plane(O * I)), as
// the GEMM engines read a row-major operand, or packed as the AVX-512
// micro-kernel reads its A: slivers of MR rows, [o / MR][i][o % MR].
struct WeightLayout {
  std::int64_t I, plane;
  bool packed;
  std::int64_t at(std::int64_t xi, std::int64_t o, std::int64_t i) const {
    constexpr std::int64_t mr = kWinogradSliver;
    return xi * plane + (packed ? (o / mr * I + i) * mr + o % mr : o * I + i);
  }
};
inline WeightLayout weight_layout(std::int64_t O, std::int64_t I, bool packed) {
  return {I, packed ? winograd_sliver_plane(O, I) : winograd_plane(O * I), packed};
}

// The transforms run across 16 tiles (or kernels) at once in GCC vectors
// (one AVX-512 register, two AVX2 or four SSE registers, as run_widest
// compiled them): loops over a tile row's few tiles, with 16 streams in and
// out, do not auto-vectorise.
// (-Wpsabi, silenced from here to the end of this file and in the
// Winograd files that include it: GCC notes that such a vector returned by
// value has another ABI without AVX-512; these helpers are inlined, never
// called across units.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"
using Vec = float __attribute__((vector_size(64)));
inline constexpr std::int64_t kLanes = 16;
inline Vec load16(const float* p) {
  Vec v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store16(float* p, const Vec& v) { std::memcpy(p, &v, sizeof v); }

// G g Gᵀ of F(4x4, 3x3) for 16 kernels g at once (g[e] holds element e of
// each, row-major 3x3), position ξ into u[ξ]. G's rows: (1/4, 0, 0),
// -(1, 1, 1)/6, -(1, -1, 1)/6, (1/24, 1/12, 1/6), (1/24, -1/12, 1/6),
// (0, 0, 1).
inline void weight_f4(const Vec (&g)[9], Vec (&u)[36]) {
  auto col = [](const Vec& a, const Vec& b, const Vec& c, Vec (&t)[6]) {
    t[0] = 0.25f * a;
    t[1] = -((a + c) + b) * (1.f / 6);
    t[2] = -((a + c) - b) * (1.f / 6);
    t[3] = (a * (1.f / 24) + c * (1.f / 6)) + b * (1.f / 12);
    t[4] = (a * (1.f / 24) + c * (1.f / 6)) - b * (1.f / 12);
    t[5] = c;
  };
  Vec t[3][6];  // (G g)ᵀ: t[c] is column c of G g
  for (int c = 0; c < 3; ++c) col(g[c], g[3 + c], g[6 + c], t[c]);
  for (int r = 0; r < 6; ++r) {  // row r of (G g) Gᵀ
    Vec u6[6];
    col(t[0][r], t[1][r], t[2][r], u6);
    for (int j = 0; j < 6; ++j) u[r * 6 + j] = u6[j];
  }
}
// The same of F(2x2, 3x3): G's rows (1, 0, 0), (1, 1, 1)/2, (1, -1, 1)/2,
// (0, 0, 1).
inline void weight_f2(const Vec (&g)[9], Vec (&u)[16]) {
  Vec t[4][3];  // G g
  for (int c = 0; c < 3; ++c) {
    t[0][c] = g[c];
    t[1][c] = 0.5f * (g[c] + g[3 + c] + g[6 + c]);
    t[2][c] = 0.5f * (g[c] - g[3 + c] + g[6 + c]);
    t[3][c] = g[6 + c];
  }
  for (int r = 0; r < 4; ++r) {  // (G g) Gᵀ
    u[r * 4 + 0] = t[r][0];
    u[r * 4 + 1] = 0.5f * (t[r][0] + t[r][1] + t[r][2]);
    u[r * 4 + 2] = 0.5f * (t[r][0] - t[r][1] + t[r][2]);
    u[r * 4 + 3] = t[r][2];
  }
}

// U_ξ[o][i] = (G g_oi Gᵀ)[ξ] for the O x I kernels of a convolution
// F(M x M, 3x3), in layout l. Its kernel g_oi is w[o][i] (flipped false), or
// for the data gradient's convolution w[i][o] turned by 180 degrees (flipped
// true; w is then [I][O][3][3]). 16 kernels at a time, across a vector:
// packed, the rows of a sliver (consecutive in U, so each position's
// values are one store; the lanes past O hold zeros, which the tile
// multiplies and never stores, where stale scratch could be subnormal and
// some CPUs multiply those hundreds of times slower); else 16 consecutive
// i of one row. One kernel at a time, with 36 stores a plane apart each,
// this took a 512 x 512 layer's F(4x4, 3x3) forward 8 ms on a Zen 4.
template <int M, class T>
void transform_weights(const T* w, std::int64_t O, std::int64_t I, bool flipped, float* U, const WeightLayout& l) {
  constexpr int P = kPositionsOf<M>;
  // Packed, the rows of a sliver interleave in every cache line of it: a
  // task takes whole slivers, or two threads would write each line of the
  // slivers they share (at 256 channels that made the forward 2x slower
  // on 2 threads than on 1).
  const std::int64_t rows = l.packed ? kWinogradSliver : 1;
  const auto kernel = [&](std::int64_t o, std::int64_t i) {
    return flipped ? w + (i * O + o) * 9 : w + (o * I + i) * 9;
  };
  parallel_for((O + rows - 1) / rows, rows * I * 64, [&](std::int64_t sb, std::int64_t se) {
    run_widest([&] {
      alignas(64) float gs[9][kLanes];
      std::memset(gs, 0, sizeof gs);  // the lanes past a partial sliver
      // Group k of this task's kernels, kLanes at most, across a vector:
      // packed, the rows of sliver o0 at input channel i; else the input
      // channels from i of row o. One call site of the transform, so each
      // instruction set carries one copy of it.
      const std::int64_t per_row = l.packed ? I : (I + kLanes - 1) / kLanes;
      const std::int64_t groups = (se - sb) * per_row;
      for (std::int64_t k = 0; k < groups; ++k) {
        const std::int64_t row = sb + k / per_row, at = k % per_row;
        const std::int64_t o0 = l.packed ? row * rows : row, i0 = l.packed ? at : at * kLanes;
        const std::int64_t n = l.packed ? std::min(rows, O - o0) : std::min(kLanes, I - i0);
        if (l.packed && n < rows && at == 0) std::memset(gs, 0, sizeof gs);
        for (std::int64_t q = 0; q < n; ++q) {
          const T* src = l.packed ? kernel(o0 + q, i0) : kernel(o0, i0 + q);
          for (int e = 0; e < 9; ++e) gs[e][q] = to_f32(src[flipped ? 8 - e : e]);
        }
        Vec g[9], u[P];
        for (int e = 0; e < 9; ++e) g[e] = load16(gs[e]);
        if constexpr (M == 4) weight_f4(g, u);
        else weight_f2(g, u);
        // u's first n lanes (packed: all rows of the sliver, the zeros
        // past O too) to U, plane after plane.
        float* dst = U + l.at(0, o0, i0);
        if (l.packed)
          for (int xi = 0; xi < P; ++xi) std::memcpy(dst + xi * l.plane, &u[xi], kWinogradSliver * sizeof(float));
        else if (n == kLanes)
          for (int xi = 0; xi < P; ++xi) store16(dst + xi * l.plane, u[xi]);
        else
          for (int xi = 0; xi < P; ++xi)
            for (std::int64_t q = 0; q < n; ++q) dst[xi * l.plane + q] = u[xi][q];
      }
    });
  });
}

// Row n of a chunk's tiles: image and tile row.
struct TileRow {
  std::int64_t img, ty;
};
inline TileRow tile_row(const WinogradTiles& t, std::int64_t row) { return {row / t.th, row % t.th}; }

// dst[0, n) = src[0, n), whole vectors then the rest (a tile row's few
// floats: a library memcpy call would cost more than the copy).
inline void copy_floats(float* __restrict dst, const float* __restrict src, std::int64_t n) {
  std::int64_t q = 0;
  for (; q + kLanes <= n; q += kLanes) store16(dst + q, load16(src + q));
  // The rest in pieces of constant size: GCC turns a loop of single copies
  // into a call of the library's memcpy, which took 7% of a layer's time
  // at 8x8 planes (2 tiles a row, 36 copies of them per row).
  for (std::int64_t piece = kLanes / 2; piece > 0; piece /= 2)
    if (n - q >= piece) {
      std::memcpy(dst + q, src + q, std::size_t(piece) * sizeof(float));
      q += piece;
    }
}

// Where a transform puts the transformed tiles of channel c from column col
// (plane ξ at base + ξ * plane): rows of ld columns, as the GEMM engines
// read a row-major operand, or packed as the AVX-512 micro-kernel reads its
// B: panels of NR columns, [col / NR][c][col % NR] with ld = the channels.
struct TileLayout {
  float* base;
  std::int64_t plane, ld;
  bool panels;
  // Channel c's n columns from col of every plane ξ < P, from src[ξ]:
  // where they go is worked out once for all P (at a few tiles a row, as
  // at 8x8 planes, that bookkeeping per plane cost more than the copies).
  template <int P, std::size_t W>
  void store(std::int64_t c, std::int64_t col, const float (&src)[P][W], std::int64_t n) const {
    if (!panels) {
      float* p = base + c * ld + col;
      for (int xi = 0; xi < P; ++xi) copy_floats(p + xi * plane, src[xi], n);
      return;
    }
    for (std::int64_t run, off = 0; off < n; off += run) {
      const std::int64_t at = col + off, j = at % kWinogradPanel;
      run = std::min(n - off, kWinogradPanel - j);
      float* p = base + (at / kWinogradPanel * ld + c) * kWinogradPanel + j;
      for (int xi = 0; xi < P; ++xi) copy_floats(p + xi * plane, src[xi] + off, run);
    }
  }
  // Channel c's n <= kLanes columns from col of plane ξ, from v's first n
  // lanes: one store where they are kLanes within one panel (the gathered
  // transforms' columns start at multiples of kLanes), else in runs.
  void store_lanes(int xi, std::int64_t c, std::int64_t col, const Vec& v, std::int64_t n) const {
    const std::int64_t j = col % kWinogradPanel;
    float* p = base + xi * plane + (panels ? (col / kWinogradPanel * ld + c) * kWinogradPanel + j : c * ld + col);
    if (n == kLanes && (!panels || j + kLanes <= kWinogradPanel)) return store16(p, v);
    alignas(64) float line[1][kLanes];
    store16(line[0], v);
    store_line(xi, c, col, line, n);
  }
  // store_lanes' rare case (the last columns of a channel), out of line:
  // inlined at each of the 36 planes' stores of every transform and
  // instruction set, it made the kernel unit a quarter slower to compile.
  [[gnu::noinline]] void store_line(int xi, std::int64_t c, std::int64_t col, const float (&line)[1][kLanes],
                                    std::int64_t n) const {
    const TileLayout one{base + xi * plane, 0, ld, panels};
    one.store(c, col, line, n);
  }
};

// A transform works on a segment of a tile row at a time, at most kSegment
// tiles, in lines on its stack (no heap while a step runs, whatever the
// image width): 4 input (or 2 dy) rows split into even and odd columns, and
// the 16 transformed streams, each a segment and one vector more long.
inline constexpr std::int64_t kSegment = 64;
struct Lines {
  static constexpr std::int64_t kWidth = kSegment + kLanes;
  alignas(64) float ev[4][kWidth], od[4][kWidth], out[16][kWidth];
  // An f16 row segment widened (or an output segment before it is rounded),
  // contiguous (split_pairs, join_pairs).
  alignas(64) float wide[2 * kWidth];
};

// Item k of a chunk's transform: channel c, tile row `row`, and the
// segment's tiles [s0, s0 + n) of that row.
struct Item {
  std::int64_t c, row, s0, n;
};
inline std::int64_t segments(std::int64_t tw) { return (tw + kSegment - 1) / kSegment; }
inline Item item(std::int64_t k, std::int64_t nr, std::int64_t r0, std::int64_t tw) {
  const std::int64_t ns = segments(tw), s0 = k % ns * kSegment, rest = k / ns;
  return {rest / nr, r0 + rest % nr, s0, std::min(kSegment, tw - s0)};
}
// The item's first column in a region of the chunk from tile row r0.
inline std::int64_t column(const Item& it, std::int64_t r0, std::int64_t tw) { return (it.row - r0) * tw + it.s0; }

// fn(k) for the items of channels [c0, c1) in tile rows [a, b) of a
// chunk of nr rows, channel by channel.
template <class Fn>
void each_item(std::int64_t c0, std::int64_t c1, std::int64_t nr, std::int64_t tw, std::int64_t a, std::int64_t b,
               Fn&& fn) {
  const std::int64_t ns = segments(tw);
  for (std::int64_t c = c0; c < c1; ++c)
    for (std::int64_t k = (c * nr + a) * ns; k < (c * nr + b) * ns; ++k) fn(k);
}

// F(2x2, 3x3)'s transforms on a row or a column of a tile: Bᵀ d (or d B)
// is (d0 - d2, d1 + d2, d2 - d1, d1 - d3); Aᵀ m is (m0 + m1 + m2,
// m1 - m2 - m3); A y is (y0, y0 + y1, y0 - y1, -y1).
inline void input_f2(const Vec (&d)[4], Vec (&r)[4]) {
  r[0] = d[0] - d[2];
  r[1] = d[1] + d[2];
  r[2] = d[2] - d[1];
  r[3] = d[1] - d[3];
}
inline void output_f2(const Vec (&m)[4], Vec (&o)[2]) {
  o[0] = m[0] + m[1] + m[2];
  o[1] = m[1] - m[2] - m[3];
}
inline void dy_f2(const Vec (&y)[2], Vec (&e)[4]) {
  e[0] = y[0];
  e[1] = y[0] + y[1];
  e[2] = y[0] - y[1];
  e[3] = -y[1];
}

// Bᵀ d B of an item's tiles in channel c of x ([n][C][h][w], padding ph,
// pw), stored in layout `to` as channel c's columns from col.
template <class T>
void input_tiles(const T* x, const ops::ConvGeometry& g, const WinogradTiles& t, const Item& it,
                 const TileLayout& to, std::int64_t col, Lines& L) {
  const TileRow tr = tile_row(t, it.row);
  const std::int64_t n = it.n, n1 = n + 1;
  const T* plane = x + (tr.img * g.cin + it.c) * g.h * g.w;
  // Tile tx reads input columns 2 tx - pw + 0..3: ev[q] holds column
  // 2 (s0 + q) - pw and od[q] the next. Both exist for s0 + q in [lo, hi);
  // the padding is around them.
  const std::int64_t lo = std::clamp((g.pw + 1) / 2 - it.s0, std::int64_t(0), n1);
  const std::int64_t hi = std::clamp((g.w + g.pw) / 2 - it.s0, lo, n1);
  for (int a = 0; a < 4; ++a) {
    float* __restrict ev = L.ev[a];
    float* __restrict od = L.od[a];
    const std::int64_t iy = 2 * tr.ty - g.ph + a;
    if (iy < 0 || iy >= g.h) {
      std::fill(ev, ev + n1, 0.f);
      std::fill(od, od + n1, 0.f);
      continue;
    }
    const T* src = plane + iy * g.w + 2 * it.s0 - g.pw;  // src[2q] is ev[q]'s column
    auto edge = [&](std::int64_t q) {
      const std::int64_t ie = 2 * (it.s0 + q) - g.pw;
      ev[q] = ie >= 0 && ie < g.w ? to_f32(src[2 * q]) : 0.f;
      od[q] = ie + 1 >= 0 && ie + 1 < g.w ? to_f32(src[2 * q + 1]) : 0.f;
    };
    for (std::int64_t q = 0; q < lo; ++q) edge(q);
    split_pairs(src + 2 * lo, ev + lo, od + lo, hi - lo, L.wide);
    for (std::int64_t q = hi; q < n1; ++q) edge(q);
  }
  // Tile q reads d0..d3 = ev[q], od[q], ev[q + 1], od[q + 1] of each row;
  // d B along the rows, then Bᵀ down the columns (input_f2). Lanes past n
  // compute what is never stored.
  for (std::int64_t q0 = 0; q0 < n; q0 += kLanes) {
    Vec r[4][4];
    for (int a = 0; a < 4; ++a) {
      const Vec d[4] = {load16(L.ev[a] + q0), load16(L.od[a] + q0), load16(L.ev[a] + q0 + 1),
                        load16(L.od[a] + q0 + 1)};
      input_f2(d, r[a]);
    }
    for (int j = 0; j < 4; ++j) {
      const Vec d[4] = {r[0][j], r[1][j], r[2][j], r[3][j]};
      Vec v[4];
      input_f2(d, v);
      for (int i = 0; i < 4; ++i) store16(L.out[i * 4 + j] + q0, v[i]);
    }
  }
  to.store(it.c, col, L.out, n);
}

// Aᵀ M A of an item's tiles in output channel c (M[ξ][c][col + tx - s0]),
// plus the bias, stored into y ([n][O][ho][wo]); partial tiles past the
// edge are dropped. M's planes are read a whole vector at a time, past the
// segment's end too (into the next row, or the plane's padding).
template <class T>
void output_tiles(const float* M, std::int64_t ld, std::int64_t col, const ops::ConvGeometry& g,
                  const WinogradTiles& t, const Item& it, float bias, T* y, Lines& L) {
  const TileRow tr = tile_row(t, it.row);
  const std::int64_t n = it.n, pstride = winograd_plane(g.cout * ld);
  const float* m = M + it.c * ld + col;
  const Vec vb = Vec{} + bias;
  for (std::int64_t q0 = 0; q0 < n; q0 += kLanes) {
    Vec s[4][2];  // M A along each row i
    for (int i = 0; i < 4; ++i) {
      const Vec v[4] = {load16(m + (i * 4 + 0) * pstride + q0), load16(m + (i * 4 + 1) * pstride + q0),
                        load16(m + (i * 4 + 2) * pstride + q0), load16(m + (i * 4 + 3) * pstride + q0)};
      output_f2(v, s[i]);
    }
    for (int b = 0; b < 2; ++b) {  // Aᵀ down the columns: ev holds output row 0, od row 1; [b] the tile's column b
      const Vec v[4] = {s[0][b], s[1][b], s[2][b], s[3][b]};
      Vec o[2];
      output_f2(v, o);
      store16(L.ev[b] + q0, o[0] + vb);
      store16(L.od[b] + q0, o[1] + vb);
    }
  }
  // Tiles [0, full) have both columns inside the plane; with Wo odd the
  // row's last tile has only its first.
  const std::int64_t full = std::clamp(g.wo / 2 - it.s0, std::int64_t(0), n);
  for (int a = 0; a < 2; ++a) {
    const std::int64_t oy = 2 * tr.ty + a;
    if (oy >= g.ho) break;
    const float* out0 = a == 0 ? L.ev[0] : L.od[0];  // columns 2 tx
    const float* out1 = a == 0 ? L.ev[1] : L.od[1];  // columns 2 tx + 1
    T* line = y + ((tr.img * g.cout + it.c) * g.ho + oy) * g.wo + 2 * it.s0;
    join_pairs(out0, out1, line, full, L.wide);
    if (full < n) line[2 * full] = from_f32<T>(out0[full]);
  }
}

// A dY Aᵀ of an item's tiles in channel c of dy ([n][O][ho][wo]; outputs
// past the edge count as zero), stored at D[ξ][c][col + tx - s0].
template <class T>
void dy_tiles(const T* dy, const ops::ConvGeometry& g, const WinogradTiles& t, const Item& it, float* D,
              std::int64_t ld, std::int64_t col, Lines& L) {
  const TileRow tr = tile_row(t, it.row);
  const std::int64_t n = it.n, full = std::clamp(g.wo / 2 - it.s0, std::int64_t(0), n);
  for (int a = 0; a < 2; ++a) {  // row a of each tile: ev = its column 0, od = its column 1
    float* __restrict y0 = L.ev[a];
    float* __restrict y1 = L.od[a];
    const std::int64_t oy = 2 * tr.ty + a;
    if (oy >= g.ho) {
      std::fill(y0, y0 + n, 0.f);
      std::fill(y1, y1 + n, 0.f);
      continue;
    }
    const T* line = dy + ((tr.img * g.cout + it.c) * g.ho + oy) * g.wo + 2 * it.s0;
    split_pairs(line, y0, y1, full, L.wide);
    if (full < n) y0[full] = to_f32(line[2 * full]), y1[full] = 0.f;
  }
  // dY Aᵀ along each row, then A down the columns (dy_f2).
  for (std::int64_t q0 = 0; q0 < n; q0 += kLanes) {
    Vec r[2][4];
    for (int a = 0; a < 2; ++a) {
      const Vec y[2] = {load16(L.ev[a] + q0), load16(L.od[a] + q0)};
      dy_f2(y, r[a]);
    }
    for (int j = 0; j < 4; ++j) {
      const Vec y[2] = {r[0][j], r[1][j]};
      Vec e[4];
      dy_f2(y, e);
      for (int i = 0; i < 4; ++i) store16(L.out[i * 4 + j] + q0, e[i]);
    }
  }
  const std::int64_t pstride = winograd_plane(g.cout * ld);
  for (int xi = 0; xi < kPositionsOf<2>; ++xi) copy_floats(D + xi * pstride + it.c * ld + col, L.out[xi], n);
}

// F(4x4, 3x3)'s lines (its transforms are the overloads of input_tiles,
// output_tiles and dy_tiles that take them): a tile reads 6 input rows at
// columns 4 tx - pw + 0..5,
// so each row segment is split by column phase (ph[a][k][q] holds column
// 4 (s0 + q) - pw + k of input row a); the 36 transformed streams; the
// output transform's 4 rows of 4 column phases (in ph's first rows).
struct Lines4 {
  static constexpr std::int64_t kWidth = kSegment + kLanes;
  alignas(64) float ph[6][4][kWidth], out[36][kWidth];
  alignas(64) float wide[4 * kWidth];
};

// Elements 4q + k of a row (q < n, k < 4) into p[k][q0 + q] as f32
// (split_quads), and back from p[k][q], rounded once (join_quads).
template <class T>
inline void split_quads(const T* __restrict src, float (*__restrict p)[Lines4::kWidth], std::int64_t q0,
                        std::int64_t n, float* __restrict wide) {
  if constexpr (std::is_same_v<T, float>) {
    for (std::int64_t q = 0; q < n; ++q)
      for (int k = 0; k < 4; ++k) p[k][q0 + q] = src[4 * q + k];
  } else {
    for (std::int64_t e = 0; e < 4 * n; ++e) wide[e] = to_f32(src[e]);
    for (std::int64_t q = 0; q < n; ++q)
      for (int k = 0; k < 4; ++k) p[k][q0 + q] = wide[4 * q + k];
  }
}
template <class T>
inline void join_quads(const float (*__restrict p)[Lines4::kWidth], T* __restrict dst, std::int64_t n,
                       float* __restrict wide) {
  if constexpr (std::is_same_v<T, float>) {
    for (std::int64_t q = 0; q < n; ++q)
      for (int k = 0; k < 4; ++k) dst[4 * q + k] = p[k][q];
  } else {
    for (std::int64_t q = 0; q < n; ++q)
      for (int k = 0; k < 4; ++k) wide[4 * q + k] = p[k][q];
    for (std::int64_t e = 0; e < 4 * n; ++e) dst[e] = from_f32<T>(wide[e]);
  }
}

// Bᵀ d of F(4x4, 3x3) on six values (a row or a column of a tile): Bᵀ's rows
// are (4, 0, -5, 0, 1, 0), (0, -4, -4, 1, 1, 0), (0, 4, -4, -1, 1, 0),
// (0, -2, -1, 2, 1, 0), (0, 2, -1, -2, 1, 0), (0, 4, 0, -5, 0, 1). The
// factors 2 and 4 are exact, so each output takes at most 2 roundings.
inline void input_f4(const Vec (&d)[6], Vec (&r)[6]) {
  r[0] = (4.f * d[0] + d[4]) - 5.f * d[2];
  r[1] = (d[3] + d[4]) - 4.f * (d[1] + d[2]);
  r[2] = (d[4] - d[3]) + 4.f * (d[1] - d[2]);
  r[3] = (d[4] - d[2]) + 2.f * (d[3] - d[1]);
  r[4] = (d[4] - d[2]) - 2.f * (d[3] - d[1]);
  r[5] = (4.f * d[1] + d[5]) - 5.f * d[3];
}
// Aᵀ m of F(4x4, 3x3) on six values: Aᵀ's rows are (1, 1, 1, 1, 1, 0),
// (0, 1, -1, 2, -2, 0), (0, 1, 1, 4, 4, 0), (0, 1, -1, 8, -8, 1).
inline void output_f4(const Vec (&m)[6], Vec (&o)[4]) {
  const Vec p12 = m[1] + m[2], m12 = m[1] - m[2], p34 = m[3] + m[4], m34 = m[3] - m[4];
  o[0] = (m[0] + p12) + p34;
  o[1] = m12 + 2.f * m34;
  o[2] = p12 + 4.f * p34;
  o[3] = (m12 + 8.f * m34) + m[5];
}

// Bᵀ d B of F(4x4, 3x3) for an item's tiles in channel c of x ([n][C][h][w],
// padding ph, pw), stored in layout `to` as channel c's columns from col.
template <class T>
void input_tiles(const T* x, const ops::ConvGeometry& g, const WinogradTiles& t, const Item& it,
                    const TileLayout& to, std::int64_t col, Lines4& L) {
  const TileRow tr = tile_row(t, it.row);
  const std::int64_t n = it.n, n1 = n + 1;
  const T* plane = x + (tr.img * g.cin + it.c) * g.h * g.w;
  // Tile tx reads input columns 4 tx - pw + 0..5: ph[a][k][q] holds column
  // 4 (s0 + q) - pw + k. All four exist for s0 + q in [lo, hi); the
  // padding is around them.
  const std::int64_t lo = std::clamp((g.pw + 3) / 4 - it.s0, std::int64_t(0), n1);
  const std::int64_t hi = std::clamp((g.w + g.pw) / 4 - it.s0, lo, n1);
  for (int a = 0; a < 6; ++a) {
    auto* p = L.ph[a];
    const std::int64_t iy = 4 * tr.ty - g.ph + a;
    if (iy < 0 || iy >= g.h) {
      for (int k = 0; k < 4; ++k) std::fill(p[k], p[k] + n1, 0.f);
      continue;
    }
    const T* src = plane + iy * g.w + 4 * it.s0 - g.pw;  // src[4q + k] is p[k][q]'s column
    auto edge = [&](std::int64_t q) {
      for (int k = 0; k < 4; ++k) {
        const std::int64_t ix = 4 * (it.s0 + q) - g.pw + k;
        p[k][q] = ix >= 0 && ix < g.w ? to_f32(src[4 * q + k]) : 0.f;
      }
    };
    for (std::int64_t q = 0; q < lo; ++q) edge(q);
    split_quads(src + 4 * lo, p, lo, hi - lo, L.wide);
    for (std::int64_t q = hi; q < n1; ++q) edge(q);
  }
  // Tile q reads d0..d5 = p0[q], p1[q], p2[q], p3[q], p0[q + 1], p1[q + 1]
  // of each row; Bᵀ along the rows, then down the columns. Lanes past n
  // compute what is never stored.
  for (std::int64_t q0 = 0; q0 < n; q0 += kLanes) {
    Vec r[6][6];  // r[a]: row a's Bᵀ d
    for (int a = 0; a < 6; ++a) {
      const auto* p = L.ph[a];
      const Vec d[6] = {load16(p[0] + q0),     load16(p[1] + q0),     load16(p[2] + q0),
                        load16(p[3] + q0),     load16(p[0] + q0 + 1), load16(p[1] + q0 + 1)};
      input_f4(d, r[a]);
    }
    for (int j = 0; j < 6; ++j) {
      const Vec d[6] = {r[0][j], r[1][j], r[2][j], r[3][j], r[4][j], r[5][j]};
      Vec c[6];
      input_f4(d, c);
      for (int i = 0; i < 6; ++i) store16(L.out[i * 6 + j] + q0, c[i]);
    }
  }
  to.store(it.c, col, L.out, n);
}

// Aᵀ M A of F(4x4, 3x3) for an item's tiles in output channel c
// (M[ξ][c][col + tx - s0]), plus the bias, stored into y ([n][O][ho][wo]);
// partial tiles past the edge are dropped. M's planes are read a whole
// vector at a time, past the segment's end too.
template <class T>
void output_tiles(const float* M, std::int64_t ld, std::int64_t col, const ops::ConvGeometry& g,
                     const WinogradTiles& t, const Item& it, float bias, T* y, Lines4& L) {
  const TileRow tr = tile_row(t, it.row);
  const std::int64_t n = it.n, pstride = winograd_plane(g.cout * ld);
  const float* m = M + it.c * ld + col;
  const Vec vb = Vec{} + bias;
  // Output row a of the tiles, column phase b, at L.ph[a][b].
  for (std::int64_t q0 = 0; q0 < n; q0 += kLanes) {
    Vec s[6][4];  // M A along each row i
    for (int i = 0; i < 6; ++i) {
      Vec v[6];
      for (int j = 0; j < 6; ++j) v[j] = load16(m + (i * 6 + j) * pstride + q0);
      output_f4(v, s[i]);
    }
    for (int b = 0; b < 4; ++b) {  // Aᵀ down the columns
      const Vec v[6] = {s[0][b], s[1][b], s[2][b], s[3][b], s[4][b], s[5][b]};
      Vec o[4];
      output_f4(v, o);
      for (int a = 0; a < 4; ++a) store16(L.ph[a][b] + q0, o[a] + vb);
    }
  }
  // Tiles [0, full) have all 4 columns inside the plane; the row's last
  // tile may have fewer.
  const std::int64_t full = std::clamp(g.wo / 4 - it.s0, std::int64_t(0), n);
  const std::int64_t rest = full < n ? std::min<std::int64_t>(4, g.wo - 4 * (it.s0 + full)) : 0;
  for (int a = 0; a < 4; ++a) {
    const std::int64_t oy = 4 * tr.ty + a;
    if (oy >= g.ho) break;
    T* line = y + ((tr.img * g.cout + it.c) * g.ho + oy) * g.wo + 4 * it.s0;
    join_quads(L.ph[a], line, full, L.wide);
    for (std::int64_t b = 0; b < rest; ++b) line[4 * full + b] = from_f32<T>(L.ph[a][b][full]);
  }
}

// A y of F(4x4, 3x3) on four values: A's rows are (1, 0, 0, 0), (1, 1, 1, 1),
// (1, -1, 1, -1), (1, 2, 4, 8), (1, -2, 4, -8), (0, 0, 0, 1).
inline void dy_f4(const Vec (&y)[4], Vec (&e)[6]) {
  const Vec p02 = y[0] + y[2], p13 = y[1] + y[3], q02 = y[0] + 4.f * y[2], q13 = 2.f * y[1] + 8.f * y[3];
  e[0] = y[0];
  e[1] = p02 + p13;
  e[2] = p02 - p13;
  e[3] = q02 + q13;
  e[4] = q02 - q13;
  e[5] = y[3];
}

// A dY Aᵀ of F(4x4, 3x3) for an item's tiles in channel c of dy
// ([n][O][ho][wo]; outputs past the edge count as zero), stored at
// D[ξ][c][col + tx - s0].
template <class T>
void dy_tiles(const T* dy, const ops::ConvGeometry& g, const WinogradTiles& t, const Item& it, float* D,
                 std::int64_t ld, std::int64_t col, Lines4& L) {
  const TileRow tr = tile_row(t, it.row);
  const std::int64_t n = it.n, full = std::clamp(g.wo / 4 - it.s0, std::int64_t(0), n);
  const std::int64_t rest = full < n ? std::min<std::int64_t>(4, g.wo - 4 * (it.s0 + full)) : 0;
  for (int a = 0; a < 4; ++a) {  // row a of each tile: ph[a][b] its column b
    auto* p = L.ph[a];
    const std::int64_t oy = 4 * tr.ty + a;
    if (oy >= g.ho) {
      for (int b = 0; b < 4; ++b) std::fill(p[b], p[b] + n, 0.f);
      continue;
    }
    const T* line = dy + ((tr.img * g.cout + it.c) * g.ho + oy) * g.wo + 4 * it.s0;
    split_quads(line, p, 0, full, L.wide);
    if (full < n)
      for (int b = 0; b < 4; ++b) p[b][full] = b < rest ? to_f32(line[4 * full + b]) : 0.f;
  }
  for (std::int64_t q0 = 0; q0 < n; q0 += kLanes) {
    Vec r[4][6];  // r[a]: dY's row a times Aᵀ
    for (int a = 0; a < 4; ++a) {
      const Vec y[4] = {load16(L.ph[a][0] + q0), load16(L.ph[a][1] + q0), load16(L.ph[a][2] + q0),
                        load16(L.ph[a][3] + q0)};
      dy_f4(y, r[a]);
    }
    for (int j = 0; j < 6; ++j) {  // A down the columns
      const Vec y[4] = {r[0][j], r[1][j], r[2][j], r[3][j]};
      Vec e[6];
      dy_f4(y, e);
      for (int i = 0; i < 6; ++i) store16(L.out[i * 6 + j] + q0, e[i]);
    }
  }
  const std::int64_t pstride = winograd_plane(g.cout * ld);
  for (int xi = 0; xi < 36; ++xi) copy_floats(D + xi * pstride + it.c * ld + col, L.out[xi], n);
}

// Gᵀ u of F(4x4, 3x3) on six values: Gᵀ's rows are
// (1/4, -1/6, -1/6, 1/24, 1/24, 0), (0, -1/6, 1/6, 1/12, -1/12, 0),
// (0, -1/6, -1/6, 1/6, 1/6, 1).
inline void weight_grad_f4(const Vec (&u)[6], Vec (&c)[3]) {
  const Vec p12 = u[1] + u[2], p34 = u[3] + u[4];
  c[0] = (0.25f * u[0] - p12 * (1.f / 6)) + p34 * (1.f / 24);
  c[1] = (u[2] - u[1]) * (1.f / 6) + (u[3] - u[4]) * (1.f / 12);
  c[2] = (p34 - p12) * (1.f / 6) + u[5];
}

// dg = Gᵀ dU G for 16 kernels at once, dU[ξ] holding position ξ of each.
inline void weight_grad_tile(const Vec (&dU)[36], Vec (&d)[9]) {
  Vec tt[3][6];  // Gᵀ dU: column j of dU through weight_grad_f4
  for (int j = 0; j < 6; ++j) {
    Vec u[6], c[3];
    for (int i = 0; i < 6; ++i) u[i] = dU[i * 6 + j];
    weight_grad_f4(u, c);
    for (int r = 0; r < 3; ++r) tt[r][j] = c[r];
  }
  for (int r = 0; r < 3; ++r) {  // (Gᵀ dU) G
    Vec c[3];
    weight_grad_f4(tt[r], c);
    for (int j = 0; j < 3; ++j) d[r * 3 + j] = c[j];
  }
}
// The same of F(2x2, 3x3).
inline void weight_grad_tile(const Vec (&dU)[16], Vec (&d)[9]) {
  Vec tt[3][4];  // Gᵀ dU
  for (int j = 0; j < 4; ++j) {
    const Vec u0 = dU[j], u1 = dU[4 + j], u2 = dU[8 + j], u3 = dU[12 + j];
    tt[0][j] = u0 + 0.5f * (u1 + u2);
    tt[1][j] = 0.5f * (u1 - u2);
    tt[2][j] = 0.5f * (u1 + u2) + u3;
  }
  for (int r = 0; r < 3; ++r) {  // (Gᵀ dU) G
    d[r * 3 + 0] = tt[r][0] + 0.5f * (tt[r][1] + tt[r][2]);
    d[r * 3 + 1] = 0.5f * (tt[r][1] - tt[r][2]);
    d[r * 3 + 2] = 0.5f * (tt[r][1] + tt[r][2]) + tt[r][3];
  }
}

#pragma GCC diagnostic pop

}  // namespace frugal::cpu::winograd
