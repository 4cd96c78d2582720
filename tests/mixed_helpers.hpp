#pragma once
// What the mixed-precision tests share (mixed_precision_test.cpp,
// bf16_gpt_test.cpp): the 16-bit formats, tensors from and to doubles,
// inputs drawn representable in a format, one-op steps, and the checks
// "rounded once from the f32 result" and "within a bound". (In a header:
// the unity build puts test files in one translation unit, where two copies
// of these helpers would collide.)
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include <frugal/frugal.hpp>

#include "reference_mixed.hpp"

namespace mixed {

using namespace frugal;

struct Format16 {
  DType dtype;
  ref::Format fmt;
};
const Format16 kFormats[] = {{DType::bf16, ref::kBf16}, {DType::f16, ref::kF16}};

// Half the spacing of the subnormals: the absolute error of rounding below
// the smallest normal value, where rounding stops being relative.
inline double subnormal_half_ulp(ref::Format f) { return std::ldexp(1.0, f.emin - f.p); }

// A tensor of dtype dt holding v (values should be representable in dt; a
// value that is not is rounded by frugal's own conversion).
inline Tensor tensor_of(const std::vector<double>& v, Shape s, DType dt) {
  Tensor t(std::move(s), dt);
  REQUIRE(std::int64_t(v.size()) == t.numel());
  auto fill = [&](auto* p) {
    using T = std::remove_pointer_t<decltype(p)>;
    for (std::size_t i = 0; i < v.size(); ++i) p[i] = math::convert<T>(v[i]);
  };
  switch (dt) {
    case DType::f32: fill(t.data<float>()); break;
    case DType::f64: fill(t.data<double>()); break;
    case DType::bf16: fill(t.data<BFloat16>()); break;
    case DType::f16: fill(t.data<Half>()); break;
    case DType::i32:
      for (std::size_t i = 0; i < v.size(); ++i) t.data<std::int32_t>()[i] = std::int32_t(v[i]);
      break;
    default: FAIL("tensor_of: unsupported dtype " << dtype_name(dt));
  }
  return t;
}

inline std::vector<double> values(const Tensor& t) {
  std::vector<double> out(static_cast<std::size_t>(t.numel()));
  auto read = [&](const auto* p) {
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = math::convert<double>(p[i]);
  };
  switch (t.dtype()) {
    case DType::f32: read(t.data<float>()); break;
    case DType::f64: read(t.data<double>()); break;
    case DType::bf16: read(t.data<BFloat16>()); break;
    case DType::f16: read(t.data<Half>()); break;
    default: FAIL("values: unsupported dtype " << dtype_name(t.dtype()));
  }
  return out;
}

// n values drawn uniformly with |x| in [lo, hi) (random signs unless
// positive), rounded to `fmt` so that every dtype sees the same inputs.
inline std::vector<double> draw(std::uint64_t seed, std::int64_t n, double lo, double hi, ref::Format fmt,
                         bool positive = false) {
  Rng r(seed);
  std::vector<double> v(static_cast<std::size_t>(n));
  for (auto& e : v) {
    double m = r.uniform(lo, hi);
    double sign = positive || r.uniform() < 0.5 ? 1.0 : -1.0;
    e = ref::round_to(sign * m, fmt);
  }
  return v;
}

using Build = std::function<Var(const std::vector<Var>&)>;

// The inputs bound into a step being captured: floating ones as
// parameters (so gradients reach them), integer ones as state.
inline std::vector<Var> bind_inputs(const std::vector<Tensor>& ins) {
  std::vector<Var> vs;
  for (std::size_t i = 0; i < ins.size(); ++i)
    vs.push_back(persistent_var(ins[i], is_floating(ins[i].dtype()) ? ValueKind::parameter : ValueKind::state,
                                "in" + std::to_string(i)));
  return vs;
}

// Runs build on the inputs (bind_inputs) in a forward-only step and returns
// its output.
inline Tensor run(const Build& build, const std::vector<Tensor>& ins) {
  Step step = compile_inference(
      [&] {
        return build(bind_inputs(ins));
      },
      {});
  step.run();
  return step.output(0).clone();
}

// Runs build with its floating inputs stored as dt (integer inputs as given).
inline Tensor run_as(const Build& build, const std::vector<std::vector<double>>& vals, const std::vector<Shape>& shapes,
              DType dt, const std::vector<DType>& fixed = {}) {
  std::vector<Tensor> ins;
  for (std::size_t i = 0; i < vals.size(); ++i)
    ins.push_back(tensor_of(vals[i], shapes[i], i < fixed.size() && fixed[i] != DType::u8 ? fixed[i] : dt));
  return run(build, ins);
}

// Every element of `got` is `want` rounded once to fmt (compared as doubles,
// so +0 and -0 are equal).
inline void expect_rounded_once(const std::string& what, const std::vector<double>& got, const std::vector<double>& want,
                         ref::Format fmt) {
  REQUIRE(got.size() == want.size());
  std::size_t bad = 0, first = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    if (!(got[i] == ref::round_to(want[i], fmt) || (std::isnan(got[i]) && std::isnan(want[i])))) {
      if (!bad) first = i;
      ++bad;
    }
  std::ostringstream os;
  os.precision(17);
  if (bad)
    os << what << ": " << bad << " of " << got.size() << " differ; first at " << first << ": got " << got[first]
       << ", f32 " << want[first] << " rounds to " << ref::round_to(want[first], fmt);
  INFO(os.str());
  CHECK(bad == 0);
}

// |got - want| <= bound[i] for every element.
inline void expect_within(const std::string& what, const std::vector<double>& got, const std::vector<double>& want,
                   const std::vector<double>& bound) {
  REQUIRE(got.size() == want.size());
  std::size_t bad = 0, worst = 0;
  double worst_ratio = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    double ratio = std::abs(got[i] - want[i]) / bound[i];
    if (!(ratio <= 1)) ++bad;
    if (!(ratio <= worst_ratio)) worst_ratio = ratio, worst = i;
  }
  std::ostringstream os;
  os.precision(10);
  os << what << ": " << bad << " of " << got.size() << " out of bound; worst err/bound " << worst_ratio << " at "
     << worst << " (got " << got[worst] << ", want " << want[worst] << ", bound " << bound[worst] << ")";
  INFO(os.str());
  CHECK(bad == 0);
}

// The message of the ShapeError fn throws.
inline std::string shape_error(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const ShapeError& e) {
    return e.what();
  }
  FAIL("expected a ShapeError, nothing was thrown");
  return {};
}

inline std::vector<double> relative_bound(const std::vector<double>& want, double rel, ref::Format fmt) {
  std::vector<double> b(want.size());
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = rel * std::abs(want[i]) + subnormal_half_ulp(fmt);
  return b;
}


}  // namespace mixed
