#pragma once
// The op-test harness. For one op case it
//   1. draws inputs from frugal::Rng with a seed fixed by the case's name
//      (never zero; strictly positive or bounded away from zero where the
//      op needs it; integer labels in range),
//   2. FORWARD: runs the op through frugal in f32 and in f64 and compares
//      both against the float64 reference in reference.hpp,
//   3. BACKWARD: builds L = sum(op(inputs...) * R) for a fixed random R of
//      the output's shape, takes frugal's analytic gradient for every
//      floating input (f64 and f32 steps) and compares it with central
//      finite differences of the f64 step's loss.
// Inputs are frugal::Tensors bound into the capture with persistent_var.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <functional>
#include <limits>
#include <sstream>
#include <string>
#include <typeinfo>
#include <vector>

#include <frugal/frugal.hpp>

#include "reference.hpp"
#include "thread_count_scope.hpp"

namespace optest {

// ---- tolerances ----------------------------------------------------------
// Inputs are drawn as float-representable doubles, so the f32 and f64 runs
// see identical inputs and one f64 reference serves both.
//
// f64 forward: the reference and the kernel differ only in summation order
// and libm rounding, a few ulp on values of size ~1-10.
constexpr double kF64ForwardTol = 1e-12;  // |y - ref| <= 1e-12 * (1 + |ref|)
// f32 forward: f32 epsilon is 6e-8; the largest accumulation in these cases
// (a dot product of <= 7 terms of size <= 1) stays below ~4e-6 absolute.
// A case with longer accumulations can widen this with Case::f32_scale.
constexpr double kF32ForwardTol = 1e-5;  // |y - ref| <= 1e-5 * (1 + |ref|) * f32_scale
// Central differences on the f64 step: truncation ~h^2 |L'''| ~ 1e-12 and
// rounding ~eps |L| / h ~ 1e-9 for |L| ~ 10, so 1e-6 leaves ~1000x margin
// while a wrong gradient (a missing term, a wrong sign or factor) is off by
// O(0.1) or more.
constexpr double kFdStep = 1e-6;
constexpr double kF64GradTol = 1e-6;  // |g - fd| <= 1e-6 * (1 + |fd|)
// The f32 step's analytic gradient against the same f64 differences: a
// backward chain of a few f32 ops on values of size ~1-10.
constexpr double kF32GradTol = 5e-5;  // |g - fd| <= 5e-5 * (1 + |fd|) * f32_scale

// ---- inputs --------------------------------------------------------------

enum class Draw {
  signed_unit,  // sign * (0.1 + 0.9 u): |x| in [0.1, 1)
  wide,         // sign * (0.1 + 4.9 u): |x| in [0.1, 5), for saturating ops
  positive,     // 0.2 + 1.8 u, for log
  denominator,  // sign * (0.5 + 1.5 u): |x| in [0.5, 2), for div
  labels,       // integers in [0, classes)
};

struct In {
  ref::Dims shape;
  Draw draw = Draw::signed_unit;
  std::int64_t classes = 0;
  frugal::DType label_dtype = frugal::DType::i32;
  bool is_labels() const { return draw == Draw::labels; }
};

inline In x(ref::Dims s) { return {std::move(s), Draw::signed_unit}; }
inline In wide(ref::Dims s) { return {std::move(s), Draw::wide}; }
inline In pos(ref::Dims s) { return {std::move(s), Draw::positive}; }
inline In den(ref::Dims s) { return {std::move(s), Draw::denominator}; }
inline In labels(ref::Dims s, std::int64_t classes, frugal::DType dt = frugal::DType::i32) {
  return {std::move(s), Draw::labels, classes, dt};
}

using Vars = std::vector<frugal::Var>;
using Arrays = std::vector<ref::Array>;
using BuildFn = std::function<frugal::Var(const Vars&)>;
using RefFn = std::function<ref::Array(const Arrays&)>;

struct Case {
  std::string name;
  std::vector<In> inputs;
  BuildFn build;      // the op through frugal
  RefFn reference;    // the same op through reference.hpp
  double f32_scale = 1;  // widens the f32 tolerances (forward and gradient)
};

// ---- helpers -------------------------------------------------------------

inline std::uint64_t seed_of(const std::string& name) {  // FNV-1a
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned char c : name) h = (h ^ c) * 1099511628211ull;
  return h;
}

inline double draw_one(frugal::Rng& rng, const In& in) {
  if (in.is_labels()) return double(rng.below(std::uint64_t(in.classes)));
  double u = rng.uniform();
  double sign = rng.uniform() < 0.5 ? -1.0 : 1.0;
  double v = 0;
  switch (in.draw) {
    case Draw::signed_unit: v = sign * (0.1 + 0.9 * u); break;
    case Draw::wide: v = sign * (0.1 + 4.9 * u); break;
    case Draw::positive: v = 0.2 + 1.8 * u; break;
    case Draw::denominator: v = sign * (0.5 + 1.5 * u); break;
    case Draw::labels: break;
  }
  return double(float(v));  // representable in f32: both dtypes see the same input
}

inline ref::Array draw_array(frugal::Rng& rng, const In& in) {
  ref::Array a = ref::zeros(in.shape);
  for (auto& e : a.v) e = draw_one(rng, in);
  return a;
}

inline frugal::Tensor to_tensor(const ref::Array& a, frugal::DType dt) {
  frugal::Tensor t{frugal::Shape(a.shape), dt};
  for (std::size_t i = 0; i < a.v.size(); ++i) {
    switch (dt) {
      case frugal::DType::f32: t.data<float>()[i] = float(a.v[i]); break;
      case frugal::DType::f64: t.data<double>()[i] = a.v[i]; break;
      case frugal::DType::i32: t.data<std::int32_t>()[i] = std::int32_t(a.v[i]); break;
      case frugal::DType::i64: t.data<std::int64_t>()[i] = std::int64_t(a.v[i]); break;
      default: FAIL("op harness: unsupported dtype " << frugal::dtype_name(dt));
    }
  }
  return t;
}

inline std::vector<double> to_doubles(const frugal::Tensor& t) {
  std::vector<double> out(std::size_t(t.numel()));
  for (std::size_t i = 0; i < out.size(); ++i)
    out[i] = t.dtype() == frugal::DType::f32 ? double(t.data<float>()[i]) : t.data<double>()[i];
  return out;
}

inline std::string idx_str(std::size_t flat, const ref::Dims& shape) {
  return shape.empty() ? "[]" : ref::str(ref::unravel(std::int64_t(flat), shape));
}

// One CHECK per comparison: passes when every element is within
// tol * (1 + |want|); on failure reports the worst element and how many fail.
inline void expect_close(const std::string& what, const std::vector<double>& got, const std::vector<double>& want,
                         const ref::Dims& shape, double tol) {
  REQUIRE(got.size() == want.size());
  std::size_t worst = 0, failing = 0;
  double worst_ratio = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    double err = std::abs(got[i] - want[i]);
    double ratio = std::isfinite(got[i]) ? err / (tol * (1 + std::abs(want[i]))) : std::numeric_limits<double>::infinity();
    if (!(ratio <= 1)) ++failing;
    if (!(ratio <= worst_ratio)) {
      worst_ratio = ratio;
      worst = i;
    }
  }
  if (std::getenv("FRUGAL_OPTEST_VERBOSE"))
    std::printf("%-60s worst err/tol %.3g\n", what.c_str(), worst_ratio);
  std::ostringstream os;
  os.precision(17);
  if (!got.empty())
    os << what << ": " << failing << " of " << got.size() << " elements out of tolerance; worst at "
       << idx_str(worst, shape) << ": got " << got[worst] << ", want " << want[worst] << " (|err| "
       << std::abs(got[worst] - want[worst]) << ", allowed " << tol * (1 + std::abs(want[worst])) << ")";
  INFO(os.str());
  CHECK(failing == 0);
}

// Binds the case's input tensors as persistent values of the capture in
// progress: floating inputs as parameters, labels as (non-trained) state.
inline Vars bind_inputs(const Case& c, const std::vector<frugal::Tensor>& ts) {
  Vars vs;
  for (std::size_t i = 0; i < ts.size(); ++i) {
    std::string name = "x";
    name += std::to_string(i);
    vs.push_back(frugal::persistent_var(
        ts[i], c.inputs[i].is_labels() ? frugal::ValueKind::state : frugal::ValueKind::parameter, name));
  }
  return vs;
}

inline std::vector<frugal::Tensor> make_inputs(const Case& c, const Arrays& vals, frugal::DType dt) {
  std::vector<frugal::Tensor> ts;
  for (std::size_t i = 0; i < vals.size(); ++i)
    ts.push_back(to_tensor(vals[i], c.inputs[i].is_labels() ? c.inputs[i].label_dtype : dt));
  return ts;
}

// The options every step the harness compiles uses (a test may pick the CPU
// backend's convolution engine through them, say).
inline frugal::CompileOptions& harness_options() {
  static frugal::CompileOptions o;
  return o;
}

// Forward through frugal in dtype dt; returns the output tensor.
inline frugal::Tensor run_forward(const Case& c, const Arrays& vals, frugal::DType dt) {
  std::vector<frugal::Tensor> ts = make_inputs(c, vals, dt);
  frugal::Step step = frugal::compile_inference([&] { return c.build(bind_inputs(c, ts)); }, {}, {}, harness_options());
  step.run();
  return step.output(0).clone();
}

struct GradRun {
  double loss = 0;
  std::vector<std::vector<double>> grads;  // one per floating input, in order
  std::vector<std::vector<double>> fd;     // f64 only: central differences
};

// L = sum(op(inputs) * R) in dtype dt: analytic gradients of every floating
// input and, when with_fd, central differences of the same step.
inline GradRun run_backward(const Case& c, const Arrays& vals, const ref::Array& r, frugal::DType dt, bool with_fd) {
  std::vector<frugal::Tensor> ts = make_inputs(c, vals, dt);
  frugal::Tensor rt = to_tensor(r, dt);
  std::vector<frugal::Tensor> wrt;
  for (std::size_t i = 0; i < ts.size(); ++i)
    if (!c.inputs[i].is_labels()) wrt.push_back(ts[i]);
  frugal::Step step = frugal::compile_gradients(
      [&] {
        frugal::Var y = c.build(bind_inputs(c, ts));
        return frugal::sum(y * frugal::persistent_var(rt, frugal::ValueKind::state, "R"));
      },
      {}, wrt, {}, harness_options());
  step.run();
  GradRun out;
  out.loss = step.last_loss_f64();
  for (auto& w : wrt) {
    frugal::Tensor g = step.grad(w);
    INFO(c.name << ": gradient shape " << g.shape().str() << " for input " << w.shape().str());
    REQUIRE(g.shape() == w.shape());
    REQUIRE(g.dtype() == w.dtype());
    out.grads.push_back(to_doubles(g));
  }
  if (!with_fd) return out;
  for (auto& w : wrt) {
    double* p = w.data<double>();
    std::vector<double> fd(std::size_t(w.numel()));
    for (std::size_t j = 0; j < fd.size(); ++j) {
      const double orig = p[j];
      p[j] = orig + kFdStep;
      const double xp = p[j];
      step.run();
      const double lp = step.last_loss_f64();
      p[j] = orig - kFdStep;
      const double xm = p[j];
      step.run();
      const double lm = step.last_loss_f64();
      p[j] = orig;
      fd[j] = (lp - lm) / (xp - xm);
    }
    out.fd.push_back(std::move(fd));
  }
  return out;
}

// Runs every check on one case.
inline void check_op(const Case& c) {
  INFO("op case: " << c.name);
  frugal::Rng rng(seed_of(c.name));
  Arrays vals;
  for (auto& in : c.inputs) vals.push_back(draw_array(rng, in));
  const ref::Array want = c.reference(vals);

  // Forward, f64 and f32.
  for (frugal::DType dt : {frugal::DType::f64, frugal::DType::f32}) {
    frugal::Tensor y = run_forward(c, vals, dt);
    const std::string what = c.name + " forward " + frugal::dtype_name(dt);
    INFO(what << ": output shape " << y.shape().str() << ", reference shape " << ref::str(want.shape));
    REQUIRE(y.shape().dims() == want.shape);
    REQUIRE(y.dtype() == dt);
    expect_close(what, to_doubles(y), want.v, want.shape,
                 dt == frugal::DType::f64 ? kF64ForwardTol : kF32ForwardTol * c.f32_scale);
  }

  // Backward: a fixed random weighting R so every output element matters.
  ref::Array r = draw_array(rng, x(want.shape));
  double want_loss = 0, loss_scale = 0;
  for (std::size_t i = 0; i < want.v.size(); ++i) {
    want_loss += want.v[i] * r.v[i];
    loss_scale += std::abs(want.v[i] * r.v[i]);
  }
  GradRun g64 = run_backward(c, vals, r, frugal::DType::f64, true);
  GradRun g32 = run_backward(c, vals, r, frugal::DType::f32, false);
  {
    INFO(c.name << " f64 loss sum(y*R): got " << g64.loss << ", reference " << want_loss);
    CHECK(std::abs(g64.loss - want_loss) <= kF64ForwardTol * (1 + loss_scale));
  }
  std::size_t k = 0;
  for (std::size_t i = 0; i < c.inputs.size(); ++i) {
    if (c.inputs[i].is_labels()) continue;
    const std::string what = c.name + " d/dx" + std::to_string(i);
    expect_close(what + " f64 vs finite differences", g64.grads[k], g64.fd[k], c.inputs[i].shape, kF64GradTol);
    expect_close(what + " f32 vs finite differences", g32.grads[k], g64.fd[k], c.inputs[i].shape,
                 kF32GradTol * c.f32_scale);
    ++k;
  }
}

// Forward only (finite differences on large inputs would be slow), f64 and
// f32 against the reference, on 2 threads: sizes above the kernels' parallel
// grain, so the chunked OpenMP paths run.
inline void check_forward_large(const Case& c) {
  INFO("large op case: " << c.name);
  frugal::Rng rng(seed_of(c.name));
  Arrays vals;
  for (auto& in : c.inputs) vals.push_back(draw_array(rng, in));
  const ref::Array want = c.reference(vals);
  for (frugal::DType dt : {frugal::DType::f64, frugal::DType::f32}) {
    frugal::Tensor y = run_forward(c, vals, dt);
    REQUIRE(y.shape().dims() == want.shape);
    expect_close(c.name + " forward " + frugal::dtype_name(dt), to_doubles(y), want.v, want.shape,
                 dt == frugal::DType::f64 ? kF64ForwardTol : kF32ForwardTol * c.f32_scale);
  }
}

// The message of the frugal::ShapeError that fn throws; fails the test when
// fn throws nothing or something else.
template <class E>
std::string error_message(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    FAIL("expected a " << typeid(E).name() << ", got another exception: " << e.what());
  }
  FAIL("expected a " << typeid(E).name() << ", nothing was thrown");
  return {};
}

// The ShapeError a capture of `build` over these tensors (bound as
// parameters of one inference step) raises.
inline std::string shape_error(std::function<frugal::Var(const Vars&)> build, std::vector<frugal::Tensor> ts) {
  return error_message<frugal::ShapeError>([&] {
    auto step = frugal::compile_inference(
        [&] {
          Vars vs;
          for (auto& t : ts) vs.push_back(frugal::persistent_var(t, frugal::ValueKind::parameter, "t"));
          return build(vs);
        },
        {});
  });
}

// The same over tensors of these shapes (f32 unless `dtypes` names another).
inline std::string capture_error(std::vector<ref::Dims> shapes, std::function<frugal::Var(const Vars&)> build,
                                 std::vector<frugal::DType> dtypes = {}) {
  std::vector<frugal::Tensor> ts;
  for (std::size_t i = 0; i < shapes.size(); ++i)
    ts.emplace_back(frugal::Shape(shapes[i]), i < dtypes.size() ? dtypes[i] : frugal::DType::f32);
  return shape_error(std::move(build), std::move(ts));
}

// A one-input case: build and reference each take the single input.
inline Case unary(std::string name, In in, std::function<frugal::Var(frugal::Var)> build,
                  std::function<ref::Array(const ref::Array&)> refn) {
  return {std::move(name), {std::move(in)}, [build](const Vars& v) { return build(v[0]); },
          [refn](const Arrays& a) { return refn(a[0]); }};
}

// A two-input case.
inline Case binary(std::string name, In a, In b, std::function<frugal::Var(frugal::Var, frugal::Var)> build,
                   std::function<ref::Array(const ref::Array&, const ref::Array&)> refn) {
  return {std::move(name), {std::move(a), std::move(b)}, [build](const Vars& v) { return build(v[0], v[1]); },
          [refn](const Arrays& a) { return refn(a[0], a[1]); }};
}

// Helpers several op test files share (they may build in one translation
// unit, tests/CMakeLists.txt's unity batches).

using test_support::ThreadCount;

// A tensor of that shape and dtype, zero-filled, for the error tests.
inline frugal::Tensor T(frugal::Shape s, frugal::DType dt = frugal::DType::f32) {
  return frugal::Tensor(std::move(s), dt);
}

// The names of named_parameters() / named_buffers(), in order.
template <class M>
std::vector<std::string> names_of(const M& named) {
  std::vector<std::string> out;
  for (auto& [name, t] : named) out.push_back(name);
  return out;
}

}  // namespace optest
