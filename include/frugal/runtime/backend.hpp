#pragma once
// What the runtime needs from a backend. runtime/ never includes a backend:
// backends are compiled with frugal's kernels, once per program
// (frugal_add_kernels in CMake, or <frugal/kernels.hpp> in one file), and
// reached through make_backend, which is defined there.
#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <typeindex>

#include "../graph/kernel_queries.hpp"
#include "../graph/var.hpp"  // Op, and Op::backward's definition

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
  // The op's planned scratch space (KernelEntry::workspace_bytes), or null.
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
};

using Kernel = std::function<void(const Op&, const KernelArgs&)>;
using WorkspaceFn = std::function<std::size_t(const Op&, std::span<const TensorMeta>, std::span<const TensorMeta>)>;

// What a backend answers for one op type: the kernel, the scratch bytes it
// needs for given shapes (planned like any value, so it counts against the
// budget), and which of the op's in-place candidates (Op::inplace_inputs)
// this kernel really may overwrite.
struct KernelEntry {
  Kernel run;
  WorkspaceFn workspace;              // null: no scratch
  std::optional<std::vector<int>> inplace;  // null: every candidate the op declares
};

// Kernels keyed by the op's C++ type; a backend owns one table and fills it
// in its constructor (nothing registers itself, so nothing can be dropped).
class KernelTable {
 public:
  // `ws(op, inputs, outputs)` sizes the kernel's scratch for those shapes.
  template <class OpT, class Fn>
  KernelEntry& add(Fn fn) {
    KernelEntry& e = table_[std::type_index(typeid(OpT))];
    e = {};
    e.run = [fn](const Op& op, const KernelArgs& a) { fn(static_cast<const OpT&>(op), a); };
    return e;
  }
  template <class OpT, class Fn, class Ws>
  KernelEntry& add(Fn fn, Ws ws) {
    KernelEntry& e = add<OpT>(std::move(fn));
    e.workspace = [ws](const Op& op, std::span<const TensorMeta> in, std::span<const TensorMeta> out) {
      return std::size_t(ws(static_cast<const OpT&>(op), in, out));
    };
    return e;
  }
  // A wrapping op (ops::CollectiveStart, ops::HostUpdate) whose kernel is
  // its inner op's (OpT::inner()), with the same arguments and scratch:
  // the wrapper changes where or when it runs, not what it computes.
  template <class OpT>
  KernelEntry& add_forwarding(const char* wrapper) {
    const KernelTable* table = this;
    auto entry = [table, wrapper](const OpT& op) -> const KernelEntry& { return table->inner(op.inner(), wrapper); };
    return add<OpT>([entry](const OpT& op, const KernelArgs& a) { entry(op).run(op.inner(), a); },
                    [entry](const OpT& op, std::span<const TensorMeta> in, std::span<const TensorMeta> out) {
                      const KernelEntry& e = entry(op);
                      return e.workspace ? e.workspace(op.inner(), in, out) : std::size_t(0);
                    });
  }
  // OpT's entry, to change (a planning table that sizes another backend's
  // scratch), or null where the table has none.
  template <class OpT>
  KernelEntry* entry() {
    auto it = table_.find(std::type_index(typeid(OpT)));
    return it == table_.end() ? nullptr : &it->second;
  }
  // The op types this table has kernels for.
  std::vector<std::type_index> op_types() const {
    std::vector<std::type_index> types;
    for (const auto& [type, e] : table_) types.push_back(type);
    return types;
  }
  const KernelEntry* find(const Op& op) const {
    auto it = table_.find(std::type_index(typeid(op)));
    return it == table_.end() ? nullptr : &it->second;
  }
  // The entry of the op that a wrapping op runs (ops::ShardedUpdate,
  // ops::CollectiveStart); `wrapper` names it in the error where there is none.
  const KernelEntry& inner(const Op& op, const char* wrapper) const {
    const KernelEntry* e = find(op);
    if (!e) fail(wrapper, ": this backend has no kernel for ", op.name());
    return *e;
  }

 private:
  std::map<std::type_index, KernelEntry> table_;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  // What the backend's kernels chose at run time that changes their speed
  // (the CPU backend: which GEMM engine and instruction set). A device
  // profile cached under another choice is stale (runtime/calibrate.hpp).
  virtual std::string kernel_variant() const { return {}; }
  virtual const KernelTable& kernels() const = 0;
  // Device memory for the arena; allocated once per compiled step.
  virtual void* allocate(std::size_t bytes) = 0;
  virtual void deallocate(void* p) = 0;
  virtual void copy_to_device(void* dst, const void* src, std::size_t bytes) = 0;
  virtual void copy_to_host(void* dst, const void* src, std::size_t bytes) = 0;
  virtual void fill(void* dst, unsigned char byte, std::size_t bytes) = 0;
  // Waits until every kernel and copy issued so far has finished (and
  // reports a failure a kernel flagged on the device, such as a bad label).
  virtual void synchronize() {}

  // Whether kernels may read and write host memory directly. The CPU's
  // "device" is host memory, so a persistent the plan keeps on the device
  // (a parameter, an optimizer state) is used where the user's tensor holds
  // it. A GPU's kernels cannot: the executor keeps a device copy of each
  // such persistent in the block it reserves for the step, loads it from the
  // tensor when the tensor changed, and writes the step's updates back.
  virtual bool host_addressable() const { return true; }

  // The host tier's transfers (arena <-> host memory), which the copy
  // engine runs on its worker thread in the order they were issued.
  // `before_transfer` runs on the executor's thread when a transfer is
  // issued: everything the step issued before it must be visible to the
  // copy (a GPU waits for its compute stream). `transfer` runs on the worker
  // and returns once the bytes are in place; `to_device`: dst is device
  // memory and src host memory (else the other way). Both ends of a CPU
  // transfer are host memory.
  virtual void before_transfer() {}
  // Page-locks host memory the host tier copies to and from (the host pool)
  // so a GPU's copies run at full speed; false when not done (the copies
  // still work, from pageable memory). unpin_host undoes it before the
  // memory is freed. Nothing to do on the CPU.
  virtual bool pin_host(void* p, std::size_t bytes) {
    (void)p, (void)bytes;
    return false;
  }
  virtual void unpin_host(void* p) noexcept { (void)p; }
  virtual void transfer(void* dst, const void* src, std::size_t bytes, bool to_device) {
    (void)to_device;
    if (bytes) std::memcpy(dst, src, bytes);
  }

  const KernelEntry& entry_for(const Op& op) const {
    const KernelEntry* e = kernels().find(op);
    if (!e) fail("backend '", name(), "' has no kernel for op '", op.name(), "'");
    return *e;
  }
  const Kernel& kernel_for(const Op& op) const { return entry_for(op).run; }

  // Scratch bytes this backend's kernel needs for `op` on these shapes.
  std::size_t workspace_bytes(const Op& op, std::span<const TensorMeta> in, std::span<const TensorMeta> out) const {
    const KernelEntry* e = kernels().find(op);
    return e && e->workspace ? e->workspace(op, in, out) : 0;
  }
};

// Options a backend takes when it is made.
struct BackendOptions {
  // cpu: which engine runs f32/bf16/f16 convolutions ("auto": AVX-512 where
  // the CPU has it, else BLAS; "blas"; "avx512", an error without it).
  std::string conv_engine = "auto";
  // cpu: which algorithm runs 3x3 stride-1 convolutions ("auto": Winograd
  // where frugal's rules say it pays, pass by pass, F(4x4,3x3) or F(2x2,3x3)
  // by the plane's size, else direct; "direct"; "winograd": wherever the
  // shape allows; "winograd-f2", "winograd-f4": so, with that tile).
  // Either engine runs them all; f64 is always direct.
  std::string conv_algorithm = "auto";
  // Kernels for ops of the program's own, added to the backend's table after
  // frugal's (an entry for an op frugal already knows replaces frugal's).
  std::vector<std::function<void(KernelTable&)>> extra_kernels;
};

// What a graph asks of the backend that will run it, as nodes are added:
// the planner sizes scratch and in-place reuse from the backend's own
// kernels, while graph/ and plan/ never see a backend. The queries keep the
// backend alive.
inline KernelQueries kernel_queries(std::shared_ptr<const Backend> backend) {
  KernelQueries q;
  q.backend = backend->name();
  q.workspace_bytes = [backend](const Op& op, std::span<const TensorMeta> in, std::span<const TensorMeta> out) {
    return backend->workspace_bytes(op, in, out);
  };
  q.inplace_inputs = [backend](const Op& op) {
    std::vector<int> wanted = op.inplace_inputs();
    const KernelEntry* e = backend->kernels().find(op);
    if (!e || !e->inplace) return wanted;
    std::vector<int> allowed;
    for (int i : wanted)
      if (std::find(e->inplace->begin(), e->inplace->end(), i) != e->inplace->end()) allowed.push_back(i);
    return allowed;
  };
  return q;
}

// Defined with the compiled kernels (frugal_add_kernels(target) in CMake, or
// #include <frugal/kernels.hpp> in exactly one file of the program). An
// undefined reference to these at link time means neither was done.
std::unique_ptr<Backend> make_backend(const std::string& name, const BackendOptions& options = {});
// The backends this program was built with, e.g. {"cpu"}.
std::vector<std::string> available_backends();

}  // namespace frugal
