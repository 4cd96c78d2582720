#pragma once
// Elastic data parallelism over MPI: ranks join and leave a running job,
// and a rank that dies costs the job a step or two, not the run.
//
// Membership is MPI's own, no other transport:
//   - growing: the ranks call MPI_Comm_spawn for the new ones, keep
//     training while those start (launch, MPI_Init, the program's own
//     loading), and merge with them (MPI_Intercomm_merge) at the first step
//     boundary after the new ranks said they are ready;
//   - shrinking: the leaving ranks hand their state over and are split off
//     (MPI_Comm_split), then exit without waiting for the others;
//   - a dead rank: a collective that does not complete within
//     ElasticOptions::failure_timeout_seconds throws RankFailure; the
//     survivors find each other with a roll call (point-to-point messages,
//     waited ElasticOptions::roll_call_seconds), agree on who is left, and
//     form their communicator with MPI_Comm_create_group, which only the
//     survivors enter. Under Open MPI this needs mpirun --mca
//     orte_enable_recovery 1, without which mpirun ends every rank when one
//     exits (scripts/frugal-elastic-run starts a job so).
//
// State moves without files. After every step each rank cuts its slice of
// the state (ElasticHooks::save: a ZeRO shard where the state is sharded,
// an equal part of its copy where not; io/state_slices.hpp) and sends it
// to its successor in the ring, which keeps the last three it received.
// Every change of membership then gives each rank of the new membership
// every old rank's slice, sent by the rank that holds it, and the new
// membership compiles its step (ElasticHooks::build) and loads them
// (ElasticHooks::load), at whatever rank count and ZeRO stage it now has.
// Replicas live in host memory, outside the device budget.
//
// How many steps a lost rank costs: a rank completes the exchange of the
// slice it cut after step v before it starts step v+2 (overlapped, the
// default: the exchange runs while step v+1 computes) or step v+1
// (ElasticOptions::overlap_replication off), the send is synchronous, and
// no collective of a step completes anywhere until every rank has started
// it. So when a rank dies, its slice of the newest version V any survivor
// reached, less two (less one, not overlapped), is on its successor, and
// every survivor holds its own slices of the last three versions: the job
// goes on from the newest version every slice exists at, with the samples
// of the steps after it drawn again. Where a dead rank's successor died
// too, no replica exists: train() throws, and the job restarts from its
// last checkpoint.
//
// Hybrid scaling (ScalingPolicy, scaling_policy.hpp): the global batch
// is kept while the rank count divides it, else the learning rate is
// scaled. The job counts samples, not steps, so a sampler that maps sample
// positions to data (data::EpochStream) sees each sample of an epoch once
// whatever the rank counts were.
#include <mpi.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <functional>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "mpi.hpp"
#include "scaling_policy.hpp"

namespace frugal::dist {

// One membership of the job: who trains, and on how much.
struct Membership {
  std::shared_ptr<Mpi> comm;  // the step's communicator (CompileOptions::communicator)
  int rank = 0, ranks = 1;
  std::int64_t epoch = 0;  // changes of membership so far
  ScalingPolicy::At batch;
};

struct ElasticEvent {
  enum class Kind { grow, shrink, failure };
  Kind kind = Kind::grow;
  std::int64_t step = 0;     // the step the new membership went on from
  int from = 0, to = 0;      // rank counts
  double seconds = 0;        // from the decision (or the failure's detection) to the new membership's first step
  double build_seconds = 0;  // of which compiling its step (ElasticHooks::build)
  // grow: how long MPI_Comm_spawn held the old ranks, and the steps they
  // trained while the new ranks started
  double spawn_seconds = 0;
  std::int64_t steps_while_starting = 0;
  std::int64_t steps_lost = 0;   // failure: steps some survivor had finished beyond `step`
  double detect_seconds = 0;     // failure: from this rank's last finished step to its recovery's start
  std::uint64_t state_hash = 0;  // what ElasticHooks::load returned, the same on every rank
  std::string source;  // where the state came from: "live" ranks, "replicas" after a failure, or a "checkpoint"
};

struct ElasticOptions {
  ScalingPolicy scaling;
  // A collective, a replica exchange or a roll call waits this long for a
  // rank before the job counts it dead.
  double failure_timeout_seconds = 30;
  // After a failure, the survivors wait this long, plus twice the longest of
  // the last 8 steps, for each other's roll call (a rank on this machine
  // whose process is still there, up to failure_timeout_seconds). It must
  // exceed the spread of the times at which they detect the failure; where
  // it does not, they hear different sets of ranks, and train() throws or
  // drops the late rank rather than guess.
  double roll_call_seconds = 2;
  // Joining, handing state over and compiling wait this long for the others.
  double start_timeout_seconds = 600;
  // Each rank's slice goes to its successor after every step. Overlapped,
  // the exchange runs while the next step computes and is completed after
  // it: a lost rank then costs at most the two steps since the newest slice
  // every rank is sure to have sent. Not overlapped, the exchange is
  // completed before the next step starts: at most the step in flight is
  // lost, and each step waits for the exchange.
  bool overlap_replication = true;
  // A rank whose process has exited on this machine is dead at once,
  // without waiting out failure_timeout_seconds (ranks on other machines
  // are waited for).
  bool watch_processes = true;
  // New ranks join at the first step boundary after they are ready; after
  // this many steps (if above 0), the others stop and wait for them.
  std::int64_t max_steps_to_join = 0;
  // Read on rank 0 at each step boundary: the rank count wanted from this
  // step on, or 0 for no change.
  std::function<int(std::int64_t step)> target_ranks;
  // How new ranks start: this program with its arguments by default.
  std::vector<std::string> command;
};

// A checkpoint ElasticHooks::restore loaded: after `step` steps and
// `samples` samples, and a hash of what it loaded (the same on every rank).
struct Restored {
  std::int64_t step = 0, samples = 0;
  std::uint64_t hash = 0;
};

struct ElasticHooks {
  // Compiles the program's step for this membership (with m.comm as its
  // communicator and m.batch.rank_batch rows), replacing the last one.
  std::function<void(const Membership& m)> build;
  // Writes this rank's slice of the state, after the steps so far, into
  // `out` from byte `at` on, sizing `out` to end with it. `out` is the
  // buffer of an earlier slice, so a hook that overwrites it in place (as
  // io::capture_encoded_slice does) allocates and clears nothing.
  std::function<void(const Membership& m, std::vector<char>& out, std::size_t at)> save;
  // Every old rank's slice, in its old rank order, into the step just
  // built; returns a hash of the state loaded (every rank must get the same).
  std::function<std::uint64_t(const Membership& m, const std::vector<std::vector<char>>& slices)> load;
  // Runs step `step` on this rank's rows: samples [first_sample,
  // first_sample + m.batch.rank_batch) of the job's sample stream. Returns
  // the rank's loss.
  std::function<double(const Membership& m, std::int64_t step, std::int64_t first_sample)> run;
  // Optional: where ranks were lost with the replicas of their state, loads
  // the program's last checkpoint into the step just built (every survivor
  // calls it), or returns nothing when there is none.
  std::function<std::optional<Restored>(const Membership& m)> restore;
  // After step `step`, with the ranks' mean loss (every rank calls it; a
  // step redone after a failure is reported again). A checkpoint saved here
  // is what restore can go on from.
  std::function<void(std::int64_t step, double mean_loss, const Membership& m)> on_step;
};

class ElasticJob {
 public:
  // Call first in main, before loading anything: the ranks that spawn this
  // one wait in MPI_Comm_spawn until it has initialised MPI.
  static void init_mpi() { detail::MpiSession::get(); }

  ElasticJob(ElasticOptions o, ElasticHooks h) : o_(std::move(o)), h_(std::move(h)) {
    if (!h_.build || !h_.save || !h_.load || !h_.run)
      fail("ElasticJob: the hooks build, save, load and run are all needed");
    if (!(o_.failure_timeout_seconds > 0) || !(o_.start_timeout_seconds > 0) || !(o_.roll_call_seconds > 0))
      fail("ElasticJob: the timeouts must be positive");
    o_.scaling.at(1);  // checks the policy
    init_mpi();
    check_recovery_enabled();
    MPI_Comm_get_parent(&parent_);
  }
  ElasticJob(const ElasticJob&) = delete;
  ElasticJob& operator=(const ElasticJob&) = delete;

  // Trains until `steps` steps are done. Returns true on the ranks that
  // finished, false on a rank the job released (the program then ends, as
  // it would after training; its MPI is not finalised, since the others
  // train on).
  bool train(std::int64_t steps) {
    // MPI_Finalize waits in a fence for every process of this one's original
    // job (Open MPI), and ranks that left or died never enter it: an elastic
    // job's processes exit without it, which mpirun accepts with recovery on.
    detail::MpiSession::get().mark_left();
    if (parent_ != MPI_COMM_NULL) {
      if (!join_as_new_rank()) return false;
    } else if (!m_.comm) {
      start();
    }
    while (version_ < steps) {
      try {
        auto t0 = Clock::now();
        const Control c = boundary();
        boundary_seconds_.push_back(since(t0));
        if (c.action == kSpawn) spawn(c.count);
        if (c.action == kMerge) {
          grow();
          continue;  // the new ranks begin at a boundary
        }
        if (c.action == kShrink) {
          if (!shrink(c.count)) return false;
          continue;
        }
        const std::int64_t first = samples_ + std::int64_t(m_.rank) * m_.batch.rank_batch;
        const double loss = h_.run(m_, version_, first);
        std::vector<double> all(static_cast<std::size_t>(m_.ranks));
        m_.comm->all_gather(&loss, all.data(), 1, DType::f64, "elastic: the ranks' losses");
        double mean = 0;
        for (double l : all) mean += l;
        mean /= m_.ranks;
        const std::int64_t done = version_;
        ++version_;
        samples_ += m_.batch.global_batch;
        t0 = Clock::now();
        replicate();
        replica_seconds_.push_back(since(t0));
        const auto end = Clock::now();
        step_seconds_[std::size_t(version_) % step_seconds_.size()] =
            std::chrono::duration<double>(end - last_step_end_).count();
        last_step_end_ = end;
        if (h_.on_step) h_.on_step(done, mean, m_);
      } catch (const RankFailure& e) {
        recover(e.what());
      }
    }
    try {
      finish_exchange();
    } catch (const RankFailure&) {  // training is done; the state every rank holds is whole
    }
    if (spawned_ != MPI_COMM_NULL) {  // ranks still starting: they are not needed now
      if (m_.rank == 0) {
        int ready = 0;
        MPI_Recv(&ready, 1, MPI_INT, 0, kReady, spawned_, MPI_STATUS_IGNORE);
      }
      tell_new_ranks(0);
      MPI_Comm_free(&spawned_);
    }
    return true;
  }

  const Membership& membership() const { return m_; }
  std::int64_t steps_done() const { return version_; }
  std::int64_t samples_seen() const { return samples_; }
  const std::vector<ElasticEvent>& events() const { return events_; }
  // The median seconds a step spent on elasticity itself: cutting, sending
  // and receiving slices (all of it added work), and the boundary's message
  // from rank 0 (mostly waiting for the slowest rank, which the step's first
  // collective would wait for otherwise).
  double replica_seconds_per_step() const { return median(replica_seconds_); }
  double boundary_seconds_per_step() const { return median(boundary_seconds_); }
  // Host bytes held for recovery: this rank's last three slices and its
  // predecessor's.
  std::size_t replica_bytes() const {
    std::size_t n = 0;
    for (const std::vector<Held>* v : {&own_, &replica_})
      for (const auto& h : *v) n += h.blob.size();
    return n;
  }

 private:
  enum Action : std::int64_t { kNone = 0, kSpawn, kMerge, kShrink };
  struct Control {
    std::int64_t action = kNone, count = 0;
  };
  // A slice of the state after `version` steps and `samples` samples.
  struct Held {
    std::int64_t version = -1;
    std::vector<char> blob;
  };
  enum Tag : int { kReady = 7100, kGo, kBoundary, kReplica, kAlive, kView, kDropped };
  // Versions of its own slice and of its predecessor's a rank holds: with
  // the exchange overlapped, a survivor may be two steps past the newest
  // version every rank is sure to have sent.
  static constexpr std::size_t kHeld = 3;

  using Clock = std::chrono::steady_clock;
  static double median(std::vector<double> v) {
    if (v.empty()) return 0;
    std::nth_element(v.begin(), v.begin() + std::ptrdiff_t(v.size() / 2), v.end());
    return v[v.size() / 2];
  }
  static double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

  // Open MPI's mpirun ends the whole job when one process exits early, unless
  // recovery is enabled: say so before anything runs, not when a rank dies.
  static void check_recovery_enabled() {
    const char* ompi = std::getenv("OMPI_COMM_WORLD_SIZE");
    if (!ompi) return;
    const char* v = std::getenv("OMPI_MCA_orte_enable_recovery");
    if (!v || (std::string(v) != "1" && std::string(v) != "true"))
      fail(
          "ElasticJob: under Open MPI an elastic job needs mpirun --mca orte_enable_recovery 1 (or "
          "scripts/frugal-elastic-run), or mpirun ends every rank when one leaves or dies");
  }

  MpiOptions comm_options() {
    return {.timeout_seconds = o_.failure_timeout_seconds, .recoverable = true, .peers_alive = [this] {
              return !any_peer_gone();
            }};
  }

  // -- ranks on this machine --------------------------------------------------
  // A rank whose process is gone is dead at once: a collective waiting for
  // it fails within 0.1 s, and the roll call does not wait for it. Only
  // ranks in this process's PID namespace on this boot of this machine are
  // checked; others are waited for (failure_timeout_seconds).

  static std::string machine_and_pid_namespace() {
    std::string id;
    std::ifstream boot("/proc/sys/kernel/random/boot_id");
    std::getline(boot, id);
    char ns[256] = {0};
    const ssize_t n = readlink("/proc/self/ns/pid", ns, sizeof ns - 1);
    if (id.empty() || n <= 0) return "";  // unknown: check no one
    return id + ":" + std::string(ns, std::size_t(n));
  }
  // Whether 0.1 s have passed since it last said so: how often a wait looks
  // at the ranks' processes.
  struct Watch {
    Clock::time_point last = Clock::now();
    bool due() {
      if (Clock::now() - last < std::chrono::milliseconds(100)) return false;
      last = Clock::now();
      return true;
    }
  };
  static bool process_gone(long pid) {
    if (kill(pid_t(pid), 0) != 0) return errno == ESRCH;
    std::ifstream f("/proc/" + std::to_string(pid) + "/stat");  // a zombie not yet reaped is gone too
    std::string stat;
    std::getline(f, stat);
    const std::size_t close = stat.rfind(')');
    return close != std::string::npos && close + 2 < stat.size() && (stat[close + 2] == 'Z' || stat[close + 2] == 'X');
  }
  bool peer_gone(int r) const {
    return o_.watch_processes && r >= 0 && std::size_t(r) < peer_pid_.size() && peer_pid_[std::size_t(r)] > 0 &&
           process_gone(peer_pid_[std::size_t(r)]);
  }
  bool any_peer_gone() const {
    if (!o_.watch_processes) return false;
    for (int r = 0; r < int(peer_pid_.size()); ++r)
      if (peer_gone(r)) return true;
    return false;
  }
  // Every rank's process id where it shares this one's machine and PID namespace.
  void learn_peers() {
    const std::string me = machine_and_pid_namespace();
    const std::uint64_t key = me.empty() ? 0 : std::hash<std::string>{}(me);
    std::int64_t mine[2] = {std::int64_t(key), std::int64_t(getpid())};
    std::vector<std::int64_t> all(static_cast<std::size_t>(2 * m_.ranks));
    MPI_Request r;
    check(MPI_Iallgather(mine, 2, MPI_INT64_T, all.data(), 2, MPI_INT64_T, ctrl_, &r), "elastic: the ranks' processes");
    peer_pid_.assign(std::size_t(m_.ranks), 0);  // empty while learning: no one is checked
    std::vector<long> pids(std::size_t(m_.ranks), 0);
    wait_one(r, o_.start_timeout_seconds, "elastic: the ranks' processes");
    for (int k = 0; k < m_.ranks; ++k)
      if (k != m_.rank && key != 0 && all[std::size_t(2 * k)] == std::int64_t(key))
        pids[std::size_t(k)] = long(all[std::size_t(2 * k + 1)]);
    peer_pid_ = std::move(pids);
  }

  // `comm` is this membership's MPI communicator (the job owns it).
  void set_membership(MPI_Comm comm) {
    if (ctrl_ != MPI_COMM_NULL && !ctrl_failed_) MPI_Comm_free(&ctrl_);
    ctrl_failed_ = false;
    MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
    ctrl_ = comm;
    m_.comm = Mpi::over(ctrl_, comm_options());
    m_.rank = m_.comm->rank();
    m_.ranks = m_.comm->size();
    m_.batch = o_.scaling.at(m_.ranks);
    ++m_.epoch;
    own_.clear();
    replica_.clear();
    exchanging_ = false;
    pred_bytes_ = 0;
    learn_peers();
  }

  void start() {
    MPI_Comm c;
    MPI_Comm_dup(MPI_COMM_WORLD, &c);
    set_membership(c);
    m_.epoch = 0;
    h_.build(m_);
    replicate();  // version 0, so a rank lost in the first step is recovered too
  }

  // -- waiting with a deadline ------------------------------------------------

  void check(int code, const std::string& what) {
    if (code != MPI_SUCCESS) {
      ctrl_failed_ = true;
      throw RankFailure(cat("elastic: ", what, " failed at rank ", m_.rank, ": ", detail::mpi_error(code)));
    }
  }
  // Polls `reqs` until all complete; throws RankFailure naming `what` after `seconds`.
  void wait_all(std::vector<MPI_Request>& reqs, double seconds, const std::string& what) {
    const auto t0 = Clock::now();
    Watch watch;
    for (long polls = 0;; ++polls) {
      int done = 0;
      check(MPI_Testall(int(reqs.size()), reqs.data(), &done, MPI_STATUSES_IGNORE), what);
      if (done) return;
      if (polls > 2000) {
        if (since(t0) > seconds || (watch.due() && any_peer_gone())) {
          ctrl_failed_ = true;
          throw RankFailure(cat("elastic: ", what,
                                since(t0) > seconds ? cat(" did not complete within ", seconds, " s")
                                                    : std::string(": a rank's process has exited"),
                                " at rank ", m_.rank, " of ", m_.ranks));
        }
        usleep(50);
      }
    }
  }
  void wait_one(MPI_Request& r, double seconds, const std::string& what) {
    std::vector<MPI_Request> v{r};
    wait_all(v, seconds, what);
    r = v[0];
  }
  // A broadcast of `bytes` from `root` over the membership's control
  // communicator, sizes first.
  void broadcast_blob(std::vector<char>& bytes, int root, double seconds, const std::string& what) {
    std::uint64_t n = bytes.size();
    MPI_Request r;
    check(MPI_Ibcast(&n, 1, MPI_UINT64_T, root, ctrl_, &r), what);
    wait_one(r, seconds, what);
    bytes.resize(std::size_t(n));
    for (std::uint64_t at = 0; at < n;) {  // MPI counts are ints
      const int part = int(std::min<std::uint64_t>(n - at, std::uint64_t(1) << 30));
      check(MPI_Ibcast(bytes.data() + at, part, MPI_BYTE, root, ctrl_, &r), what);
      wait_one(r, seconds, what);
      at += std::uint64_t(part);
    }
  }

  // -- the step boundary ------------------------------------------------------

  Control boundary() {
    Control c;
    if (m_.rank == 0) {
      if (o_.target_ranks)
        if (int t = o_.target_ranks(version_); t > 0) wanted_ = t;
      if (spawned_ != MPI_COMM_NULL) {
        int ready = 0;
        check(MPI_Iprobe(0, kReady, spawned_, &ready, MPI_STATUS_IGNORE), "elastic: looking for the new ranks");
        const bool due = o_.max_steps_to_join > 0 && version_ - spawned_at_ >= o_.max_steps_to_join;
        if (ready || due) {
          int dummy;
          MPI_Request r;
          check(MPI_Irecv(&dummy, 1, MPI_INT, 0, kReady, spawned_, &r), "elastic: waiting for the new ranks");
          try {
            wait_one(r, o_.start_timeout_seconds, "elastic: waiting for the new ranks to start");
          } catch (const RankFailure& e) {
            fail(e.what(), " (ElasticOptions::start_timeout_seconds)");
          }
          c = {kMerge, 0};
        }
      } else if (wanted_ > m_.ranks) {
        c = {kSpawn, wanted_ - m_.ranks};
      } else if (wanted_ > 0 && wanted_ < m_.ranks) {
        c = {kShrink, wanted_};
      }
    }
    if (m_.ranks > 1) {
      // Point to point from rank 0: 2 us a step here, where MPI_Ibcast in
      // the same place took about 1 ms on every rank (and 4 us in a test
      // program alone; the difference was not tracked down).
      std::int64_t msg[2] = {c.action, c.count};
      std::vector<MPI_Request> reqs;
      if (m_.rank == 0) {
        for (int r = 1; r < m_.ranks; ++r)
          check(MPI_Isend(msg, 2, MPI_INT64_T, r, kBoundary, ctrl_, &reqs.emplace_back()),
                "elastic: the step boundary");
      } else {
        check(MPI_Irecv(msg, 2, MPI_INT64_T, 0, kBoundary, ctrl_, &reqs.emplace_back()), "elastic: the step boundary");
      }
      wait_all(reqs, o_.failure_timeout_seconds, "elastic: the step boundary");
      c = {msg[0], msg[1]};
    }
    return c;
  }

  std::vector<std::string> command() const {
    if (!o_.command.empty()) return o_.command;
    std::ifstream f("/proc/self/cmdline", std::ios::binary);
    std::vector<std::string> out;
    for (std::string part; std::getline(f, part, '\0');) out.push_back(part);
    char exe[4096];
    const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (out.empty() || n <= 0) fail("ElasticJob: cannot read this program's command line; set ElasticOptions::command");
    out[0] = std::string(exe, std::size_t(n));  // argv[0] may be relative to a directory the new ranks do not start in
    return out;
  }

  // The new ranks start; training goes on until they are ready.
  void spawn(std::int64_t count) {
    const auto cmd = command();
    std::vector<char*> argv;
    for (std::size_t i = 1; i < cmd.size(); ++i) argv.push_back(const_cast<char*>(cmd[i].c_str()));
    argv.push_back(nullptr);
    std::vector<int> errors(static_cast<std::size_t>(count));
    const auto t0 = Clock::now();
    const int code =
        MPI_Comm_spawn(cmd[0].c_str(), argv.data(), int(count), MPI_INFO_NULL, 0, ctrl_, &spawned_, errors.data());
    spawn_seconds_ = since(t0);
    spawned_at_ = version_;
    if (code != MPI_SUCCESS)
      fail("elastic: MPI_Comm_spawn of ", count, " rank(s) running '", cmd[0], "' failed: ", detail::mpi_error(code));
    MPI_Comm_set_errhandler(spawned_, MPI_ERRORS_RETURN);
  }

  // A spawned rank: say it is ready, then join at the parents' next
  // boundary, unless they finished training first (false: released).
  bool join_as_new_rank() {
    MPI_Comm_set_errhandler(parent_, MPI_ERRORS_RETURN);
    int me = 0, go = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Barrier(MPI_COMM_WORLD);  // every new rank has started
    if (me == 0) {
      int one = 1;
      MPI_Send(&one, 1, MPI_INT, 0, kReady, parent_);
      MPI_Recv(&go, 1, MPI_INT, 0, kGo, parent_, MPI_STATUS_IGNORE);
    }
    MPI_Bcast(&go, 1, MPI_INT, 0, MPI_COMM_WORLD);
    if (!go) {
      MPI_Comm_free(&parent_);
      return false;
    }
    MPI_Comm merged;
    MPI_Intercomm_merge(parent_, 1, &merged);
    MPI_Comm_free(&parent_);
    parent_ = MPI_COMM_NULL;
    regroup(merged, ElasticEvent::Kind::grow, -1, Clock::now());
    return true;
  }

  // Rank 0 tells the new ranks (who said they are ready) to join, or that
  // training ended before they could.
  void tell_new_ranks(int go) {
    if (m_.rank == 0) MPI_Send(&go, 1, MPI_INT, 0, kGo, spawned_);
  }

  void grow() {
    const auto t0 = Clock::now();
    finish_exchange();
    tell_new_ranks(1);
    MPI_Comm merged;
    MPI_Intercomm_merge(spawned_, 0, &merged);
    MPI_Comm_free(&spawned_);
    spawned_ = MPI_COMM_NULL;
    regroup(merged, ElasticEvent::Kind::grow, m_.ranks, t0);
  }

  // Every old rank's slice to every rank of `comm` (the old ranks first,
  // in order, then any new ones), from the rank that holds it; then the new
  // membership compiles and loads. `old_ranks` < 0: this rank is new.
  void regroup(MPI_Comm comm, ElasticEvent::Kind kind, int old_ranks, Clock::time_point t0) {
    std::vector<char> mine;
    std::int64_t header[4] = {version_, samples_, old_ranks, m_.epoch};
    if (old_ranks >= 0) mine = current_slice().blob;
    const int old_rank = old_ranks >= 0 ? m_.rank : -1;
    set_membership(comm);
    const double wait = o_.start_timeout_seconds;
    MPI_Request r;
    check(MPI_Ibcast(header, 4, MPI_INT64_T, 0, ctrl_, &r), "elastic: joining");
    wait_one(r, wait, "elastic: joining");
    version_ = header[0];
    samples_ = header[1];
    m_.epoch = header[3] + 1;
    std::vector<std::vector<char>> slices(static_cast<std::size_t>(header[2]));
    for (int o = 0; o < int(header[2]); ++o) {
      if (o == old_rank) slices[std::size_t(o)] = mine;
      broadcast_blob(slices[std::size_t(o)], o, wait, "elastic: handing the state over");
    }
    finish_regroup(kind, int(header[2]), slices, t0, 0, "live");
  }

  // The ranks above `to` hand their state over and leave.
  bool shrink(std::int64_t to) {
    const auto t0 = Clock::now();
    finish_exchange();
    const int from = m_.ranks;
    const bool leaving = m_.rank >= to;
    std::vector<std::vector<char>> slices(static_cast<std::size_t>(from));
    for (int o = 0; o < from; ++o) {
      if (o == m_.rank) slices[std::size_t(o)] = current_slice().blob;
      broadcast_blob(slices[std::size_t(o)], o, o_.start_timeout_seconds, "elastic: handing the state over");
    }
    MPI_Comm rest;
    check(MPI_Comm_split(ctrl_, leaving ? MPI_UNDEFINED : 0, m_.rank, &rest), "elastic: splitting off the leavers");
    if (leaving) {
      detail::MpiSession::get().mark_left();
      m_.comm.reset();
      return false;
    }
    set_membership(rest);
    finish_regroup(ElasticEvent::Kind::shrink, from, slices, t0, 0, "live");
    return true;
  }

  void finish_regroup(ElasticEvent::Kind kind, int from, const std::vector<std::vector<char>>& blobs,
                      Clock::time_point t0, std::int64_t lost, const std::string& source) {
    std::vector<std::vector<char>> slices;
    for (const auto& b : blobs) slices.push_back(unwrap(b));
    finish_regroup(
        kind, from, [&] { return h_.load(m_, slices); }, t0, lost, source);
  }
  // The new membership compiles its step and loads the state `load` gives it.
  void finish_regroup(ElasticEvent::Kind kind, int from, const std::function<std::uint64_t()>& load,
                      Clock::time_point t0, std::int64_t lost, const std::string& source) {
    const auto tb = Clock::now();
    h_.build(m_);
    const double build = since(tb);
    const std::uint64_t hash = load();
    // Every rank loaded the same state, or the job stops here.
    std::vector<std::uint64_t> hashes(static_cast<std::size_t>(m_.ranks));
    m_.comm->all_gather(&hash, hashes.data(), 1, DType::i64, "elastic: the state each rank loaded");
    for (std::uint64_t x : hashes)
      if (x != hash) fail("elastic: the ranks loaded different states after a change of membership (a bug in frugal)");
    replicate();
    if (wanted_ == 0 || kind == ElasticEvent::Kind::failure) wanted_ = m_.ranks;
    ElasticEvent e{kind, version_, from, m_.ranks, since(t0), build, 0, 0, lost, 0, hash, source};
    if (kind == ElasticEvent::Kind::grow && from > 0) {
      e.spawn_seconds = spawn_seconds_;
      e.steps_while_starting = version_ - spawned_at_;
    }
    events_.push_back(e);
  }

  // -- replicas ---------------------------------------------------------------

  // A held slice is sent as it is held: the version and the sample count,
  // then the hook's bytes.
  static std::vector<char> unwrap(const std::vector<char>& blob) {
    if (blob.size() < 16) fail("elastic: a state slice of ", blob.size(), " bytes has no header");
    return std::vector<char>(blob.begin() + 16, blob.end());
  }
  static std::int64_t version_of(const std::vector<char>& blob) {
    std::int64_t v = -1;
    if (blob.size() >= 8) std::memcpy(&v, blob.data(), 8);
    return v;
  }

  const Held& current_slice() {
    if (own_.empty() || own_.back().version != version_) {
      Held& h = next_slot(own_);
      h.version = version_;
      h.blob.resize(std::max<std::size_t>(h.blob.size(), 16));
      std::memcpy(h.blob.data(), &version_, 8);
      std::memcpy(h.blob.data() + 8, &samples_, 8);
      h_.save(m_, h.blob, 16);
    }
    return own_.back();
  }
  // The slot for a new slice: a new one until kHeld are held, then the
  // oldest one's, whose buffer the new slice overwrites.
  static Held& next_slot(std::vector<Held>& v) {
    if (v.size() < kHeld) return v.emplace_back();
    std::rotate(v.begin(), v.begin() + 1, v.end());
    v.back().version = -1;
    return v.back();
  }

  // This rank's slice after the steps so far, kept, and sent to its
  // successor; its predecessor's received (after the next step, where
  // overlapped).
  void replicate() {
    finish_exchange();
    const Held& mine = current_slice();
    if (m_.ranks == 1) return;
    const int succ = (m_.rank + 1) % m_.ranks, pred = (m_.rank + m_.ranks - 1) % m_.ranks;
    exchange_what_ = cat("elastic: the replica exchange after step ", version_);
    check(MPI_Issend(mine.blob.data(), int(mine.blob.size()), MPI_BYTE, succ, kReplica, ctrl_, &exchange_[0]),
          exchange_what_);
    Held& h = next_slot(replica_);
    if (pred_bytes_ == 0) {  // the first exchange of a membership learns the size of the predecessor's slices
      MPI_Message msg;
      MPI_Status st;
      const auto t0 = Clock::now();
      Watch watch;
      for (long polls = 0;; ++polls) {
        int found = 0;
        check(MPI_Improbe(pred, kReplica, ctrl_, &found, &msg, &st), exchange_what_);
        if (found) break;
        if (polls > 2000) {
          if (since(t0) > o_.failure_timeout_seconds || (watch.due() && peer_gone(pred))) {
            ctrl_failed_ = true;
            throw RankFailure(cat(exchange_what_, ": nothing from rank ", pred, " within ", o_.failure_timeout_seconds,
                                  " s, or its process exited"));
          }
          usleep(50);
        }
      }
      int count = 0;
      MPI_Get_count(&st, MPI_BYTE, &count);
      pred_bytes_ = std::size_t(count);
      h.blob.resize(pred_bytes_);
      check(MPI_Imrecv(h.blob.data(), count, MPI_BYTE, &msg, &exchange_[1]), exchange_what_);
    } else {
      h.blob.resize(pred_bytes_);
      check(MPI_Irecv(h.blob.data(), int(pred_bytes_), MPI_BYTE, pred, kReplica, ctrl_, &exchange_[1]), exchange_what_);
    }
    exchanging_ = true;
    if (!o_.overlap_replication) finish_exchange();
  }
  // Completes the exchange in flight: the predecessor's slice is held.
  void finish_exchange() {
    if (!exchanging_) return;
    std::vector<MPI_Request> both{exchange_[0], exchange_[1]};
    wait_all(both, o_.failure_timeout_seconds, exchange_what_);
    exchanging_ = false;
    Held& h = replica_.back();
    h.version = version_of(h.blob);
  }

  // -- a rank lost ------------------------------------------------------------

  // The ranks that answer a roll call within the failure timeout: every
  // rank sends to every other, waits, then sends what it heard and keeps
  // what every survivor heard. A rank the others dropped (it was stopped,
  // not dead) learns it from their notice and ends.
  std::vector<int> roll_call() {
    const int n = m_.ranks, me = m_.rank;
    // A survivor still computing reaches a wait, and so learns of the
    // failure, up to a step later than one that was waiting.
    const double window = o_.roll_call_seconds + 2 * longest_recent_step();
    std::vector<char> heard(std::size_t(n), 0);
    heard[std::size_t(me)] = 1;
    std::vector<MPI_Request> recvs(std::size_t(n), MPI_REQUEST_NULL), sends;
    // Outlive the call: a receive from a rank that never sends is cancelled, not completed.
    std::vector<int>& flags = abandoned_flags_.emplace_back(std::size_t(n), 0);
    static const int one = 1;
    for (int r = 0; r < n; ++r) {
      if (r == me) continue;
      MPI_Irecv(&flags[std::size_t(r)], 1, MPI_INT, r, kAlive, ctrl_, &recvs[std::size_t(r)]);
      MPI_Request s;
      MPI_Isend(&one, 1, MPI_INT, r, kAlive, ctrl_, &s);
      sends.push_back(s);
    }
    auto dropped = [&] {
      int found = 0;
      MPI_Iprobe(MPI_ANY_SOURCE, kDropped, ctrl_, &found, MPI_STATUS_IGNORE);
      if (found)
        fail("elastic: rank ", me, " was dropped from the job: it stopped answering and the others went on without it");
    };
    // A rank on this machine whose process has exited is not waited for;
    // one whose process is there is waited for up to the failure timeout (it
    // may be computing on a loaded machine); others for the window.
    const auto t0 = Clock::now();
    for (;;) {
      bool all = true, local_alive = false;
      for (int r = 0; r < n; ++r) {
        if (r == me || heard[std::size_t(r)]) continue;
        int done = 0;
        MPI_Test(&recvs[std::size_t(r)], &done, MPI_STATUS_IGNORE);
        heard[std::size_t(r)] = char(done);
        const bool gone = !done && peer_gone(r);
        all = all && (done || gone);
        local_alive = local_alive || (!done && !gone && o_.watch_processes && peer_pid_[std::size_t(r)] > 0);
      }
      dropped();
      if (all || since(t0) >= (local_alive ? std::max(window, o_.failure_timeout_seconds) : window)) break;
      usleep(1000);
    }
    // What each survivor heard; the survivors are those every one heard.
    std::vector<std::vector<char>> views(static_cast<std::size_t>(n));
    std::vector<MPI_Request> view_reqs;
    for (int r = 0; r < n; ++r) {
      if (r == me || !heard[std::size_t(r)]) continue;
      views[std::size_t(r)].assign(std::size_t(n), 0);
      MPI_Request q;
      MPI_Irecv(views[std::size_t(r)].data(), n, MPI_CHAR, r, kView, ctrl_, &q);
      view_reqs.push_back(q);
      view_sent_ = heard;  // outlives the call: a send to a rank that dies may never complete
      MPI_Isend(view_sent_.data(), n, MPI_CHAR, r, kView, ctrl_, &q);
      sends.push_back(q);
    }
    try {
      wait_all(view_reqs, window, "elastic: the roll call");
    } catch (const RankFailure&) {
      fail(
          "elastic: a second rank stopped answering during the recovery from the first; restart the job from its "
          "last checkpoint");
    }
    dropped();
    std::vector<int> alive;
    for (int r = 0; r < n; ++r) {
      if (!heard[std::size_t(r)]) continue;
      alive.push_back(r);
      for (int q = 0; q < n; ++q)
        if (q != me && heard[std::size_t(q)] && views[std::size_t(q)] != heard)
          fail("elastic: the surviving ranks heard different ranks in the roll call after a failure (rank ", me,
               " heard ", std::count(heard.begin(), heard.end(), 1), ", rank ", q,
               " another set); raise "
               "ElasticOptions::failure_timeout_seconds, or restart the job from its last checkpoint");
    }
    for (auto& q : recvs)
      if (q != MPI_REQUEST_NULL) {
        MPI_Cancel(&q);
        MPI_Request_free(&q);
      }
    for (auto& q : sends) MPI_Request_free(&q);
    return alive;
  }

  void recover(const std::string& why) {
    const auto t0 = Clock::now();
    const double detect = std::chrono::duration<double>(t0 - last_step_end_).count();
    const int n_old = m_.ranks, me_old = m_.rank;
    if (spawned_ != MPI_COMM_NULL)
      fail("elastic: a rank was lost while new ranks were starting (", why,
           "); restart the job from its last checkpoint");
    const std::vector<int> alive = roll_call();
    MPI_Group all, survivors;
    MPI_Comm_group(ctrl_, &all);
    MPI_Group_incl(all, int(alive.size()), alive.data(), &survivors);
    MPI_Comm next;
    check(MPI_Comm_create_group(ctrl_, survivors, int(m_.epoch % 32768), &next),
          "elastic: forming the survivors' group");
    MPI_Group_free(&survivors);
    MPI_Group_free(&all);
    for (int r = 0, k = 0; r < n_old; ++r) {  // a rank that was only stopped learns it was dropped
      if (k < int(alive.size()) && alive[std::size_t(k)] == r) {
        ++k;
        continue;
      }
      MPI_Request q;
      static const int notice = 1;
      MPI_Isend(&notice, 1, MPI_INT, r, kDropped, ctrl_, &q);
      MPI_Request_free(&q);
    }
    // What each survivor holds: its old rank, its slices' versions, its
    // predecessor's slices' versions.
    constexpr int kRow = 1 + 2 * int(kHeld);  // old rank, own versions, replica versions
    std::int64_t mine[kRow];
    std::fill(mine, mine + kRow, -1);
    mine[0] = me_old;
    for (std::size_t i = 0; i < own_.size(); ++i) mine[1 + i] = own_[i].version;
    for (std::size_t i = 0; i < replica_.size(); ++i) mine[1 + kHeld + i] = replica_[i].version;
    // The old control communicator has requests that may never complete: it
    // is abandoned, and the buffers they read or write are kept for as long
    // as the job lives (the slices recovered from are read there).
    ctrl_failed_ = true;
    abandoned_.push_back(std::move(own_));
    abandoned_.push_back(std::move(replica_));
    const std::vector<Held>& own = abandoned_[abandoned_.size() - 2];
    const std::vector<Held>& replica = abandoned_.back();
    set_membership(next);
    std::vector<std::int64_t> held(static_cast<std::size_t>(kRow * m_.ranks));
    MPI_Request r;
    check(MPI_Iallgather(mine, kRow, MPI_INT64_T, held.data(), kRow, MPI_INT64_T, ctrl_, &r), "elastic: recovery");
    wait_one(r, o_.start_timeout_seconds, "elastic: recovery");
    // The newest version at which every old rank's slice exists: its own,
    // or its successor's replica of it.
    std::vector<int> new_rank_of(std::size_t(n_old), -1);
    for (int k = 0; k < m_.ranks; ++k) new_rank_of[std::size_t(held[std::size_t(kRow * k)])] = k;
    auto has = [&](int k, int first, std::int64_t v) {
      for (int i = 0; i < int(kHeld); ++i)
        if (held[std::size_t(kRow * k + first + i)] == v) return true;
      return false;
    };
    std::int64_t newest = -1, best = -1;
    for (int k = 0; k < m_.ranks; ++k)
      for (int i = 1; i <= int(kHeld); ++i) newest = std::max(newest, held[std::size_t(kRow * k + i)]);
    for (std::int64_t v = newest; v >= std::max<std::int64_t>(0, newest - 2) && best < 0; --v) {
      bool ok = true;
      for (int o = 0; o < n_old && ok; ++o) {
        const int k = new_rank_of[std::size_t(o)], ks = new_rank_of[std::size_t((o + 1) % n_old)];
        ok = (k >= 0 && has(k, 1, v)) || (ks >= 0 && has(ks, 1 + int(kHeld), v));
      }
      if (ok) best = v;
    }
    if (best < 0) {  // a lost rank's successor was lost too: its slice exists nowhere
      const std::string lost_all = cat("elastic: ", n_old - m_.ranks, " of ", n_old, " ranks were lost (", why,
                                       "), and a lost rank's successor with them, so no replica of its state exists");
      if (!h_.restore) fail(lost_all, "; restart the job from its last checkpoint (or give ElasticHooks::restore)");
      std::optional<Restored> r;
      finish_regroup(
          ElasticEvent::Kind::failure, n_old,
          [&] {
            r = h_.restore(m_);
            if (!r) fail(lost_all, ", and ElasticHooks::restore found no checkpoint to go on from");
            version_ = r->step;
            samples_ = r->samples;
            return r->hash;
          },
          t0, 0, "checkpoint");
      events_.back().steps_lost = newest - version_;
      events_.back().detect_seconds = detect;
      return;
    }
    std::vector<std::vector<char>> slices(static_cast<std::size_t>(n_old));
    std::int64_t samples = 0;  // after `best` steps: every slice of it says
    for (int o = 0; o < n_old; ++o) {
      const int k = new_rank_of[std::size_t(o)];
      const bool self = k >= 0 && has(k, 1, best);
      const int root = self ? k : new_rank_of[std::size_t((o + 1) % n_old)];
      if (root == m_.rank)
        for (const Held& h : self ? own : replica)
          if (h.version == best) slices[std::size_t(o)] = h.blob;
      broadcast_blob(slices[std::size_t(o)], root, o_.start_timeout_seconds, "elastic: recovering the state");
    }
    std::memcpy(&samples, slices[0].data() + 8, 8);
    const std::int64_t lost = newest - best;
    version_ = best;
    samples_ = samples;
    finish_regroup(ElasticEvent::Kind::failure, n_old, slices, t0, lost, "replicas");
    events_.back().detect_seconds = detect;
  }

  ElasticOptions o_;
  ElasticHooks h_;
  Membership m_;
  MPI_Comm ctrl_ = MPI_COMM_NULL;     // the membership's communicator for the job's own messages
  bool ctrl_failed_ = false;          // it has requests that will never complete
  MPI_Comm parent_ = MPI_COMM_NULL;   // a spawned rank's parents, until it joins
  MPI_Comm spawned_ = MPI_COMM_NULL;  // the ranks being started, until they join
  int wanted_ = 0;                    // the rank count rank 0 was last asked for
  std::int64_t version_ = 0, samples_ = 0;
  std::vector<Held> own_, replica_;  // the last two of this rank's slices, and of its predecessor's
  std::vector<ElasticEvent> events_;
  std::vector<char> view_sent_;
  MPI_Request exchange_[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};  // the replica exchange in flight
  bool exchanging_ = false;
  std::string exchange_what_;
  std::size_t pred_bytes_ = 0;  // the predecessor's slices' size in this membership, once known
  Clock::time_point last_step_end_ = Clock::now();
  std::array<double, 8> step_seconds_{};  // the last steps' wall times, boundary to boundary
  double longest_recent_step() const { return *std::max_element(step_seconds_.begin(), step_seconds_.end()); }
  std::vector<long> peer_pid_;                   // each rank's process id where this process can check it, else 0
  std::vector<std::vector<Held>> abandoned_;     // buffers of requests a failure left in flight
  std::list<std::vector<int>> abandoned_flags_;  // the roll calls' receive buffers
  double spawn_seconds_ = 0;
  std::vector<double> replica_seconds_, boundary_seconds_;  // per step
  std::int64_t spawned_at_ = 0;
};

}  // namespace frugal::dist
