#pragma once
// nll_loss and its backward (ops/nll_loss.hpp).
#include <cstring>

#include "../../ops/nll_loss.hpp"
#include "../../runtime/backend.hpp"
#include "parallel.hpp"

#include "abi.hpp"

namespace frugal::cpu::inline FRUGAL_KERNEL_ABI {

// Input [N, C, R...] (or [C]) as N x C x R; target position p = n R + r.
struct NllView {
  std::int64_t n = 1, c = 1, r = 1;
};
inline NllView nll_view(const Shape& in) {
  NllView v;
  if (in.rank() == 1) {
    v.c = in[0];
    return v;
  }
  v.n = in[0], v.c = in[1];
  for (int i = 2; i < in.rank(); ++i) v.r *= in[i];
  return v;
}

// Calls fn(targets) typed, after checking every target; returns how many
// positions are kept (not ignore_index).
template <class Fn>
std::int64_t with_nll_targets(const ops::NllLossBase& op, const TensorRef& target, const NllView& v, Fn&& fn) {
  std::int64_t kept = 0;
  auto run = [&](const auto* t) {
    for (std::int64_t p = 0; p < v.n * v.r; ++p) {
      if (std::int64_t(t[p]) == op.ignore_index()) continue;
      if (t[p] < 0 || t[p] >= v.c)
        fail<DataError>(op.name(), ": target ", std::int64_t(t[p]), " at position ", p, " is outside [0, ", v.c,
                        ") for an input with ", v.c, " classes (and is not ignore_index ", op.ignore_index(), ")");
      ++kept;
    }
    fn(t);
  };
  if (target.dtype == DType::i32) run(target.as<std::int32_t>());
  else run(target.as<std::int64_t>());
  return kept;
}

inline void nll_loss_kernel(const ops::NllLoss& op, const KernelArgs& a) {
  dispatch_storage(a.in[0].dtype, "nll_loss", [&](auto tag) {
    using S = decltype(tag);
    const NllView v = nll_view(*a.in[0].shape);
    const S* x = a.in[0].as<S>();
    S* y = a.out[0].as<S>();
    double total = 0;
    const std::int64_t kept = with_nll_targets(op, a.in[1], v, [&](const auto* t) {
      // Summed in position order in f64 (deterministic at any thread count).
      for (std::int64_t n = 0; n < v.n; ++n)
        for (std::int64_t r = 0; r < v.r; ++r) {
          const std::int64_t p = n * v.r + r;
          const bool keep = std::int64_t(t[p]) != op.ignore_index();
          const double l = keep ? -math::convert<double>(x[(n * v.c + std::int64_t(t[p])) * v.r + r]) : 0.0;
          if (op.reduction() == Reduction::none) y[p] = math::convert<S>(l);
          else total += l;
        }
    });
    if (op.reduction() == Reduction::sum) y[0] = math::convert<S>(total);
    if (op.reduction() == Reduction::mean) y[0] = math::convert<S>(total / double(kept));  // 0/0 = NaN, as PyTorch
  });
}

inline void nll_loss_grad_kernel(const ops::NllLossGrad& op, const KernelArgs& a) {
  dispatch_storage(op.input().dtype, "nll_loss_grad", [&](auto tag) {
    using S = decltype(tag);
    const NllView v = nll_view(op.input().shape);
    const S* g = a.in[1].as<S>();
    S* dx = a.out[0].as<S>();
    std::memset(static_cast<void*>(dx), 0, std::size_t(op.input().shape.numel()) * sizeof(S));
    std::int64_t kept = 0;
    auto scatter = [&](const auto* t) {
      const double g0 = math::convert<double>(g[0]);
      const double scale = op.reduction() == Reduction::mean ? g0 / double(kept) : g0;
      for (std::int64_t n = 0; n < v.n; ++n)
        for (std::int64_t r = 0; r < v.r; ++r) {
          const std::int64_t p = n * v.r + r;
          if (std::int64_t(t[p]) == op.ignore_index()) continue;
          const double d = op.reduction() == Reduction::none ? math::convert<double>(g[p]) : scale;
          dx[(n * v.c + std::int64_t(t[p])) * v.r + r] = math::convert<S>(-d);
        }
    };
    // Count first (the mean's divisor), then scatter.
    kept = with_nll_targets(op, a.in[0], v, [](const auto*) {});
    with_nll_targets(op, a.in[0], v, scatter);
  });
}

}  // namespace frugal::cpu
