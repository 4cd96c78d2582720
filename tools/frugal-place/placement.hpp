#pragma once
// Jobs onto servers: which device of which server runs each job, and in
// what order, so that the energy cost plus the timeliness penalty is least
// (issue 21). A frugal plan knows a job's memory and predicted time before
// it runs; this is what those numbers are for when many jobs share servers.
//
// The model (README, "frugal-place"):
// - A server has `devices` identical devices of `memory` bytes each, runs a
//   job `speed` times as fast as the job's own time says, and each device
//   draws `busy_watts` while it runs a job and `idle_watts` otherwise.
// - A job runs whole on one device whose memory holds it (a job that fits
//   no device is an error naming it). Each device runs its jobs back to
//   back from time 0, in its order; every device is powered until the last
//   job anywhere finishes (the horizon H).
// - Energy = sum over devices of busy_watts * busy + idle_watts * (H - busy),
//   in joules; its cost is price_per_kwh * joules / 3.6e6.
// - A job finishing `late` seconds after its deadline (late > 0) costs
//   weight (step), weight * late (linear, per second) or
//   weight * (exp(late / scale) - 1) (exponential; scale defaults to the
//   job's own seconds).
// - The objective is energy cost + the sum of penalties.
//
// Three solvers: greedy (earliest deadline first, each job onto the
// feasible device where it finishes first), simulated annealing from the
// greedy answer, and exact search for small instances (every assignment of
// jobs to devices, each device's order by dynamic programming over subsets:
// penalties only grow with a job's finish, and energy depends only on the
// devices' busy times, so the best order on a device is the DP's).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include <frugal/core/bytes.hpp>
#include <frugal/core/error.hpp>
#include <frugal/core/json.hpp>
#include <frugal/core/rng.hpp>

namespace frugal::place {

enum class Penalty { step, linear, exponential };

inline const char* penalty_name(Penalty p) {
  switch (p) {
    case Penalty::step: return "step";
    case Penalty::linear: return "linear";
    case Penalty::exponential: return "exponential";
  }
  return "?";
}

struct Job {
  std::string name;
  std::uint64_t memory = 0;  // bytes on one device
  double seconds = 0;        // at speed 1
  double deadline = 0;       // seconds from the start
  Penalty kind = Penalty::linear;
  double weight = 1;
  double scale = 0;  // exponential: seconds of lateness per e-fold; 0: the job's own seconds
};

struct Server {
  std::string name;
  int devices = 1;
  std::uint64_t memory = 0;  // bytes per device
  double speed = 1;
  double idle_watts = 0, busy_watts = 0;
};

struct Instance {
  std::vector<Job> jobs;
  std::vector<Server> servers;
  double price_per_kwh = 1;
};

// One device of one server.
struct Device {
  int server = 0, index = 0;
};

inline std::vector<Device> devices_of(const Instance& in) {
  std::vector<Device> d;
  for (int s = 0; s < int(in.servers.size()); ++s)
    for (int k = 0; k < in.servers[std::size_t(s)].devices; ++k) d.push_back({s, k});
  return d;
}

inline double penalty_of(const Job& j, double finish) {
  const double late = finish - j.deadline;
  if (!(late > 0)) return 0;
  switch (j.kind) {
    case Penalty::step: return j.weight;
    case Penalty::linear: return j.weight * late;
    case Penalty::exponential: return j.weight * std::expm1(late / (j.scale > 0 ? j.scale : j.seconds));
  }
  return 0;
}

// Each device's jobs in run order.
struct Assignment {
  std::vector<std::vector<int>> order;
};

struct Evaluation {
  double joules = 0, energy_cost = 0, penalty = 0, cost = 0, horizon = 0;
  std::vector<double> start, finish;  // by job
  std::vector<int> device_of;         // by job
};

// Checks the instance and says what is wrong, naming the field.
inline void validate(const Instance& in) {
  if (in.servers.empty()) fail("frugal-place: no servers");
  if (!(in.price_per_kwh >= 0) || !std::isfinite(in.price_per_kwh))
    fail("frugal-place: price_per_kwh must be a finite number >= 0, got ", in.price_per_kwh);
  for (const Server& s : in.servers) {
    if (s.devices < 1) fail("frugal-place: server '", s.name, "': devices must be at least 1, got ", s.devices);
    if (!(s.speed > 0) || !std::isfinite(s.speed)) fail("frugal-place: server '", s.name, "': speed must be > 0, got ", s.speed);
    if (!(s.idle_watts >= 0) || !(s.busy_watts >= 0) || !std::isfinite(s.idle_watts) || !std::isfinite(s.busy_watts))
      fail("frugal-place: server '", s.name, "': idle_watts and busy_watts must be finite and >= 0");
  }
  for (const Job& j : in.jobs) {
    if (!(j.seconds > 0) || !std::isfinite(j.seconds)) fail("frugal-place: job '", j.name, "': seconds must be > 0, got ", j.seconds);
    if (!std::isfinite(j.deadline)) fail("frugal-place: job '", j.name, "': deadline must be finite");
    if (!(j.weight >= 0) || !std::isfinite(j.weight)) fail("frugal-place: job '", j.name, "': weight must be >= 0, got ", j.weight);
    if (!(j.scale >= 0) || !std::isfinite(j.scale)) fail("frugal-place: job '", j.name, "': scale must be >= 0, got ", j.scale);
    bool fits = false;
    std::uint64_t largest = 0;
    for (const Server& s : in.servers) {
      fits = fits || j.memory <= s.memory;
      largest = std::max(largest, s.memory);
    }
    if (!fits)
      fail<BudgetError>("frugal-place: job '", j.name, "' needs ", format_bytes(j.memory), " (", j.memory,
                        " bytes) on one device, and the largest device holds ", format_bytes(largest), " (", largest,
                        " bytes): give it a server with more memory per device, or plan it under a smaller budget");
  }
}

// The cost of an assignment; fails if it breaks a device's memory or
// leaves a job out.
inline Evaluation evaluate(const Instance& in, const Assignment& a) {
  const std::vector<Device> dev = devices_of(in);
  if (a.order.size() != dev.size()) fail("frugal-place: an assignment of ", a.order.size(), " devices for ", dev.size());
  Evaluation e;
  e.start.assign(in.jobs.size(), -1);
  e.finish.assign(in.jobs.size(), -1);
  e.device_of.assign(in.jobs.size(), -1);
  std::vector<double> busy(dev.size(), 0);
  for (std::size_t d = 0; d < dev.size(); ++d) {
    const Server& s = in.servers[std::size_t(dev[d].server)];
    for (int j : a.order[d]) {
      const Job& job = in.jobs.at(std::size_t(j));
      if (e.device_of[std::size_t(j)] >= 0) fail("frugal-place: job '", job.name, "' is assigned twice");
      if (job.memory > s.memory)
        fail("frugal-place: job '", job.name, "' (", job.memory, " bytes) assigned to server '", s.name, "' (", s.memory,
             " bytes per device)");
      e.device_of[std::size_t(j)] = int(d);
      e.start[std::size_t(j)] = busy[d];
      busy[d] += job.seconds / s.speed;
      e.finish[std::size_t(j)] = busy[d];
      e.penalty += penalty_of(job, busy[d]);
    }
    e.horizon = std::max(e.horizon, busy[d]);
  }
  for (std::size_t j = 0; j < in.jobs.size(); ++j)
    if (e.device_of[j] < 0) fail("frugal-place: job '", in.jobs[j].name, "' is not assigned");
  for (std::size_t d = 0; d < dev.size(); ++d) {
    const Server& s = in.servers[std::size_t(dev[d].server)];
    e.joules += s.busy_watts * busy[d] + s.idle_watts * (e.horizon - busy[d]);
  }
  e.energy_cost = in.price_per_kwh * e.joules / 3.6e6;
  e.cost = e.energy_cost + e.penalty;
  return e;
}

// Earliest deadline first, each job onto the device where it would finish
// first (ties: the lower busy power, then the first device).
inline Assignment greedy(const Instance& in) {
  validate(in);
  const std::vector<Device> dev = devices_of(in);
  std::vector<int> by_deadline(in.jobs.size());
  for (std::size_t j = 0; j < by_deadline.size(); ++j) by_deadline[j] = int(j);
  std::stable_sort(by_deadline.begin(), by_deadline.end(),
                   [&](int x, int y) { return in.jobs[std::size_t(x)].deadline < in.jobs[std::size_t(y)].deadline; });
  Assignment a;
  a.order.resize(dev.size());
  std::vector<double> busy(dev.size(), 0);
  for (int j : by_deadline) {
    const Job& job = in.jobs[std::size_t(j)];
    int best = -1;
    double best_finish = 0;
    for (std::size_t d = 0; d < dev.size(); ++d) {
      const Server& s = in.servers[std::size_t(dev[d].server)];
      if (job.memory > s.memory) continue;
      const double f = busy[d] + job.seconds / s.speed;
      const bool better = best < 0 || f < best_finish ||
                          (f == best_finish && s.busy_watts < in.servers[std::size_t(dev[std::size_t(best)].server)].busy_watts);
      if (better) best = int(d), best_finish = f;
    }
    a.order[std::size_t(best)].push_back(j);
    busy[std::size_t(best)] = best_finish;
  }
  return a;
}

struct AnnealOptions {
  std::uint64_t seed = 1;
  std::int64_t iterations = 0;  // 0: 400 per job, at least 200,000
};

struct AnnealResult {
  Assignment best;
  double start_cost = 0, best_cost = 0;
  std::int64_t iterations = 0, accepted = 0;
  double t0 = 0;
};

// Simulated annealing from `start`. Moves, each drawn with equal odds:
// - relocate: a random job to a random position on a random device that
//   holds it (its own device included: a reordering);
// - swap: two random jobs on different devices, each of which holds the
//   other's job.
// A move that lowers the cost is taken; one that raises it by delta with
// probability exp(-delta / T). T falls geometrically from T0 to T0 * 1e-4
// over the iterations; T0 is the mean rise of 200 random moves from the
// start, so about a third of rises are taken at first. The best assignment
// seen is returned. Seeded: the same instance and seed give the same answer
// on every machine.
class Annealer {
 public:
  Annealer(const Instance& in, Assignment start) : in_(in), dev_(devices_of(in)), a_(std::move(start)) {
    busy_.assign(dev_.size(), 0);
    pen_.assign(dev_.size(), 0);
    where_.assign(in.jobs.size(), {-1, -1});
    for (std::size_t d = 0; d < dev_.size(); ++d) refresh(int(d));
    for (std::size_t d = 0; d < dev_.size(); ++d) idle_watts_ += server(int(d)).idle_watts;
    horizon_ = *std::max_element(busy_.begin(), busy_.end());
    for (std::size_t j = 0; j < in.jobs.size(); ++j) {
      std::vector<int> ok;
      for (std::size_t d = 0; d < dev_.size(); ++d)
        if (in.jobs[j].memory <= server(int(d)).memory) ok.push_back(int(d));
      holds_.push_back(std::move(ok));
    }
  }

  AnnealResult run(const AnnealOptions& o) {
    AnnealResult r;
    r.start_cost = r.best_cost = cost();
    r.best = a_;
    const std::size_t n = in_.jobs.size();
    if (n == 0) return r;
    r.iterations = o.iterations > 0 ? o.iterations : std::max<std::int64_t>(200000, 400 * std::int64_t(n));
    Rng rng(o.seed, 21);
    // T0: the mean rise of random moves, undone.
    double rise = 0;
    int rises = 0;
    for (int k = 0; k < 200; ++k) {
      const double before = cost();
      if (!propose(rng)) continue;
      const double d = cost() - before;
      undo();
      if (d > 0) rise += d, ++rises;
    }
    r.t0 = rises ? rise / rises : 1.0;
    const double t_end = r.t0 * 1e-4;
    const double cool = std::pow(t_end / r.t0, 1.0 / double(r.iterations));
    double t = r.t0, current = cost();
    for (std::int64_t it = 0; it < r.iterations; ++it, t *= cool) {
      if (!propose(rng)) continue;
      const double next = cost(), d = next - current;
      if (d <= 0 || rng.uniform() < std::exp(-d / t)) {
        current = next;
        ++r.accepted;
        if (current < r.best_cost - 1e-12 * std::max(1.0, std::abs(r.best_cost))) {
          r.best_cost = current;
          r.best = a_;
        }
      } else {
        undo();
      }
    }
    return r;
  }

 private:
  const Server& server(int d) const { return in_.servers[std::size_t(dev_[std::size_t(d)].server)]; }
  double cost() const {
    double joules = idle_watts_ * horizon_, pen = 0;
    for (std::size_t d = 0; d < dev_.size(); ++d) {
      joules += (server(int(d)).busy_watts - server(int(d)).idle_watts) * busy_[d];
      pen += pen_[d];
    }
    return in_.price_per_kwh * joules / 3.6e6 + pen;
  }
  void refresh(int d) {
    const Server& s = server(d);
    double t = 0, p = 0;
    const auto& jobs = a_.order[std::size_t(d)];
    for (std::size_t i = 0; i < jobs.size(); ++i) {
      const Job& job = in_.jobs[std::size_t(jobs[i])];
      t += job.seconds / s.speed;
      p += penalty_of(job, t);
      where_[std::size_t(jobs[i])] = {d, int(i)};
    }
    busy_[std::size_t(d)] = t;
    pen_[std::size_t(d)] = p;
  }
  // The horizon after devices a and b, once busy for was_a and was_b, changed:
  // a rescan only where one of them held the old maximum.
  void fix_horizon(int a, double was_a, int b, double was_b) {
    horizon_ = std::max({horizon_, busy_[std::size_t(a)], busy_[std::size_t(b)]});
    if (was_a >= horizon_ || was_b >= horizon_) horizon_ = *std::max_element(busy_.begin(), busy_.end());
  }
  // A random move, applied (and remembered for undo); false if none was drawn.
  bool propose(Rng& rng) {
    const std::size_t n = in_.jobs.size();
    saved_ = {};
    const int j = int(rng.below(n));
    const auto [a, p] = where_[std::size_t(j)];
    if (rng.below(2) == 0) {  // relocate
      const auto& ok = holds_[std::size_t(j)];
      const int b = ok[rng.below(ok.size())];
      const std::size_t len = a_.order[std::size_t(b)].size() - (a == b ? 1 : 0);
      const int q = int(rng.below(len + 1));
      if (a == b && q == p) return false;
      save(a), save(b);
      auto& from = a_.order[std::size_t(a)];
      from.erase(from.begin() + p);
      auto& to = a_.order[std::size_t(b)];
      to.insert(to.begin() + q, j);
      const double was_a = busy_[std::size_t(a)], was_b = busy_[std::size_t(b)];
      refresh(a);
      if (b != a) refresh(b);
      fix_horizon(a, was_a, b, was_b);
      return true;
    }
    const int k = int(rng.below(n));  // swap
    const auto [b, q] = where_[std::size_t(k)];
    if (a == b) return false;
    if (in_.jobs[std::size_t(j)].memory > server(b).memory || in_.jobs[std::size_t(k)].memory > server(a).memory) return false;
    save(a), save(b);
    a_.order[std::size_t(a)][std::size_t(p)] = k;
    a_.order[std::size_t(b)][std::size_t(q)] = j;
    const double was_a = busy_[std::size_t(a)], was_b = busy_[std::size_t(b)];
    refresh(a);
    refresh(b);
    fix_horizon(a, was_a, b, was_b);
    return true;
  }
  void save(int d) {
    for (const auto& s : saved_.devices)
      if (s.first == d) return;
    saved_.devices.push_back({d, a_.order[std::size_t(d)]});
    saved_.horizon = horizon_;
  }
  void undo() {
    for (auto& [d, order] : saved_.devices) {
      a_.order[std::size_t(d)] = std::move(order);
      refresh(d);
    }
    horizon_ = saved_.horizon;
    saved_ = {};
  }

  const Instance& in_;
  std::vector<Device> dev_;
  Assignment a_;
  std::vector<double> busy_, pen_;
  std::vector<std::pair<int, int>> where_;  // by job: device, position
  std::vector<std::vector<int>> holds_;     // by job: the devices whose memory holds it
  double idle_watts_ = 0, horizon_ = 0;
  struct Saved {
    std::vector<std::pair<int, std::vector<int>>> devices;
    double horizon = 0;
  } saved_;
};

inline AnnealResult anneal(const Instance& in, const Assignment& start, const AnnealOptions& o = {}) {
  validate(in);
  Annealer a(in, start);
  return a.run(o);
}

// The exact least cost where devices^jobs assignments are few enough
// (at most `limit`) and jobs at most 16; otherwise nothing.
inline std::optional<Assignment> exact(const Instance& in, double limit = 2e7) {
  validate(in);
  const std::vector<Device> dev = devices_of(in);
  const int n = int(in.jobs.size()), m = int(dev.size());
  if (n > 16 || std::pow(double(m), double(n)) > limit) return std::nullopt;
  const std::uint32_t full = (1u << n);
  constexpr double inf = std::numeric_limits<double>::infinity();
  // By device: busy time and least penalty of each subset, and its last job.
  std::vector<std::vector<double>> busy(std::size_t(m), std::vector<double>(full, 0)),
      pen(std::size_t(m), std::vector<double>(full, inf));
  std::vector<std::vector<int>> last(std::size_t(m), std::vector<int>(full, -1));
  for (int d = 0; d < m; ++d) {
    const Server& s = in.servers[std::size_t(dev[std::size_t(d)].server)];
    auto& b = busy[std::size_t(d)];
    auto& p = pen[std::size_t(d)];
    p[0] = 0;
    for (std::uint32_t set = 1; set < full; ++set) {
      const int low = __builtin_ctz(set);
      b[set] = b[set & (set - 1)] + in.jobs[std::size_t(low)].seconds / s.speed;
      for (int j = 0; j < n; ++j) {
        if (!(set >> j & 1u) || in.jobs[std::size_t(j)].memory > s.memory) continue;
        const double c = p[set & ~(1u << j)] + penalty_of(in.jobs[std::size_t(j)], b[set]);
        if (c < p[set]) p[set] = c, last[std::size_t(d)][set] = j;
      }
    }
  }
  std::vector<std::uint32_t> sets(std::size_t(m), 0), best_sets;
  double best = inf;
  auto total = [&] {
    double h = 0, joules = 0, p = 0;
    for (int d = 0; d < m; ++d) h = std::max(h, busy[std::size_t(d)][sets[std::size_t(d)]]);
    for (int d = 0; d < m; ++d) {
      const Server& s = in.servers[std::size_t(dev[std::size_t(d)].server)];
      const double bt = busy[std::size_t(d)][sets[std::size_t(d)]];
      joules += s.busy_watts * bt + s.idle_watts * (h - bt);
      p += pen[std::size_t(d)][sets[std::size_t(d)]];
    }
    return in.price_per_kwh * joules / 3.6e6 + p;
  };
  auto place = [&](auto&& self, int j) -> void {
    if (j == n) {
      const double c = total();
      if (c < best) best = c, best_sets = sets;
      return;
    }
    for (int d = 0; d < m; ++d) {
      if (in.jobs[std::size_t(j)].memory > in.servers[std::size_t(dev[std::size_t(d)].server)].memory) continue;
      sets[std::size_t(d)] |= 1u << j;
      self(self, j + 1);
      sets[std::size_t(d)] &= ~(1u << j);
    }
  };
  place(place, 0);
  Assignment a;
  a.order.resize(std::size_t(m));
  for (int d = 0; d < m; ++d) {
    for (std::uint32_t set = best_sets[std::size_t(d)]; set; set &= ~(1u << last[std::size_t(d)][set]))
      a.order[std::size_t(d)].push_back(last[std::size_t(d)][set]);
    std::reverse(a.order[std::size_t(d)].begin(), a.order[std::size_t(d)].end());
  }
  return a;
}

// ---- Reading an instance -------------------------------------------------

namespace detail {
inline const Json& member(const Json& o, const char* key, const std::string& where) {
  const Json* v = o.find(key);
  if (!v) fail(where, ": '", key, "' is missing");
  return *v;
}
inline double number(const Json& o, const char* key, const std::string& where, std::optional<double> otherwise = {}) {
  const Json* v = o.find(key);
  if (!v) {
    if (otherwise) return *otherwise;
    fail(where, ": '", key, "' is missing");
  }
  if (v->kind != Json::Kind::number || !std::isfinite(v->number))
    fail(where, ": '", key, "' must be a finite number, got ", v->describe());
  return v->number;
}
inline std::string text(const Json& o, const char* key, const std::string& where, std::optional<std::string> otherwise = {}) {
  const Json* v = o.find(key);
  if (!v) {
    if (otherwise) return *otherwise;
    fail(where, ": '", key, "' is missing");
  }
  if (v->kind != Json::Kind::string) fail(where, ": '", key, "' must be a string, got ", v->describe());
  return v->str;
}
// Bytes as a number or a size string ("12GiB", "512MiB").
inline std::uint64_t bytes(const Json& o, const char* key, const std::string& where) {
  const Json& v = member(o, key, where);
  if (v.kind == Json::Kind::string) return parse_bytes(v.str);
  if (v.kind == Json::Kind::number && v.is_integer) return v.integer;
  fail(where, ": '", key, "' must be a byte count (an integer, or a string such as \"16GiB\"), got ", v.describe());
}
}  // namespace detail

// {"price_per_kwh": 0.3,
//  "servers": [{"name", "devices", "memory", "speed", "idle_watts", "busy_watts"}, ...],
//  "jobs": [{"name", "memory", "seconds", "deadline", "penalty": "step|linear|exponential", "weight", "scale"}, ...]}
// A job may give "plan" instead of "memory": the JSON `frugal-plan --json`
// prints (its "budget_bytes", else "planned_bytes"), read by the caller;
// here, the object's own fields.
inline Instance parse_instance(const Json& root, const std::string& where) {
  Instance in;
  if (root.kind != Json::Kind::object) fail(where, ": expected an object with 'servers' and 'jobs'");
  in.price_per_kwh = detail::number(root, "price_per_kwh", where, 1.0);
  const Json& servers = detail::member(root, "servers", where);
  if (servers.kind != Json::Kind::array) fail(where, ": 'servers' must be an array");
  for (std::size_t i = 0; i < servers.items.size(); ++i) {
    const Json& s = servers.items[i];
    const std::string w = cat(where, ": servers[", i, "]");
    if (s.kind != Json::Kind::object) fail(w, ": expected an object");
    Server v;
    v.name = detail::text(s, "name", w, cat("server", i));
    const double devices = detail::number(s, "devices", w, 1.0);
    if (devices != std::floor(devices) || devices < 1 || devices > 4096)
      fail(w, ": 'devices' must be an integer from 1 to 4096, got ", devices);
    v.devices = int(devices);
    v.memory = detail::bytes(s, "memory", w);
    v.speed = detail::number(s, "speed", w, 1.0);
    v.idle_watts = detail::number(s, "idle_watts", w);
    v.busy_watts = detail::number(s, "busy_watts", w);
    in.servers.push_back(v);
  }
  const Json& jobs = detail::member(root, "jobs", where);
  if (jobs.kind != Json::Kind::array) fail(where, ": 'jobs' must be an array");
  for (std::size_t i = 0; i < jobs.items.size(); ++i) {
    const Json& j = jobs.items[i];
    const std::string w = cat(where, ": jobs[", i, "]");
    if (j.kind != Json::Kind::object) fail(w, ": expected an object");
    Job v;
    v.name = detail::text(j, "name", w, cat("job", i));
    v.memory = detail::bytes(j, "memory", w);
    v.seconds = detail::number(j, "seconds", w);
    v.deadline = detail::number(j, "deadline", w);
    const std::string kind = detail::text(j, "penalty", w, std::string("linear"));
    if (kind == "step") v.kind = Penalty::step;
    else if (kind == "linear") v.kind = Penalty::linear;
    else if (kind == "exponential") v.kind = Penalty::exponential;
    else fail(w, ": 'penalty' must be \"step\", \"linear\" or \"exponential\", got \"", kind, "\"");
    v.weight = detail::number(j, "weight", w, 1.0);
    v.scale = detail::number(j, "scale", w, 0.0);
    in.jobs.push_back(v);
  }
  validate(in);
  return in;
}

// A seeded random instance: `jobs` jobs, `servers` servers of 1 to
// `max_devices` devices (8 by default)
// with 16-80 GiB each, speeds 0.5-2, 60-150 W idle and 250-700 W busy per
// device; jobs of 1-60 GiB (some fit only the larger servers), 10 minutes
// to 4 hours, deadlines from their own length to a few times the load per
// device; the penalty kind given (weights so lateness and energy matter
// alike).
inline Instance random_instance(int jobs, int servers, Penalty kind, std::uint64_t seed, int max_devices = 8) {
  Rng r(seed, 7);
  Instance in;
  in.price_per_kwh = 0.3;
  int devices = 0;
  for (int s = 0; s < servers; ++s) {
    Server v;
    v.name = cat("s", s);
    v.devices = 1 + int(r.below(std::uint64_t(std::max(max_devices, 1))));
    v.memory = (s == 0 ? 80 : 16 + 16 * r.below(5)) * (std::uint64_t(1) << 30);  // the first holds every job
    v.speed = r.uniform(0.5, 2.0);
    v.idle_watts = r.uniform(60, 150);
    v.busy_watts = r.uniform(250, 700);
    devices += v.devices;
    in.servers.push_back(v);
  }
  double work = 0;
  for (int j = 0; j < jobs; ++j) {
    Job v;
    v.name = cat("j", j);
    v.memory = (1 + r.below(60)) * (std::uint64_t(1) << 30);
    v.seconds = r.uniform(600, 4 * 3600);
    v.kind = kind;
    work += v.seconds;
    in.jobs.push_back(v);
  }
  const double per_device = work / std::max(devices, 1);
  for (Job& v : in.jobs) {
    v.deadline = v.seconds + r.uniform(0, per_device);  // about half finish late on a balanced load
    // An hour late costs about what a device-hour of busy power does.
    v.weight = kind == Penalty::step ? 0.2 : kind == Penalty::linear ? 0.2 / 3600 : 0.2;
    v.scale = kind == Penalty::exponential ? 3600 : 0;
  }
  return in;
}

}  // namespace frugal::place
