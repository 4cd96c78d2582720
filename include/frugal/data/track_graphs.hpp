#pragma once
// A synthetic particle-tracking dataset, generated here (no download): events
// of charged particles crossing a barrel detector, as graphs for
// Exa.TrkX-style edge classification. Its point is the irregular, heavy-
// tailed graph sizes of real events, which make batch memory swing.
//
// The generator, for event i of TrackGraphOptions o (all randomness from
// Rng(o.seed, stream i), so event i is the same whatever the event count):
//   - particles: round(exp(N(ln o.median_particles, o.sigma))), clipped to
//     [o.min_particles, o.max_particles]: log-normal, so a few events are
//     tens of times the median one.
//   - each particle: charge ±1, transverse momentum pT log-uniform in
//     [o.min_pt, o.max_pt], direction phi0 uniform in [-pi, pi), pseudo-
//     rapidity eta uniform in [-o.max_eta, o.max_eta], origin z0 ~ N(0, o.z0_sigma).
//     Its track is a helix from the beam line in a solenoid field: at radius
//     r it sits at phi = phi0 + charge * asin(r / (2 R)) with R = pT /
//     o.curvature (a particle whose 2 R is under r curls up before layer r
//     and leaves no further hits), and at z = z0 + r sinh(eta).
//   - hits: one per layer l (radius 1 + l, l < o.layers) the track reaches,
//     kept with probability o.efficiency, its phi smeared by N(0, o.phi_noise).
//     Node features [r / layers, phi / pi, z / z_scale] (f32).
//   - candidate edges: hit a on layer l to hit b on layer l + 1 (directed
//     outward) when |phi_b - phi_a| (wrapped) < o.phi_window and |z_b / r_b
//     - z_a / r_a| < o.slope_window. Edge features [dphi, dz / z_scale,
//     d(z/r)] (f32). Edge label 1 when a and b are hits of one particle,
//     else 0: most candidates are fakes, as in real events.
#include <algorithm>
#include <cmath>
#include <numbers>
#include <vector>

#include "../core/error.hpp"
#include "../core/rng.hpp"
#include "graph_batch.hpp"

namespace frugal::data {

struct TrackGraphOptions {
  std::int64_t events = 200;
  std::uint64_t seed = 19;
  double median_particles = 20, sigma = 1.0;
  std::int64_t min_particles = 2, max_particles = 500;
  std::int64_t layers = 8;
  double min_pt = 0.5, max_pt = 20, curvature = 0.1;
  double max_eta = 2.0, z0_sigma = 0.3, z_scale = 30;
  double efficiency = 0.95, phi_noise = 0.002;
  double phi_window = 0.3, slope_window = 0.6;
};

// One event as a graph (see the header comment).
inline GraphSample track_event(const TrackGraphOptions& o, std::int64_t event) {
  constexpr double pi = std::numbers::pi;
  Rng r(o.seed, 0x7ac0000u + std::uint64_t(event));
  const double ln_n = std::log(o.median_particles) + o.sigma * r.normal();
  const auto particles =
      std::clamp<std::int64_t>(std::int64_t(std::llround(std::exp(std::min(ln_n, 30.0)))), o.min_particles, o.max_particles);
  struct Hit {
    double r, phi, z;
    std::int64_t particle;
  };
  std::vector<std::vector<Hit>> by_layer(std::size_t(o.layers));
  for (std::int64_t p = 0; p < particles; ++p) {
    const double charge = r.uniform() < 0.5 ? -1.0 : 1.0;
    const double pt = o.min_pt * std::exp(r.uniform() * std::log(o.max_pt / o.min_pt));
    const double phi0 = r.uniform(-pi, pi), eta = r.uniform(-o.max_eta, o.max_eta), z0 = o.z0_sigma * r.normal();
    const double radius = pt / o.curvature;
    for (std::int64_t l = 0; l < o.layers; ++l) {
      const double rl = double(1 + l);
      if (rl > 2 * radius) break;  // curled up inside this layer
      const double eff = r.uniform(), noise = o.phi_noise * r.normal();
      if (eff >= o.efficiency) continue;
      double phi = phi0 + charge * std::asin(rl / (2 * radius)) + noise;
      phi = std::remainder(phi, 2 * pi);  // back into [-pi, pi]
      by_layer[std::size_t(l)].push_back({rl, phi, z0 + rl * std::sinh(eta), p});
    }
  }
  GraphSample g;
  std::vector<std::int64_t> first(std::size_t(o.layers) + 1, 0);
  for (std::int64_t l = 0; l < o.layers; ++l)
    first[std::size_t(l + 1)] = first[std::size_t(l)] + std::int64_t(by_layer[std::size_t(l)].size());
  const std::int64_t n = first.back();
  g.x = Tensor({n, 3});
  float* x = g.x.data<float>();
  for (std::int64_t l = 0; l < o.layers; ++l)
    for (std::size_t k = 0; k < by_layer[std::size_t(l)].size(); ++k) {
      const Hit& h = by_layer[std::size_t(l)][k];
      float* row = x + (first[std::size_t(l)] + std::int64_t(k)) * 3;
      row[0] = float(h.r / double(o.layers));
      row[1] = float(h.phi / pi);
      row[2] = float(h.z / o.z_scale);
    }
  std::vector<float> attr;
  std::vector<std::int32_t> label;
  for (std::int64_t l = 0; l + 1 < o.layers; ++l) {
    const auto &in = by_layer[std::size_t(l)], &out = by_layer[std::size_t(l + 1)];
    for (std::size_t a = 0; a < in.size(); ++a)
      for (std::size_t b = 0; b < out.size(); ++b) {
        const double dphi = std::remainder(out[b].phi - in[a].phi, 2 * pi);
        const double dslope = out[b].z / out[b].r - in[a].z / in[a].r;
        if (std::abs(dphi) >= o.phi_window || std::abs(dslope) >= o.slope_window) continue;
        g.src.push_back(first[std::size_t(l)] + std::int64_t(a));
        g.dst.push_back(first[std::size_t(l + 1)] + std::int64_t(b));
        attr.insert(attr.end(), {float(dphi), float((out[b].z - in[a].z) / o.z_scale), float(dslope)});
        label.push_back(in[a].particle == out[b].particle ? 1 : 0);
      }
  }
  const auto e = std::int64_t(label.size());
  g.edge_attr = Tensor::from(attr, {e, 3});
  g.edge_label = Tensor::from(label, {e});
  return g;
}

// o.events events (see the header comment).
inline std::vector<GraphSample> track_graphs(const TrackGraphOptions& o = {}) {
  if (o.events < 1 || o.layers < 2 || o.median_particles <= 0 || o.min_particles < 1 ||
      o.max_particles < o.min_particles || !(o.min_pt > 0) || !(o.max_pt >= o.min_pt) || !(o.curvature > 0) ||
      !(o.efficiency > 0 && o.efficiency <= 1))
    fail<DataError>("track_graphs: needs events >= 1, layers >= 2, median_particles > 0, 1 <= min_particles <= "
                    "max_particles, 0 < min_pt <= max_pt, curvature > 0 and efficiency in (0, 1]; got events ",
                    o.events, ", layers ", o.layers, ", particles ", o.min_particles, "..", o.max_particles,
                    " (median ", o.median_particles, "), pt ", o.min_pt, "..", o.max_pt, ", curvature ", o.curvature,
                    ", efficiency ", o.efficiency);
  std::vector<GraphSample> out;
  out.reserve(std::size_t(o.events));
  for (std::int64_t i = 0; i < o.events; ++i) out.push_back(track_event(o, i));
  return out;
}

}  // namespace frugal::data
