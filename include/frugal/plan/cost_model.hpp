#pragma once
// Prices ops and transfers for the budget solver. Before a step has run, an
// op's time is the profile's roofline; once the executor has measured it
// (median over a few steps, from OpTimeRecorder), the measurement wins. If
// the plan's predicted step time then turns out off by more than 20%, the
// step is re-planned with the refined model (prediction_is_off).
#include <cmath>
#include <limits>
#include <unordered_map>
#include <vector>

#include "../graph/graph.hpp"
#include "../stats/quantiles.hpp"
#include "device_profile.hpp"
#include "node_cost.hpp"

namespace frugal::plan {

// Per-node op times, as streaming quantiles. All digests are sized when the
// recorder is built, so recording inside a step allocates nothing.
class OpTimeRecorder {
 public:
  // compression 50 keeps a node's digest near 3 KiB; medians of op times
  // need no finer ranks than that.
  explicit OpTimeRecorder(std::size_t num_nodes, double compression = 50)
      : times_(num_nodes, StreamingQuantiles(compression)) {}

  void record(NodeId n, double seconds) {
    if (n < 0 || std::size_t(n) >= times_.size())
      fail("OpTimeRecorder::record: node ", n, " is not in the graph (it has ", times_.size(), " nodes)");
    if (!(seconds >= 0) || !std::isfinite(seconds))
      fail("OpTimeRecorder::record: node ", n, " took ", seconds, " s, not a time");
    times_[std::size_t(n)].add(seconds);
  }
  // Marks the end of one step's recordings (a recomputed node is recorded
  // twice in a step, so steps are counted here, not inferred from samples).
  void finish_step() { ++steps_; }
  std::size_t steps_recorded() const { return steps_; }

  std::size_t num_nodes() const { return times_.size(); }
  std::uint64_t samples(NodeId n) const { return at(n).count(); }
  // Median seconds of node n, or NaN when it was never recorded.
  double median(NodeId n) const {
    const StreamingQuantiles& q = at(n);
    return q.count() == 0 ? std::numeric_limits<double>::quiet_NaN() : q.quantile(0.5);
  }
  const StreamingQuantiles& times(NodeId n) const { return at(n); }
  void clear() {
    double c = times_.empty() ? 50 : times_.front().compression();
    for (auto& t : times_) t = StreamingQuantiles(c);
    steps_ = 0;
  }

 private:
  const StreamingQuantiles& at(NodeId n) const {
    if (n < 0 || std::size_t(n) >= times_.size())
      fail("OpTimeRecorder: node ", n, " is not in the graph (it has ", times_.size(), " nodes)");
    return times_[std::size_t(n)];
  }
  std::vector<StreamingQuantiles> times_;
  std::size_t steps_ = 0;
};

class CostModel {
 public:
  explicit CostModel(DeviceProfile profile) : profile_(std::move(profile)) {}

  const DeviceProfile& profile() const { return profile_; }

  // Node n of the graph this model prices (measured times are keyed by node
  // id, so they belong to one graph).
  double op_ms(const Graph& g, NodeId n) const {
    if (auto it = measured_.find(n); it != measured_.end()) return it->second * 1e3;
    return profile_.op_seconds(node_cost(g, n)) * 1e3;
  }
  double copy_ms(std::size_t bytes) const { return profile_.copy_seconds(bytes) * 1e3; }
  double nvme_write_ms(std::size_t bytes) const { return profile_.nvme_write_seconds(bytes) * 1e3; }
  double nvme_read_ms(std::size_t bytes) const { return profile_.nvme_read_seconds(bytes) * 1e3; }

  void set_measured(NodeId n, double seconds) {
    if (!(seconds >= 0) || !std::isfinite(seconds))
      fail("CostModel::set_measured: node ", n, " measured at ", seconds, " s, not a time");
    measured_[n] = seconds;
  }
  // Takes the median of every node the recorder has seen.
  void set_measured(const OpTimeRecorder& r) {
    for (NodeId n = 0; n < NodeId(r.num_nodes()); ++n)
      if (r.samples(n) > 0) measured_[n] = r.median(n);
  }
  void clear_measured() { measured_.clear(); }
  std::size_t measured_count() const { return measured_.size(); }

 private:
  DeviceProfile profile_;
  std::unordered_map<NodeId, double> measured_;  // seconds
};

// True when a measured time differs from its prediction by more than
// `tolerance` of the measurement (0.20: off by more than 20%). Without a
// positive, finite measurement there is nothing to be off from.
inline bool prediction_is_off(double predicted_ms, double measured_ms, double tolerance = 0.20) {
  if (!(measured_ms > 0) || !std::isfinite(measured_ms)) return false;
  if (!std::isfinite(predicted_ms)) return true;
  return std::abs(predicted_ms - measured_ms) > tolerance * measured_ms;
}

}  // namespace frugal::plan
