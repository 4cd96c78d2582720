#pragma once
// The fused elementwise kernel: one pass over memory. A block of up to
// bulk::kBlock elements is read from every input into compute-type slots,
// every step of the program runs over the block, and the output slots are
// stored; intermediate slots never leave the stack.
//
// Bits: the unfused kernels (elementwise.hpp) compute f32 and f64 in the
// storage type itself and bf16/f16 in f32 rounded to storage on every
// store. Here each step's result is rounded to the storage type and read
// back, so every step sees exactly the operands the unfused op would have
// read from memory.
#include "../../ops/fused_elementwise.hpp"
#include "../../runtime/backend.hpp"
#include "convert.hpp"
#include "parallel.hpp"
#include "strided.hpp"

#include <cstring>

#include "abi.hpp"

namespace frugal::cpu::inline FRUGAL_KERNEL_ABI {

namespace fused_detail {

// Runs one program step over m elements: operands from `src` (an input's
// memory, or an earlier step's block), the result into r.
template <class S, class C>
void run_step(const ops::FusedStep& st, const C* const* src, C* r, int m) {
  std::visit(
      [&](const auto& f) {
        using F = std::decay_t<decltype(f)>;
        const C* x = src[st.args[0]];
        if constexpr (ops::fused_arity<F> == 1) {
          for (int j = 0; j < m; ++j) r[j] = f(x[j]);
        } else if constexpr (ops::fused_arity<F> == 2) {
          const C* z = src[st.args[1]];
          for (int j = 0; j < m; ++j) r[j] = f(x[j], z[j]);
        } else {
          const C *y = src[st.args[1]], *dy = src[st.args[2]];
          for (int j = 0; j < m; ++j) r[j] = f(x[j], y[j], dy[j]);
        }
      },
      st.fn);
  if constexpr (!std::is_same_v<S, C>) {  // what the unfused op would have stored, read back
    S stored[bulk::kBlock];
    convert_block(r, stored, m);
    convert_block(stored, r, m);
  }
}

}  // namespace fused_detail

inline void fused_elementwise_kernel(const ops::FusedElementwise& op, const KernelArgs& a) {
  const ops::FusedProgram& prog = op.program();
  dispatch_precision(a.out[0].dtype, "fused_elementwise", [&](auto p) {
    using S = typename decltype(p)::Storage;
    using C = typename decltype(p)::Compute;
    constexpr int kSlots = ops::FusedProgram::kMaxInputs + ops::FusedProgram::kMaxSteps;
    const Shape& out = *a.out[0].shape;
    const std::int64_t numel = out.numel();
    const int ni = prog.inputs, ns = int(prog.steps.size());
    std::array<const S*, ops::FusedProgram::kMaxInputs> in{};
    std::array<bool, ops::FusedProgram::kMaxInputs> full{};
    std::array<Strides, ops::FusedProgram::kMaxInputs> st{};
    bool all_full = true;
    for (int k = 0; k < ni; ++k) {
      in[std::size_t(k)] = a.in[std::size_t(k)].template as<S>();
      // Broadcasting only stretches axes of size 1: an input with as many
      // elements as the output has them in the same order.
      full[std::size_t(k)] = a.in[std::size_t(k)].numel() == numel;
      all_full = all_full && full[std::size_t(k)];
      if (!full[std::size_t(k)]) st[std::size_t(k)] = broadcast_strides(*a.in[std::size_t(k)].shape, out);
    }
    std::array<S*, ops::FusedProgram::kMaxOutputs> outp{};
    for (std::size_t o = 0; o < prog.outputs.size(); ++o) outp[o] = a.out[o].template as<S>();

    // Elements [base, base + m) of the output; row r's broadcast inputs
    // start at their row offsets, column c0 of the row.
    // Outputs are stored only after every step has read the inputs, so an
    // output may share an input's memory (in place).
    auto block = [&](C (*slot)[bulk::kBlock], std::int64_t base, int m, std::int64_t r, std::int64_t c0) {
      const C* src[kSlots];
      for (int k = 0; k < ni; ++k) {
        if constexpr (std::is_same_v<S, C>) {
          if (full[std::size_t(k)]) {  // read in place: no copy
            src[k] = in[std::size_t(k)] + base;
            continue;
          }
        }
        if (full[std::size_t(k)]) {
          convert_block(in[std::size_t(k)] + base, slot[k], m);
        } else {
          const Strides& s = st[std::size_t(k)];
          const S* row = in[std::size_t(k)] + (out.rank() > 0 ? row_offset(r, out, s) : 0);
          const std::int64_t cs = out.rank() > 0 ? s[out.rank() - 1] : 0;
          for (int j = 0; j < m; ++j) slot[k][j] = math::convert<C>(row[(c0 + j) * cs]);
        }
        src[k] = slot[k];
      }
      for (int s = 0; s < ns; ++s) {
        fused_detail::run_step<S, C>(prog.steps[std::size_t(s)], src, slot[ni + s], m);
        src[ni + s] = slot[ni + s];
      }
      for (std::size_t o = 0; o < prog.outputs.size(); ++o) {
        if constexpr (std::is_same_v<S, C>) std::memcpy(outp[o] + base, slot[prog.outputs[o]], sizeof(C) * std::size_t(m));
        else convert_block(slot[prog.outputs[o]], outp[o] + base, m);
      }
    };
    if (all_full) {
      parallel_for(numel, 8, [&](std::int64_t b, std::int64_t e) {
        C slot[kSlots][bulk::kBlock];
        for (std::int64_t i = b; i < e; i += bulk::kBlock)
          block(slot, i, int(std::min<std::int64_t>(bulk::kBlock, e - i)), 0, 0);
      });
      return;
    }
    const std::int64_t cols = out.dim(-1), rows = numel / std::max<std::int64_t>(cols, 1);
    parallel_for(rows, cols, [&](std::int64_t b, std::int64_t e) {
      C slot[kSlots][bulk::kBlock];
      for (std::int64_t r = b; r < e; ++r)
        for (std::int64_t c0 = 0; c0 < cols; c0 += bulk::kBlock)
          block(slot, r * cols + c0, int(std::min<std::int64_t>(bulk::kBlock, cols - c0)), r, c0);
    });
  });
}

}  // namespace frugal::cpu
