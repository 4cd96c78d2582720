#pragma once
// The type a tensor is stored in and the type a kernel computes in, and the
// dispatch from a run-time DType to them: every backend's kernels use it,
// so bf16/f16 are computed the same way everywhere (read into f32, rounded
// to nearest even once on store; f32 and f64 compute in themselves).
#include "dtype.hpp"
#include "error.hpp"
#include "half.hpp"

namespace frugal {

template <class S, class C>
struct Precision {
  using Storage = S;
  using Compute = C;
};

// Calls fn(Precision<Storage, Compute>{}) for a floating dtype; otherwise
// fails naming the backend and the op.
template <class Fn>
void dispatch_precision_on(const char* backend, DType t, const char* op, Fn&& fn) {
  switch (t) {
    case DType::f32: fn(Precision<float, float>{}); return;
    case DType::f64: fn(Precision<double, double>{}); return;
    case DType::bf16: fn(Precision<BFloat16, float>{}); return;
    case DType::f16: fn(Precision<Half, float>{}); return;
    default:
      fail(backend, ": op ", op, " has no kernel for dtype ", dtype_name(t), " (f32, f64, bf16 and f16 are supported)");
  }
}

}  // namespace frugal
