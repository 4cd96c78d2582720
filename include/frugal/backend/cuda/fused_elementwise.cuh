#pragma once
// The fused elementwise op (ops/fused_elementwise.hpp) on the GPU: one
// thread per output element runs the whole program in registers, applying
// the same FRUGAL_HD functors in the same order as the CPU kernel. bf16/f16
// steps compute in f32 and every step's result is rounded to the storage
// type (the store-and-reload of the unfused ops), as on the CPU; so where
// the functors are + - * / and bit selects (add, mul, affine, relu, the erf
// polynomial GELU), the GPU's bits are the CPU's (-fmad=false). A thread
// reads all its element's inputs before it stores an output: any input of
// the output's shape may be overwritten (the op's in-place candidates).
#include <cstring>

#include "../../ops/fused_elementwise.hpp"
#include "elementwise.cuh"

namespace frugal::cuda {

// The program as the device reads it: a variant index and the functor's
// bytes (trivially copyable structs) per step, instead of std::variant.
struct DeviceFusedProgram {
  static constexpr int kMaxIn = ops::FusedProgram::kMaxInputs, kMaxSteps = ops::FusedProgram::kMaxSteps,
                       kMaxOut = ops::FusedProgram::kMaxOutputs, kFnBytes = 16;
  int inputs = 0, steps = 0, outputs = 0, rank = 0;
  int kind[kMaxSteps] = {};
  int args[kMaxSteps][3] = {};
  alignas(8) unsigned char fn[kMaxSteps][kFnBytes] = {};
  int out_slot[kMaxOut] = {};
  std::int64_t out_dims[kMaxRank] = {};
  std::int64_t in_strides[kMaxIn][kMaxRank] = {};  // 0 along stretched axes
  bool full[kMaxIn] = {};                           // the input has the output's elements in its order
};

template <class F>
__device__ __forceinline__ F functor_at(const unsigned char* bytes) {
  F f;
  memcpy(&f, bytes, sizeof(F));
  return f;
}

template <class C, class F>
__device__ __forceinline__ C apply_step(const unsigned char* bytes, C x, C y, C z) {
  const F f = functor_at<F>(bytes);
  if constexpr (ops::fused_arity<F> == 1) return f(x);
  else if constexpr (ops::fused_arity<F> == 2) return f(x, y);
  else return f(x, y, z);
}

// r = step `kind`'s functor on (x, y, z): a switch over FusedFn's alternatives.
template <class C, std::size_t... I>
__device__ __forceinline__ C dispatch_step(int kind, const unsigned char* bytes, C x, C y, C z, std::index_sequence<I...>) {
  C r = C(0);
  ((kind == int(I) ? (r = apply_step<C, std::variant_alternative_t<I, ops::FusedFn>>(bytes, x, y, z), true) : false) || ...);
  return r;
}

// Pointers travel in the program's launch parameters too.
struct FusedPointers {
  const void* in[DeviceFusedProgram::kMaxIn] = {};
  void* out[DeviceFusedProgram::kMaxOut] = {};
};

template <class S, class C>
__global__ void fused_k(DeviceFusedProgram p, FusedPointers ptr, std::int64_t n) {
  constexpr int kSlots = DeviceFusedProgram::kMaxIn + DeviceFusedProgram::kMaxSteps;
  constexpr bool same = std::is_same_v<S, C>;
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n; i += std::int64_t(gridDim.x) * blockDim.x) {
    C v[kSlots];
    for (int k = 0; k < p.inputs; ++k) {
      std::int64_t off = i;
      if (!p.full[k]) {
        off = 0;
        std::int64_t rest = i;
        for (int d = p.rank - 1; d >= 0; --d) {
          off += (rest % p.out_dims[d]) * p.in_strides[k][d];
          rest /= p.out_dims[d];
        }
      }
      v[k] = load<C>(static_cast<const S*>(ptr.in[k])[off]);
    }
    for (int s = 0; s < p.steps; ++s) {
      const int* a = p.args[s];
      const C x = v[a[0]], y = a[1] >= 0 ? v[a[1]] : C(0), z = a[2] >= 0 ? v[a[2]] : C(0);
      C r = dispatch_step<C>(p.kind[s], p.fn[s], x, y, z, std::make_index_sequence<std::variant_size_v<ops::FusedFn>>{});
      if constexpr (!same) r = load<C>(store<S>(r));  // what the unfused op would have stored, read back
      v[p.inputs + s] = r;
    }
    for (int o = 0; o < p.outputs; ++o) static_cast<S*>(ptr.out[o])[i] = store<S>(v[p.out_slot[o]]);
  }
}

template <std::size_t... I>
constexpr bool functors_fit(std::index_sequence<I...>) {
  return ((sizeof(std::variant_alternative_t<I, ops::FusedFn>) <= DeviceFusedProgram::kFnBytes &&
           std::is_trivially_copyable_v<std::variant_alternative_t<I, ops::FusedFn>>) && ...);
}
static_assert(functors_fit(std::make_index_sequence<std::variant_size_v<ops::FusedFn>>{}),
              "a fused functor no longer fits DeviceFusedProgram::kFnBytes");

struct FusedElementwiseKernel {
  Context ctx;
  void operator()(const ops::FusedElementwise& op, const KernelArgs& a) const {
    const std::string what = describe(op, a);
    const ops::FusedProgram& prog = op.program();
    const Shape& out = *a.out[0].shape;
    const std::int64_t n = out.numel();
    if (n == 0) return;
    if (out.rank() > kMaxRank) fail("cuda: ", what, ": rank ", out.rank(), " is above the ", kMaxRank, " this kernel takes");
    if (prog.inputs > DeviceFusedProgram::kMaxIn || int(prog.steps.size()) > DeviceFusedProgram::kMaxSteps ||
        int(prog.outputs.size()) > DeviceFusedProgram::kMaxOut)
      fail("internal: ", what, ": the program exceeds FusedProgram's limits");
    DeviceFusedProgram p;
    p.inputs = prog.inputs;
    p.steps = int(prog.steps.size());
    p.outputs = int(prog.outputs.size());
    p.rank = out.rank();
    for (int d = 0; d < out.rank(); ++d) p.out_dims[d] = out[d];
    FusedPointers ptr;
    for (int k = 0; k < prog.inputs; ++k) {
      const TensorRef& t = a.in[std::size_t(k)];
      ptr.in[k] = t.data;
      p.full[k] = t.numel() == n;
      if (!p.full[k]) {
        const Broadcast b = broadcast_of(*t.shape, *t.shape, out, what);
        for (int d = 0; d < out.rank(); ++d) p.in_strides[k][d] = b.sx[d];
      }
    }
    for (int s = 0; s < p.steps; ++s) {
      const ops::FusedStep& st = prog.steps[std::size_t(s)];
      p.kind[s] = int(st.fn.index());
      const int ar = ops::arity_of(st.fn);
      for (int k = 0; k < 3; ++k) p.args[s][k] = k < ar ? st.args[std::size_t(k)] : -1;
      std::visit([&](const auto& f) { std::memcpy(p.fn[s], &f, sizeof f); }, st.fn);
    }
    for (int o = 0; o < p.outputs; ++o) {
      p.out_slot[o] = prog.outputs[std::size_t(o)];
      ptr.out[o] = a.out[std::size_t(o)].data;
    }
    dispatch_precision(a.out[0].dtype, "fused_elementwise", [&](auto pr) {
      using S = typename decltype(pr)::Storage;
      using C = typename decltype(pr)::Compute;
      fused_k<S, C><<<blocks_for(n), kThreads, 0, ctx.compute>>>(p, ptr, n);
    });
    check_launch(what);
  }
};

}  // namespace frugal::cuda
