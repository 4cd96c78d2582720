#pragma once
#include <cmath>
#include <type_traits>

#include "../../ops/elementwise_math.hpp"
#include "../../ops/gelu.hpp"
#include "../../ops/loss.hpp"
#include "../../runtime/backend.hpp"
#include "parallel.hpp"
#include "row_math.hpp"

#include "abi.hpp"

namespace frugal::cpu::inline FRUGAL_KERNEL_ABI {

template <class L>
void check_labels(const L* labels, std::int64_t positions, std::int64_t classes) {
  for (std::int64_t p = 0; p < positions; ++p)
    if (labels[p] < 0 || labels[p] >= classes)
      fail<DataError>("cross_entropy: label ", std::int64_t(labels[p]), " at position ", p, " is outside [0, ",
                      classes, ") for logits with ", classes, " classes");
}

// Calls fn(L{}) for the label type.
template <class Fn>
void dispatch_label(DType t, Fn&& fn) {
  if (t == DType::i32) fn(std::int32_t{});
  else fn(std::int64_t{});
}

// Calls fn(Precision{}, logits, labels, positions, classes) with typed
// pointers, once the labels are known to be in range. The loss and its
// gradient seed have the compute type (f32 for bf16/f16 logits).
template <class Fn>
void with_logits_and_labels(const KernelArgs& a, const char* op, Fn&& fn) {
  dispatch_precision(a.in[0].dtype, op, [&](auto p) {
    using S = typename decltype(p)::Storage;
    dispatch_label(a.in[1].dtype, [&](auto ltag) {
      using L = decltype(ltag);
      std::int64_t C = a.in[0].shape->dim(-1), P = a.in[1].numel();
      const L* lab = a.in[1].as<L>();
      check_labels(lab, P, C);
      fn(p, static_cast<const S*>(a.in[0].data), lab, P, C);
    });
  });
}

inline void cross_entropy_kernel(const ops::CrossEntropy&, const KernelArgs& a) {
  with_logits_and_labels(a, "cross_entropy", [&](auto p, const auto* x, const auto* lab, std::int64_t P, std::int64_t C) {
    using S = typename decltype(p)::Storage;
    using T = typename decltype(p)::Compute;
    double total = parallel_sum(P, C, [&](std::int64_t b, std::int64_t e) {
      double s = 0;
      for (std::int64_t q = b; q < e; ++q) {
        const S* row = x + q * C;
        T mx;
        if constexpr (std::is_same_v<S, T>) {
          mx = row_max(row, C);
        } else {
          mx = math::convert<T>(row[0]);
          for (std::int64_t c = 1; c < C; ++c) mx = std::max(mx, math::convert<T>(row[c]));
        }
        const T z = lane_sum<T>(C, [&](std::int64_t c) { return math::exp_poly(math::convert<T>(row[c]) - mx); });
        s += double(mx + math::log_(z) - math::convert<T>(row[lab[q]]));
      }
      return s;
    });
    a.out[0].as<T>()[0] = T(P ? total / double(P) : 0.0);
  });
}

inline void cross_entropy_grad_kernel(const ops::CrossEntropyGrad&, const KernelArgs& a) {
  with_logits_and_labels(a, "cross_entropy_grad", [&](auto p, const auto* x, const auto* lab, std::int64_t P,
                                                      std::int64_t C) {
    using S = typename decltype(p)::Storage;
    using T = typename decltype(p)::Compute;
    T scale = a.in[2].as<T>()[0] / T(std::max<std::int64_t>(P, 1));
    S* dx = a.out[0].as<S>();
    parallel_for(P, C, [&](std::int64_t b, std::int64_t e) {
      for (std::int64_t q = b; q < e; ++q) {
        const S* row = x + q * C;
        S* drow = dx + q * C;
        if constexpr (std::is_same_v<S, T>) {
          const T mx = row_max(row, C);
          for (std::int64_t c = 0; c < C; ++c) drow[c] = math::exp_poly(row[c] - mx);
          const T inv = scale / row_sum(drow, C);
          for (std::int64_t c = 0; c < C; ++c) drow[c] *= inv;
          drow[lab[q]] -= scale;
        } else {
          // 16-bit storage: recompute the exponentials and round each
          // gradient once (the label's entry after subtracting).
          T mx = math::convert<T>(row[0]);
          for (std::int64_t c = 1; c < C; ++c) mx = std::max(mx, math::convert<T>(row[c]));
          const T z = lane_sum<T>(C, [&](std::int64_t c) { return math::exp_poly(math::convert<T>(row[c]) - mx); });
          T inv = scale / z;
          for (std::int64_t c = 0; c < C; ++c) {
            T d = math::exp_poly(math::convert<T>(row[c]) - mx) * inv;
            drow[c] = math::convert<S>(c == lab[q] ? d - scale : d);
          }
        }
      }
    });
  });
}


}  // namespace frugal::cpu
