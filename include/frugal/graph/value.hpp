#pragma once
#include <cstdint>
#include <string>

#include "../core/dtype.hpp"
#include "../core/shape.hpp"
#include "../core/tensor.hpp"

namespace frugal {

using ValueId = std::int32_t;
using NodeId = std::int32_t;
inline constexpr ValueId kNoValue = -1;

// What a value is for. The planner places each kind differently: inputs and
// activations live in the step's arena; parameters, optimizer state, module
// buffers and constants persist across steps in storage the user (a Module,
// an Optimizer, the program) owns. Under a tight budget the planner adds
// copies of activations kept off the device for a while: in the host pool,
// or in the NVMe store.
//   buffer:   a module's state that is not trained (BatchNorm's running
//             statistics), which ops may update;
//   constant: data every step reads and none writes (a graph's adjacency,
//             a fixed feature matrix): bound once, never re-staged, and
//             offloaded like a parameter, without write-backs.
enum class ValueKind : std::uint8_t { input, parameter, state, activation, host, nvme, buffer, constant };

inline const char* value_kind_name(ValueKind k) {
  switch (k) {
    case ValueKind::input: return "input";
    case ValueKind::parameter: return "parameter";
    case ValueKind::state: return "optimizer state";
    case ValueKind::activation: return "activation";
    case ValueKind::host: return "host copy";
    case ValueKind::nvme: return "NVMe copy";
    case ValueKind::buffer: return "buffer";
    case ValueKind::constant: return "constant";
  }
  return "?";
}

// Bound to storage outside the step, living across steps.
inline bool is_persistent(ValueKind k) {
  return k == ValueKind::parameter || k == ValueKind::state || k == ValueKind::buffer || k == ValueKind::constant;
}

// The plan's name for the bytes of a persistent kind.
inline const char* persistent_category(ValueKind k) {
  switch (k) {
    case ValueKind::parameter: return "parameters";
    case ValueKind::buffer: return "buffers";
    case ValueKind::constant: return "constants";
    default: return "optimizer state";
  }
}

struct TensorMeta {
  DType dtype = DType::f32;
  Shape shape;
  std::size_t nbytes() const { return std::size_t(shape.numel()) * dtype_size(dtype); }
  std::string str() const { return cat(dtype_name(dtype), shape.str()); }
};

struct Value {
  TensorMeta meta;
  ValueKind kind = ValueKind::activation;
  NodeId producer = -1;   // -1 for inputs, parameters and state
  std::string name;       // parameters and inputs carry their names into errors and plans
  Tensor external;        // the persistent storage of a parameter or state value
  bool is_gradient = false;  // set by autograd, for the plan's categories
  bool is_workspace = false; // an op's scratch output (Op::workspace_bytes)
};

}  // namespace frugal
