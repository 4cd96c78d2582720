// frugal-info: what this build of frugal runs on (backends, BLAS, threads),
// for bug reports and for checking an install.
#include <cblas.h>
#include <omp.h>

#include <cstdio>
#include <frugal/frugal.hpp>

int main(int argc, char** argv) {
  bool json = argc > 1 && std::string(argv[1]) == "--json";
  std::string backends;
  for (auto& [name, _] : frugal::backend_registry()) backends += (backends.empty() ? "" : ",") + name;
  const char* blas = openblas_get_config();
  int omp = omp_get_max_threads(), blas_threads = openblas_get_num_threads();
  if (json)
    std::printf("{\"backends\":\"%s\",\"blas\":\"%s\",\"omp_threads\":%d,\"blas_threads\":%d,\"alignment\":%zu}\n",
                backends.c_str(), blas, omp, blas_threads, frugal::kAlignment);
  else
    std::printf("backends     %s\nblas         %s\nomp threads  %d\nblas threads %d\nalignment    %zu bytes\n",
                backends.c_str(), blas, omp, blas_threads, frugal::kAlignment);
  return 0;
}
