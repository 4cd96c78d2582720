#pragma once
// What the runtime needs from a backend, and how backends make themselves
// known. runtime/ never includes a backend: a backend header registers a
// factory here when it is included (frugal.hpp includes the CPU one).
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <typeindex>

#include "../graph/op.hpp"

namespace frugal {

// A tensor as a kernel sees it: memory, dtype, shape.
struct TensorRef {
  void* data = nullptr;
  DType dtype = DType::f32;
  const Shape* shape = nullptr;
  std::int64_t numel() const { return shape->numel(); }
  template <class T>
  T* as() const {
    return static_cast<T*>(data);
  }
};

struct KernelArgs {
  std::span<const TensorRef> in;
  std::span<const TensorRef> out;
  // Steps run before this one. Random ops key their counter-based streams
  // by it, so a recomputation inside a step replays the same numbers.
  std::uint64_t step = 0;
  // The op's planned scratch space (Op::workspace_bytes), or null.
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
};

using Kernel = std::function<void(const Op&, const KernelArgs&)>;

// Kernels keyed by the op's C++ type; a backend owns one table.
class KernelTable {
 public:
  template <class OpT, class Fn>
  bool add(Fn fn) {
    table_[std::type_index(typeid(OpT))] = [fn](const Op& op, const KernelArgs& a) {
      fn(static_cast<const OpT&>(op), a);
    };
    return true;
  }
  const Kernel* find(const Op& op) const {
    auto it = table_.find(std::type_index(typeid(op)));
    return it == table_.end() ? nullptr : &it->second;
  }

 private:
  std::map<std::type_index, Kernel> table_;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual const KernelTable& kernels() const = 0;
  // Device memory for the arena; allocated once per compiled step.
  virtual void* allocate(std::size_t bytes) = 0;
  virtual void deallocate(void* p) = 0;
  virtual void copy_to_device(void* dst, const void* src, std::size_t bytes) = 0;
  virtual void copy_to_host(void* dst, const void* src, std::size_t bytes) = 0;
  virtual void fill(void* dst, unsigned char byte, std::size_t bytes) = 0;
  virtual void set_threads(int n) = 0;
  virtual void synchronize() {}

  const Kernel& kernel_for(const Op& op) const {
    const Kernel* k = kernels().find(op);
    if (!k) fail("backend '", name(), "' has no kernel for op '", op.name(), "'");
    return *k;
  }
};

using BackendFactory = std::function<std::unique_ptr<Backend>()>;

inline std::map<std::string, BackendFactory>& backend_registry() {
  static std::map<std::string, BackendFactory> r;
  return r;
}

inline bool register_backend(const std::string& name, BackendFactory f) {
  backend_registry()[name] = std::move(f);
  return true;
}

inline std::unique_ptr<Backend> make_backend(const std::string& name) {
  auto& r = backend_registry();
  auto it = r.find(name);
  if (it == r.end()) {
    std::string known;
    for (auto& [k, _] : r) known += (known.empty() ? "" : ", ") + k;
    fail("backend '", name, "' is not available (built in: ", known.empty() ? "none" : known,
         "); include <frugal/frugal.hpp>, and for 'cuda' build with FRUGAL_WITH_CUDA");
  }
  return it->second();
}

}  // namespace frugal
