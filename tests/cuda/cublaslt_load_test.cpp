// The CUDA backend loads cuBLASLt with dlopen (backend/cuda/cublaslt_api.hpp)
// instead of linking it. Loading needs no GPU, so this runs on every
// machine with the CUDA toolkit: every function the backend binds is found
// under the name it asks for, and calls through the bound pointers reach
// the library (a misspelt symbol would otherwise show only on a GPU).
// argv[1]: the library file CMake found.
#include <cstdio>
#include <cstring>
#include <frugal/backend/cuda/cublaslt_api.hpp>
#include <string>

int main(int argc, char** argv) {
  const std::string found = argc > 1 ? argv[1] : "";
  int failures = 0;
  auto check = [&](bool ok, const char* what) {
    if (!ok) {
      std::printf("FAILED: %s\n", what);
      ++failures;
    }
  };
  try {
    const frugal::cuda::CublasLt api = frugal::cuda::load_cublaslt(found);
    check(api.Create && api.Destroy && api.GetStatusString && api.Matmul && api.MatmulAlgoGetHeuristic &&
              api.MatmulDescCreate && api.MatmulDescDestroy && api.MatmulDescSetAttribute && api.MatmulPreferenceCreate &&
              api.MatmulPreferenceDestroy && api.MatmulPreferenceSetAttribute && api.MatrixLayoutCreate &&
              api.MatrixLayoutDestroy && api.MatrixLayoutSetAttribute,
          "every entry is bound");
    // Needs no device: the library's own status names.
    const char* ok = api.GetStatusString(CUBLAS_STATUS_SUCCESS);
    const char* bad = api.GetStatusString(CUBLAS_STATUS_NOT_INITIALIZED);
    check(ok && bad && *ok && std::strcmp(ok, bad) != 0, "a call through the bound GetStatusString reaches cuBLASLt");
    // A layout is host-side bookkeeping: create, set and destroy it.
    cublasLtMatrixLayout_t layout = nullptr;
    check(api.MatrixLayoutCreate(&layout, CUDA_R_32F, 4, 3, 4) == CUBLAS_STATUS_SUCCESS && layout,
          "a matrix layout is made through the bound entries");
    if (layout) check(api.MatrixLayoutDestroy(layout) == CUBLAS_STATUS_SUCCESS, "and destroyed");
  } catch (const std::exception& e) {
    std::printf("FAILED: %s\n", e.what());
    return 1;
  }
  if (failures == 0) std::printf("cuBLASLt loaded and bound (%s)\n", found.c_str());
  return failures ? 1 : 0;
}
