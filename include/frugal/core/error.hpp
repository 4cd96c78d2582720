#pragma once
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace frugal {

// Every error frugal raises is a frugal::Error; the message names what was
// wrong (op, shapes, file) and, where there is one, what to do about it.
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};
struct ShapeError : Error {
  using Error::Error;
};
struct BudgetError : Error {
  using Error::Error;
  BudgetError(const std::string& what, std::size_t smallest, std::size_t unconstrained = 0)
      : Error(what), smallest_feasible_bytes(smallest), unconstrained_bytes(unconstrained) {}
  std::size_t smallest_feasible_bytes = 0;  // the least device budget that plan fits, when known
  std::size_t unconstrained_bytes = 0;      // what the step needs with nothing evicted, when known
  // smallest_feasible_bytes is a lower bound, not the searched least: the
  // step was refused because its device, host and NVMe together cannot hold
  // it (PlanOptions::refuse_overflow, fit_only).
  bool smallest_is_lower_bound = false;
};
struct DataError : Error {
  using Error::Error;
};
// A transfer to or from a memory tier (host pool, NVMe) failed: full disk,
// I/O error. The step stops before it writes anything it cannot undo.
struct IoError : Error {
  using Error::Error;
};

template <class... Parts>
std::string cat(Parts&&... parts) {
  std::ostringstream os;
  (os << ... << std::forward<Parts>(parts));
  return os.str();
}

template <class E = Error, class... Parts>
[[noreturn]] void fail(Parts&&... parts) {
  throw E(cat(std::forward<Parts>(parts)...));
}

}  // namespace frugal
