#pragma once
// Which vector instruction set a CPU kernel's loop runs with, chosen at run
// time: the library is compiled for plain x86-64, and a loop that matters
// (the optimizer updates) is compiled a second and third time for AVX2 and
// AVX-512 through target attributes. Every path of those loops rounds as
// the scalar loop: the kernel units compile with -ffp-contract=off (no
// fused multiply-adds appear), and add, multiply, divide and square root
// are correctly rounded in every instruction set, so their bits never
// depend on the CPU. The GEMM engines this also chooses (blas.hpp) are
// different kernels: each sums in its own order, within the same bound, so
// a product's bits depend on the engine (never on the thread count).
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "../../core/error.hpp"

#include "abi.hpp"

// AVX2 wherever x86-64 is compiled by GCC or Clang; AVX-512 too unless the
// build turns it off (FRUGAL_WITH_AVX512=OFF defines FRUGAL_NO_AVX512).
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define FRUGAL_CPU_ISA_DISPATCH 1
#else
#define FRUGAL_CPU_ISA_DISPATCH 0
#endif
#if FRUGAL_CPU_ISA_DISPATCH && !defined(FRUGAL_NO_AVX512)
#define FRUGAL_CPU_ISA_AVX512 1
#else
#define FRUGAL_CPU_ISA_AVX512 0
#endif

namespace frugal::cpu {

// avx512bf16: AVX-512F with AVX512-BF16's dot products (and AVX512-BW);
// only the bf16 GEMM uses them, every other loop runs its AVX-512 form.
enum class CpuIsa : int { base = 0, avx2 = 1, avx512 = 2, avx512bf16 = 3 };

inline const char* isa_name(CpuIsa i) {
  switch (i) {
    case CpuIsa::avx2: return "avx2";
    case CpuIsa::avx512: return "avx512f";
    case CpuIsa::avx512bf16: return "avx512bf16";
    default: return "x86-64";
  }
}

// The widest this CPU runs.
inline CpuIsa widest_cpu_isa() {
#if FRUGAL_CPU_ISA_DISPATCH
  // What the CPU has, whatever this file was compiled with (so the answer
  // is the same in every file); a kernel compiled without its AVX-512 loop
  // runs its AVX2 one there.
  static const CpuIsa widest =
      __builtin_cpu_supports("avx512f")
          ? (__builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw") ? CpuIsa::avx512bf16
                                                                                       : CpuIsa::avx512)
      : __builtin_cpu_supports("avx2") ? CpuIsa::avx2
                                       : CpuIsa::base;
  return widest;
#else
  return CpuIsa::base;
#endif
}

// FRUGAL_CPU_ISA=avx512 (or avx2, or x86-64) caps every run-time choice at that
// instruction set, so the narrower paths can be measured on a wider CPU;
// -1 (unset, or "auto"): the widest.
inline int cpu_isa_from_env() {
  const char* v = std::getenv("FRUGAL_CPU_ISA");
  if (!v || !*v || std::strcmp(v, "auto") == 0) return -1;
  for (CpuIsa i : {CpuIsa::base, CpuIsa::avx2, CpuIsa::avx512, CpuIsa::avx512bf16})
    if (std::strcmp(v, isa_name(i)) == 0 || (i == CpuIsa::avx512 && std::strcmp(v, "avx512") == 0)) return int(i);
  fail("FRUGAL_CPU_ISA='", v, "' is not an instruction set: use x86-64, avx2, avx512 or auto");
}

// Tests set a narrower one to compare each path's bits with the others' on
// one machine.
inline std::atomic<int> forced_cpu_isa{cpu_isa_from_env()};

inline CpuIsa cpu_isa() {
  const int forced = forced_cpu_isa.load(std::memory_order_relaxed);
  const CpuIsa widest = widest_cpu_isa();
  return forced < 0 ? widest : CpuIsa(std::min(forced, int(widest)));
}

// fn() built for the widest instruction set cpu_isa() allows: flatten
// inlines fn and everything it calls into a copy compiled for AVX-512 or
// AVX2, so plain loops inside vectorise that wide. Only the width changes:
// each element sees the same operations in the same order (the kernel
// units build with -ffp-contract=off, so no multiply and add fuse), so the
// bits are those of the plain build.
#if FRUGAL_CPU_ISA_AVX512
template <class Fn>
[[gnu::target("avx512f"), gnu::flatten]] void run_as_avx512(Fn& fn) {
  fn();
}
#endif
#if FRUGAL_CPU_ISA_DISPATCH
template <class Fn>
[[gnu::target("avx2"), gnu::flatten]] void run_as_avx2(Fn& fn) {
  fn();
}
#endif
template <class Fn>
void run_widest(Fn&& fn) {
  [[maybe_unused]] const CpuIsa isa = cpu_isa();
#if FRUGAL_CPU_ISA_AVX512
  if (isa >= CpuIsa::avx512) return run_as_avx512(fn);
#endif
#if FRUGAL_CPU_ISA_DISPATCH
  if (isa >= CpuIsa::avx2) return run_as_avx2(fn);
#endif
  fn();
}

// run_widest for the element types whose speed matters. float64 (gradient
// checks, references) runs the baseline build: no model trains in it, and
// its wide copies were code the kernel units compiled for nothing. (With
// the shared 16-bit loops, the elementwise unit went from 270 to 145
// AVX-512 copies and 80.8 to 77.4 CPU-seconds.)
template <class T, class Fn>
void run_widest_unless_f64(Fn&& fn) {
  if constexpr (std::is_same_v<T, double>)
    fn();
  else
    run_widest(fn);
}

}  // namespace frugal::cpu
