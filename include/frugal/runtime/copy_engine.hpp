#pragma once
// Transfers beside compute: one worker thread runs them in the order they
// were submitted, and a slot's wait() is the event that orders compute after
// it. Memory copies go through the backend (Backend::transfer: a memcpy on
// the CPU, a copy stream on a GPU), so the ordering logic here is the same
// for every backend and tested on the CPU.
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "../core/bytes.hpp"
#include "../core/error.hpp"
#include "backend.hpp"
#include "nvme_store.hpp"

namespace frugal {

class CopyEngine {
 public:
  // One slot per transfer in a plan. Every record is made here, so
  // submitting a job allocates nothing.
  // `backend`: who moves memory (null: plain memcpy, both ends in host memory).
  explicit CopyEngine(std::size_t slots, Backend* backend = nullptr)
      : backend_(backend), jobs_(slots), state_(slots, State::idle), queue_(slots) {
    worker_ = std::thread([this] { work(); });
  }

  ~CopyEngine() {
    {
      std::unique_lock lk(mutex_);
      idle_.wait(lk, [&] { return queued_ == 0 && !running_; });
      stop_ = true;
    }
    work_ready_.notify_all();
    worker_.join();
  }

  CopyEngine(const CopyEngine&) = delete;
  CopyEngine& operator=(const CopyEngine&) = delete;

  // Enqueue and return at once. A slot's job must be waited before the slot
  // is used again. Once a job has failed, these throw that job's error until
  // reset_error().
  // `to_device`: dst is the arena and src host memory (else the other way).
  void copy(std::size_t slot, void* dst, const void* src, std::size_t bytes, bool to_device = false) {
    if (backend_) backend_->before_transfer();  // the copy sees what compute wrote before it was issued
    submit(slot, Job{to_device ? Kind::copy_to_device : Kind::copy, dst, src, bytes, nullptr, 0});
  }
  void write_nvme(std::size_t slot, NvmeStore& store, std::uint64_t offset, const void* src, std::size_t bytes) {
    store.check_range(offset, bytes);  // a bad plan fails here, in the caller, not on the worker
    submit(slot, Job{Kind::write_nvme, nullptr, src, bytes, &store, offset});
  }
  void read_nvme(std::size_t slot, NvmeStore& store, std::uint64_t offset, void* dst, std::size_t bytes) {
    store.check_range(offset, bytes);
    submit(slot, Job{Kind::read_nvme, dst, nullptr, bytes, &store, offset});
  }

  // Blocks until the slot's job has run. If it failed, or was skipped
  // because an earlier job failed, throws the engine's error (naming the
  // transfer that failed). Waiting on a slot with no job returns at once.
  void wait(std::size_t slot) {
    std::unique_lock lk(mutex_);
    check_slot(slot);
    finished_.wait(lk, [&] { return state_[slot] != State::pending; });
    const State s = std::exchange(state_[slot], State::idle);
    if (s == State::failed) throw_error();
  }

  // Waits for every submitted job, which counts as waiting each slot that
  // succeeded; throws the engine's error if one failed.
  void drain() {
    std::unique_lock lk(mutex_);
    idle_.wait(lk, [&] { return queued_ == 0 && !running_; });
    for (auto& s : state_)
      if (s == State::done) s = State::idle;
    if (failed_) throw_error();
  }

  // Accepts work again after a failure (the step that failed is abandoned):
  // waits for the queue to empty and frees the failed slots.
  void reset_error() {
    std::unique_lock lk(mutex_);
    idle_.wait(lk, [&] { return queued_ == 0 && !running_; });
    failed_ = false;
    error_.clear();
    for (auto& s : state_)
      if (s == State::failed) s = State::idle;
  }

  std::size_t slots() const { return jobs_.size(); }
  // Bytes of the jobs that completed, and the worker's time spent on jobs.
  std::uint64_t bytes_moved() const {
    std::lock_guard lk(mutex_);
    return bytes_moved_;
  }
  double busy_seconds() const {
    std::lock_guard lk(mutex_);
    return busy_seconds_;
  }

 private:
  enum class Kind : std::uint8_t { copy, copy_to_device, write_nvme, read_nvme };
  // idle: free to submit; pending: queued or running; done/failed: run, not yet waited.
  enum class State : std::uint8_t { idle, pending, done, failed };

  struct Job {
    Kind kind = Kind::copy;
    void* dst = nullptr;
    const void* src = nullptr;
    std::size_t bytes = 0;
    NvmeStore* store = nullptr;
    std::uint64_t offset = 0;
  };

  void check_slot(std::size_t slot) const {
    if (slot >= jobs_.size()) fail("internal: copy engine slot ", slot, " out of range (", jobs_.size(), " slots)");
  }

  [[noreturn]] void throw_error() const {
    if (error_is_io_) throw IoError(error_);
    throw Error(error_);
  }

  void submit(std::size_t slot, const Job& job) {
    {
      std::lock_guard lk(mutex_);
      check_slot(slot);
      if (failed_) throw_error();
      if (state_[slot] != State::idle)
        fail("internal: copy engine slot ", slot, " was given a new job before its last one was waited");
      jobs_[slot] = job;
      state_[slot] = State::pending;
      // Each pending slot holds one queue entry, so the ring never overflows.
      queue_[(head_ + queued_) % queue_.size()] = slot;
      ++queued_;
    }
    work_ready_.notify_one();
  }

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

  void run(const Job& job) {
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
  }

  void work() {
    std::unique_lock lk(mutex_);
    for (;;) {
      work_ready_.wait(lk, [&] { return queued_ > 0 || stop_; });
      if (queued_ == 0) return;  // stop_, and nothing left to do
      const std::size_t slot = queue_[head_];
      head_ = (head_ + 1) % queue_.size();
      --queued_;
      running_ = true;
      // After a failure the later jobs are not run: they may read what the
      // failed one should have written.
      const bool skip = failed_;
      const Job job = jobs_[slot];
      lk.unlock();

      std::string error;
      bool error_is_io = true;
      const auto t0 = std::chrono::steady_clock::now();
      if (!skip) {
        try {
          run(job);
        } catch (const IoError& e) {
          error = cat("copy engine: ", describe(job, slot), " failed: ", e.what());
        } catch (const std::exception& e) {
          error = cat("copy engine: ", describe(job, slot), " failed: ", e.what());
          error_is_io = false;
        }
      }
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

      lk.lock();
      running_ = false;
      busy_seconds_ += seconds;
      if (skip) {
        state_[slot] = State::failed;
      } else if (!error.empty()) {
        state_[slot] = State::failed;
        failed_ = true;
        error_ = std::move(error);
        error_is_io_ = error_is_io;
      } else {
        state_[slot] = State::done;
        bytes_moved_ += job.bytes;
      }
      finished_.notify_all();
      if (queued_ == 0) idle_.notify_all();
    }
  }

  Backend* backend_ = nullptr;
  mutable std::mutex mutex_;
  std::condition_variable work_ready_;  // the worker waits for jobs
  std::condition_variable finished_;    // wait(slot) waits for a job
  std::condition_variable idle_;        // drain() waits for an empty queue
  std::vector<Job> jobs_;
  std::vector<State> state_;
  std::vector<std::size_t> queue_;  // a ring of slot numbers in submission order
  std::size_t head_ = 0, queued_ = 0;
  bool running_ = false;
  bool stop_ = false;
  bool failed_ = false;
  bool error_is_io_ = true;
  std::string error_;
  std::uint64_t bytes_moved_ = 0;
  double busy_seconds_ = 0;
  std::thread worker_;
};

}  // namespace frugal
