#pragma once
// A backend whose kernels cannot address host memory (a GPU's), played by
// the CPU backend with Backend::host_addressable() false: the executor then
// runs every kernel on device copies of the persistents, each step its own,
// and moves the host tier's bytes through Backend::transfer (counted here).
#include <atomic>
#include <frugal/frugal.hpp>

namespace test_backends {

class SeparateMemory final : public frugal::Backend {
 public:
  std::string name() const override { return real_->name(); }
  const frugal::KernelTable& kernels() const override { return real_->kernels(); }
  bool host_addressable() const override { return false; }
  void* allocate(std::size_t bytes) override { return real_->allocate(bytes); }
  void deallocate(void* p) override { real_->deallocate(p); }
  void copy_to_device(void* d, const void* s, std::size_t n) override { real_->copy_to_device(d, s, n); }
  void copy_to_host(void* d, const void* s, std::size_t n) override { real_->copy_to_host(d, s, n); }
  void fill(void* d, unsigned char b, std::size_t n) override { real_->fill(d, b, n); }
  void before_transfer() override { ++issued; }
  void transfer(void* d, const void* s, std::size_t n, bool to_device) override {
    ++moved;
    frugal::Backend::transfer(d, s, n, to_device);
  }
  std::atomic<int> issued{0}, moved{0};

 private:
  std::unique_ptr<frugal::Backend> real_ = frugal::make_backend("cpu");
};

}  // namespace test_backends
