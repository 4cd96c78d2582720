#pragma once
// MPI as a Communicator: the ranks are the processes mpirun started (Open
// MPI from Debian: apt-get install openmpi-bin libopenmpi-dev; any MPI-3
// library). A program that includes this links MPI (CMake:
// set(MPI_CXX_SKIP_MPICXX ON), find_package(MPI COMPONENTS CXX),
// target_link_libraries(app PRIVATE MPI::MPI_CXX)).
//
// Sums never use MPI's own reductions, whose order of addition is the
// library's choice: a reduction is an all-to-all that hands each rank one
// chunk of every rank's data, a sum of those rows in rank order
// (rank_order_sum.hpp), and an all-gather of the chunks: the traffic of a
// ring all-reduce, 2 (n - 1) / n of the data each way, and the same bits on
// every rank and in every run.
//
// No collective waits forever: each is started non-blocking and polled, and
// one that has not completed after MpiOptions::timeout_seconds fails with an
// error naming it, the rank and the step (a rank that died or was stopped).
// The job cannot go on after that (the other ranks are still inside the
// collective), so at exit a process that saw one calls MPI_Abort, which ends
// every rank, instead of MPI_Finalize, which would wait for them; unless
// the communicator is recoverable (MpiOptions::recoverable), when the error
// is a RankFailure an elastic job (dist/elastic.hpp) recovers from.
#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstring>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "../ops/collective.hpp"
#include "rank_order_sum.hpp"

namespace frugal::dist {

struct MpiOptions {
  double timeout_seconds = 300;
  // A collective that fails or times out throws RankFailure and leaves MPI
  // usable, so the surviving ranks can go on without the lost one (an
  // elastic job, dist/elastic.hpp, does). Otherwise the process ends the
  // job with MPI_Abort at exit.
  bool recoverable = false;
  // Polled about every 0.1 s while a collective waits, where given: false
  // says a rank's process is gone (an elastic job checks the ranks on this
  // machine), and the collective fails at once instead of at the timeout.
  std::function<bool()> peers_alive;
};

namespace detail {

// MPI's lifetime in this process: initialised by the first communicator
// (unless the program did it), finalised at exit, or aborted where a
// collective timed out.
class MpiSession {
 public:
  static MpiSession& get() {
    static MpiSession s;
    return s;
  }
  void mark_broken() { broken_ = true; }
  // This process is part of an elastic job, whose processes come and go:
  // MPI_Finalize, which waits for every process it was started or
  // connected with, is not called at exit.
  void mark_left() { left_ = true; }
  // MPI_THREAD_SERIALIZED or more: any thread may call MPI, one at a time.
  bool serialized() const { return thread_level_ >= MPI_THREAD_SERIALIZED; }
  bool broken() const { return broken_; }
  ~MpiSession() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    if (broken_) MPI_Abort(MPI_COMM_WORLD, 1);
    if (initialized_here_ && !left_) MPI_Finalize();
  }

 private:
  MpiSession() {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      // Serialized: a step's collectives run on a thread of its own, the
      // program's calls (a checkpoint, a mean of the loss) on its thread
      // between steps, never two at once.
      int provided = 0;
      if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS)
        fail("mpi: MPI_Init_thread failed (run the program under mpirun, or alone as one rank)");
      initialized_here_ = true;
    }
    // Where the program initialised MPI at a lower level, or the library
    // gives less, the collectives stay on the step's thread.
    MPI_Query_thread(&thread_level_);
  }
  bool initialized_here_ = false;
  int thread_level_ = MPI_THREAD_SINGLE;
  std::atomic<bool> broken_{false};
  bool left_ = false;
};

inline std::string mpi_error(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, text, &len);
  return std::string(text, std::size_t(len));
}

}  // namespace detail

class Mpi final : public Communicator {
 public:
  // MPI_COMM_WORLD (duplicated, so frugal's traffic never matches the
  // program's own messages).
  static std::shared_ptr<Mpi> world(MpiOptions o = {}) { return over(MPI_COMM_WORLD, o); }
  // The ranks of `comm` (duplicated, as MPI_COMM_WORLD is): a communicator
  // an elastic job formed, spawned or shrank.
  static std::shared_ptr<Mpi> over(MPI_Comm comm, MpiOptions o = {}) { return std::shared_ptr<Mpi>(new Mpi(comm, o)); }
  ~Mpi() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    // After a timeout the other ranks may still be inside a collective on
    // this communicator: leave it to MPI_Abort.
    if (finalized || detail::MpiSession::get().broken() || failed_) return;
    for (auto& [bytes, type] : types_) MPI_Type_free(&type);
    MPI_Comm_free(&comm_);
  }
  Mpi(const Mpi&) = delete;
  Mpi& operator=(const Mpi&) = delete;

  std::string name() const override { return "mpi"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  double timeout_seconds() const { return timeout_; }
  bool serialized_threads() const override { return detail::MpiSession::get().serialized(); }
  int ranks_on_this_machine() const override { return local_size_; }

  void all_reduce_sum(void* data, std::size_t count, DType dtype, void* workspace, const std::string& what) override {
    if (size_ == 1 || count == 0) return;
    const std::size_t es = dtype_size(dtype);
    const MPI_Datatype t = type_of(es);
    const std::size_t ranks = std::size_t(size_);
    std::vector<int> send_counts(ranks), send_at(ranks), recv_counts(ranks), recv_at(ranks);
    const std::size_t mine = chunk_begin(count, rank_ + 1) - chunk_begin(count, rank_);
    for (int r = 0; r < size_; ++r) {
      send_counts[std::size_t(r)] = elements(chunk_begin(count, r + 1) - chunk_begin(count, r), "all_reduce", what);
      send_at[std::size_t(r)] = elements(chunk_begin(count, r), "all_reduce", what);
      recv_counts[std::size_t(r)] = elements(mine, "all_reduce", what);
      recv_at[std::size_t(r)] = elements(std::size_t(r) * mine, "all_reduce", what);
    }
    MPI_Request req;
    check(MPI_Ialltoallv(data, send_counts.data(), send_at.data(), t, workspace, recv_counts.data(), recv_at.data(), t,
                         comm_, &req),
          "all_reduce", what);
    wait(req, "all_reduce", what, count * es);
    char* bytes = static_cast<char*>(data);
    sum_in_rank_order(workspace, mine, size_, dtype, bytes + chunk_begin(count, rank_) * es);
    check(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, data, send_counts.data(), send_at.data(), t, comm_, &req),
          "all_reduce", what);
    wait(req, "all_reduce", what, count * es);
  }
  // A row of this rank's chunk from every rank: size() rows of the largest chunk.
  std::size_t all_reduce_workspace(std::size_t count, DType dtype) const override {
    return rank_order_all_reduce_workspace(count, dtype, size_);
  }

  void reduce_scatter_sum(const void* send, void* recv, std::size_t count, DType dtype, void* workspace,
                          const std::string& what) override {
    const std::size_t es = dtype_size(dtype);
    if (size_ == 1) {
      if (send != recv) std::memmove(recv, send, count * es);
      return;
    }
    const int n = elements(count, "reduce_scatter", what);
    MPI_Request req;
    check(MPI_Ialltoall(send, n, type_of(es), workspace, n, type_of(es), comm_, &req), "reduce_scatter", what);
    wait(req, "reduce_scatter", what, count * es * std::size_t(size_));
    sum_in_rank_order(workspace, count, size_, dtype, recv);
  }
  std::size_t reduce_scatter_workspace(std::size_t count, DType dtype) const override {
    return rank_order_reduce_scatter_workspace(count, dtype, size_);
  }

  void all_gather(const void* send, void* recv, std::size_t count, DType dtype, const std::string& what) override {
    const std::size_t es = dtype_size(dtype);
    const int n = elements(count, "all_gather", what);
    MPI_Request req;
    check(MPI_Iallgather(send, n, type_of(es), recv, n, type_of(es), comm_, &req), "all_gather", what);
    wait(req, "all_gather", what, count * es * std::size_t(size_));
  }
  void broadcast(void* data, std::size_t count, DType dtype, int root, const std::string& what) override {
    if (root < 0 || root >= size_) fail("mpi: broadcast (", what, "): root ", root, " is not a rank of ", size_);
    const std::size_t es = dtype_size(dtype);
    MPI_Request req;
    check(MPI_Ibcast(data, elements(count, "broadcast", what), type_of(es), root, comm_, &req), "broadcast", what);
    wait(req, "broadcast", what, count * es);
  }
  void barrier(const std::string& what) override {
    MPI_Request req;
    check(MPI_Ibarrier(comm_, &req), "barrier", what);
    wait(req, "barrier", what, 0);
  }

 private:
  Mpi(MPI_Comm comm, MpiOptions o)
      : timeout_(o.timeout_seconds), recoverable_(o.recoverable), peers_alive_(std::move(o.peers_alive)) {
    if (!(o.timeout_seconds > 0)) fail("mpi: MpiOptions::timeout_seconds must be > 0, got ", o.timeout_seconds);
    detail::MpiSession::get();
    MPI_Comm_dup(comm, &comm_);
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    MPI_Comm local;  // the ranks that share memory with this one: this machine's
    MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local);
    MPI_Comm_size(local, &local_size_);
    MPI_Comm_free(&local);
  }

  // Chunk r of a reduction of `count` elements starts here (the chunks
  // differ by at most one element).
  std::size_t chunk_begin(std::size_t count, int r) const {
    return std::size_t((unsigned __int128)count * unsigned(r) / unsigned(size_));
  }
  static int elements(std::size_t n, const char* collective, const std::string& what) {
    if (n > std::size_t(INT_MAX))
      fail("mpi: ", collective, " (", what, "): ", n, " elements in one message, more than MPI's int counts allow");
    return int(n);
  }
  // An element of `bytes` bytes, as an opaque MPI type (frugal adds the
  // numbers itself).
  MPI_Datatype type_of(std::size_t bytes) {
    for (auto& [b, t] : types_)
      if (b == bytes) return t;
    MPI_Datatype t;
    MPI_Type_contiguous(int(bytes), MPI_BYTE, &t);
    MPI_Type_commit(&t);
    types_.push_back({bytes, t});
    return t;
  }
  void check(int code, const char* collective, const std::string& what) {
    if (code != MPI_SUCCESS) {
      lost(cat("mpi: ", collective, " (", what, ") failed at rank ", rank_, " of ", size_, ": ", detail::mpi_error(code)));
      fail("mpi: ", collective, " (", what, ") failed at rank ", rank_, " of ", size_, ": ", detail::mpi_error(code));
    }
  }
  void wait(MPI_Request& req, const char* collective, const std::string& what, std::size_t bytes) {
    const auto start = std::chrono::steady_clock::now();
    auto checked = start;  // when peers_alive_ was last asked
    for (long polls = 0;; ++polls) {
      int done = 0;
      check(MPI_Test(&req, &done, MPI_STATUS_IGNORE), collective, what);
      if (done) return;
      // Spin briefly (most collectives finish within microseconds of the
      // last rank arriving), then sleep between polls so a waiting rank
      // leaves the cores to the ranks still computing.
      if (polls < 2000) continue;
      // Every 0.1 s by the clock, not by polls: a loaded machine stretches the sleeps.
      const auto now = std::chrono::steady_clock::now();
      if (peers_alive_ && now - checked >= std::chrono::milliseconds(100) && ((checked = now), !peers_alive_())) {
        const std::string why = cat("mpi: ", collective, " (", what, ", ", bytes, " bytes) at rank ", rank_, " of ",
                                    size_, ": the process of another rank on this machine has exited");
        lost(why);
        fail(why, ". The job cannot continue; this process ends it with MPI_Abort at exit");
      }
      if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > timeout_) {
        lost(cat("mpi: ", collective, " (", what, ", ", bytes, " bytes) did not complete within ", timeout_,
                 " s at rank ", rank_, " of ", size_, ": another rank has died, stopped or is stuck"));
        fail("mpi: ", collective, " (", what, ", ", bytes, " bytes) did not complete within ", timeout_, " s at rank ",
             rank_, " of ", size_,
             ": another rank has died, stopped or is stuck. The job cannot continue; this process ends it with "
             "MPI_Abort at exit (MpiOptions::timeout_seconds sets the limit)");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  // A collective failed: recoverable, this communicator is abandoned and
  // the survivors are told (RankFailure); else the job ends at exit.
  void lost(const std::string& why) {
    if (!recoverable_) {
      detail::MpiSession::get().mark_broken();
      return;
    }
    failed_ = true;
    throw RankFailure(why);
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1, local_size_ = 1;
  double timeout_;
  bool recoverable_ = false;
  std::function<bool()> peers_alive_;
  std::atomic<bool> failed_{false};
  std::vector<std::pair<std::size_t, MPI_Datatype>> types_;
};

}  // namespace frugal::dist
