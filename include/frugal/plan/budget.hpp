#pragma once
#include <cstddef>
#include <string>

namespace frugal {

// What a step may use. Zero means "no limit" for that tier.
struct Budget {
  std::size_t device = 0;
  std::size_t host = 0;
  std::string nvme_dir;
  std::size_t nvme = 0;
};

}  // namespace frugal
