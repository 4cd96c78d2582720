#pragma once
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "bytes.hpp"
#include "dtype.hpp"
#include "error.hpp"
#include "shape.hpp"

namespace frugal {

// While a MetaScope is open on a thread, the tensors made there are meta
// tensors: a shape and a dtype with no memory behind them (PyTorch's "meta"
// device, accelerate's init_empty_weights). A model and its optimizer built
// inside one can be captured and planned -- every byte of the plan is known
// from shapes -- without allocating its parameters, so a 1T-parameter step
// plans on a laptop. Running such a step, or reading its data, is an error.
// Scopes nest; MetaScope(false) makes real tensors inside an open one (data
// a planner must read, such as a graph's adjacency).
class MetaScope {
 public:
  explicit MetaScope(bool on = true) : before_(active_ref()) { active_ref() = on; }
  ~MetaScope() { active_ref() = before_; }
  MetaScope(const MetaScope&) = delete;
  MetaScope& operator=(const MetaScope&) = delete;
  static bool active() { return active_ref(); }

 private:
  static bool& active_ref() {
    thread_local bool on = false;
    return on;
  }
  bool before_;
};

namespace detail {
// A meta tensor's address: unique, so the graph and the optimizer key it as
// they key real storage, and never dereferenceable -- it lies in the upper
// half of the 64-bit address space, which is the kernel's on every OS
// frugal runs on, so a read through it faults at once instead of reading
// someone else's memory. The 2^47 bytes there give 2^23 tensors 16 MiB apart
// (then addresses repeat: a graph of more meta tensors than that would
// merge two of them).
inline void* next_meta_address() {
  static std::atomic<std::uint64_t> next{0};
  std::uint64_t k = next.fetch_add(1, std::memory_order_relaxed) % (std::uint64_t(1) << 23);
  return reinterpret_cast<void*>(std::uintptr_t(0xffff800000000000ull + (k << 24)));
}
}  // namespace detail

// Concrete data the user owns: inputs, parameters, optimizer state, results.
// Host memory, aligned to kAlignment. Copies share storage (like torch::Tensor);
// clone() makes a deep copy.
class Tensor {
 public:
  Tensor() = default;
  Tensor(Shape shape, DType dtype = DType::f32) : shape_(std::move(shape)), dtype_(dtype) {
    if (MetaScope::active()) {
      storage_ = std::shared_ptr<void>(detail::next_meta_address(), [](void*) {});
      meta_ = true;
      return;
    }
    std::size_t n = std::max<std::size_t>(align_up(nbytes()), kAlignment);
    void* p = std::aligned_alloc(kAlignment, n);
    if (!p) fail("out of host memory allocating a tensor of ", format_bytes(n), " with shape ", shape_.str());
    std::memset(p, 0, n);
    storage_ = std::shared_ptr<void>(p, [](void* q) { std::free(q); });
  }

  static Tensor zeros(Shape shape, DType dtype = DType::f32) { return Tensor(std::move(shape), dtype); }

  template <class T>
  static Tensor from(const std::vector<T>& values, Shape shape) {
    if (std::int64_t(values.size()) != shape.numel())
      fail<ShapeError>("Tensor::from: ", values.size(), " values do not fill shape ", shape.str());
    Tensor t(std::move(shape), dtype_of<T>());
    std::memcpy(t.raw(), values.data(), values.size() * sizeof(T));
    return t;
  }

  bool defined() const { return bool(storage_); }
  // Shapes only (made inside a MetaScope): it can be planned, not read.
  bool is_meta() const { return meta_; }
  const Shape& shape() const { return shape_; }
  DType dtype() const { return dtype_; }
  std::int64_t numel() const { return shape_.numel(); }
  std::size_t nbytes() const { return std::size_t(numel()) * dtype_size(dtype_); }
  void* raw() const { return storage_.get(); }

  template <class T>
  T* data() const {
    if (meta_) fail_meta("data()");
    if (dtype_of<T>() != dtype_)
      fail("tensor holds ", dtype_name(dtype_), " but was read as ", dtype_name(dtype_of<T>()));
    return static_cast<T*>(storage_.get());
  }
  template <class T>
  std::vector<T> to_vector() const {
    const T* p = data<T>();
    return std::vector<T>(p, p + numel());
  }
  template <class T>
  T item() const {
    if (numel() != 1) fail("item() needs a single-element tensor, got shape ", shape_.str());
    return data<T>()[0];
  }

  Tensor clone() const {
    if (meta_) {
      MetaScope meta;
      return Tensor(shape_, dtype_);
    }
    Tensor t(shape_, dtype_);
    if (defined()) std::memcpy(t.raw(), raw(), nbytes());
    return t;
  }
  void copy_from(const Tensor& other) {
    if (other.shape_ != shape_ || other.dtype_ != dtype_)
      fail<ShapeError>("copy_from: ", dtype_name(other.dtype_), other.shape_.str(), " into ",
                       dtype_name(dtype_), shape_.str());
    if (meta_ || other.meta_) fail_meta("copy_from");
    std::memcpy(raw(), other.raw(), nbytes());
  }

 private:
  [[noreturn]] void fail_meta(const char* what) const {
    fail("Tensor::", what, ": this ", dtype_name(dtype_), shape_.str(),
         " tensor is a meta tensor (made inside a frugal::MetaScope): it has a shape and no data. Plan with it "
         "(plan_training, frugal-plan); build the model outside the scope to train or read it");
  }
  std::shared_ptr<void> storage_;
  Shape shape_;
  DType dtype_ = DType::f32;
  bool meta_ = false;
};

}  // namespace frugal
