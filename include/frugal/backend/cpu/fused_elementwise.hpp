#pragma once
// The fused elementwise kernel: one pass over memory. The output is cut
// into blocks of 4 KiB of the compute type; every step of the program runs
// over a block before the next block starts, so a chain's intermediates
// live in a few L1-resident buffers and never reach memory.
//
// What makes it faster than the unfused kernels (bench/fused_kernels.cpp),
// and not only lighter on memory:
// - The program is resolved once per call, not per block: each step's
//   functor becomes a function pointer to a loop over restrict pointers
//   (no std::visit per step per block, no alias checks), and each
//   intermediate gets a buffer by liveness, so a chain of any length
//   touches only the buffers live at once.
// - f32/f64 inputs of the output's shape, and broadcast rows (a bias), are
//   read where they lie; a step whose result is an output writes it
//   straight into the output (no final copy) unless the output shares
//   memory with an input (in place), where the block's results are stored
//   only after every step has read the inputs.
//
// Bits: the unfused kernels (elementwise.hpp) compute f32 and f64 in the
// storage type itself and bf16/f16 in f32 rounded to storage on every
// store. Here each bf16/f16 step's result is rounded to the storage type
// in place (round_block: the store-and-reload, bit for bit), so every step
// sees exactly the operands the unfused op would have read from memory.
// A result nothing reads later is only converted on its store, which
// rounds it the same way.
#include "../../ops/fused_elementwise.hpp"
#include "../../runtime/backend.hpp"
#include "convert.hpp"
#include "isa.hpp"
#include "parallel.hpp"
#include "strided.hpp"

#include <cstring>

#include "abi.hpp"

namespace frugal::cpu::inline FRUGAL_KERNEL_ABI {

namespace fused_detail {

// Elements per block: 4 KiB of the compute type (f32: 1024, a multiple of
// bulk::kBlock, so 16-bit conversions take their vectorised path).
template <class C>
inline constexpr int kBlockOf = int(4096 / sizeof(C));

template <class C>
using StepFn = void (*)(const ops::FusedFn&, const C* const* args, C* __restrict r, int m);

// One step over m elements: r[j] = f(args[0][j], ...). r never is one of
// the operands (buffers are assigned so), hence the restrict.
template <class F, class C>
void step_loop(const ops::FusedFn& fn, const C* const* a, C* __restrict r, int m) {
  const F f = *std::get_if<F>(&fn);
  const C* __restrict x = a[0];
  // run_widest: AVX-512 or AVX2 registers, the bits of the baseline build.
  run_widest_unless_f64<C>([&] {
    if constexpr (ops::fused_arity<F> == 1) {
      for (int j = 0; j < m; ++j) r[j] = f(x[j]);
    } else if constexpr (ops::fused_arity<F> == 2) {
      const C* __restrict z = a[1];
      for (int j = 0; j < m; ++j) r[j] = f(x[j], z[j]);
    } else {
      const C *__restrict y = a[1], *__restrict dy = a[2];
      for (int j = 0; j < m; ++j) r[j] = f(x[j], y[j], dy[j]);
    }
  });
}

template <class C, std::size_t... I>
constexpr std::array<StepFn<C>, sizeof...(I)> step_table(std::index_sequence<I...>) {
  return {&step_loop<std::variant_alternative_t<I, ops::FusedFn>, C>...};
}

// The loop for each alternative of FusedFn, by variant index.
template <class C>
inline constexpr auto kStepLoops = step_table<C>(std::make_index_sequence<std::variant_size_v<ops::FusedFn>>{});

// y[0, n) = x[0, n) converted, any n (in bulk::kBlock pieces).
template <class From, class To>
void convert_n(const From* x, To* y, int n) {
  for (int i = 0; i < n; i += bulk::kBlock) convert_block(x + i, y + i, std::min(bulk::kBlock, n - i));
}

}  // namespace fused_detail

inline void fused_elementwise_kernel(const ops::FusedElementwise& op, const KernelArgs& a) {
  const ops::FusedProgram& prog = op.program();
  dispatch_precision(a.out[0].dtype, "fused_elementwise", [&](auto p) {
    using S = typename decltype(p)::Storage;
    using C = typename decltype(p)::Compute;
    using namespace fused_detail;
    constexpr int kB = kBlockOf<C>;
    constexpr int kMaxIn = ops::FusedProgram::kMaxInputs, kMaxSteps = ops::FusedProgram::kMaxSteps;
    constexpr int kSlots = kMaxIn + kMaxSteps, kBuffers = kSlots;
    constexpr bool same = std::is_same_v<S, C>;
    const Shape& out = *a.out[0].shape;
    const std::int64_t numel = out.numel();
    const int ni = prog.inputs, ns = int(prog.steps.size()), no = int(prog.outputs.size());
    const std::int64_t cols = out.rank() > 0 ? std::max<std::int64_t>(out.dim(-1), 1) : 1;

    // Inputs: full (the output's element order) or broadcast.
    std::array<const S*, kMaxIn> in{};
    std::array<bool, kMaxIn> full{};
    std::array<Strides, kMaxIn> st{};
    std::array<std::int64_t, kMaxIn> cs{};  // a broadcast input's stride along the last axis
    for (int k = 0; k < ni; ++k) {
      in[std::size_t(k)] = a.in[std::size_t(k)].template as<S>();
      // Broadcasting only stretches axes of size 1: an input with as many
      // elements as the output has them in the same order.
      full[std::size_t(k)] = a.in[std::size_t(k)].numel() == numel;
      if (!full[std::size_t(k)]) {
        st[std::size_t(k)] = broadcast_strides(*a.in[std::size_t(k)].shape, out);
        cs[std::size_t(k)] = out.rank() > 0 ? st[std::size_t(k)][out.rank() - 1] : 0;
      }
    }
    std::array<S*, ops::FusedProgram::kMaxOutputs> outp{};
    for (int o = 0; o < no; ++o) outp[std::size_t(o)] = a.out[std::size_t(o)].template as<S>();

    // Where each slot's block lives. Steps get buffers by liveness: a
    // buffer is reused once its slot's last reader has run, never by the
    // reader itself (so a step's result is not one of its operands).
    std::array<int, kSlots> last_read{}, out_of{};
    last_read.fill(-1);
    out_of.fill(-1);
    for (int s = 0; s < ns; ++s)
      for (int k = 0; k < ops::arity_of(prog.steps[std::size_t(s)].fn); ++k)
        last_read[std::size_t(prog.steps[std::size_t(s)].args[std::size_t(k)])] = s;
    for (int o = 0; o < no; ++o) out_of[std::size_t(prog.outputs[std::size_t(o)])] = o;
    // A result may go straight to its output when no output shares memory
    // with an input (then stores cannot clobber what a later step reads).
    bool direct = same;
    for (int o = 0; o < no && direct; ++o) {
      const auto* ob = reinterpret_cast<const std::byte*>(outp[std::size_t(o)]);
      const std::size_t obytes = std::size_t(numel) * sizeof(S);
      for (int k = 0; k < ni; ++k) {
        const auto* ib = reinterpret_cast<const std::byte*>(in[std::size_t(k)]);
        const std::size_t ibytes = std::size_t(a.in[std::size_t(k)].numel()) * sizeof(S);
        if (ib < ob + obytes && ob < ib + ibytes) direct = false;
      }
    }
    // Blocks stop at row ends when rows are long, so a broadcast row (a
    // bias) is read in place; short rows are gathered, many per block.
    bool any_broadcast = false;
    for (int k = 0; k < ni; ++k) any_broadcast = any_broadcast || !full[std::size_t(k)];
    const bool row_blocks = any_broadcast && cols >= bulk::kBlock;
    std::array<int, kSlots> buffer{};  // a buffer index, or -1: read in place / written to the output
    buffer.fill(-1);
    std::array<int, kSlots> free_list{};
    int nfree = 0, nbuf = 0;
    auto take = [&] { return nfree > 0 ? free_list[std::size_t(--nfree)] : nbuf++; };
    for (int k = 0; k < ni; ++k) {
      const bool in_place = same && (full[std::size_t(k)] || (row_blocks && cs[std::size_t(k)] == 1));
      if (!in_place) buffer[std::size_t(k)] = take();
    }
    for (int s = 0; s < ns; ++s) {
      const int slot = ni + s;
      const bool to_output = direct && out_of[std::size_t(slot)] >= 0;
      if (!to_output) buffer[std::size_t(slot)] = take();
      for (int k = 0; k < ops::arity_of(prog.steps[std::size_t(s)].fn); ++k) {
        const int r = prog.steps[std::size_t(s)].args[std::size_t(k)];
        const bool kept = out_of[std::size_t(r)] >= 0 && !direct;  // stored after the last step
        if (last_read[std::size_t(r)] == s && buffer[std::size_t(r)] >= 0 && !kept) {
          bool listed = false;  // an operand read twice by this step is freed once
          for (int f = 0; f < nfree; ++f) listed = listed || free_list[std::size_t(f)] == buffer[std::size_t(r)];
          if (!listed) free_list[std::size_t(nfree++)] = buffer[std::size_t(r)];
        }
      }
    }
    std::array<StepFn<C>, kMaxSteps> fns{};
    for (int s = 0; s < ns; ++s) fns[std::size_t(s)] = kStepLoops<C>[prog.steps[std::size_t(s)].fn.index()];

    // Elements [base, base + m) of the output.
    auto block = [&](C (*buf)[kB], std::int64_t base, int m) {
      const C* src[kSlots];
      for (int k = 0; k < ni; ++k) {
        const std::size_t ku = std::size_t(k);
        if (full[ku]) {
          if constexpr (same) src[k] = in[ku] + base;
          else convert_n(in[ku] + base, buf[buffer[ku]], m), src[k] = buf[buffer[ku]];
          continue;
        }
        // A broadcast input: in place within one row, else gathered row
        // piece by row piece.
        if constexpr (same) {
          if (buffer[ku] < 0) {
            src[k] = in[ku] + (out.rank() > 0 ? row_offset(base / cols, out, st[ku]) : 0) + base % cols;
            continue;
          }
        }
        C* dst = buf[buffer[ku]];
        for (std::int64_t i = base, j = 0; j < m;) {
          const std::int64_t r = i / cols, c = i % cols, len = std::min<std::int64_t>(m - j, cols - c);
          const S* row = in[ku] + (out.rank() > 0 ? row_offset(r, out, st[ku]) : 0);
          if (cs[ku] == 1) convert_n(row + c, dst + j, int(len));
          else
            for (std::int64_t q = 0; q < len; ++q) dst[j + q] = math::convert<C>(row[(c + q) * cs[ku]]);
          i += len, j += len;
        }
        src[k] = dst;
      }
      for (int s = 0; s < ns; ++s) {
        const int slot = ni + s;
        const ops::FusedStep& stp = prog.steps[std::size_t(s)];
        const C* args[3];
        for (int k = 0; k < 3; ++k) args[k] = stp.args[std::size_t(k)] >= 0 ? src[stp.args[std::size_t(k)]] : nullptr;
        C* r = buffer[std::size_t(slot)] >= 0 ? buf[buffer[std::size_t(slot)]]
                                                : reinterpret_cast<C*>(outp[std::size_t(out_of[std::size_t(slot)])]) + base;
        fns[std::size_t(s)](stp.fn, args, r, m);
        if constexpr (!same) {
          // What the unfused op would have stored, read back; a result
          // only stored is rounded by its store.
          if (last_read[std::size_t(slot)] > s)
            for (int i = 0; i < m; i += bulk::kBlock) round_block<S>(r + i, std::min(bulk::kBlock, m - i));
        }
        src[slot] = r;
      }
      if (same && direct) return;
      for (int o = 0; o < no; ++o) {
        const C* r = src[prog.outputs[std::size_t(o)]];
        if constexpr (same) std::memcpy(outp[std::size_t(o)] + base, r, sizeof(C) * std::size_t(m));
        else convert_n(r, outp[std::size_t(o)] + base, m);
      }
    };
    parallel_for(numel, 4 * ns, [&](std::int64_t b, std::int64_t e) {
      alignas(64) C buf[kBuffers][kB];
      for (std::int64_t i = b; i < e;) {
        std::int64_t m = std::min<std::int64_t>(kB, e - i);
        if (row_blocks) m = std::min(m, cols - i % cols);
        block(buf, i, int(m));
        i += m;
      }
    });
  });
}

}  // namespace frugal::cpu
