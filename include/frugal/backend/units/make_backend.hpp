#pragma once
// Kernel unit (compiled once per program, with the kernels): the backends
// this program was built with, made by name. runtime/ declares these;
// nothing registers itself, so a static library cannot drop a backend.
//
// FRUGAL_WITH_CUDA_KERNELS (defined by frugal_add_kernels where the project
// has CUDA enabled, or by hand beside compiling backend/cuda/units/kernels.cuh
// and backend/cuda/units/transformer.cuh with nvcc, one .cu file each): this
// program also has the CUDA backend.
#include "../cpu/cpu_backend.hpp"

namespace frugal {

#if defined(FRUGAL_WITH_CUDA_KERNELS)
// Defined in backend/cuda/units/kernels.cuh (nvcc). Fails with "no CUDA
// device: ..." where the machine has none.
std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& options);
std::vector<std::string> available_backends() { return {"cpu", "cuda"}; }
#else
std::vector<std::string> available_backends() { return {"cpu"}; }
#endif

std::unique_ptr<Backend> make_backend(const std::string& name, const BackendOptions& options) {
  if (name == "cpu") return std::make_unique<cpu::CpuBackend>(options);
#if defined(FRUGAL_WITH_CUDA_KERNELS)
  if (name == "cuda") return make_cuda_backend(options);
#endif
  std::string known;
  for (auto& b : available_backends()) known += (known.empty() ? "" : ", ") + b;
  fail("backend '", name, "' is not available in this program (built with: ", known,
       "); 'cuda' needs frugal's CUDA kernels, compiled where nvcc is found (FRUGAL_WITH_CUDA)");
}

}  // namespace frugal
