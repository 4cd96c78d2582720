#pragma once
// A communicator for planning one rank of a job that is not running: it has
// the rank and the rank count, sizes its scratch as dist::Mpi does (so a
// plan's bytes are that rank's under mpirun), and refuses to run a
// collective. frugal-plan --ranks plans with it; plan_training accepts it,
// compile does not (compile checks with the other ranks that they agree).
#include <string>

#include "../core/error.hpp"
#include "../ops/collective.hpp"
#include "rank_order_sum.hpp"

namespace frugal::dist {

class PlanOnly final : public Communicator {
 public:
  PlanOnly(int rank, int ranks) : rank_(rank), size_(ranks) {
    if (ranks < 1 || rank < 0 || rank >= ranks)
      fail("dist::PlanOnly: rank ", rank, " of ", ranks, " ranks: give 0 <= rank < ranks, ranks >= 1");
  }
  std::string name() const override { return "plan-only"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void all_reduce_sum(void*, std::size_t, DType, void*, const std::string& what) override { refuse("all_reduce", what); }
  std::size_t all_reduce_workspace(std::size_t count, DType dtype) const override {
    return rank_order_all_reduce_workspace(count, dtype, size_);
  }
  void reduce_scatter_sum(const void*, void*, std::size_t, DType, void*, const std::string& what) override {
    refuse("reduce_scatter", what);
  }
  std::size_t reduce_scatter_workspace(std::size_t count, DType dtype) const override {
    return rank_order_reduce_scatter_workspace(count, dtype, size_);
  }
  void all_gather(const void*, void*, std::size_t, DType, const std::string& what) override { refuse("all_gather", what); }
  void broadcast(void*, std::size_t, DType, int, const std::string& what) override { refuse("broadcast", what); }
  void barrier(const std::string& what) override { refuse("barrier", what); }
  // As dist::Mpi under mpirun: its plans run the collectives beside compute.
  bool serialized_threads() const override { return true; }

 private:
  [[noreturn]] void refuse(const char* collective, const std::string& what) const {
    fail("dist::PlanOnly: ", collective, " (", what, ") at rank ", rank_, " of ", size_,
         ": this communicator plans a rank of a job that is not running, it cannot communicate; run under mpirun "
         "with dist::Mpi::world()");
  }
  int rank_, size_;
};

}  // namespace frugal::dist
