#pragma once
// Reading this process's resident memory, for checking memory predictions.
#include <sys/resource.h>

#include <cstdio>
#include <cstring>

namespace frugal {

// Resident set size now (VmRSS), in bytes; 0 where /proc is unavailable.
inline std::size_t current_rss_bytes() {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return 0;
  char line[256];
  std::size_t kib = 0;
  while (std::fgets(line, sizeof line, f))
    if (std::strncmp(line, "VmRSS:", 6) == 0) {
      std::sscanf(line + 6, "%zu", &kib);
      break;
    }
  std::fclose(f);
  return kib * 1024;
}

// The largest resident set this process has had (ru_maxrss), in bytes.
inline std::size_t peak_rss_bytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return std::size_t(u.ru_maxrss) * 1024;
}

}  // namespace frugal
