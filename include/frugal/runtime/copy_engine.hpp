#pragma once
// Transfers beside compute: one worker thread (slot_worker.hpp) runs them in
// the order they were submitted, and a slot's wait() is the event that
// orders compute after it. Memory copies go through the backend
// (Backend::transfer: a memcpy on the CPU, a copy stream on a GPU), so the
// ordering logic here is the same for every backend and tested on the CPU.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "../core/bytes.hpp"
#include "../core/error.hpp"
#include "backend.hpp"
#include "nvme_store.hpp"
#include "slot_worker.hpp"

namespace frugal {

class CopyEngine {
 public:
  // One slot per transfer in a plan.
  // `backend`: who moves memory (null: plain memcpy, both ends in host memory).
  explicit CopyEngine(std::size_t slots, Backend* backend = nullptr)
      : backend_(backend), worker_(slots, [this](const Job& job, std::size_t slot) { run(job, slot); }, "copy engine") {}
  CopyEngine(const CopyEngine&) = delete;
  CopyEngine& operator=(const CopyEngine&) = delete;

  // Enqueue and return at once. A slot's job must be waited before the slot
  // is used again. Once a job has failed, these throw that job's error until
  // reset_error().
  // `to_device`: dst is the arena and src host memory (else the other way).
  void copy(std::size_t slot, void* dst, const void* src, std::size_t bytes, bool to_device = false) {
    if (backend_) backend_->before_transfer();  // the copy sees what compute wrote before it was issued
    worker_.submit(slot, Job{to_device ? Kind::copy_to_device : Kind::copy, dst, src, bytes, nullptr, 0});
  }
  void write_nvme(std::size_t slot, NvmeStore& store, std::uint64_t offset, const void* src, std::size_t bytes) {
    store.check_range(offset, bytes);  // a bad plan fails here, in the caller, not on the worker
    worker_.submit(slot, Job{Kind::write_nvme, nullptr, src, bytes, &store, offset});
  }
  void read_nvme(std::size_t slot, NvmeStore& store, std::uint64_t offset, void* dst, std::size_t bytes) {
    store.check_range(offset, bytes);
    worker_.submit(slot, Job{Kind::read_nvme, dst, nullptr, bytes, &store, offset});
  }

  // Blocks until the slot's job has run. If it failed, or was skipped
  // because an earlier job failed, throws the engine's error (naming the
  // transfer that failed: an IoError where the transfer's I/O failed).
  // Waiting on a slot with no job returns at once.
  void wait(std::size_t slot) { worker_.wait(slot); }
  // Waits for every submitted job, which counts as waiting each slot that
  // succeeded; throws the engine's error if one failed.
  void drain() { worker_.drain(); }
  // Accepts work again after a failure (the step that failed is abandoned):
  // waits for the queue to empty and frees the failed slots.
  void reset_error() { worker_.reset_error(); }

  std::size_t slots() const { return worker_.slots(); }
  // Bytes of the jobs that completed, and the worker's time spent on jobs.
  std::uint64_t bytes_moved() const { return bytes_moved_.load(std::memory_order_relaxed); }
  double busy_seconds() const { return worker_.busy_seconds(); }

 private:
  enum class Kind : std::uint8_t { copy, copy_to_device, write_nvme, read_nvme };
  struct Job {
    Kind kind = Kind::copy;
    void* dst = nullptr;
    const void* src = nullptr;
    std::size_t bytes = 0;
    NvmeStore* store = nullptr;
    std::uint64_t offset = 0;
  };

  static std::string describe(const Job& job, std::size_t slot) {
    switch (job.kind) {
      case Kind::copy:
      case Kind::copy_to_device:
        return cat("copy of ", format_bytes(job.bytes), " (slot ", slot, ")");
      case Kind::write_nvme:
        return cat("write of ", format_bytes(job.bytes), " to NVMe offset ", job.offset, " (slot ", slot, ")");
      case Kind::read_nvme:
        return cat("read of ", format_bytes(job.bytes), " from NVMe offset ", job.offset, " (slot ", slot, ")");
    }
    return "transfer";
  }

  // On the worker; a failure names the transfer, and stays an IoError where
  // the I/O failed.
  void run(const Job& job, std::size_t slot) {
    try {
      switch (job.kind) {
        case Kind::copy:
        case Kind::copy_to_device:
          if (backend_) backend_->transfer(job.dst, job.src, job.bytes, job.kind == Kind::copy_to_device);
          else if (job.bytes) std::memcpy(job.dst, job.src, job.bytes);
          break;
        case Kind::write_nvme:
          job.store->write(job.offset, job.src, job.bytes);
          break;
        case Kind::read_nvme:
          job.store->read(job.offset, job.dst, job.bytes);
          break;
      }
    } catch (const IoError& e) {
      throw IoError(cat("copy engine: ", describe(job, slot), " failed: ", e.what()));
    } catch (const std::exception& e) {
      throw Error(cat("copy engine: ", describe(job, slot), " failed: ", e.what()));
    }
    bytes_moved_.fetch_add(job.bytes, std::memory_order_relaxed);
  }

  Backend* backend_ = nullptr;
  std::atomic<std::uint64_t> bytes_moved_{0};
  SlotWorker<Job> worker_;  // last: its thread stops before the members it uses go
};

}  // namespace frugal
