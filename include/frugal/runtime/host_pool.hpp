#pragma once
// STUB (replaced by the tiers helper's version)
#include <cstdlib>
#include <cstddef>
namespace frugal {
class HostPool {
 public:
  explicit HostPool(std::size_t bytes = 0) : bytes_(bytes), p_(static_cast<std::byte*>(std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096 + 4096))) {}
  ~HostPool() { std::free(p_); }
  HostPool(const HostPool&) = delete;
  std::byte* at(std::size_t off) { return p_ + off; }
  std::size_t bytes() const { return bytes_; }
 private:
  std::size_t bytes_; std::byte* p_;
};
}
