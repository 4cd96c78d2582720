#pragma once
#include "../../runtime/backend.hpp"

namespace frugal::cpu {

// The CPU backend's kernels. Each kernel header adds its own entries, so
// adding an op never touches a central list.
inline KernelTable& kernels() {
  static KernelTable t;
  return t;
}

}  // namespace frugal::cpu
