#pragma once
// Ranks as threads of one process, for tests of data parallelism without
// MPI: each collective exchanges every rank's bytes, and sums add in rank
// order (frugal::dist::sum_in_rank_order) as dist::Mpi does, so n ranks here
// compute what n processes under mpirun would.
#include <array>
#include <bit>
#include <catch2/catch.hpp>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <frugal/dist/rank_order_sum.hpp>
#include <frugal/frugal.hpp>

namespace test_support {

// A rank that fails aborts the others' collectives instead of leaving them
// waiting.
class ThreadGroup {
 public:
  explicit ThreadGroup(int n) : n_(n), rows_(std::size_t(n)) {}
  int size() const { return n_; }
  // Every rank's bytes, rank 0's first, once all have given theirs.
  std::vector<char> exchange(int rank, const void* data, std::size_t bytes) {
    std::unique_lock lock(m_);
    const long round = round_;
    rows_[std::size_t(rank)].assign(static_cast<const char*>(data), static_cast<const char*>(data) + bytes);
    if (++arrived_ == n_) cv_.notify_all();
    wait(lock, [&] { return arrived_ == n_ || round_ != round; });
    std::vector<char> all;
    for (const auto& r : rows_) all.insert(all.end(), r.begin(), r.end());
    if (++copied_ == n_) {  // the last to copy opens the next round
      arrived_ = copied_ = 0;
      ++round_;
      cv_.notify_all();
    } else {
      wait(lock, [&] { return round_ != round; });
    }
    return all;
  }
  void abort() {
    std::lock_guard lock(m_);
    aborted_ = true;
    cv_.notify_all();
  }

 private:
  template <class Pred>
  void wait(std::unique_lock<std::mutex>& lock, Pred ready) {
    if (!cv_.wait_for(lock, std::chrono::seconds(60), [&] { return aborted_ || ready(); }))
      frugal::fail("ThreadGroup: a rank waited 60 s for the others' collective");
    if (aborted_) frugal::fail("ThreadGroup: another rank failed");
  }
  int n_;
  std::mutex m_;
  std::condition_variable cv_;
  std::vector<std::vector<char>> rows_;
  int arrived_ = 0, copied_ = 0;
  long round_ = 0;
  bool aborted_ = false;
};

class ThreadComm final : public frugal::Communicator {
  using DType = frugal::DType;

 public:
  ThreadComm(ThreadGroup& g, int rank) : g_(g), rank_(rank) {}
  std::string name() const override { return "threads"; }
  int rank() const override { return rank_; }
  int size() const override { return g_.size(); }
  void all_reduce_sum(void* data, std::size_t count, DType dtype, void*, const std::string&) override {
    const auto all = g_.exchange(rank_, data, count * frugal::dtype_size(dtype));
    frugal::dist::sum_in_rank_order(all.data(), count, size(), dtype, data);
  }
  std::size_t all_reduce_workspace(std::size_t, DType) const override { return 0; }
  void reduce_scatter_sum(const void* send, void* recv, std::size_t count, DType dtype, void*,
                          const std::string&) override {
    const std::size_t es = frugal::dtype_size(dtype), row = count * es;
    const auto all = g_.exchange(rank_, send, std::size_t(size()) * row);
    std::vector<char> mine(std::size_t(size()) * row);  // every rank's chunk rank_, in rank order
    for (int r = 0; r < size(); ++r)
      std::memcpy(mine.data() + std::size_t(r) * row, all.data() + (std::size_t(r) * std::size_t(size()) + std::size_t(rank_)) * row, row);
    frugal::dist::sum_in_rank_order(mine.data(), count, size(), dtype, recv);
  }
  std::size_t reduce_scatter_workspace(std::size_t, DType) const override { return 0; }
  void all_gather(const void* send, void* recv, std::size_t count, DType dtype, const std::string&) override {
    const auto all = g_.exchange(rank_, send, count * frugal::dtype_size(dtype));
    std::memcpy(recv, all.data(), all.size());
  }
  void broadcast(void* data, std::size_t count, DType dtype, int root, const std::string&) override {
    const std::size_t bytes = count * frugal::dtype_size(dtype);
    const auto all = g_.exchange(rank_, data, bytes);
    std::memcpy(data, all.data() + std::size_t(root) * bytes, bytes);
  }
  void barrier(const std::string&) override { g_.exchange(rank_, nullptr, 0); }

 private:
  ThreadGroup& g_;
  int rank_;
};

// Runs rank(r, communicator) as ranks 0 to n-1 of a ThreadGroup, each but
// rank 0 on a thread of its own; a rank that fails aborts the others'
// collectives. Returns each rank's error, empty where it had none.
inline std::vector<std::string> run_ranks(int n,
                                          const std::function<void(int, std::shared_ptr<frugal::Communicator>)>& rank) {
  ThreadGroup group(n);
  std::vector<std::string> errors(static_cast<std::size_t>(n));
  auto run = [&](int r) {
    try {
      rank(r, std::make_shared<ThreadComm>(group, r));
    } catch (const std::exception& e) {
      errors[std::size_t(r)] = e.what();
      group.abort();
    }
  };
  std::vector<std::thread> others;
  for (int r = 1; r < n; ++r) others.emplace_back(run, r);
  run(0);
  for (auto& t : others) t.join();
  return errors;
}

inline std::array<std::string, 2> run_two_ranks(
    const std::function<void(int, std::shared_ptr<frugal::Communicator>)>& rank) {
  const std::vector<std::string> e = run_ranks(2, rank);
  return {e[0], e[1]};
}

// run_two_ranks for ranks that must not fail: a rank's error fails the
// test, naming both ranks' errors.
inline void run_two_ranks_ok(const std::function<void(int, std::shared_ptr<frugal::Communicator>)>& rank) {
  const std::array<std::string, 2> errors = run_two_ranks(rank);
  INFO(errors[0] << " | " << errors[1]);
  REQUIRE((errors[0].empty() && errors[1].empty()));
}

// What a rank trained, for check_same_training: copies of `params` (gathered
// by the caller where they are sharded) and of `opt`'s state tensors.
template <class Run>
void record_trained(Run& got, const std::vector<frugal::Tensor>& params, const frugal::Optimizer& opt) {
  for (const frugal::Tensor& p : params) got.params.push_back(p.clone());
  for (const auto& st : opt.state()) got.state.push_back(st.tensor.clone());
}

inline bool same_bits(const frugal::Tensor& a, const frugal::Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// One rank's two runs that must be the same training: every loss, every
// parameter and every optimizer state tensor, bit for bit. `Run` has
// `losses` (floats) and `params` and `state` (tensors).
template <class Run>
void check_same_training(const Run& got, const Run& want) {
  REQUIRE(got.losses.size() == want.losses.size());
  for (std::size_t k = 0; k < want.losses.size(); ++k) {
    INFO("step " << k);
    CHECK(std::bit_cast<std::uint32_t>(got.losses[k]) == std::bit_cast<std::uint32_t>(want.losses[k]));
  }
  REQUIRE(got.params.size() == want.params.size());
  for (std::size_t k = 0; k < want.params.size(); ++k) {
    INFO("parameter " << k);
    CHECK(same_bits(got.params[k], want.params[k]));
  }
  REQUIRE(got.state.size() == want.state.size());
  for (std::size_t k = 0; k < want.state.size(); ++k) {
    INFO("state tensor " << k);
    CHECK(same_bits(got.state[k], want.state[k]));
  }
}

}  // namespace test_support
