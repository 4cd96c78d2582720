#pragma once
// Elementwise math, written once for the host and the device. Each unary
// functor gives the value y = f(x) and the gradient dx from (x, y, dy), so a
// backward kernel never recomputes what the forward already knows. uses_x
// and uses_y say which of the two the gradient reads: the other need not
// stay alive until the backward pass.
#include <math.h>

#include "../core/hd.hpp"

namespace frugal::math {

FRUGAL_HD float exp_(float x) { return ::expf(x); }
FRUGAL_HD double exp_(double x) { return ::exp(x); }
FRUGAL_HD float log_(float x) { return ::logf(x); }
FRUGAL_HD double log_(double x) { return ::log(x); }
FRUGAL_HD float tanh_(float x) { return ::tanhf(x); }
FRUGAL_HD double tanh_(double x) { return ::tanh(x); }
FRUGAL_HD float erf_(float x) { return ::erff(x); }
FRUGAL_HD double erf_(double x) { return ::erf(x); }
FRUGAL_HD float sqrt_(float x) { return ::sqrtf(x); }
FRUGAL_HD double sqrt_(double x) { return ::sqrt(x); }

struct Relu {
  static constexpr const char* name = "relu";
  static constexpr bool uses_x = false, uses_y = true;  // y > 0 exactly where x > 0
  template <class T> FRUGAL_HD T operator()(T x) const { return x > T(0) ? x : T(0); }
  template <class T> FRUGAL_HD T grad(T, T y, T dy) const { return y > T(0) ? dy : T(0); }
};

// GELU, tanh approximation (GPT-2, PyTorch approximate="tanh").
struct GeluTanh {
  static constexpr const char* name = "gelu_tanh";
  static constexpr bool uses_x = true, uses_y = false;
  static constexpr double kA = 0.7978845608028654;  // sqrt(2/pi)
  static constexpr double kB = 0.044715;
  template <class T> FRUGAL_HD T operator()(T x) const {
    T u = T(kA) * (x + T(kB) * x * x * x);
    return T(0.5) * x * (T(1) + tanh_(u));
  }
  template <class T> FRUGAL_HD T grad(T x, T, T dy) const {
    T u = T(kA) * (x + T(kB) * x * x * x);
    T t = tanh_(u);
    T du = T(kA) * (T(1) + T(3 * kB) * x * x);
    return dy * (T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * du);
  }
};

// GELU, exact form with erf (PyTorch's default).
struct GeluErf {
  static constexpr const char* name = "gelu_erf";
  static constexpr bool uses_x = true, uses_y = false;
  template <class T> FRUGAL_HD T operator()(T x) const {
    return T(0.5) * x * (T(1) + erf_(x * T(0.7071067811865476)));
  }
  template <class T> FRUGAL_HD T grad(T x, T, T dy) const {
    T cdf = T(0.5) * (T(1) + erf_(x * T(0.7071067811865476)));
    T pdf = exp_(T(-0.5) * x * x) * T(0.3989422804014327);
    return dy * (cdf + x * pdf);
  }
};

struct Tanh {
  static constexpr const char* name = "tanh";
  static constexpr bool uses_x = false, uses_y = true;
  template <class T> FRUGAL_HD T operator()(T x) const { return tanh_(x); }
  template <class T> FRUGAL_HD T grad(T, T y, T dy) const { return dy * (T(1) - y * y); }
};

struct Sigmoid {
  static constexpr const char* name = "sigmoid";
  static constexpr bool uses_x = false, uses_y = true;
  // Split by sign so neither branch overflows exp.
  template <class T> FRUGAL_HD T operator()(T x) const {
    if (x >= T(0)) return T(1) / (T(1) + exp_(-x));
    T e = exp_(x);
    return e / (T(1) + e);
  }
  template <class T> FRUGAL_HD T grad(T, T y, T dy) const { return dy * y * (T(1) - y); }
};

struct Exp {
  static constexpr const char* name = "exp";
  static constexpr bool uses_x = false, uses_y = true;
  template <class T> FRUGAL_HD T operator()(T x) const { return exp_(x); }
  template <class T> FRUGAL_HD T grad(T, T y, T dy) const { return dy * y; }
};

struct Log {
  static constexpr const char* name = "log";
  static constexpr bool uses_x = true, uses_y = false;
  template <class T> FRUGAL_HD T operator()(T x) const { return log_(x); }
  template <class T> FRUGAL_HD T grad(T x, T, T dy) const { return dy / x; }
};

// 1/sqrt(x), for normalisations (layer norm composed from primitives).
struct Rsqrt {
  static constexpr const char* name = "rsqrt";
  static constexpr bool uses_x = false, uses_y = true;
  template <class T> FRUGAL_HD T operator()(T x) const { return T(1) / sqrt_(x); }
  template <class T> FRUGAL_HD T grad(T, T y, T dy) const { return T(-0.5) * y * y * y * dy; }
};

// y = a*x + b, with constants a and b carried by the op.
struct Affine {
  static constexpr const char* name = "affine";
  static constexpr bool uses_x = false, uses_y = false;
  double a = 1, b = 0;
  template <class T> FRUGAL_HD T operator()(T x) const { return T(a) * x + T(b); }
  template <class T> FRUGAL_HD T grad(T, T, T dy) const { return T(a) * dy; }
};

struct Add {
  static constexpr const char* name = "add";
  template <class T> FRUGAL_HD T operator()(T a, T b) const { return a + b; }
};
struct Sub {
  static constexpr const char* name = "sub";
  template <class T> FRUGAL_HD T operator()(T a, T b) const { return a - b; }
};
struct Mul {
  static constexpr const char* name = "mul";
  template <class T> FRUGAL_HD T operator()(T a, T b) const { return a * b; }
};
struct Div {
  static constexpr const char* name = "div";
  template <class T> FRUGAL_HD T operator()(T a, T b) const { return a / b; }
};

}  // namespace frugal::math
