#pragma once
// cuBLASLt, loaded with dlopen when the first CUDA backend is made, not
// linked. Loading libcublasLt (540 MB in CUDA 13) runs its static
// initialisers: 0.36 s at the start of every process that links it, with or
// without a GPU, which every test, sample and tool of a CUDA-enabled build
// paid before it ran a line (a third of the test suite's time). A program
// that never asks for backend "cuda" now never loads it.
//
// The entries are the library's own functions, typed from its header, so a
// call through them is checked by the compiler exactly as a direct call.
// Host-only code.
#include <cublasLt.h>
#include <dlfcn.h>

#include <string>
#include <type_traits>

#include "../../core/error.hpp"

namespace frugal::cuda {

struct CublasLt {
  decltype(&::cublasLtCreate) Create = nullptr;
  decltype(&::cublasLtDestroy) Destroy = nullptr;
  decltype(&::cublasLtGetStatusString) GetStatusString = nullptr;
  decltype(&::cublasLtMatmul) Matmul = nullptr;
  decltype(&::cublasLtMatmulAlgoGetHeuristic) MatmulAlgoGetHeuristic = nullptr;
  decltype(&::cublasLtMatmulDescCreate) MatmulDescCreate = nullptr;
  decltype(&::cublasLtMatmulDescDestroy) MatmulDescDestroy = nullptr;
  decltype(&::cublasLtMatmulDescSetAttribute) MatmulDescSetAttribute = nullptr;
  decltype(&::cublasLtMatmulPreferenceCreate) MatmulPreferenceCreate = nullptr;
  decltype(&::cublasLtMatmulPreferenceDestroy) MatmulPreferenceDestroy = nullptr;
  decltype(&::cublasLtMatmulPreferenceSetAttribute) MatmulPreferenceSetAttribute = nullptr;
  decltype(&::cublasLtMatrixLayoutCreate) MatrixLayoutCreate = nullptr;
  decltype(&::cublasLtMatrixLayoutDestroy) MatrixLayoutDestroy = nullptr;
  decltype(&::cublasLtMatrixLayoutSetAttribute) MatrixLayoutSetAttribute = nullptr;
};

// The loaded library, the first call loads it (thread-safe). Defined once,
// in the CUDA kernel unit (units/kernels.cuh), which knows where CMake found
// the library. Fails naming the library and what to do where it cannot load.
const CublasLt& cublaslt();

// Tries, in order: the soname of the cuBLAS the headers are from (found
// through LD_LIBRARY_PATH, the program's run path and ld.so's cache), the
// same soname in the directory CMake found the library in, then the file
// CMake found (`found`, may be empty).
inline CublasLt load_cublaslt(const std::string& found) {
  const std::string soname = "libcublasLt.so." + std::to_string(CUBLAS_VER_MAJOR);
  std::string tried, why;
  void* lib = nullptr;
  auto attempt = [&](const std::string& name) {
    if (lib || name.empty()) return;
    lib = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    tried += (tried.empty() ? "" : ", ") + name;
    if (!lib) why = dlerror();
  };
  attempt(soname);
  if (const auto slash = found.rfind('/'); slash != std::string::npos) attempt(found.substr(0, slash + 1) + soname);
  attempt(found);
  if (!lib)
    fail("cuda: cannot load cuBLASLt, which the CUDA backend's matrix products need (tried ", tried, "; last error: ", why,
         "). Install the CUDA toolkit's cuBLAS (", soname, ") or put its directory on LD_LIBRARY_PATH");
  CublasLt api;
  auto bind = [&](auto& entry, const char* symbol) {
    entry = reinterpret_cast<std::remove_reference_t<decltype(entry)>>(dlsym(lib, symbol));
    if (!entry) fail("cuda: the cuBLASLt that loaded has no ", symbol, " (", dlerror(), "); frugal was compiled against cuBLAS ",
                     CUBLAS_VER_MAJOR, ".", CUBLAS_VER_MINOR, ": install that version");
  };
  bind(api.Create, "cublasLtCreate");
  bind(api.Destroy, "cublasLtDestroy");
  bind(api.GetStatusString, "cublasLtGetStatusString");
  bind(api.Matmul, "cublasLtMatmul");
  bind(api.MatmulAlgoGetHeuristic, "cublasLtMatmulAlgoGetHeuristic");
  bind(api.MatmulDescCreate, "cublasLtMatmulDescCreate");
  bind(api.MatmulDescDestroy, "cublasLtMatmulDescDestroy");
  bind(api.MatmulDescSetAttribute, "cublasLtMatmulDescSetAttribute");
  bind(api.MatmulPreferenceCreate, "cublasLtMatmulPreferenceCreate");
  bind(api.MatmulPreferenceDestroy, "cublasLtMatmulPreferenceDestroy");
  bind(api.MatmulPreferenceSetAttribute, "cublasLtMatmulPreferenceSetAttribute");
  bind(api.MatrixLayoutCreate, "cublasLtMatrixLayoutCreate");
  bind(api.MatrixLayoutDestroy, "cublasLtMatrixLayoutDestroy");
  bind(api.MatrixLayoutSetAttribute, "cublasLtMatrixLayoutSetAttribute");
  return api;  // the library stays loaded for the life of the process
}

}  // namespace frugal::cuda
