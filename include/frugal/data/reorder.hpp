#pragma once
// Vertex orderings for locality, as preprocessing of a graph task. Each
// ordering returns a permutation of the vertices; permute_task() carries one
// permutation to the adjacency (rows and columns), the features, the labels
// and the splits together, so the task is the same task under other ids.
//
// Why: an SpMM (a GCN layer, its backward) and a traversal gather rows of a
// dense matrix, or adjacency lists, by neighbour id. When neighbours have
// nearby ids their rows share cache lines and pages, so a gather touches
// fewer of them; and when the dense matrix lives in a slower tier (host
// memory behind a device budget, unified memory), fewer pages are fetched.
//
// Convention: an order is new -> old. order[k] is the old id of the vertex
// that gets the new id k. inverse_order() gives old -> new (rank[old] = new).
//
// The orderings (each a pure function of the graph and its seed):
//   random_order     a seeded shuffle: the worst case, and a baseline
//   degree_order     hubs first: descending degree, ties by old id
//   rcm_order        reverse Cuthill-McKee
//   bisection_order  recursive BFS (level-structure) bisection
//   halo_order       HALO-style harmonic locality ordering
// They read row i's entries as vertex i's neighbours, the direction an SpMM
// or a traversal follows. Bandwidth and cut arguments hold for symmetric
// adjacencies (symmetrize() makes one); a directed graph still gets a valid
// permutation. Self loops and duplicate entries are allowed and ignored.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "../core/error.hpp"
#include "../core/rng.hpp"
#include "../core/tensor.hpp"
#include "graph.hpp"
#include "planetoid.hpp"

namespace frugal::data {

// ---- permutations ------------------------------------------------------------

// Throws a DataError unless `order` holds each of 0..n-1 exactly once.
inline void check_order(std::span<const std::int64_t> order, std::int64_t n, const std::string& what) {
  if (std::int64_t(order.size()) != n)
    fail<DataError>(what, ": the order has ", order.size(), " entries but the graph has ", n,
                    " vertices; compute the order from this graph");
  std::vector<char> seen(std::size_t(n), 0);
  for (std::size_t k = 0; k < order.size(); ++k) {
    const std::int64_t v = order[k];
    if (v < 0 || v >= n)
      fail<DataError>(what, ": order[", k, "] = ", v, " is not a vertex id in [0, ", n, ")");
    if (seen[std::size_t(v)])
      fail<DataError>(what, ": vertex ", v, " appears twice in the order (again at ", k,
                      "); an order must list each vertex once");
    seen[std::size_t(v)] = 1;
  }
}

// old -> new from new -> old (and back: the inverse of a rank is the order).
inline std::vector<std::int64_t> inverse_order(std::span<const std::int64_t> order) {
  check_order(order, std::int64_t(order.size()), "inverse_order");
  std::vector<std::int64_t> rank(order.size());
  for (std::size_t k = 0; k < order.size(); ++k) rank[std::size_t(order[k])] = std::int64_t(k);
  return rank;
}

// The adjacency under new ids: new row k is old row order[k], each column j
// becomes rank[j], and each row is sorted again by its new columns (stably,
// so duplicate entries keep their order and a round trip is exact). Rows and
// columns are the same vertices, so the matrix must be square.
inline Csr permute_csr(const Csr& a, std::span<const std::int64_t> order) {
  a.validate("permute_csr");
  if (a.rows != a.cols)
    fail<DataError>("permute_csr: the adjacency must be square to permute its rows and columns together, got [", a.rows,
                    ", ", a.cols, "]");
  check_order(order, a.rows, "permute_csr");
  std::vector<std::int64_t> rank = inverse_order(order);
  Csr out;
  out.rows = out.cols = a.rows;
  out.row_ptr.assign(std::size_t(a.rows + 1), 0);
  out.col.resize(a.col.size());
  out.values.resize(a.values.size());
  std::vector<std::pair<std::int64_t, std::int64_t>> row;  // (new column, old position)
  for (std::int64_t k = 0; k < a.rows; ++k) {
    const std::int64_t old = order[std::size_t(k)];
    row.clear();
    for (std::int64_t p = a.row_ptr[std::size_t(old)]; p < a.row_ptr[std::size_t(old + 1)]; ++p)
      row.emplace_back(rank[std::size_t(a.col[std::size_t(p)])], p);
    std::stable_sort(row.begin(), row.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
    std::int64_t q = out.row_ptr[std::size_t(k)];
    for (auto [c, p] : row) {
      out.col[std::size_t(q)] = c;
      out.values[std::size_t(q)] = a.values[std::size_t(p)];
      ++q;
    }
    out.row_ptr[std::size_t(k + 1)] = q;
  }
  return out;
}

// A tensor whose first dimension runs over the vertices (features [n, f],
// labels [n], a split mask [n]), with row k taken from old row order[k].
inline Tensor permute_rows(const Tensor& t, std::span<const std::int64_t> order, const std::string& what) {
  if (!t.defined() || t.shape().rank() < 1)
    fail<DataError>(what, ": needs a tensor with one row per vertex, got ",
                    t.defined() ? t.shape().str() : std::string("an undefined tensor"));
  const std::int64_t n = t.shape()[0];
  if (std::int64_t(order.size()) != n)
    fail<DataError>(what, ": the tensor ", t.shape().str(), " has ", n, " rows but the order has ", order.size(),
                    " vertices; every per-vertex tensor needs one row per vertex of the graph");
  check_order(order, n, what);
  Tensor out(t.shape(), t.dtype());
  const std::size_t row_bytes = n > 0 ? t.nbytes() / std::size_t(n) : 0;
  const auto* src = static_cast<const std::byte*>(t.raw());
  auto* dst = static_cast<std::byte*>(out.raw());
  for (std::int64_t k = 0; k < n; ++k)
    std::memcpy(dst + std::size_t(k) * row_bytes, src + std::size_t(order[std::size_t(k)]) * row_bytes, row_bytes);
  return out;
}

// A list of vertex ids (a train, validation or test split) under new ids:
// each id becomes rank[id]. The list keeps its order (so a loss over it sums
// the same nodes in the same order); it is not re-sorted.
inline std::vector<std::int64_t> permute_ids(std::span<const std::int64_t> ids, std::span<const std::int64_t> rank,
                                             const std::string& what) {
  std::vector<std::int64_t> out(ids.size());
  for (std::size_t k = 0; k < ids.size(); ++k) {
    const std::int64_t v = ids[k];
    if (v < 0 || v >= std::int64_t(rank.size()))
      fail<DataError>(what, ": id ", v, " at position ", k, " is not a vertex of the ", rank.size(), "-vertex graph");
    out[k] = rank[std::size_t(v)];
  }
  return out;
}

// The whole task under new ids: adjacency (rows and columns), features,
// labels and the three splits, from one order.
inline NodeClassification permute_task(const NodeClassification& d, std::span<const std::int64_t> order) {
  const std::int64_t n = d.adjacency.rows;
  if (d.adjacency.rows != d.adjacency.cols)
    fail<DataError>("permute_task: the adjacency must be square (nodes x nodes), got [", d.adjacency.rows, ", ",
                    d.adjacency.cols, "]");
  if (!d.features.defined() || d.features.shape().rank() != 2 || d.features.shape()[0] != n)
    fail<DataError>("permute_task: the features ",
                    d.features.defined() ? d.features.shape().str() : std::string("(undefined)"),
                    " must be [nodes, features] with one row for each of the adjacency's ", n, " nodes");
  if (!d.labels.defined() || d.labels.numel() != n || d.labels.shape().rank() != 1)
    fail<DataError>("permute_task: the labels ",
                    d.labels.defined() ? d.labels.shape().str() : std::string("(undefined)"),
                    " must be [nodes] with one label for each of the adjacency's ", n, " nodes");
  check_order(order, n, "permute_task");
  const std::vector<std::int64_t> rank = inverse_order(order);
  NodeClassification out;
  out.adjacency = permute_csr(d.adjacency, order);
  out.features = permute_rows(d.features, order, "permute_task: features");
  out.labels = permute_rows(d.labels, order, "permute_task: labels");
  out.train = permute_ids(d.train, rank, "permute_task: train split");
  out.val = permute_ids(d.val, rank, "permute_task: validation split");
  out.test = permute_ids(d.test, rank, "permute_task: test split");
  out.classes = d.classes;
  return out;
}

// ---- breadth-first search ----------------------------------------------------

// Breadth-first search along rows (the traversal HALO's paper times, and the
// one the orderings below are built from), reusing its arrays between
// searches: a reset touches only the vertices the last search reached, so
// many small searches cost their own size, not n each.
struct BreadthFirstSearch {
  std::vector<std::int64_t> dist;   // -1: not reached by the last search
  std::vector<std::int64_t> queue;  // the vertices the last search reached, in visit order

  explicit BreadthFirstSearch(std::int64_t n) : dist(static_cast<std::size_t>(n), -1) {}

  // From source; vertices with skip[v] set (when skip is given) are not
  // entered. Returns the largest distance reached (the source's
  // eccentricity). The graph is not validated here (a search is the inner
  // loop of the orderings); pass one that passes Csr::validate().
  std::int64_t run(const Csr& g, std::int64_t source, const std::vector<char>* skip = nullptr) {
    if (g.rows != g.cols || std::int64_t(dist.size()) != g.rows)
      fail<DataError>("BreadthFirstSearch: the search was made for ", dist.size(),
                      " vertices; it needs a square adjacency of that many, got [", g.rows, ", ", g.cols, "]");
    if (source < 0 || source >= g.rows)
      fail<DataError>("BreadthFirstSearch: source ", source, " is not a vertex of the ", g.rows, "-vertex graph");
    for (std::int64_t v : queue) dist[std::size_t(v)] = -1;
    queue.clear();
    dist[std::size_t(source)] = 0;
    queue.push_back(source);
    for (std::size_t h = 0; h < queue.size(); ++h) {
      const std::int64_t v = queue[h];
      for (std::int64_t p = g.row_ptr[std::size_t(v)]; p < g.row_ptr[std::size_t(v + 1)]; ++p) {
        const std::int64_t w = g.col[std::size_t(p)];
        if (dist[std::size_t(w)] >= 0 || (skip && (*skip)[std::size_t(w)])) continue;
        dist[std::size_t(w)] = dist[std::size_t(v)] + 1;
        queue.push_back(w);
      }
    }
    return dist[std::size_t(queue.back())];
  }
};

// ---- shared pieces of the orderings -----------------------------------------

namespace reorder_detail {

inline void check_graph(const Csr& g, const char* what) {
  g.validate(what);
  if (g.rows != g.cols)
    fail<DataError>(what, ": the adjacency must be square (nodes x nodes), got [", g.rows, ", ", g.cols,
                    "]; an ordering permutes rows and columns together");
}

inline std::int64_t degree(const Csr& g, std::int64_t v) {
  return g.row_ptr[std::size_t(v + 1)] - g.row_ptr[std::size_t(v)];
}

// A pseudo-peripheral vertex of start's component among the vertices not
// skipped (George and Liu, 1979): from a vertex, search breadth-first; from
// the last level's vertex of least degree search again; keep going while the
// eccentricity grows. A few rounds suffice in practice; `rounds` bounds them.
inline std::int64_t pseudo_peripheral(const Csr& g, std::int64_t start, BreadthFirstSearch& bfs,
                                      const std::vector<char>* skip, int rounds = 8) {
  std::int64_t root = start, ecc = bfs.run(g, root, skip);
  for (int r = 0; r < rounds; ++r) {
    std::int64_t best = -1;
    for (auto it = bfs.queue.rbegin(); it != bfs.queue.rend() && bfs.dist[std::size_t(*it)] == ecc; ++it)
      if (best < 0 || degree(g, *it) < degree(g, best) || (degree(g, *it) == degree(g, best) && *it < best)) best = *it;
    const std::int64_t e = bfs.run(g, best, skip);
    if (e <= ecc) break;
    root = best;
    ecc = e;
  }
  return root;
}

// Appends to `order` a breadth-first visit from root over the vertices not
// yet placed, each vertex's unplaced neighbours in the order `before` gives
// (the Cuthill-McKee layout, with the sort key left to the caller), and
// marks them placed.
template <class Before>
void append_breadth_first(const Csr& g, std::int64_t root, std::vector<char>& placed, std::vector<std::int64_t>& order,
                          Before before) {
  std::vector<std::int64_t> fresh;
  std::size_t head = order.size();
  order.push_back(root);
  placed[std::size_t(root)] = 1;
  for (; head < order.size(); ++head) {
    const std::int64_t v = order[head];
    fresh.clear();
    for (std::int64_t p = g.row_ptr[std::size_t(v)]; p < g.row_ptr[std::size_t(v + 1)]; ++p) {
      const std::int64_t w = g.col[std::size_t(p)];
      if (placed[std::size_t(w)]) continue;
      placed[std::size_t(w)] = 1;
      fresh.push_back(w);
    }
    std::sort(fresh.begin(), fresh.end(), before);
    order.insert(order.end(), fresh.begin(), fresh.end());
  }
}

}  // namespace reorder_detail

// ---- the orderings -----------------------------------------------------------

// A seeded uniform shuffle of n vertices (Fisher-Yates).
inline std::vector<std::int64_t> random_order(std::int64_t n, std::uint64_t seed) {
  if (n < 0) fail<DataError>("random_order: negative vertex count ", n);
  std::vector<std::int64_t> order(static_cast<std::size_t>(n));
  std::iota(order.begin(), order.end(), std::int64_t(0));
  Rng rng(seed, 0x0e0d0000u);
  for (std::int64_t i = n - 1; i > 0; --i) std::swap(order[std::size_t(i)], order[rng.below(std::uint64_t(i + 1))]);
  return order;
}

// Hubs first: descending degree (entries per row), ties by old id. Packs the
// rows gathered most often together (the "hub sorting" of the reordering
// literature); it does nothing for the locality of the rest.
inline std::vector<std::int64_t> degree_order(const Csr& g) {
  reorder_detail::check_graph(g, "degree_order");
  std::vector<std::int64_t> order(std::size_t(g.rows));
  std::iota(order.begin(), order.end(), std::int64_t(0));
  std::stable_sort(order.begin(), order.end(), [&](std::int64_t x, std::int64_t y) {
    return reorder_detail::degree(g, x) > reorder_detail::degree(g, y);
  });
  return order;
}

// Reverse Cuthill-McKee (George's reversal of Cuthill and McKee, 1969): for
// each component (taken in the order of its smallest vertex id), a
// breadth-first search from a pseudo-peripheral vertex that visits each
// vertex's unvisited neighbours by increasing degree (ties by id); the whole
// visit order reversed. Keeps every edge's endpoints within a few BFS levels
// of each other, so the matrix's bandwidth is small on meshes and grids.
inline std::vector<std::int64_t> rcm_order(const Csr& g) {
  using namespace reorder_detail;
  check_graph(g, "rcm_order");
  const std::int64_t n = g.rows;
  BreadthFirstSearch bfs(n);
  std::vector<char> placed(std::size_t(n), 0);
  std::vector<std::int64_t> order;
  order.reserve(static_cast<std::size_t>(n));
  auto by_degree = [&](std::int64_t x, std::int64_t y) {
    return degree(g, x) != degree(g, y) ? degree(g, x) < degree(g, y) : x < y;
  };
  for (std::int64_t s = 0; s < n; ++s)
    if (!placed[std::size_t(s)])
      append_breadth_first(g, pseudo_peripheral(g, s, bfs, &placed), placed, order, by_degree);
  std::reverse(order.begin(), order.end());
  return order;
}


namespace reorder_detail {

// The vertices order[b, e) (those with part[v] == id) in breadth-first order
// from source, restarting at the part's next unvisited vertex (in its current
// order) whenever a component inside the part is used up. Only edges inside
// the part are followed. seen[v] == stamp marks this search's visits.
inline void part_breadth_first(const Csr& g, std::span<const std::int64_t> members, std::int64_t id,
                               std::int64_t source, const std::vector<std::int64_t>& part,
                               std::vector<std::int64_t>& seen, std::int64_t stamp, std::vector<std::int64_t>& queue) {
  queue.clear();
  std::size_t next = 0;
  auto visit = [&](std::int64_t v) {
    seen[std::size_t(v)] = stamp;
    queue.push_back(v);
  };
  visit(source);
  for (std::size_t h = 0; queue.size() < members.size(); ++h) {
    if (h == queue.size()) {  // a component of the part is done: restart
      while (seen[std::size_t(members[next])] == stamp) ++next;
      visit(members[next]);
    }
    const std::int64_t v = queue[h];
    for (std::int64_t p = g.row_ptr[std::size_t(v)]; p < g.row_ptr[std::size_t(v + 1)]; ++p) {
      const std::int64_t w = g.col[std::size_t(p)];
      if (part[std::size_t(w)] == id && seen[std::size_t(w)] != stamp) visit(w);
    }
  }
}

}  // namespace reorder_detail

// Recursive BFS bisection (level-structure bisection, the splitting step of
// George's nested dissection without its separators): a part's vertices are
// laid out breadth-first from a pseudo-peripheral vertex of the part (two
// sweeps: search from the part's first vertex, then from the last vertex that
// search reached), the first half of that layout becomes one part and the
// rest the other, and each half is bisected again until it has at most
// leaf_size vertices. The first half is a ball around one end of the part, so
// the cut between the halves is about one BFS level's edges: small on graphs
// with geometry or communities, and each level of the recursion keeps the
// vertices of a small cut's sides in contiguous id ranges.
// Simplified against the recursive graph bisection of graph compression
// (Dhulipala et al., KDD 2016, which HALO's paper adapts): no gain-based
// swapping of vertices between the halves to shrink the cut further; that
// refinement costs several passes over the edges per level.
// Cost: two breadth-first sweeps over the edges per level, log2(n / leaf_size)
// levels.
inline std::vector<std::int64_t> bisection_order(const Csr& g, std::int64_t leaf_size = 64) {
  using namespace reorder_detail;
  check_graph(g, "bisection_order");
  if (leaf_size < 1) fail<DataError>("bisection_order: leaf_size must be at least 1, got ", leaf_size);
  const std::int64_t n = g.rows;
  std::vector<std::int64_t> order(static_cast<std::size_t>(n)), part(std::size_t(n), 0), seen(std::size_t(n), -1);
  std::vector<std::int64_t> queue;
  std::iota(order.begin(), order.end(), std::int64_t(0));
  struct Segment {
    std::int64_t begin, end, id;
  };
  std::vector<Segment> todo{{0, n, 0}};
  std::int64_t next_id = 1, stamp = 0;
  while (!todo.empty()) {
    const Segment s = todo.back();
    todo.pop_back();
    if (s.end - s.begin <= leaf_size) continue;
    std::span<const std::int64_t> members(order.data() + s.begin, std::size_t(s.end - s.begin));
    part_breadth_first(g, members, s.id, members[0], part, seen, ++stamp, queue);
    const std::int64_t far = queue.back();
    part_breadth_first(g, members, s.id, far, part, seen, ++stamp, queue);
    std::copy(queue.begin(), queue.end(), order.begin() + s.begin);
    const std::int64_t mid = s.begin + (s.end - s.begin) / 2, lo = next_id++, hi = next_id++;
    for (std::int64_t k = s.begin; k < s.end; ++k) part[std::size_t(order[std::size_t(k)])] = k < mid ? lo : hi;
    todo.push_back({mid, s.end, hi});
    todo.push_back({s.begin, mid, lo});  // the first half is laid out first
  }
  return order;
}

// The harmonic centrality of each vertex, estimated from a seeded sample of
// `sources` distinct source vertices: h(v) = sum over sampled sources s != v
// reaching v of 1 / d(s, v), with d the breadth-first distance along rows
// (so a directed graph gives the in-centrality: how soon a traversal from
// elsewhere arrives at v). Proportional to the sampling estimate of
// sum over all s of 1 / d(s, v) (Marchiori and Latora's harmonic centrality);
// unreached vertices score 0. Cost: `sources` breadth-first searches.
inline std::vector<double> harmonic_centrality(const Csr& g, std::int64_t sources, std::uint64_t seed) {
  using namespace reorder_detail;
  check_graph(g, "harmonic_centrality");
  if (sources < 1) fail<DataError>("harmonic_centrality: needs at least 1 source, got ", sources);
  const std::int64_t n = g.rows;
  std::vector<double> h(std::size_t(n), 0.0);
  std::vector<std::int64_t> picked = random_order(n, seed);
  picked.resize(std::size_t(std::min(sources, n)));
  BreadthFirstSearch bfs(n);
  for (std::int64_t s : picked) {
    bfs.run(g, s);
    for (std::int64_t v : bfs.queue)
      if (bfs.dist[std::size_t(v)] > 0) h[std::size_t(v)] += 1.0 / double(bfs.dist[std::size_t(v)]);
  }
  return h;
}

struct HaloOptions {
  std::int64_t sources = 16;  // sampled breadth-first searches for the harmonic centrality
  std::uint64_t seed = 0;     // which sources are sampled
};

// HALO-style harmonic locality ordering, after Gera, Kim, Sao, Kim and Bader,
// "Traversing large graphs on GPUs with unified memory" (PVLDB 13(7), 2020).
// Their observation: a traversal from any source reaches the vertices of high
// harmonic centrality (those near everything) first and the periphery last,
// so vertices that traversals from random sources reach at about the same
// time should share pages, and an order that follows the centrality outwards
// turns each traversal's frontier into few contiguous id ranges.
// What this implements:
//   1. estimate every vertex's harmonic centrality from a sample of
//      breadth-first searches (harmonic_centrality above);
//   2. lay the vertices out breadth-first from the most central vertex,
//      appending each vertex's unplaced neighbours by descending centrality
//      (ties: higher degree, then lower id), so siblings stay together and the
//      core precedes the periphery;
//   3. when that search ends (another component, or, on a directed graph,
//      vertices it cannot reach), restart from the most central unplaced
//      vertex.
// Where this is simplified, or may differ: only the paper's abstract was at
// hand when this was written, so steps 2-3 are our reading of its idea, not a
// transcription of its algorithm. The centrality is a sampled estimate, not
// exact; and no treatment specific to directed graphs beyond following rows
// (in-centrality) and restarting on unreached vertices.
inline std::vector<std::int64_t> halo_order(const Csr& g, const HaloOptions& o = {}) {
  using namespace reorder_detail;
  check_graph(g, "halo_order");
  const std::vector<double> h = harmonic_centrality(g, o.sources, o.seed);
  auto more_central = [&](std::int64_t x, std::int64_t y) {
    if (h[std::size_t(x)] != h[std::size_t(y)]) return h[std::size_t(x)] > h[std::size_t(y)];
    if (degree(g, x) != degree(g, y)) return degree(g, x) > degree(g, y);
    return x < y;
  };
  const std::int64_t n = g.rows;
  std::vector<std::int64_t> roots(static_cast<std::size_t>(n)), order;
  std::iota(roots.begin(), roots.end(), std::int64_t(0));
  std::sort(roots.begin(), roots.end(), more_central);
  std::vector<char> placed(std::size_t(n), 0);
  order.reserve(static_cast<std::size_t>(n));
  for (std::int64_t r : roots)
    if (!placed[std::size_t(r)]) append_breadth_first(g, r, placed, order, more_central);
  return order;
}

// ---- locality measures -------------------------------------------------------

// The largest |i - j| over the entries (i, j): the matrix's bandwidth.
inline std::int64_t bandwidth(const Csr& a) {
  a.validate("bandwidth");
  std::int64_t b = 0;
  for (std::int64_t i = 0; i < a.rows; ++i)
    for (std::int64_t p = a.row_ptr[std::size_t(i)]; p < a.row_ptr[std::size_t(i + 1)]; ++p)
      b = std::max(b, std::abs(i - a.col[std::size_t(p)]));
  return b;
}

// The mean |i - j| over the entries (i, j) (0 for an empty matrix): how far,
// in ids, a row's gathers reach on average.
inline double mean_edge_gap(const Csr& a) {
  a.validate("mean_edge_gap");
  double sum = 0;
  for (std::int64_t i = 0; i < a.rows; ++i)
    for (std::int64_t p = a.row_ptr[std::size_t(i)]; p < a.row_ptr[std::size_t(i + 1)]; ++p)
      sum += double(std::abs(i - a.col[std::size_t(p)]));
  return a.nnz() > 0 ? sum / double(a.nnz()) : 0.0;
}

namespace reorder_detail {

// A cache of `capacity` pages, least recently used evicted: doubly linked
// over page numbers, so each access is O(1).
class LruPages {
 public:
  LruPages(std::int64_t pages, std::int64_t capacity)
      : prev_(std::size_t(pages), -1), next_(std::size_t(pages), -1), cached_(std::size_t(pages), 0),
        capacity_(capacity) {}
  // Touches a page; returns true when it had to be fetched.
  bool touch(std::int64_t page) {
    if (cached_[std::size_t(page)]) {
      unlink(page);
      push_front(page);
      return false;
    }
    if (size_ == capacity_) {
      const std::int64_t victim = tail_;
      unlink(victim);
      cached_[std::size_t(victim)] = 0;
      --size_;
    }
    push_front(page);
    cached_[std::size_t(page)] = 1;
    ++size_;
    return true;
  }

 private:
  void unlink(std::int64_t p) {
    const std::int64_t a = prev_[std::size_t(p)], b = next_[std::size_t(p)];
    (a >= 0 ? next_[std::size_t(a)] : head_) = b;
    (b >= 0 ? prev_[std::size_t(b)] : tail_) = a;
  }
  void push_front(std::int64_t p) {
    prev_[std::size_t(p)] = -1;
    next_[std::size_t(p)] = head_;
    (head_ >= 0 ? prev_[std::size_t(head_)] : tail_) = p;
    head_ = p;
  }
  std::vector<std::int64_t> prev_, next_;
  std::vector<char> cached_;
  std::int64_t capacity_, size_ = 0, head_ = -1, tail_ = -1;
};

}  // namespace reorder_detail

// A model, not a measurement, of the unified-memory setting HALO studies: a
// dense matrix [a.cols, row_bytes / element] lives in a slower tier and is
// fetched in pages of page_bytes into a cache of cache_pages pages, least
// recently used evicted. Replays the gathers of one SpMM over `a` (rows in
// order, as one thread runs them; entry (i, j) reads row j of the dense
// matrix, every page that row spans) and returns the pages fetched (misses).
// No prefetching, no readahead, no concurrency.
inline std::int64_t spmm_pages_fetched(const Csr& a, std::int64_t row_bytes, std::int64_t page_bytes,
                                       std::int64_t cache_pages) {
  a.validate("spmm_pages_fetched");
  if (row_bytes < 1 || page_bytes < 1 || cache_pages < 1)
    fail<DataError>("spmm_pages_fetched: row_bytes, page_bytes and cache_pages must be positive, got ", row_bytes, ", ",
                    page_bytes, " and ", cache_pages);
  const std::int64_t pages = (a.cols * row_bytes + page_bytes - 1) / page_bytes;
  reorder_detail::LruPages cache(pages, cache_pages);
  std::int64_t fetched = 0;
  for (std::int64_t j : a.col) {
    const std::int64_t first = j * row_bytes / page_bytes, last = ((j + 1) * row_bytes - 1) / page_bytes;
    for (std::int64_t q = first; q <= last; ++q) fetched += cache.touch(q);
  }
  return fetched;
}

}  // namespace frugal::data
