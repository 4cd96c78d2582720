#pragma once
// Prices for the step simulator (plan/step_sim.hpp) from one DeviceProfile:
// a rank of a data-parallel job on machines like the one calibrated, its
// ranks joined by a link of the given latency and bandwidth. This is how
// frugal's CPU ranks run under mpirun (dist::Mpi): every collective adds in
// rank order (dist/rank_order_sum.hpp), an all-to-all of chunks, each rank
// summing its chunk's rows, then an all-gather; so an all-reduce moves
// 2 (p - 1) / p of the buffer through the link and reads the p rows of its
// chunk once, like a ring, with two rounds of latency.
#include "device_profile.hpp"
#include "step_sim.hpp"

namespace frugal::plan {

struct RankLink {
  int ranks = 1;
  double latency_s = 0;       // one collective call's fixed cost
  double bytes_per_s = 1e30;  // what one rank sends and receives per second
};

class ProfilePrices final : public StepPrices {
 public:
  ProfilePrices(DeviceProfile p, RankLink link) : p_(std::move(p)), link_(link) {
    if (link_.ranks < 1) fail("ProfilePrices: ", link_.ranks, " ranks");
    if (!(link_.bytes_per_s > 0)) fail("ProfilePrices: the ranks' link moves ", link_.bytes_per_s, " bytes/s");
  }
  double compute_seconds(const Graph& g, NodeId n) const override { return seconds(g, n); }
  double host_update_seconds(const Graph& g, NodeId n) const override { return seconds(g, n); }
  double h2d_seconds(std::size_t bytes) const override { return p_.copy_seconds(bytes); }
  double d2h_seconds(std::size_t bytes) const override { return p_.copy_seconds(bytes); }
  double nvme_read_seconds(std::size_t bytes) const override { return p_.nvme_read_seconds(bytes); }
  double nvme_write_seconds(std::size_t bytes) const override { return p_.nvme_write_seconds(bytes); }
  double collective_seconds(Collective c, std::size_t bytes) const override {
    const double p = link_.ranks;
    if (p == 1) return 0;
    const double moved = (p - 1) / p * double(bytes) / link_.bytes_per_s;
    const double sum = double(bytes) / p_.stream_bytes;  // p rows of a 1/p chunk
    switch (c) {
      case Collective::all_reduce: return 2 * link_.latency_s + 2 * moved + sum;
      case Collective::reduce_scatter: return link_.latency_s + moved + sum;
      case Collective::all_gather: return link_.latency_s + moved;
      case Collective::broadcast: return link_.latency_s + double(bytes) / link_.bytes_per_s;
    }
    return 0;
  }

 private:
  double seconds(const Graph& g, NodeId n) const { return p_.op_seconds(node_cost(g, n)); }
  DeviceProfile p_;
  RankLink link_;
};

}  // namespace frugal::plan
