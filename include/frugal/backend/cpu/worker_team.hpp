#pragma once
// The CPU kernels' own threads: a caller splits its work into a fixed
// number of chunks that depends only on the work's size, and the calling
// thread and its helpers take chunks one at a time until none is left.
//
// Why not OpenMP (measured in bench/under-load, bench/RESULTS.md): an
// OpenMP region gives each thread a fixed share and waits at a barrier for
// the last one, so on a core shared with another busy process every region
// waits for a descheduled thread. A gpt step with 2 threads on 2 cores, each
// also running a busy loop, took 4x as long as with 1 thread; OpenMP's
// passive wait policy still left it at 1.6-2.1x. Here a descheduled helper
// holds at most the one chunk it took: the others take the rest.
//
// Why fixed chunks: the partition, and so every rounding, is the same at
// any thread count (1 included) and however the chunks land on threads, so
// a step's results do not depend on how many threads ran it or on the load.
//
// Waiting: a helper spins for a few microseconds (consecutive regions of a
// step follow each other that closely) and then sleeps on a futex, so an
// idle team costs nothing and a busy machine gets its cores back. (Not
// std::atomic::wait: libstdc++ 12 waits on 64-bit atomics through a shared
// proxy, and a test of this team lost wake-ups through it.)
//
// Each calling thread owns its team (thread_local), so steps run from
// different threads never share or wait on each other's helpers. Chunks
// that call run() again run their inner chunks inline, in chunk order.
#include <linux/futex.h>
#include <omp.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdint>
#include <exception>
#include <memory>
#include <thread>
#include <vector>

#include "../../core/error.hpp"

#include "abi.hpp"

namespace frugal::cpu::inline FRUGAL_KERNEL_ABI {

namespace team_detail {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Spins while pred() is false for up to `spin`, then returns pred(). 20 us
// covers the gap between a step's consecutive regions; longer spins (200 us,
// 1 ms) measured no faster on an idle machine and would take more from a
// busy one.
inline constexpr std::chrono::microseconds kHelperSpin{20}, kCallerSpin{20};
template <class Pred>
bool spin_until(Pred&& pred, std::chrono::microseconds spin) {
  if (pred()) return true;
  const auto until = std::chrono::steady_clock::now() + spin;
  for (int i = 1;; ++i) {
    cpu_relax();
    if (pred()) return true;
    if ((i & 63) == 0 && std::chrono::steady_clock::now() >= until) return pred();
  }
}

// Sleeps while w holds `old` (or until woken); returns at once if it does not.
inline void futex_wait(std::atomic<std::uint32_t>& w, std::uint32_t old) {
  static_assert(sizeof(std::atomic<std::uint32_t>) == sizeof(std::uint32_t));
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&w), FUTEX_WAIT_PRIVATE, old, nullptr, nullptr, 0);
}
inline void futex_wake_all(std::atomic<std::uint32_t>& w) {
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&w), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
}

// True on a thread that is running a chunk: nested regions run inline.
inline thread_local bool in_chunk = false;

// Sets this thread's OpenMP thread count (which OpenBLAS reads for each
// call) for a scope: 1 inside chunks, so BLAS never starts threads of its own.
class OmpThreads {
 public:
  explicit OmpThreads(int n) : saved_(omp_get_max_threads()) {
    if (saved_ != n) omp_set_num_threads(n);
  }
  ~OmpThreads() {
    if (omp_get_max_threads() != saved_) omp_set_num_threads(saved_);
  }
  OmpThreads(const OmpThreads&) = delete;
  OmpThreads& operator=(const OmpThreads&) = delete;

 private:
  int saved_;
};

// Forks this process has made (counted in the child by a pthread_atfork
// handler). A child has only the thread that forked: the helpers it
// inherited as std::thread objects do not exist there, and joining one
// would wait forever, so a team made before the fork abandons them.
inline std::atomic<std::uint32_t> forks{0};
inline void count_fork() { forks.fetch_add(1, std::memory_order_relaxed); }
inline std::uint32_t forks_so_far() {
  static const int registered = pthread_atfork(nullptr, nullptr, count_fork);
  (void)registered;
  return forks.load(std::memory_order_relaxed);
}

}  // namespace team_detail

// The thread count a region started on this thread may use: the step's
// (runtime/threads.hpp sets it as this thread's OpenMP count).
inline int team_threads() { return std::max(1, omp_get_max_threads()); }

class WorkerTeam {
 public:
  WorkerTeam() = default;
  WorkerTeam(const WorkerTeam&) = delete;
  WorkerTeam& operator=(const WorkerTeam&) = delete;
  ~WorkerTeam() {
    if (forks_seen_ != team_detail::forks_so_far()) {
      abandon_helpers();
      return;
    }
    stop_.store(true);
    ticket_.fetch_add(kGenOne);  // no job carries this generation
    wake_helpers();
    for (auto& t : helpers_) t.join();
  }

  // Calls fn(chunk) for every chunk in [0, chunks), on this thread and up to
  // threads - 1 helpers, and returns when all have returned. An exception
  // from a chunk is rethrown here after the others finish.
  template <class Fn>
  void run(std::int64_t chunks, int threads, Fn&& fn) {
    if (chunks <= 0) return;
    threads = int(std::min<std::int64_t>(std::max(threads, 1), chunks));
    if (threads == 1 || team_detail::in_chunk) {
      run_inline(chunks, fn);
      return;
    }
    if (std::uint64_t(chunks) >= kIdxOne) fail_too_many(chunks);
    if (forks_seen_ != team_detail::forks_so_far()) abandon_helpers();
    grow(threads - 1);
    using F = std::remove_reference_t<Fn>;
    const std::uint64_t gen = (ticket_.load(std::memory_order_relaxed) >> kIdxBits) + 1;
    Slot& s = slots_[gen % kSlots];
    s.call.store(&call_chunk<F>, std::memory_order_relaxed);
    s.ctx.store(const_cast<void*>(static_cast<const void*>(&fn)), std::memory_order_relaxed);
    s.chunks.store(chunks, std::memory_order_relaxed);
    s.helpers.store(threads - 1, std::memory_order_relaxed);
    s.done.store(0, std::memory_order_relaxed);
    s.caller_sleeps.store(0, std::memory_order_relaxed);
    s.failed.store(false, std::memory_order_relaxed);
    s.error = nullptr;
    ticket_.store(gen << kIdxBits);
    wake_helpers();
    {
      team_detail::OmpThreads one(1);
      work(gen, s);
    }
    const auto all = std::uint32_t(chunks);
    if (!team_detail::spin_until([&] { return s.done.load(std::memory_order_acquire) == all; }, team_detail::kCallerSpin)) {
      // Dekker with the last chunk's finisher: it adds to done, then reads
      // caller_sleeps; this sets caller_sleeps, then reads done.
      s.caller_sleeps.store(1);
      for (std::uint32_t d = s.done.load(); d != all; d = s.done.load()) team_detail::futex_wait(s.done, d);
    }
    if (s.failed.load(std::memory_order_acquire)) std::rethrow_exception(s.error);
  }

  // The calling thread's team. Inside a chunk, where run() goes inline and
  // touches no team, one shared team that never grows: a helper thread
  // must not make a team of its own there, since which helper first runs a
  // nested region depends on the load, and a step's later run would then
  // allocate it (seen on a loaded machine: attention's heads inside a
  // helper's chunk).
  static WorkerTeam& mine() {
    if (team_detail::in_chunk) {
      static WorkerTeam inline_only;
      return inline_only;
    }
    thread_local std::unique_ptr<WorkerTeam> team = std::make_unique<WorkerTeam>();
    return *team;
  }

 private:
  // ticket_ = generation << kIdxBits | next chunk: one CAS both claims a
  // chunk and proves the job is still the current one.
  static constexpr int kIdxBits = 24;
  static constexpr std::uint64_t kIdxOne = std::uint64_t(1) << kIdxBits, kGenOne = kIdxOne,
                                 kIdxMask = kIdxOne - 1;
  // A helper that read a slot but was descheduled before its claim can only
  // claim for the generation it read; slots are reused kSlots jobs later.
  static constexpr int kSlots = 4;

  struct Slot {
    // Relaxed atomics: a helper descheduled for kSlots jobs may read them
    // while they are rewritten; its claim then fails (see work()).
    std::atomic<void (*)(void*, std::int64_t)> call{nullptr};
    std::atomic<void*> ctx{nullptr};
    std::atomic<std::int64_t> chunks{0};
    std::atomic<int> helpers{0};
    std::atomic<std::uint32_t> done{0};  // chunks finished
    std::atomic<std::uint32_t> caller_sleeps{0};
    std::atomic<bool> failed{false};
    std::exception_ptr error;
  };

  // Chunk c of the task at ctx, an F: the one copy of a task's body, which
  // both the team and run_inline call. (run_inline calling the task
  // directly put two more inlined copies of every kernel's loops into each
  // run<F>; without them the CPU kernel units' code is 13% smaller.)
  template <class F>
  static void call_chunk(void* ctx, std::int64_t c) {
    (*static_cast<F*>(ctx))(c);
  }

  template <class Fn>
  static void run_inline(std::int64_t chunks, Fn& fn) {
    using F = std::remove_reference_t<Fn>;
    run_inline_erased(chunks, &call_chunk<F>, const_cast<void*>(static_cast<const void*>(&fn)));
  }
  // Out of line, or the compiler inlines the task at this call again.
  [[gnu::noinline]] static void run_inline_erased(std::int64_t chunks, void (*call)(void*, std::int64_t), void* ctx) {
    const bool outer = !team_detail::in_chunk;
    team_detail::in_chunk = true;
    struct Reset {
      bool outer;
      ~Reset() {
        if (outer) team_detail::in_chunk = false;
      }
    } reset{outer};
    if (outer) {
      team_detail::OmpThreads one(1);
      for (std::int64_t c = 0; c < chunks; ++c) call(ctx, c);
    } else {
      for (std::int64_t c = 0; c < chunks; ++c) call(ctx, c);
    }
  }

  [[noreturn]] static void fail_too_many(std::int64_t chunks) {
    fail("internal: a parallel region of ", chunks, " chunks; at most ", kIdxOne - 1, " fit the team's ticket");
  }

  // Claims and runs chunks of job gen until none is left or the job is over.
  void work(std::uint64_t gen, Slot& s) {
    const std::int64_t chunks = s.chunks.load(std::memory_order_relaxed);
    auto* call = s.call.load(std::memory_order_relaxed);
    void* ctx = s.ctx.load(std::memory_order_relaxed);
    std::uint64_t t = ticket_.load(std::memory_order_acquire);
    team_detail::in_chunk = true;
    while ((t >> kIdxBits) == gen && std::int64_t(t & kIdxMask) < chunks) {
      if (!ticket_.compare_exchange_weak(t, t + 1, std::memory_order_acq_rel, std::memory_order_acquire)) continue;
      const std::int64_t c = std::int64_t(t & kIdxMask);
      if (!s.failed.load(std::memory_order_relaxed)) {
        try {
          call(ctx, c);
        } catch (...) {
          bool expected = false;
          if (s.failed.compare_exchange_strong(expected, true)) s.error = std::current_exception();
        }
      }
      if (s.done.fetch_add(1) + 1 == std::uint32_t(chunks) && s.caller_sleeps.load()) team_detail::futex_wake_all(s.done);
      t = ticket_.load(std::memory_order_acquire);
    }
    team_detail::in_chunk = false;
  }

  // `seen` is the generation before the job the helper was made for: a
  // helper that starts late still joins that job, and one that starts after
  // the team's end sees stop_.
  void helper_loop(int index, std::uint64_t seen) {
    omp_set_num_threads(1);  // BLAS called from a chunk stays on this thread
    for (;;) {
      std::uint64_t t = 0;
      auto fresh = [&] {
        t = ticket_.load();
        return (t >> kIdxBits) != seen || stop_.load(std::memory_order_relaxed);
      };
      if (!team_detail::spin_until(fresh, team_detail::kHelperSpin)) {
        // Dekker with wake_helpers(): this counts itself asleep, reads the
        // epoch, then the ticket; the caller writes the ticket, bumps the
        // epoch, then reads the count.
        sleepers_.fetch_add(1);
        for (;;) {
          const std::uint32_t e = epoch_.load();
          if (fresh()) break;
          team_detail::futex_wait(epoch_, e);
        }
        sleepers_.fetch_sub(1);
      }
      if (stop_.load()) return;
      seen = t >> kIdxBits;
      Slot& s = slots_[seen % kSlots];
      // The slot was written before the ticket that named its generation; a
      // stale read is caught by work()'s claim, which checks the generation.
      if (index < s.helpers.load(std::memory_order_relaxed)) work(seen, s);
    }
  }

  // In a forked child: the inherited helpers are not running (no job is in
  // flight between runs, so no slot holds a claim of theirs); their
  // std::thread objects are moved to a heap vector that is never freed,
  // since destroying a joinable std::thread terminates and joining one
  // hangs. New helpers are made as the next run needs them.
  void abandon_helpers() {
    if (!helpers_.empty()) new std::vector<std::thread>(std::move(helpers_));  // deliberately never freed
    helpers_.clear();
    sleepers_.store(0);
    forks_seen_ = team_detail::forks_so_far();
  }

  void wake_helpers() {
    epoch_.fetch_add(1);
    if (sleepers_.load() > 0) team_detail::futex_wake_all(epoch_);
  }

  void grow(int n) {
    while (int(helpers_.size()) < n) {
      const int index = int(helpers_.size());
      const std::uint64_t seen = ticket_.load() >> kIdxBits;
      helpers_.emplace_back([this, index, seen] { helper_loop(index, seen); });
    }
  }

  std::atomic<std::uint64_t> ticket_{0};
  std::atomic<bool> stop_{false};
  std::atomic<std::uint32_t> epoch_{0};  // the futex sleeping helpers wait on
  std::atomic<int> sleepers_{0};
  Slot slots_[kSlots];
  std::vector<std::thread> helpers_;
  std::uint32_t forks_seen_ = team_detail::forks_so_far();
};

}  // namespace frugal::cpu
