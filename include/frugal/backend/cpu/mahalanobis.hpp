#pragma once
// Mahalanobis distances and the Gaussian-discriminant loss
// (ops/mahalanobis.hpp), forward and backward, in f32 or f64.
//
// With L the Cholesky factor built from P and m̄ the mean of the centres, the
// kernels project once, u_n = Lᵀ(z_n − m̄) and c_k = Lᵀ(μ_k − m̄), so
// d²_nk = ||u_n − c_k||² costs O((N + K) D² + N K D) instead of N K D². The
// shift by m̄ changes no distance (they are differences) but keeps the
// projections small where the embeddings sit far from the origin, so L's
// gradient, Σ_n (z_n − m̄) du_nᵀ + Σ_k (μ_k − m̄) dc_kᵀ, does not cancel two
// large sums. (Its gradient through m̄ is zero: Σ_n du_n + Σ_k dc_k = 0.)
//
// Backward from G = dℓ/dd² [N, K]:
//   du_n = 2 Σ_k G_nk (u_n − c_k),   dz_n = L du_n
//   dc_k = −2 Σ_n G_nk (u_n − c_k),  dμ_k = L dc_k
//   dL_ij = Σ_n (z_n − m̄)_i du_nj + Σ_k (μ_k − m̄)_i dc_kj   (i ≥ j)
//   dP_ij = dL_ij (i > j), dL_ii L_ii (i = j, through exp), 0 (i < j).
// Every output element is summed by one thread in a fixed order, so the
// bits do not depend on the thread count. Scratch is a planned workspace.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <span>
#include <type_traits>

#include "../../ops/elementwise_math.hpp"
#include "../../ops/mahalanobis.hpp"
#include "../../runtime/backend.hpp"
#include "parallel.hpp"

#include "abi.hpp"

namespace frugal::cpu::inline FRUGAL_KERNEL_ABI {

// Scratch elements: L [D, D], m̄ [D], u and du [N, D], c and dc [K, D], G [N, K].
inline std::size_t mahalanobis_scratch_elements(const ops::MahalanobisDims& m) {
  return std::size_t(m.d * m.d + m.d + 2 * (m.n + m.k) * m.d + m.n * m.k);
}

// The workspace of all four ops: z is input 0; the centres are input 1, or
// input 2 after the labels for the loss ops.
template <class OpT>
std::size_t mahalanobis_workspace(const OpT&, std::span<const TensorMeta> in, std::span<const TensorMeta>) {
  constexpr bool with_labels = std::is_base_of_v<ops::MahalanobisLossBase, OpT>;
  const TensorMeta& centres = in[with_labels ? 2 : 1];
  return mahalanobis_scratch_elements(ops::mahalanobis_dims(in[0], centres)) * dtype_size(in[0].dtype);
}

template <class T>
struct MahalanobisScratch {
  T *L, *mbar, *u, *c, *du, *dc, *g;
};

template <class T>
MahalanobisScratch<T> mahalanobis_scratch(void* ws, const ops::MahalanobisDims& m) {
  T* p = static_cast<T*>(ws);
  MahalanobisScratch<T> s{};
  s.L = p, p += m.d * m.d;
  s.mbar = p, p += m.d;
  s.u = p, p += m.n * m.d;
  s.c = p, p += m.k * m.d;
  s.du = p, p += m.n * m.d;
  s.dc = p, p += m.k * m.d;
  s.g = p;
  return s;
}

// L from P; m̄; u = Lᵀ(z − m̄) and c = Lᵀ(μ − m̄).
template <class T>
void mahalanobis_project(const T* z, const T* mu, const T* P, const ops::MahalanobisDims& m,
                         const MahalanobisScratch<T>& s) {
  const std::int64_t D = m.d;
  for (std::int64_t i = 0; i < D; ++i)
    for (std::int64_t j = 0; j < D; ++j)
      s.L[i * D + j] = i > j ? P[i * D + j] : i == j ? math::exp_(P[i * D + i]) : T(0);
  for (std::int64_t j = 0; j < D; ++j) {
    T acc = 0;
    for (std::int64_t k = 0; k < m.k; ++k) acc += mu[k * D + j];
    s.mbar[j] = acc / T(m.k);
  }
  auto project = [&](const T* x, T* out) {
    for (std::int64_t j = 0; j < D; ++j) {
      T acc = 0;
      for (std::int64_t i = j; i < D; ++i) acc += s.L[i * D + j] * (x[i] - s.mbar[i]);
      out[j] = acc;
    }
  };
  parallel_for(m.n, D * D, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t n = b; n < e; ++n) project(z + n * D, s.u + n * D);
  });
  for (std::int64_t k = 0; k < m.k; ++k) project(mu + k * D, s.c + k * D);
}

// d² [N, K] = ||u_n − c_k||².
template <class T>
void mahalanobis_distances(const ops::MahalanobisDims& m, const MahalanobisScratch<T>& s, T* d2) {
  const std::int64_t D = m.d;
  parallel_for(m.n, m.k * D, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t n = b; n < e; ++n)
      for (std::int64_t k = 0; k < m.k; ++k) {
        T acc = 0;
        for (std::int64_t j = 0; j < D; ++j) {
          const T w = s.u[n * D + j] - s.c[k * D + j];
          acc += w * w;
        }
        d2[n * m.k + k] = acc;
      }
  });
}

// dz, dμ, dP from G = dℓ/dd² (see the top of this file).
template <class T>
void mahalanobis_backward(const T* z, const T* mu, const T* G, const ops::MahalanobisDims& m,
                          const MahalanobisScratch<T>& s, T* dz, T* dmu, T* dP) {
  const std::int64_t D = m.d, N = m.n, K = m.k;
  parallel_for(N, K * D + D * D, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t n = b; n < e; ++n) {
      T* du = s.du + n * D;
      for (std::int64_t j = 0; j < D; ++j) {
        T acc = 0;
        for (std::int64_t k = 0; k < K; ++k) acc += G[n * K + k] * (s.u[n * D + j] - s.c[k * D + j]);
        du[j] = T(2) * acc;
      }
      for (std::int64_t i = 0; i < D; ++i) {
        T acc = 0;
        for (std::int64_t j = 0; j <= i; ++j) acc += s.L[i * D + j] * du[j];
        dz[n * D + i] = acc;
      }
    }
  });
  parallel_for(K, N * D + D * D, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t k = b; k < e; ++k) {
      T* dc = s.dc + k * D;
      for (std::int64_t j = 0; j < D; ++j) {
        T acc = 0;
        for (std::int64_t n = 0; n < N; ++n) acc += G[n * K + k] * (s.u[n * D + j] - s.c[k * D + j]);
        dc[j] = T(-2) * acc;
      }
      for (std::int64_t i = 0; i < D; ++i) {
        T acc = 0;
        for (std::int64_t j = 0; j <= i; ++j) acc += s.L[i * D + j] * dc[j];
        dmu[k * D + i] = acc;
      }
    }
  });
  parallel_for(D, (N + K) * D, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t i = b; i < e; ++i)
      for (std::int64_t j = 0; j < D; ++j) {
        if (j > i) {
          dP[i * D + j] = T(0);
          continue;
        }
        T acc = 0;
        for (std::int64_t n = 0; n < N; ++n) acc += (z[n * D + i] - s.mbar[i]) * s.du[n * D + j];
        for (std::int64_t k = 0; k < K; ++k) acc += (mu[k * D + i] - s.mbar[i]) * s.dc[k * D + j];
        dP[i * D + j] = i == j ? acc * s.L[i * D + i] : acc;
      }
  });
}

inline void mahalanobis_distance_kernel(const ops::MahalanobisDistance&, const KernelArgs& a) {
  dispatch_float(a.in[0].dtype, "mahalanobis_distance", [&](auto tag) {
    using T = decltype(tag);
    const ops::MahalanobisDims m{a.in[0].shape->dim(0), a.in[1].shape->dim(0), a.in[0].shape->dim(1)};
    auto s = mahalanobis_scratch<T>(a.workspace, m);
    mahalanobis_project(a.in[0].as<T>(), a.in[1].as<T>(), a.in[2].as<T>(), m, s);
    mahalanobis_distances(m, s, a.out[0].as<T>());
  });
}

inline void mahalanobis_distance_grad_kernel(const ops::MahalanobisDistanceGrad&, const KernelArgs& a) {
  dispatch_float(a.in[0].dtype, "mahalanobis_distance_grad", [&](auto tag) {
    using T = decltype(tag);
    const ops::MahalanobisDims m{a.in[0].shape->dim(0), a.in[1].shape->dim(0), a.in[0].shape->dim(1)};
    auto s = mahalanobis_scratch<T>(a.workspace, m);
    const T *z = a.in[0].as<T>(), *mu = a.in[1].as<T>();
    mahalanobis_project(z, mu, a.in[2].as<T>(), m, s);
    mahalanobis_backward(z, mu, a.in[3].as<T>(), m, s, a.out[0].as<T>(), a.out[1].as<T>(), a.out[2].as<T>());
  });
}

// Calls fn(labels) typed, after checking each is in [0, K).
template <class Fn>
void with_mahalanobis_labels(const TensorRef& labels, std::int64_t n, std::int64_t k, const char* op, Fn&& fn) {
  auto run = [&](const auto* y) {
    for (std::int64_t r = 0; r < n; ++r)
      if (y[r] < 0 || y[r] >= k)
        fail<DataError>(op, ": label ", std::int64_t(y[r]), " at position ", r, " is outside [0, ", k, ") for ", k,
                        " class centres");
    fn(y);
  };
  if (labels.dtype == DType::i32) run(labels.as<std::int32_t>());
  else run(labels.as<std::int64_t>());
}

// Row n's loss from its distances d2 [K] (see ops/mahalanobis.hpp); with
// `grad`, writes dℓ_n/dd²_nk * scale there instead.
template <class T>
double mahalanobis_row(T* d2, std::int64_t K, std::int64_t y, const ops::MahalanobisLossOptions& o, T scale,
                       bool grad) {
  const T half = T(0.5), lam = T(o.likelihood_weight), alpha = T(o.margin);
  auto logit = [&](std::int64_t k) { return -half * (k == y ? T(1) + alpha : T(1)) * d2[k]; };
  T mx = logit(0);
  for (std::int64_t k = 1; k < K; ++k) mx = std::max(mx, logit(k));
  T z = 0;
  for (std::int64_t k = 0; k < K; ++k) z += math::exp_(logit(k) - mx);
  const T own = d2[y];
  if (!grad) return double(mx + math::log_(z) - logit(y) + lam * half * own);
  const T inv = T(1) / z;
  for (std::int64_t k = 0; k < K; ++k) {
    const T p = math::exp_(logit(k) - mx) * inv;
    const T s = k == y ? T(1) + alpha : T(1);
    d2[k] = scale * (-half * s * (k == y ? p - T(1) : p) + (k == y ? lam * half : T(0)));
  }
  return 0;
}

inline void mahalanobis_loss_kernel(const ops::MahalanobisLoss& op, const KernelArgs& a) {
  dispatch_float(a.in[0].dtype, "mahalanobis_loss", [&](auto tag) {
    using T = decltype(tag);
    const ops::MahalanobisDims m{a.in[0].shape->dim(0), a.in[2].shape->dim(0), a.in[0].shape->dim(1)};
    with_mahalanobis_labels(a.in[1], m.n, m.k, "mahalanobis_loss", [&](const auto* y) {
      auto s = mahalanobis_scratch<T>(a.workspace, m);
      const T* P = a.in[3].as<T>();
      mahalanobis_project(a.in[0].as<T>(), a.in[2].as<T>(), P, m, s);
      mahalanobis_distances(m, s, s.g);
      // Summed in row order in f64: deterministic at any thread count.
      double total = 0;
      for (std::int64_t n = 0; n < m.n; ++n)
        total += mahalanobis_row(s.g + n * m.k, m.k, std::int64_t(y[n]), op.options(), T(1), false);
      double logdet = 0;  // Σ_i log L_ii = Σ_i P_ii = −½ log det Σ
      for (std::int64_t i = 0; i < m.d; ++i) logdet += double(P[i * m.d + i]);
      a.out[0].as<T>()[0] = T(total / double(m.n) - op.options().likelihood_weight * logdet);
    });
  });
}

inline void mahalanobis_loss_grad_kernel(const ops::MahalanobisLossGrad& op, const KernelArgs& a) {
  dispatch_float(a.in[0].dtype, "mahalanobis_loss_grad", [&](auto tag) {
    using T = decltype(tag);
    const ops::MahalanobisDims m{a.in[0].shape->dim(0), a.in[2].shape->dim(0), a.in[0].shape->dim(1)};
    with_mahalanobis_labels(a.in[1], m.n, m.k, "mahalanobis_loss_grad", [&](const auto* y) {
      auto s = mahalanobis_scratch<T>(a.workspace, m);
      const T *z = a.in[0].as<T>(), *mu = a.in[2].as<T>(), *P = a.in[3].as<T>();
      const T dloss = a.in[4].as<T>()[0];
      mahalanobis_project(z, mu, P, m, s);
      mahalanobis_distances(m, s, s.g);
      const T scale = dloss / T(m.n);
      parallel_for(m.n, 4 * m.k, [&](std::int64_t b, std::int64_t e) {
        for (std::int64_t n = b; n < e; ++n)
          mahalanobis_row(s.g + n * m.k, m.k, std::int64_t(y[n]), op.options(), scale, true);
      });
      T* dP = a.out[2].as<T>();
      mahalanobis_backward(z, mu, s.g, m, s, a.out[0].as<T>(), a.out[1].as<T>(), dP);
      // The log-determinant term −λ Σ_i P_ii.
      for (std::int64_t i = 0; i < m.d; ++i) dP[i * m.d + i] -= T(op.options().likelihood_weight) * dloss;
    });
  });
}

}  // namespace frugal::cpu
