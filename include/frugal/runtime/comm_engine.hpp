#pragma once
// Collectives beside compute: one thread (slot_worker.hpp) runs a step's
// collective kernels in the order they were issued, so every rank calls its
// communicator in the same order, and from one thread at a time
// (MPI_THREAD_SERIALIZED). A started collective (ops::CollectiveStart) is
// waited at its done; a collective that is not split is issued and waited
// at once, so it still queues behind the ones in flight and the
// communicator is never called from two threads together. Between steps
// the thread is idle, so the program may call the communicator itself.
#include <cstddef>

#include "backend.hpp"
#include "slot_worker.hpp"

namespace frugal {

class CommEngine {
 public:
  // One slot per collective in a plan.
  explicit CommEngine(std::size_t slots)
      : worker_(slots, [](const Job& job, std::size_t) { (*job.kernel)(*job.op, job.args); }, "communication thread") {}

  // Queues `kernel(op, args)` in `slot` and returns. What `args` points at
  // must stay put until the slot is waited.
  void start(std::size_t slot, const Kernel& kernel, const Op& op, const KernelArgs& args) {
    worker_.submit(slot, Job{&kernel, &op, args});
  }
  // Blocks until the slot's collective has run; throws its error (or that
  // of an earlier one, after which the later ones do not run: the ranks no
  // longer agree on which collective comes next).
  void wait(std::size_t slot) { worker_.wait(slot); }
  // After a failed step: waits for what is queued (nothing may still write
  // memory the caller reuses); the next reset_error() accepts work again.
  void drain() { worker_.drain(); }
  void reset_error() { worker_.reset_error(); }

  // Seconds the thread spent in collectives, and seconds the step waited
  // for them: the difference is communication hidden behind compute.
  double busy_seconds() const { return worker_.busy_seconds(); }
  double waited_seconds() const { return worker_.waited_seconds(); }

 private:
  struct Job {
    const Kernel* kernel = nullptr;
    const Op* op = nullptr;
    KernelArgs args;
  };
  SlotWorker<Job> worker_;
};

}  // namespace frugal
