#pragma once
// Collectives beside compute: one thread runs a step's collective kernels in
// the order they were issued, so every rank calls its communicator in the
// same order, and from one thread at a time (MPI_THREAD_SERIALIZED). A
// started collective (ops::CollectiveStart) is waited at its done; a
// collective that is not split is issued and waited at once, so it still
// queues behind the ones in flight and the communicator is never called
// from two threads together. Between steps the thread is idle, so the
// program may call the communicator itself.
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "../core/error.hpp"
#include "backend.hpp"

namespace frugal {

class CommEngine {
 public:
  // One slot per collective in a plan.
  explicit CommEngine(std::size_t slots) : jobs_(slots), state_(slots, State::idle), queue_(slots) {
    worker_ = std::thread([this] { work(); });
  }
  ~CommEngine() {
    {
      std::unique_lock lk(mutex_);
      idle_.wait(lk, [&] { return queued_ == 0 && !running_; });
      stop_ = true;
    }
    work_ready_.notify_all();
    worker_.join();
  }
  CommEngine(const CommEngine&) = delete;
  CommEngine& operator=(const CommEngine&) = delete;

  // Queues `kernel(op, args)` in `slot` and returns. What `args` points at
  // must stay put until the slot is waited. Once a job has failed, throws
  // its error until reset_error().
  void start(std::size_t slot, const Kernel& kernel, const Op& op, const KernelArgs& args) {
    {
      std::lock_guard lk(mutex_);
      check_slot(slot);
      if (failed_) std::rethrow_exception(error_);
      if (state_[slot] != State::idle)
        fail("internal: communication slot ", slot, " was given a new collective before its last one was waited");
      jobs_[slot] = {&kernel, &op, args};
      state_[slot] = State::pending;
      queue_[(head_ + queued_) % queue_.size()] = slot;
      ++queued_;
    }
    work_ready_.notify_one();
  }

  // Blocks until the slot's job has run; rethrows its error (or the error
  // of an earlier job, after which the later ones do not run).
  void wait(std::size_t slot) {
    std::unique_lock lk(mutex_);
    check_slot(slot);
    if (state_[slot] == State::pending) {
      const auto t0 = std::chrono::steady_clock::now();
      finished_.wait(lk, [&] { return state_[slot] != State::pending; });
      waited_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    const State s = std::exchange(state_[slot], State::idle);
    if (s == State::failed) std::rethrow_exception(error_);
  }

  // After a failed step: waits for what is queued (nothing may still write
  // memory the caller reuses), forgets the error and frees every slot.
  void reset() noexcept {
    std::unique_lock lk(mutex_);
    idle_.wait(lk, [&] { return queued_ == 0 && !running_; });
    failed_ = false;
    error_ = nullptr;
    for (auto& s : state_) s = State::idle;
  }

  std::size_t slots() const { return jobs_.size(); }
  // Seconds the thread spent running collectives, and seconds the caller
  // spent blocked in wait(): the difference is communication hidden behind
  // what the caller did meanwhile.
  double busy_seconds() const {
    std::lock_guard lk(mutex_);
    return busy_;
  }
  double waited_seconds() const {
    std::lock_guard lk(mutex_);
    return waited_;
  }

 private:
  enum class State : unsigned char { idle, pending, done, failed };
  struct Job {
    const Kernel* kernel = nullptr;
    const Op* op = nullptr;
    KernelArgs args;
  };

  void check_slot(std::size_t slot) const {
    if (slot >= jobs_.size()) fail("internal: communication slot ", slot, " out of range (", jobs_.size(), " slots)");
  }

  void work() {
    std::unique_lock lk(mutex_);
    for (;;) {
      work_ready_.wait(lk, [&] { return queued_ > 0 || stop_; });
      if (queued_ == 0) return;
      const std::size_t slot = queue_[head_];
      head_ = (head_ + 1) % queue_.size();
      --queued_;
      running_ = true;
      // After a failure the later collectives are not run: the ranks no
      // longer agree on which collective comes next.
      const bool skip = failed_;
      const Job job = jobs_[slot];
      lk.unlock();
      std::exception_ptr error;
      const auto t0 = std::chrono::steady_clock::now();
      if (!skip) {
        try {
          (*job.kernel)(*job.op, job.args);
        } catch (...) {
          error = std::current_exception();
        }
      }
      const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      lk.lock();
      busy_ += took;
      running_ = false;
      if (error && !failed_) {
        failed_ = true;
        error_ = error;
      }
      state_[slot] = skip || error ? State::failed : State::done;
      finished_.notify_all();
      if (queued_ == 0) idle_.notify_all();
    }
  }

  std::vector<Job> jobs_;
  std::vector<State> state_;
  std::vector<std::size_t> queue_;  // a ring: each pending slot holds one entry
  std::size_t head_ = 0, queued_ = 0;
  bool running_ = false, stop_ = false, failed_ = false;
  double busy_ = 0, waited_ = 0;
  std::exception_ptr error_;
  mutable std::mutex mutex_;
  std::condition_variable work_ready_, finished_, idle_;
  std::thread worker_;
};

}  // namespace frugal
