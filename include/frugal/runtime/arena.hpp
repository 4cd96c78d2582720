#pragma once
// The device arena, owned: one block from Backend::allocate, given back to
// that backend when its owner goes, including when the constructor that
// took it throws part way (a node with no kernel, an NVMe tier that cannot
// be reserved) or when a re-plan hands it on to the executor after it.
#include <cstddef>
#include <utility>

#include "backend.hpp"

namespace frugal {

class Arena {
 public:
  Arena() = default;
  Arena(Backend& backend, std::size_t bytes)
      : backend_(&backend), data_(static_cast<std::byte*>(backend.allocate(bytes))), bytes_(bytes) {}
  ~Arena() { release(); }

  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
  Arena(Arena&& o) noexcept
      : backend_(std::exchange(o.backend_, nullptr)), data_(std::exchange(o.data_, nullptr)),
        bytes_(std::exchange(o.bytes_, 0)) {}
  Arena& operator=(Arena&& o) noexcept {
    if (this != &o) {
      release();
      backend_ = std::exchange(o.backend_, nullptr);
      data_ = std::exchange(o.data_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }

  std::byte* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }  // what was allocated
  explicit operator bool() const { return data_ != nullptr; }

 private:
  void release() noexcept {
    if (data_) backend_->deallocate(data_);
    data_ = nullptr;
    bytes_ = 0;
  }
  Backend* backend_ = nullptr;
  std::byte* data_ = nullptr;
  std::size_t bytes_ = 0;
};

}  // namespace frugal
