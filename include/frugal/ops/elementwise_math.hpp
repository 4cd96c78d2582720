#pragma once
// Elementwise math, written once for the host and the device. Each unary
// functor gives the value y = f(x) and the gradient dx from (x, y, dy), so a
// backward kernel never recomputes what the forward already knows. uses_x
// and uses_y say which of the two the gradient reads: the other need not
// stay alive until the backward pass.
#include <math.h>

#include <type_traits>

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
FRUGAL_HD float sin_(float x) { return ::sinf(x); }
FRUGAL_HD double sin_(double x) { return ::sin(x); }
FRUGAL_HD float cos_(float x) { return ::cosf(x); }
FRUGAL_HD double cos_(double x) { return ::cos(x); }
FRUGAL_HD float pow_(float x, float p) { return ::powf(x, p); }
FRUGAL_HD double pow_(double x, double p) { return ::pow(x, p); }
FRUGAL_HD float log1p_(float x) { return ::log1pf(x); }
FRUGAL_HD double log1p_(double x) { return ::log1p(x); }
FRUGAL_HD float fabs_(float x) { return ::fabsf(x); }
FRUGAL_HD double fabs_(double x) { return ::fabs(x); }

// NaN semantics follow PyTorch: NaN in gives NaN out wherever PyTorch
// propagates it. std::max/fmax and `a > b ? a : b` drop a NaN; these keep
// it (a NaN operand wins), and still compile to branch-free selects.
template <class T> FRUGAL_HD T max_nan(T a, T b) { return (a > b || a != a) ? a : b; }
template <class T> FRUGAL_HD T min_nan(T a, T b) { return (a < b || a != a) ? a : b; }

// Evaluations of exp, log, tanh, erf and the like per element of a
// functor's value and of its gradient (Cost::transcendentals); 0 where it
// declares none.
// (A C++17 trait: nvcc compiles this header for the CUDA kernels too.)
template <class F, class = void>
struct TranscendentalsOf {
  static constexpr double value = 0, grad = 0;
};
template <class F>
struct TranscendentalsOf<F, std::void_t<decltype(F::transcendentals)>> {
  static constexpr double value = F::transcendentals, grad = F::grad_transcendentals;
};
template <class F>
constexpr double transcendentals_of() {
  return TranscendentalsOf<F>::value;
}
template <class F>
constexpr double grad_transcendentals_of() {
  return TranscendentalsOf<F>::grad;
}

struct Relu {
  static constexpr const char* name = "relu";
  static constexpr bool uses_x = false, uses_y = true;  // y > 0 exactly where x > 0, y is NaN where x is
  // relu(NaN) = NaN, as PyTorch's clamp_min(x, 0); the gradient is zero
  // only where y <= 0 (PyTorch's threshold_backward), so dy passes at NaN.
  template <class T> FRUGAL_HD T operator()(T x) const { return x <= T(0) ? T(0) : x; }
  template <class T> FRUGAL_HD T grad(T, T y, T dy) const { return y <= T(0) ? T(0) : dy; }
};

// GELU, tanh approximation (GPT-2, PyTorch approximate="tanh").
struct GeluTanh {
  static constexpr const char* name = "gelu_tanh";
  static constexpr bool uses_x = true, uses_y = false;
  static constexpr double transcendentals = 1, grad_transcendentals = 1;  // Cost::transcendentals
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
  static constexpr double transcendentals = 1, grad_transcendentals = 2;  // Cost::transcendentals
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
  static constexpr double transcendentals = 1, grad_transcendentals = 0;  // Cost::transcendentals
  template <class T> FRUGAL_HD T operator()(T x) const { return tanh_(x); }
  template <class T> FRUGAL_HD T grad(T, T y, T dy) const { return dy * (T(1) - y * y); }
};

struct Sigmoid {
  static constexpr const char* name = "sigmoid";
  static constexpr bool uses_x = false, uses_y = true;
  static constexpr double transcendentals = 1, grad_transcendentals = 0;  // Cost::transcendentals
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
  static constexpr double transcendentals = 1, grad_transcendentals = 0;  // Cost::transcendentals
  template <class T> FRUGAL_HD T operator()(T x) const { return exp_(x); }
  template <class T> FRUGAL_HD T grad(T, T y, T dy) const { return dy * y; }
};

struct Log {
  static constexpr const char* name = "log";
  static constexpr bool uses_x = true, uses_y = false;
  static constexpr double transcendentals = 1, grad_transcendentals = 0;  // Cost::transcendentals
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

// ---- issue 14: more unary math, each with PyTorch's gradient ---------------

// |x|; dx = sgn(x) dy with sgn(0) = 0 and, as torch.sign, sgn(NaN) = 0.
struct Abs {
  static constexpr const char* name = "abs";
  static constexpr bool uses_x = true, uses_y = false;
  template <class T> FRUGAL_HD T operator()(T x) const { return fabs_(x); }
  template <class T> FRUGAL_HD T grad(T x, T, T dy) const {
    return x > T(0) ? dy : x < T(0) ? -dy : T(0);
  }
};

// dx = dy / (2 sqrt(x)): inf at 0 and NaN below, as PyTorch.
struct Sqrt {
  static constexpr const char* name = "sqrt";
  static constexpr bool uses_x = false, uses_y = true;
  template <class T> FRUGAL_HD T operator()(T x) const { return sqrt_(x); }
  template <class T> FRUGAL_HD T grad(T, T y, T dy) const { return dy / (T(2) * y); }
};

struct Square {
  static constexpr const char* name = "square";
  static constexpr bool uses_x = true, uses_y = false;
  template <class T> FRUGAL_HD T operator()(T x) const { return x * x; }
  template <class T> FRUGAL_HD T grad(T x, T, T dy) const { return T(2) * x * dy; }
};

struct Sin {
  static constexpr const char* name = "sin";
  static constexpr bool uses_x = true, uses_y = false;
  static constexpr double transcendentals = 1, grad_transcendentals = 1;  // Cost::transcendentals
  template <class T> FRUGAL_HD T operator()(T x) const { return sin_(x); }
  template <class T> FRUGAL_HD T grad(T x, T, T dy) const { return dy * cos_(x); }
};

struct Cos {
  static constexpr const char* name = "cos";
  static constexpr bool uses_x = true, uses_y = false;
  static constexpr double transcendentals = 1, grad_transcendentals = 1;  // Cost::transcendentals
  template <class T> FRUGAL_HD T operator()(T x) const { return cos_(x); }
  template <class T> FRUGAL_HD T grad(T x, T, T dy) const { return -dy * sin_(x); }
};

// x ** p for a constant p. dx = p x^(p-1) dy, and exactly 0 when p == 0
// (PyTorch's pow_backward: the gradient of the constant 1, even at NaN).
struct Pow {
  static constexpr const char* name = "pow";
  static constexpr bool uses_x = true, uses_y = false;
  static constexpr double transcendentals = 2, grad_transcendentals = 2;  // Cost::transcendentals
  double p = 1;
  template <class T> FRUGAL_HD T operator()(T x) const { return pow_(x, T(p)); }
  template <class T> FRUGAL_HD T grad(T x, T, T dy) const {
    return p == 0 ? T(0) : T(p) * pow_(x, T(p - 1)) * dy;
  }
};

// min(max(x, lo), hi) (so hi wins when lo > hi, as torch.clamp); a missing
// bound is +-inf. NaN stays NaN. The gradient passes where lo <= x <= hi and
// is 0 elsewhere, NaN included (PyTorch's clamp_backward).
struct Clamp {
  static constexpr const char* name = "clamp";
  static constexpr bool uses_x = true, uses_y = false;
  double lo = -HUGE_VAL, hi = HUGE_VAL;
  template <class T> FRUGAL_HD T operator()(T x) const {
    T y = x < T(lo) ? T(lo) : x;
    return y > T(hi) ? T(hi) : y;
  }
  template <class T> FRUGAL_HD T grad(T x, T, T dy) const { return (x >= T(lo) && x <= T(hi)) ? dy : T(0); }
};

// smooth_l1 of a difference d: 0.5 d^2 / beta where |d| < beta, else
// |d| - 0.5 beta. The gradient is PyTorch's kernel's: -1 for d <= -beta,
// 1 for d >= beta, d / beta between. (beta == 0 is l1, see ops/losses.hpp.)
struct SmoothL1 {
  static constexpr const char* name = "smooth_l1";
  static constexpr bool uses_x = true, uses_y = false;
  double beta = 1;
  template <class T> FRUGAL_HD T operator()(T d) const {
    T z = fabs_(d);
    return z < T(beta) ? T(0.5) * d * d / T(beta) : z - T(0.5 * beta);
  }
  template <class T> FRUGAL_HD T grad(T d, T, T dy) const {
    return d <= T(-beta) ? -dy : d >= T(beta) ? dy : d / T(beta) * dy;
  }
};

// huber of a difference d: 0.5 d^2 where |d| < delta, else
// delta (|d| - 0.5 delta); gradient clipped to [-delta, delta] (PyTorch's).
struct Huber {
  static constexpr const char* name = "huber";
  static constexpr bool uses_x = true, uses_y = false;
  double delta = 1;
  template <class T> FRUGAL_HD T operator()(T d) const {
    T z = fabs_(d);
    return z < T(delta) ? T(0.5) * d * d : T(delta) * (z - T(0.5 * delta));
  }
  template <class T> FRUGAL_HD T grad(T d, T, T dy) const {
    return d <= T(-delta) ? T(-delta) * dy : d >= T(delta) ? T(delta) * dy : d * dy;
  }
};

// log(1 + exp(z)) without overflow: max(z, 0) + log1p(exp(-|z|)); the
// gradient is sigmoid(z). The stable core of binary_cross_entropy_with_logits
// (no threshold: this is not torch's softplus, which turns linear above 20).
struct Log1pExp {
  static constexpr const char* name = "log1p_exp";
  static constexpr bool uses_x = true, uses_y = false;
  static constexpr double transcendentals = 2, grad_transcendentals = 1;  // Cost::transcendentals
  template <class T> FRUGAL_HD T operator()(T z) const { return max_nan(z, T(0)) + log1p_(exp_(-fabs_(z))); }
  template <class T> FRUGAL_HD T grad(T z, T, T dy) const {
    if (z >= T(0)) return dy / (T(1) + exp_(-z));
    T e = exp_(z);
    return dy * e / (T(1) + e);
  }
};

// ---- elementwise binary: torch.maximum / torch.minimum ---------------------

// NaN-propagating, as torch.maximum.
struct Maximum {
  static constexpr const char* name = "maximum";
  template <class T> FRUGAL_HD T operator()(T a, T b) const { return max_nan(a, b); }
};
struct Minimum {
  static constexpr const char* name = "minimum";
  template <class T> FRUGAL_HD T operator()(T a, T b) const { return min_nan(a, b); }
};
// The share of maximum(a, b)'s gradient that goes to a: 1 where a > b, 0
// where a < b, 0.5 where they tie, and 1 where either is NaN (PyTorch:
// where(a == b, g/2, g).masked_fill_(a < b, 0)). b's share is
// MaxShare(b, a); minimum's shares are MaxShare(b, a) for a and
// MaxShare(a, b) for b.
struct MaxShare {
  static constexpr const char* name = "max_share";
  template <class T> FRUGAL_HD T operator()(T a, T b) const { return a == b ? T(0.5) : a < b ? T(0) : T(1); }
};

}  // namespace frugal::math
