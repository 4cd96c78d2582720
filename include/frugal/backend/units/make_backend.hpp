#pragma once
// Kernel unit (compiled once per program, with the kernels): the backends
// this program was built with, made by name. runtime/ declares these;
// nothing registers itself, so a static library cannot drop a backend.
#include "../cpu/cpu_backend.hpp"

namespace frugal {

std::vector<std::string> available_backends() { return {"cpu"}; }

std::unique_ptr<Backend> make_backend(const std::string& name, const BackendOptions& options) {
  if (name == "cpu") return std::make_unique<cpu::CpuBackend>(options);
  std::string known;
  for (auto& b : available_backends()) known += (known.empty() ? "" : ", ") + b;
  fail("backend '", name, "' is not available in this program (built with: ", known,
       "); 'cuda' needs frugal's CUDA kernels, compiled where nvcc is found (FRUGAL_WITH_CUDA)");
}

}  // namespace frugal
