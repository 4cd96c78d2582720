#pragma once
// What a graph asks of the backend that will run it. A backend's kernel
// decides how much scratch an op needs and which inputs it may overwrite;
// the graph records both on each node as it is added, so the planner places
// them like any value while graph/ and plan/ never see a backend
// (runtime/backend.hpp makes these from a backend's kernel table).
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "value.hpp"

namespace frugal {

class Op;

struct KernelQueries {
  std::string backend;  // empty: not bound to any backend (no scratch, the op's own in-place candidates)
  std::function<std::size_t(const Op&, std::span<const TensorMeta>, std::span<const TensorMeta>)> workspace_bytes;
  std::function<std::vector<int>(const Op&)> inplace_inputs;
};

}  // namespace frugal
