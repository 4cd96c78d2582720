#pragma once
// Replays an access trace (plan/access_trace.hpp) on a device smaller than
// its footprint, in virtual time, under three memory managers:
//
// - demand paging (unified memory with no hints): a page not on the device
//   faults, the step stalls for the fault's latency and the page's copy, and
//   the least recently used page makes room (written back first if the
//   device holds its only current copy);
// - LRU with a sequential prefetcher (the driver's default): the same, and
//   each fault also starts copies of the next pages in address order, which
//   run on the link while the step goes on;
// - next use (CPPE's idea, with what frugal's graph knows): whole tensors;
//   before each op, the tensors the rest of the step reads are fetched in
//   the order they are needed, each making room only by evicting tensors
//   whose next use is later than its own (so the prefetcher never evicts
//   what it would have to bring back sooner), and a demand fetch evicts the
//   resident tensor used furthest ahead. It knows the current step's graph
//   (captured before the step runs) and not the next one's: a persistent's
//   next use past the step's end is predicted at its position in this step.
//
// Common to all three: one copy link each way (PCIe is full duplex), each
// copy taking latency + bytes / bandwidth and starting when its link is
// free; compute runs op after op and overlaps the copies it does not wait
// for; a tensor dead after its last use is freed without being written
// back; a tensor made by its first writer needs room but no copy; and a
// tensor whose host copy is current (never written on the device since it
// came) is evicted for free.
#include <algorithm>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "../core/error.hpp"
#include "access_trace.hpp"
#include "next_use.hpp"

namespace frugal::plan {

struct CopyLink {
  double bytes_per_s = 5e9;
  double latency_s = 1e-5;
  double seconds(std::size_t bytes) const { return latency_s + double(bytes) / bytes_per_s; }
};

struct PagingOptions {
  std::size_t capacity = 0;  // device bytes
  CopyLink h2d, d2h;
  double fault_latency_s = 1e-5;  // the stall a page fault adds before its copy
};

struct PagingResult {
  std::string policy;
  double ms = 0;          // the trace's virtual time
  double compute_ms = 0;  // of it, the ops' own time
  // Page faults (first touches of a made tensor's pages included, as on a
  // GPU); for the next-use manager, demand fetches of data not on the device.
  std::size_t faults = 0;
  std::size_t bytes_in = 0;       // host to device
  std::size_t bytes_out = 0;      // device to host (write-backs)
  double stall_ms() const { return ms - compute_ms; }
};

// Demand paging (prefetch_pages = 0) or LRU with a sequential prefetcher:
// pages of `page_bytes`, tensors laid out one after another in order of
// first appearance, each starting on a page boundary.
inline PagingResult simulate_pages(const AccessTrace& trace, const PagingOptions& o, std::size_t page_bytes,
                                   int prefetch_pages = 0) {
  if (page_bytes == 0) fail("simulate_pages: page_bytes is 0");
  const std::size_t capacity_pages = o.capacity / page_bytes;
  if (capacity_pages == 0)
    fail("simulate_pages: a device of ", o.capacity, " bytes holds no page of ", page_bytes, " bytes");
  std::vector<std::size_t> base(trace.tensors.size() + 1, 0);
  for (std::size_t i = 0; i < trace.tensors.size(); ++i)
    base[i + 1] = base[i] + (trace.tensors[i].bytes + page_bytes - 1) / page_bytes;
  const std::size_t pages = base.back();
  std::vector<int> owner(pages);
  for (std::size_t i = 0; i < trace.tensors.size(); ++i)
    for (std::size_t q = base[i]; q < base[i + 1]; ++q) owner[q] = int(i);
  // Per page: on the device; the device copy newer than the host's; has
  // any content (a made tensor's pages before their first write have none);
  // when an in-flight copy lands; its LRU stamp.
  std::vector<char> resident(pages, 0), dirty(pages, 0), populated(pages, 0);
  std::vector<double> ready(pages, 0);
  std::vector<std::uint64_t> stamp(pages, 0);
  for (std::size_t i = 0; i < trace.tensors.size(); ++i)
    if (trace.tensors[i].from_host)
      for (std::size_t q = base[i]; q < base[i + 1]; ++q) populated[q] = 1;
  std::set<std::pair<std::uint64_t, std::size_t>> lru;
  std::uint64_t clock = 0;
  std::size_t used = 0;
  double now = 0, h2d_free = 0, d2h_free = 0;
  PagingResult r;
  r.policy = prefetch_pages > 0 ? cat("LRU + sequential prefetch of ", prefetch_pages, " x ", page_bytes, " B")
                                : cat("demand paging, ", page_bytes, " B pages");
  auto page_size = [&](std::size_t q) {
    const std::size_t t = std::size_t(owner[q]);
    const std::size_t end = std::min((q - base[t] + 1) * page_bytes, trace.tensors[t].bytes);
    return end - (q - base[t]) * page_bytes;
  };
  auto drop = [&](std::size_t q) {
    lru.erase({stamp[q], q});
    resident[q] = 0;
    --used;
  };
  // Room for one page; returns when that room is free (after a write-back).
  auto make_room = [&]() {
    double free_at = 0;
    while (used >= capacity_pages) {
      const std::size_t victim = lru.begin()->second;
      if (dirty[victim]) {
        const double start = std::max({now, d2h_free, ready[victim]});
        d2h_free = start + o.d2h.seconds(page_size(victim)) * 1e3;
        r.bytes_out += page_size(victim);
        dirty[victim] = 0;
        free_at = std::max(free_at, d2h_free);
      }
      drop(victim);
    }
    return free_at;
  };
  auto mark = [&](std::size_t q) {
    if (resident[q]) lru.erase({stamp[q], q});
    stamp[q] = ++clock;
    lru.insert({stamp[q], q});
  };
  auto bring = [&](std::size_t q, bool wait) {
    const double room_at = make_room();
    resident[q] = 1;
    ++used;
    mark(q);
    if (!populated[q]) {  // first touch of a made tensor: room, no copy
      populated[q] = 1;
      if (wait) now = std::max(now, room_at);
      return;
    }
    const double start = std::max({now, h2d_free, room_at});
    h2d_free = start + o.h2d.seconds(page_size(q)) * 1e3;
    r.bytes_in += page_size(q);
    ready[q] = h2d_free;
    if (wait) now = h2d_free;
  };
  for (const TraceOp& op : trace.ops) {
    for (const auto* list : {&op.reads, &op.writes}) {
      const bool writes = list == &op.writes;
      for (int t : *list) {
        for (std::size_t q = base[std::size_t(t)]; q < base[std::size_t(t) + 1]; ++q) {
          if (resident[q]) {
            now = std::max(now, ready[q]);
            mark(q);
          } else {
            ++r.faults;
            now += o.fault_latency_s * 1e3;
            bring(q, true);
            for (int k = 1; k <= prefetch_pages && q + std::size_t(k) < pages; ++k) {
              const std::size_t n = q + std::size_t(k);
              if (!resident[n] && populated[n]) bring(n, false);
            }
          }
          if (writes) dirty[q] = 1;
        }
      }
    }
    now += op.ms;
    r.compute_ms += op.ms;
    for (int t : op.dies)
      for (std::size_t q = base[std::size_t(t)]; q < base[std::size_t(t) + 1]; ++q) {
        if (resident[q]) drop(q);
        dirty[q] = 0;
        populated[q] = 0;
      }
  }
  r.ms = std::max({now, h2d_free, d2h_free});
  return r;
}

// The next-use manager over whole tensors (see the top of this file).
inline PagingResult simulate_next_use(const AccessTrace& trace, const PagingOptions& o) {
  const std::size_t T = trace.tensors.size(), N = trace.ops.size();
  if (const std::size_t need = trace.largest_op_bytes(); need > o.capacity)
    fail("simulate_next_use: one op reads and writes ", need, " bytes, more than the device's ", o.capacity,
         "; whole-tensor management needs at least that");
  const NextUses next(trace);
  std::vector<char> resident(T, 0), dirty(T, 0), populated(T, 0);
  std::vector<double> ready(T, 0);
  for (std::size_t t = 0; t < T; ++t) populated[t] = trace.tensors[t].from_host;
  std::vector<int> on_device;
  std::size_t used = 0;
  double now = 0, h2d_free = 0, d2h_free = 0;
  PagingResult r;
  r.policy = "next use (whole tensors, prefetch and eviction coordinated)";
  auto evict = [&](int v) {  // returns when its room is free
    double free_at = 0;
    if (dirty[std::size_t(v)]) {
      const double start = std::max({now, d2h_free, ready[std::size_t(v)]});
      d2h_free = start + o.d2h.seconds(trace.tensors[std::size_t(v)].bytes) * 1e3;
      r.bytes_out += trace.tensors[std::size_t(v)].bytes;
      dirty[std::size_t(v)] = 0;
      free_at = d2h_free;
    }
    resident[std::size_t(v)] = 0;
    used -= trace.tensors[std::size_t(v)].bytes;
    on_device.erase(std::find(on_device.begin(), on_device.end(), v));
    return free_at;
  };
  // Room for `bytes`, evicting the resident tensors used furthest ahead,
  // none of `keep` and none used before `before` (an op index); returns
  // when the room is free, or -1 (and evicts nothing) where there is none.
  auto make_room = [&](std::size_t bytes, std::size_t i, const std::vector<int>& keep, std::size_t before) -> double {
    const auto victims = next.victims(on_device, used, bytes, o.capacity, i, keep, before);
    if (!victims) return -1;
    double free_at = 0;
    for (int v : *victims) free_at = std::max(free_at, evict(v));
    return free_at;
  };
  auto place = [&](int t, double room_at, bool wait) {
    resident[std::size_t(t)] = 1;
    used += trace.tensors[std::size_t(t)].bytes;
    on_device.push_back(t);
    if (!populated[std::size_t(t)]) {
      populated[std::size_t(t)] = 1;
      ready[std::size_t(t)] = room_at;
      if (wait) now = std::max(now, room_at);
      return;
    }
    const double start = std::max({now, h2d_free, room_at});
    h2d_free = start + o.h2d.seconds(trace.tensors[std::size_t(t)].bytes) * 1e3;
    r.bytes_in += trace.tensors[std::size_t(t)].bytes;
    ready[std::size_t(t)] = h2d_free;
    if (wait) now = h2d_free;
  };
  for (std::size_t i = 0; i < N; ++i) {
    const TraceOp& op = trace.ops[i];
    std::vector<int> here;
    for (const auto* list : {&op.reads, &op.writes})
      for (int t : *list)
        if (std::find(here.begin(), here.end(), t) == here.end()) here.push_back(t);
    for (int t : here) {
      if (resident[std::size_t(t)]) continue;
      r.faults += populated[std::size_t(t)];  // a made tensor's room is an allocation, not a fault
      const double room_at = make_room(trace.tensors[std::size_t(t)].bytes, i, here, i);
      place(t, std::max(room_at, 0.0), true);
    }
    for (int t : here) now = std::max(now, ready[std::size_t(t)]);
    // Prefetch what the rest of this step reads, in the order it is needed,
    // until the first tensor there is no room for.
    bool room = true;
    for (std::size_t j = i + 1; room && j < N && trace.ops[j].step == op.step; ++j)
      for (int t : trace.ops[j].reads) {
        if (resident[std::size_t(t)] || !populated[std::size_t(t)]) continue;
        const double room_at = make_room(trace.tensors[std::size_t(t)].bytes, i, here, j);
        if (room_at < 0) {
          room = false;
          break;
        }
        place(t, room_at, false);
      }
    now += op.ms;
    r.compute_ms += op.ms;
    for (int t : op.writes) dirty[std::size_t(t)] = 1;
    for (int t : op.dies) {
      if (resident[std::size_t(t)]) {
        dirty[std::size_t(t)] = 0;
        evict(t);
      }
      populated[std::size_t(t)] = 0;
    }
  }
  r.ms = std::max({now, h2d_free, d2h_free});
  return r;
}

}  // namespace frugal::plan
