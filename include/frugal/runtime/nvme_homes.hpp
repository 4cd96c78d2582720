#pragma once
// Tensors whose bytes a step holds in its NVMe file (ZeRO-Infinity homes,
// plan/nvme_home.hpp), not in their own storage.
//
// Between steps, a parameter or optimizer state whose home is NVMe lives
// only there: the step gives the pages of the user's tensor back to the
// system (its storage then reads as zeros) so the tensor takes no host
// memory. Whoever reads or writes such a tensor outside that step first
// asks for it back here, by its storage: checkpoints and weight files do,
// another step that reads it does, and Step::sync_to_host() does for a
// program that reads its tensors itself. The bytes come back from the file
// and stay in the tensor until the owning step's next run takes them again.
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>

#include "../core/error.hpp"

namespace frugal {

class NvmeHomes {
 public:
  static NvmeHomes& registry() {
    static NvmeHomes r;
    return r;
  }
  // `storage`'s bytes are in `owner`'s file now; `bring_back` copies them
  // into it (and is called at most once per hold).
  void hold(const void* storage, const void* owner, std::function<void()> bring_back) {
    std::lock_guard<std::mutex> g(lock_);
    held_[storage] = {owner, std::move(bring_back)};
    count_.store(held_.size(), std::memory_order_release);
  }
  // `owner` no longer holds `storage` (it is going away).
  void drop(const void* storage, const void* owner) {
    std::lock_guard<std::mutex> g(lock_);
    auto it = held_.find(storage);
    if (it != held_.end() && it->second.owner == owner) held_.erase(it);
    count_.store(held_.size(), std::memory_order_release);
  }
  // Copies `storage`'s bytes back from the file that holds them, if one
  // does; `except` (an owner) keeps its own. If reading fails, the owner
  // still holds them (and the error propagates).
  void bring_back(const void* storage, const void* except = nullptr) {
    if (count_.load(std::memory_order_acquire) == 0) return;
    std::function<void()> f;
    const void* owner;
    {
      std::lock_guard<std::mutex> g(lock_);
      auto it = held_.find(storage);
      if (it == held_.end() || it->second.owner == except) return;
      f = it->second.bring_back;
      owner = it->second.owner;
    }
    f();
    drop(storage, owner);
  }
  // Every tensor any step holds: before a checkpoint reads or writes them.
  void bring_back_all() {
    while (count_.load(std::memory_order_acquire) != 0) {
      const void* storage;
      {
        std::lock_guard<std::mutex> g(lock_);
        if (held_.empty()) return;
        storage = held_.begin()->first;
      }
      bring_back(storage);
    }
  }
  std::size_t held() const { return count_.load(std::memory_order_acquire); }

  // Gives the whole pages inside [p, p + bytes) back to the system: they
  // read as zeros until written (private anonymous memory, which is what
  // Tensor's aligned_alloc hands out). The bytes must be safe elsewhere.
  static void release_pages(void* p, std::size_t bytes) {
    static const std::uintptr_t page = std::uintptr_t(sysconf(_SC_PAGESIZE));
    const std::uintptr_t begin = (std::uintptr_t(p) + page - 1) / page * page;
    const std::uintptr_t end = (std::uintptr_t(p) + bytes) / page * page;
    if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
  }

 private:
  struct Held {
    const void* owner;
    std::function<void()> bring_back;
  };
  std::mutex lock_;
  std::map<const void*, Held> held_;
  std::atomic<std::size_t> count_{0};
};

}  // namespace frugal
