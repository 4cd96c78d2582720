#pragma once
// The real CPU backend, counting its arena allocations: compile with
// CompileOptions{.use_backend = counting::make()}. With hide_kernels set it has no
// kernels, so an executor's constructor throws after reserving its memory.
#include <atomic>
#include <frugal/frugal.hpp>
#include <memory>

namespace counting {

inline std::atomic<int> allocations{0}, deallocations{0};
inline std::atomic<std::size_t> bytes_to_device{0};  // what copy_to_device moved
inline std::atomic<bool> hide_kernels{false};

inline void reset() {
  allocations = 0;
  deallocations = 0;
  bytes_to_device = 0;
  hide_kernels = false;
}

class Backend final : public frugal::Backend {
 public:
  std::string name() const override { return real_->name(); }
  const frugal::KernelTable& kernels() const override { return hide_kernels ? none_ : real_->kernels(); }
  void* allocate(std::size_t bytes) override {
    ++allocations;
    return real_->allocate(bytes);
  }
  void deallocate(void* p) override {
    ++deallocations;
    real_->deallocate(p);
  }
  void copy_to_device(void* d, const void* s, std::size_t n) override {
    bytes_to_device += n;
    real_->copy_to_device(d, s, n);
  }
  void copy_to_host(void* d, const void* s, std::size_t n) override { real_->copy_to_host(d, s, n); }
  void fill(void* d, unsigned char b, std::size_t n) override { real_->fill(d, b, n); }
  void synchronize() override { real_->synchronize(); }

 private:
  std::unique_ptr<frugal::Backend> real_ = frugal::make_backend("cpu");
  frugal::KernelTable none_;
};

// A fresh counting backend, for CompileOptions::use_backend.
inline std::shared_ptr<frugal::Backend> make() { return std::make_shared<Backend>(); }

}  // namespace counting
