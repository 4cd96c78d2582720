#pragma once
// The host tier: one block of host memory, sized by Budget::host, taken once
// when the step is compiled so a step never allocates while it runs.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <utility>

#include "../core/bytes.hpp"
#include "../core/error.hpp"
#include "backend.hpp"

namespace frugal {

class HostPool {
 public:
  // Page-aligned: a slot can be handed straight to an O_DIRECT transfer or
  // pinned for DMA without a bounce buffer.
  static constexpr std::size_t kAlignment = 4096;

  // `pin`: the backend that pins the pool for fast copies (a GPU page-locks
  // it; Backend::pin_host), or null.
  explicit HostPool(std::size_t bytes, Backend* pin = nullptr) : bytes_(bytes) {
    if (bytes == 0) return;
    void* p = nullptr;
    if (bytes > SIZE_MAX - kAlignment || posix_memalign(&p, kAlignment, align_up(bytes, kAlignment)) != 0 || !p)
      fail<BudgetError>("host pool: cannot allocate ", format_bytes(bytes), " (", bytes,
                        " bytes, Budget::host): lower Budget::host or free host memory");
    data_ = static_cast<std::byte*>(p);
    if (pin && pin->pin_host(p, align_up(bytes, kAlignment))) pinned_by_ = pin;
  }
  ~HostPool() { release(); }

  HostPool(const HostPool&) = delete;
  HostPool& operator=(const HostPool&) = delete;
  HostPool(HostPool&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), bytes_(std::exchange(o.bytes_, 0)),
        pinned_by_(std::exchange(o.pinned_by_, nullptr)) {}
  HostPool& operator=(HostPool&& o) noexcept {
    if (this != &o) {
      release();
      data_ = std::exchange(o.data_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
      pinned_by_ = std::exchange(o.pinned_by_, nullptr);
    }
    return *this;
  }

  // The address `offset` bytes into the pool; offset == bytes() is the end.
  std::byte* at(std::size_t offset) const {
    if (offset > bytes_)
      fail("internal: host pool offset ", offset, " is past the end of the ", bytes_, "-byte pool");
    return data_ ? data_ + offset : nullptr;
  }
  std::size_t bytes() const { return bytes_; }

 private:
  void release() noexcept {
    if (pinned_by_ && data_) pinned_by_->unpin_host(data_);
    std::free(data_);
    data_ = nullptr;
    pinned_by_ = nullptr;
  }
  std::byte* data_ = nullptr;
  std::size_t bytes_ = 0;
  Backend* pinned_by_ = nullptr;  // unpins the block before it is freed
};

}  // namespace frugal
