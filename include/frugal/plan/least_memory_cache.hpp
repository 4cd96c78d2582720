#pragma once
// The least-memory search's answers, kept for the process: the search reads
// only the price-free view of a step's problem (memory_view), which is the
// same every time the same step is compiled under the same host and NVMe
// limits, whatever the device budget or the measured speeds. Compiling a
// step again (a re-plan with measured speeds, the same model at another
// budget, the test suite's three compiles per graph) found its answer again
// by the same deterministic search, CBC included: seconds each time on
// larger steps. The key is every number the search reads, compared whole,
// so a hit is the answer the search would give.
#include <cstdint>
#include <cstring>
#include <list>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include "budget_greedy.hpp"

namespace frugal::plan {

// Every field of the problem the least-memory search reads, in bytes: all
// but device_budget (it reads none: its targets are its own) and the
// options' reason strings (empty in the view).
inline std::string least_memory_key(const BudgetProblem& p) {
  std::string k;
  auto put = [&](auto v) {
    char b[sizeof v];
    std::memcpy(b, &v, sizeof v);
    k.append(b, sizeof v);
  };
  auto effects = [&](const std::vector<MemEffect>& es) {
    put(es.size());
    for (const MemEffect& e : es) put(e.span.first), put(e.span.last), put(e.bytes);
  };
  put(p.positions), put(p.host_budget), put(p.nvme_budget);
  put(p.base.size());
  for (std::int64_t b : p.base) put(b);
  put(p.op_ms.size());
  for (double t : p.op_ms) put(t);
  put(p.candidates.size());
  for (const Candidate& c : p.candidates) {
    put(c.value), put(c.bytes), put(c.before), put(c.after), put(c.wraps), put(c.segment_boundary);
    put(c.options.size());
    for (const Option& o : c.options) {
      put(o.choice), put(o.cost_ms), put(o.out_done), put(o.in_start), put(o.in_done), put(o.price_free);
      effects(o.device), effects(o.host), effects(o.nvme);
      put(o.requires_.size());
      for (const Requirement& r : o.requires_) put(r.candidate), put(r.allowed);
      put(o.inline_nodes.size());
      for (NodeId n : o.inline_nodes) put(n);
    }
  }
  return k;
}

// The last few answers (most recent first), shared by every thread.
class LeastMemoryCache {
 public:
  static LeastMemoryCache& instance() {
    static LeastMemoryCache cache;
    return cache;
  }
  std::optional<Solution> find(const std::string& key) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = entries_.begin(); it != entries_.end(); ++it)
      if (it->first == key) {
        entries_.splice(entries_.begin(), entries_, it);
        ++hits_;
        return entries_.front().second;
      }
    return std::nullopt;
  }
  std::size_t hits() {
    std::lock_guard<std::mutex> lock(mutex_);
    return hits_;
  }
  void insert(std::string key, const Solution& s) {
    std::lock_guard<std::mutex> lock(mutex_);
    entries_.emplace_front(std::move(key), s);
    if (entries_.size() > kEntries) entries_.pop_back();
  }

 private:
  // A program compiles a few steps (training, evaluation, their re-plans);
  // eight keys of a 12-layer gpt are a few MB.
  static constexpr std::size_t kEntries = 8;
  std::mutex mutex_;
  std::list<std::pair<std::string, Solution>> entries_;
  std::size_t hits_ = 0;
};

}  // namespace frugal::plan
