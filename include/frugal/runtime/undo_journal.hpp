#pragma once
// What a step must be able to take back if it fails part way: the old bytes
// of every persistent (parameter, optimizer state, buffer) that the step
// writes before its last operation that can fail (an NVMe read or write).
// A failed step is then undone, so it leaves the model exactly as it found
// it; writes after the last fallible operation need no record, since
// nothing after them can fail. Sized once when the step is bound (host
// memory, outside the device budget: Executor::journal_bytes); a step
// without NVMe traffic after its first update records nothing.
#include <cstring>
#include <vector>

#include "backend.hpp"

namespace frugal {

class UndoJournal {
 public:
  enum class Where : std::uint8_t { device, host };
  struct Entry {
    void* home = nullptr;  // the storage the step overwrites
    std::size_t bytes = 0;
    Where where = Where::device;
    std::size_t offset = 0;  // in the journal
  };

  // Records that position `at` overwrites `bytes` at `home` (positions added
  // in increasing order).
  void add(std::size_t at, void* home, std::size_t bytes, Where where) {
    if (at >= before_.size()) before_.resize(at + 1);
    before_[at].push_back({home, bytes, where, size_});
    size_ += bytes;
  }
  // Reserves the journal's memory: once, before the first step.
  void reserve() {
    bytes_.assign(size_, std::byte{0});
    taken_.clear();
    taken_.reserve(count());
  }
  std::size_t bytes() const { return size_; }

  // A step starts: nothing is recorded yet.
  void begin() { taken_.clear(); }
  // Before position `at` runs: keeps the bytes it is about to overwrite.
  void before(std::size_t at, Backend& backend) {
    if (at >= before_.size()) return;
    for (const Entry& e : before_[at]) {
      if (e.where == Where::device) backend.copy_to_host(bytes_.data() + e.offset, e.home, e.bytes);
      else std::memcpy(bytes_.data() + e.offset, e.home, e.bytes);
      taken_.push_back(&e);
    }
  }
  // The step failed: puts back everything it overwrote, newest first, so a
  // home written twice ends with its oldest bytes.
  void undo(Backend& backend) {
    for (auto it = taken_.rbegin(); it != taken_.rend(); ++it) {
      const Entry& e = **it;
      if (e.where == Where::device) backend.copy_to_device(e.home, bytes_.data() + e.offset, e.bytes);
      else std::memcpy(e.home, bytes_.data() + e.offset, e.bytes);
    }
    backend.synchronize();
    taken_.clear();
  }

 private:
  std::size_t count() const {
    std::size_t n = 0;
    for (auto& v : before_) n += v.size();
    return n;
  }
  std::vector<std::vector<Entry>> before_;  // by position
  std::vector<std::byte> bytes_;
  std::vector<const Entry*> taken_;  // recorded this step, in order
  std::size_t size_ = 0;
};

}  // namespace frugal
