#pragma once
// One worker thread that runs a step's jobs in the order they were issued:
// the copy engine's transfers, the communication thread's collectives. Each
// job has a slot, made when the step is bound, so issuing one allocates
// nothing; a slot's wait() is the event that orders the caller after it.
// Once a job fails, the later ones are skipped (they may read what it
// should have written), and every wait and submit reports its error until
// reset_error().
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "../core/error.hpp"

namespace frugal {

template <class Job>
class SlotWorker {
 public:
  // `run(job, slot)` does a job on the worker; what it throws fails it.
  using Run = std::function<void(const Job&, std::size_t slot)>;
  // `what` names the worker in internal errors ("copy engine").
  SlotWorker(std::size_t slots, Run run, const char* what)
      : run_(std::move(run)), what_(what), jobs_(slots), state_(slots, State::idle), queue_(slots) {
    worker_ = std::thread([this] { work(); });
  }
  ~SlotWorker() {
    {
      std::unique_lock lk(mutex_);
      idle_.wait(lk, [&] { return queued_ == 0 && !running_; });
      stop_ = true;
    }
    work_ready_.notify_all();
    worker_.join();
  }
  SlotWorker(const SlotWorker&) = delete;
  SlotWorker& operator=(const SlotWorker&) = delete;

  // Queues `job` in `slot` and returns. A slot's job must be waited before
  // the slot is used again.
  void submit(std::size_t slot, const Job& job) {
    {
      std::lock_guard lk(mutex_);
      check_slot(slot);
      if (failed_) std::rethrow_exception(error_);
      if (state_[slot] != State::idle)
        fail("internal: ", what_, " slot ", slot, " was given a new job before its last one was waited");
      jobs_[slot] = job;
      state_[slot] = State::pending;
      // Each pending slot holds one queue entry, so the ring never overflows.
      queue_[(head_ + queued_) % queue_.size()] = slot;
      ++queued_;
    }
    work_ready_.notify_one();
  }

  // Blocks until the slot's job has run; throws the worker's error if it
  // failed or was skipped. Waiting on a slot with no job returns at once.
  void wait(std::size_t slot) {
    std::unique_lock lk(mutex_);
    check_slot(slot);
    if (state_[slot] == State::pending) {
      const auto t0 = std::chrono::steady_clock::now();
      finished_.wait(lk, [&] { return state_[slot] != State::pending; });
      waited_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    if (std::exchange(state_[slot], State::idle) == State::failed) std::rethrow_exception(error_);
  }

  // Waits for every job issued, which counts as waiting each that succeeded;
  // throws the worker's error if one failed.
  void drain() {
    std::unique_lock lk(mutex_);
    idle_.wait(lk, [&] { return queued_ == 0 && !running_; });
    for (auto& s : state_)
      if (s == State::done) s = State::idle;
    if (failed_) std::rethrow_exception(error_);
  }

  // Accepts jobs again after a failure (the step that failed is abandoned):
  // waits for the queue to empty and frees the failed slots.
  void reset_error() {
    std::unique_lock lk(mutex_);
    idle_.wait(lk, [&] { return queued_ == 0 && !running_; });
    failed_ = false;
    error_ = nullptr;
    for (auto& s : state_)
      if (s == State::failed) s = State::idle;
  }

  std::size_t slots() const { return jobs_.size(); }
  // Seconds the worker spent on jobs, and seconds callers spent blocked in
  // wait(): the difference ran beside what the callers did meanwhile.
  double busy_seconds() const {
    std::lock_guard lk(mutex_);
    return busy_;
  }
  double waited_seconds() const {
    std::lock_guard lk(mutex_);
    return waited_;
  }

 private:
  // idle: free to submit; pending: queued or running; done/failed: run, not yet waited.
  enum class State : unsigned char { idle, pending, done, failed };

  void check_slot(std::size_t slot) const {
    if (slot >= jobs_.size()) fail("internal: ", what_, " slot ", slot, " out of range (", jobs_.size(), " slots)");
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
      const bool skip = failed_;
      const Job job = jobs_[slot];
      lk.unlock();
      std::exception_ptr error;
      const auto t0 = std::chrono::steady_clock::now();
      if (!skip) {
        try {
          run_(job, slot);
        } catch (...) {
          error = std::current_exception();
        }
      }
      const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      lk.lock();
      running_ = false;
      busy_ += took;
      if (error && !failed_) {
        failed_ = true;
        error_ = error;
      }
      state_[slot] = skip || error ? State::failed : State::done;
      finished_.notify_all();
      if (queued_ == 0) idle_.notify_all();
    }
  }

  Run run_;
  const char* what_;
  mutable std::mutex mutex_;
  std::condition_variable work_ready_;  // the worker waits for jobs
  std::condition_variable finished_;    // wait(slot) waits for a job
  std::condition_variable idle_;        // drain() waits for an empty queue
  std::vector<Job> jobs_;
  std::vector<State> state_;
  std::vector<std::size_t> queue_;  // a ring of slot numbers in submission order
  std::size_t head_ = 0, queued_ = 0;
  bool running_ = false, stop_ = false, failed_ = false;
  std::exception_ptr error_;
  double busy_ = 0, waited_ = 0;
  std::thread worker_;  // last: started once everything above exists
};

}  // namespace frugal
