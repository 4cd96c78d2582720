#pragma once
// Puts back, at the end of a scope, the instruction-set cap of the CPU
// kernels (backend/cpu/isa.hpp, forced_cpu_isa) that a test found, whatever
// the test set meanwhile.
#include <frugal/backend/cpu/isa.hpp>

namespace test_support {

struct KeepCpuIsa {
  int saved = frugal::cpu::forced_cpu_isa.load();
  KeepCpuIsa() = default;
  KeepCpuIsa(const KeepCpuIsa&) = delete;
  KeepCpuIsa& operator=(const KeepCpuIsa&) = delete;
  ~KeepCpuIsa() { frugal::cpu::forced_cpu_isa = saved; }
};

}  // namespace test_support
