// frugal-info: what this build of frugal runs on (backends, BLAS, threads),
// for bug reports and for checking an install.
#include <cblas.h>
#include <omp.h>

#include <cstdio>
// What it uses, not all of frugal.hpp: the tool compiled in 10 s, most of
// it frugal.hpp's parse and deferred instantiations.
#include <frugal/core/bytes.hpp>
#include <frugal/runtime/backend.hpp>
#include <frugal/runtime/calibrate.hpp>

// --calibrate [--nvme-dir DIR]: measures this machine's rates for the CPU
// backend at the current thread count and caches them, so that steps compiled
// with CompileOptions::calibrate (or any later run) price budgets with them.
static int calibrate(int argc, char** argv) {
  std::string nvme;
  for (int i = 2; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--nvme-dir") nvme = argv[i + 1];
  auto backend = frugal::make_backend("cpu");
  int threads = std::max(1, omp_get_max_threads());
  frugal::DeviceProfile p = frugal::load_or_calibrate(*backend, threads, nvme);
  auto dir = frugal::profile_cache_dir();
  std::printf("%s\n", p.to_json().c_str());
  if (dir) std::printf("cached in %s\n", (*dir / frugal::profile_cache_file_name("cpu", threads)).c_str());
  return 0;
}

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "--calibrate") return calibrate(argc, argv);
  if (argc > 1 && std::string(argv[1]) == "--help") {
    std::printf("usage: frugal-info [--json | --calibrate [--nvme-dir DIR]]\n");
    return 0;
  }
  bool json = argc > 1 && std::string(argv[1]) == "--json";
  std::string backends;
  for (auto& name : frugal::available_backends()) backends += (backends.empty() ? "" : ",") + name;
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
