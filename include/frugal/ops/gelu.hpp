#pragma once
// The exact (erf) GELU of PyTorch's nn.GELU() / F.gelu, with math the
// compiler vectorises: in f32, erf and exp are branch-free polynomials (no
// libm calls), so a plain loop over them becomes SIMD code without
// -ffast-math; in f64 they are libm's. The transformer layers use it; it is
// the same function as gelu(x, false), to f32 rounding (erf within 4 ulp).
#include <string.h>

#include "unary.hpp"

namespace frugal::math {

// c ? a : b on the bits. GCC does not if-convert a floating-point select
// under its default -ftrapping-math, which keeps a loop with one from being
// vectorised; an integer mask select vectorises.
FRUGAL_HD float select_bits(bool c, float a, float b) {
  int ai, bi;
  memcpy(&ai, &a, sizeof ai);
  memcpy(&bi, &b, sizeof bi);
  const int m = -int(c);
  const int ri = (ai & m) | (bi & ~m);
  float r;
  memcpy(&r, &ri, sizeof r);
  return r;
}
// min(max(x, lo), hi); NaN stays NaN.
FRUGAL_HD float clamp_bits(float x, float lo, float hi) { return select_bits(x < lo, lo, select_bits(x > hi, hi, x)); }

// erf(x) = x P(x^2) / Q(x^2) on [-4, 4] (and +-1 beyond, where erf rounds
// to +-1 in f32): the rational approximation Eigen and XLA use for f32.
// Largest error against erf, over [-6, 6]: 4.5e-7 absolute (4 ulp of 1).
FRUGAL_HD float erf_poly(float x) {
  x = clamp_bits(x, -4.0f, 4.0f);
  const float x2 = x * x;
  float p = -2.72614225801306e-10f;
  p = p * x2 + 2.77068142495902e-08f;
  p = p * x2 + -2.10102402082508e-06f;
  p = p * x2 + -5.69250639462346e-05f;
  p = p * x2 + -7.34990630326855e-04f;
  p = p * x2 + -2.95459980854025e-03f;
  p = p * x2 + -1.60960333262415e-02f;
  float q = -1.45660718464996e-05f;
  q = q * x2 + -2.13374055278905e-04f;
  q = q * x2 + -1.68282697438203e-03f;
  q = q * x2 + -7.37332916720468e-03f;
  q = q * x2 + -1.42647390514189e-02f;
  return x * p / q;
}
FRUGAL_HD double erf_poly(double x) { return erf_(x); }

// exp(x): Cody-Waite reduction by ln 2, Cephes' degree-6 expf polynomial,
// the power of two built in the exponent bits. Within 2 ulp of exp; exactly
// 0 below -87.34 (where exp leaves the normal floats), NaN stays NaN.
FRUGAL_HD float exp_poly(float x) {
  const float lo = -87.33654475f, hi = 88.37626266f;
  const float xc = clamp_bits(x, lo, hi);
  const float r = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // round(x / ln 2)
  const float g = (xc - r * 0.693359375f) - r * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * g + 1.3981999507e-3f;
  p = p * g + 8.3334519073e-3f;
  p = p * g + 4.1665795894e-2f;
  p = p * g + 1.6666665459e-1f;
  p = p * g + 5.0000001201e-1f;
  p = p * g * g + g + 1.0f;
  const int bits = int(r) * (1 << 23) + (127 << 23);
  float scale;
  memcpy(&scale, &bits, sizeof scale);
  return select_bits(x < lo, 0.0f, p * scale);
}
FRUGAL_HD double exp_poly(double x) { return exp_(x); }

// 0.5 x (1 + erf(x / sqrt 2)); dx = dy (Phi(x) + x phi(x)).
struct GeluErfPoly {
  static constexpr const char* name = "gelu";
  static constexpr bool uses_x = true, uses_y = false;
  static constexpr double transcendentals = 1, grad_transcendentals = 2;  // erf; erf and exp
  template <class T>
  FRUGAL_HD T operator()(T x) const {
    return T(0.5) * x * (T(1) + erf_poly(x * T(0.7071067811865476)));
  }
  template <class T>
  FRUGAL_HD T grad(T x, T, T dy) const {
    const T cdf = T(0.5) * (T(1) + erf_poly(x * T(0.7071067811865476)));
    const T pdf = exp_poly(T(-0.5) * x * x) * T(0.3989422804014327);
    return dy * (cdf + x * pdf);
  }
};

}  // namespace frugal::math

namespace frugal {
// Exact GELU (PyTorch's default), vectorised in f32; see gelu(x, false).
inline Var gelu_erf_poly(Var x) { return apply1<ops::Unary<math::GeluErfPoly>>({x}); }
}  // namespace frugal
