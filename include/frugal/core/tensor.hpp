#pragma once
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "bytes.hpp"
#include "dtype.hpp"
#include "error.hpp"
#include "shape.hpp"

namespace frugal {

// Concrete data the user owns: inputs, parameters, optimizer state, results.
// Host memory, aligned to kAlignment. Copies share storage (like torch::Tensor);
// clone() makes a deep copy.
class Tensor {
 public:
  Tensor() = default;
  Tensor(Shape shape, DType dtype = DType::f32) : shape_(std::move(shape)), dtype_(dtype) {
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
  const Shape& shape() const { return shape_; }
  DType dtype() const { return dtype_; }
  std::int64_t numel() const { return shape_.numel(); }
  std::size_t nbytes() const { return std::size_t(numel()) * dtype_size(dtype_); }
  void* raw() const { return storage_.get(); }

  template <class T>
  T* data() const {
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
    Tensor t(shape_, dtype_);
    if (defined()) std::memcpy(t.raw(), raw(), nbytes());
    return t;
  }
  void copy_from(const Tensor& other) {
    if (other.shape_ != shape_ || other.dtype_ != dtype_)
      fail<ShapeError>("copy_from: ", dtype_name(other.dtype_), other.shape_.str(), " into ",
                       dtype_name(dtype_), shape_.str());
    std::memcpy(raw(), other.raw(), nbytes());
  }

 private:
  std::shared_ptr<void> storage_;
  Shape shape_;
  DType dtype_ = DType::f32;
};

}  // namespace frugal
