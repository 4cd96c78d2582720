#pragma once
// Runs a Plan on a Backend: one arena allocated up front, every kernel bound
// and every operand address resolved before the first step, so a step itself
// allocates nothing.
#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <chrono>
#include <cstdio>

#include "../plan/cost_model.hpp"
#include "../ops/collective.hpp"
#include "../plan/plan.hpp"
#include "arena.hpp"
#include "backend.hpp"
#include "comm_engine.hpp"
#include "copy_engine.hpp"
#include "host_pool.hpp"
#include "nvme_homes.hpp"
#include "nvme_store.hpp"
#include "undo_journal.hpp"

namespace frugal {

// How many times the host-resident storage at an address (a parameter's or
// an optimizer state's home) has been written by a step or declared changed:
// an early fetch from it is still good while the count is what it was when
// the fetch was issued. One counter per address, shared by every executor
// that reads or writes it, so a step that does not touch a tensor never
// invalidates another's fetch of it.
class WriteGenerations {
 public:
  using Counter = std::atomic<std::uint64_t>;
  static std::shared_ptr<Counter> of(const void* storage) {
    static std::mutex lock;  // executors are built from several threads
    static std::map<const void*, std::weak_ptr<Counter>> known;
    static std::size_t sweep_at = 64;
    std::lock_guard<std::mutex> hold(lock);
    std::shared_ptr<Counter> c = known[storage].lock();
    if (c) return c;
    if (known.size() >= sweep_at) {  // drop the counters of storage no executor uses now
      std::erase_if(known, [](const auto& e) { return e.second.expired(); });
      sweep_at = std::max<std::size_t>(64, 2 * known.size());
    }
    c = std::make_shared<Counter>(0);
    known[storage] = c;
    return c;
  }
};

class Executor {
 public:
  // What an executor runs in: the device arena (with the canary beyond it),
  // the host pool and the NVMe store, each reserved once.
  struct Memory {
    Arena arena;  // the plan's arena, the canary, then the device copies of persistents (mirror_bytes)
    std::size_t mirror_bytes = 0;
    HostPool host{0};
    std::unique_ptr<NvmeStore> nvme;
  };

  // Reserves the memory `plan` needs and binds it. `nvme_dir` holds the NVMe
  // tier's file when the plan spills there. If binding fails, what was
  // reserved is given back (Memory owns it).
  Executor(std::shared_ptr<const Graph> graph, const Plan& plan, Backend& backend, const std::string& nvme_dir = "")
      : graph_(std::move(graph)), backend_(backend) {
    if (plan.nvme_bytes && !backend_.host_addressable())
      fail<BudgetError>("backend '", backend_.name(), "': this plan spills ", format_bytes(plan.nvme_bytes),
                        " to NVMe, which this backend does not support yet (the NVMe tier would hand device "
                        "memory to file I/O); give the step more device or host memory (Budget::host) instead");
    memory_.host = HostPool(plan.host_bytes, &backend_);  // pinned where the backend pins
    if (plan.nvme_bytes) {
      if (nvme_dir.empty())
        fail("the plan spills ", format_bytes(plan.nvme_bytes), " to NVMe but no directory was given (Budget::nvme_dir)");
      memory_.nvme = std::make_unique<NvmeStore>(nvme_dir, plan.nvme_bytes);
    }
    memory_.mirror_bytes = mirror_layout(plan).second;
    memory_.arena = Arena(backend_, plan.arena_bytes + kCanaryBytes + memory_.mirror_bytes);
    bind(plan, memory_);
  }
  // Runs `plan` (a re-plan) in the memory `previous` reserved, which must
  // hold it (fits()): nothing is allocated. `previous` gives its memory up
  // only once this one is bound, so if binding throws it keeps it and can
  // still run; after success it must not run again.
  Executor(std::shared_ptr<const Graph> graph, const Plan& plan, Executor& previous)
      : graph_(std::move(graph)), backend_(previous.backend_) {
    if (!previous.fits(plan))
      fail("internal error: a re-plan that needs more memory than the step reserved was handed its memory");
    previous.forget_prefetch();  // binding fills the arena, over what its last run fetched early
    previous.sync_to_host();     // the NVMe homes' slots may be another plan's now
    bind(plan, previous.memory_);
    memory_ = std::move(previous.memory_);  // the addresses bound above stay valid: a move keeps the blocks
  }
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;
  // The tensors whose home is this step's NVMe file get their bytes back:
  // the file goes with the step.
  ~Executor() {
    if (torn_)
      std::fprintf(stderr, "frugal: %s\n", torn_message().c_str());  // their tensors keep no bytes: load a checkpoint
    else try {
      sync_to_host();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "frugal: reading the NVMe homes back into their tensors failed: %s\n", e.what());
    }
    for (const Home& h : homes_) NvmeHomes::registry().drop(h.host, this);
  }

  // Parameters and optimizer state whose home is the NVMe file (the plan's
  // nvme_home_of): their bytes back in their tensors, for a program that
  // reads them between steps. The next run takes them again.
  void sync_to_host() {
    for (const Home& h : homes_) NvmeHomes::registry().bring_back(h.host);
  }

  // Whether `plan` runs in the memory this executor reserved.
  bool fits(const Plan& plan) const {
    const std::size_t mirrors = mirror_layout(plan).second;
    return memory_.arena && mirrors <= memory_.mirror_bytes &&
           plan.arena_bytes + kCanaryBytes + memory_.mirror_bytes <= memory_.arena.bytes() &&
           plan.host_bytes <= memory_.host.bytes() &&
           (plan.nvme_bytes == 0 || (memory_.nvme && plan.nvme_bytes <= memory_.nvme->bytes()));
  }

  // `times`, when given, receives each node's wall time (the backend
  // synchronised after each, so the time is the op's own).
  void run(std::uint64_t step = 0, plan::OpTimeRecorder* times = nullptr) {
    if (torn_) fail(torn_message());
    wrote_in_place_ = false;
    if (copies_) copies_->reset_error();
    if (comms_) comms_->reset_error();
    // This step's early fetches were issued by its last run, and each still
    // holds what it copied only if nothing wrote its source since: another
    // step (an evaluation step, a second model sharing weights) may have
    // written the host-resident parameter it was fetched from.
    const bool fetched = prefetched_;
    prefetched_ = false;
    bring_back_others();
    take_homes();
    load_mirrors(false);
    journal_.begin();
    try {
      for (std::size_t i = 0; i < bound_.size(); ++i) {
        const Bound& b = bound_[i];
        auto t0 = times ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
        journal_.before(i, backend_);
        if (b.comm != Bound::Comm::none) run_collective(b, step);
        else if (b.kernel) (*b.kernel)(*b.op, KernelArgs{b.in, b.out, step, b.workspace, b.workspace_bytes});
        else if (!(fetched && early_[i] && still_fetched(i))) transfer(b.move);
        for (WriteGenerations::Counter* c : b.writes) c->fetch_add(1, std::memory_order_acq_rel);
        if (times) {
          backend_.synchronize();
          times->record(b.node, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        }
        for (std::size_t f : early_at_[i]) {  // the next step's, beside this one's tail
          if (bound_[f].source) fetched_at_[f] = bound_[f].source->load(std::memory_order_acquire);
          transfer(bound_[f].move);
        }
      }
    } catch (...) {
      try {
        if (copies_) copies_->drain();  // nothing may still be copying into memory the caller reuses
      } catch (...) {
      }
      try {
        if (comms_) comms_->drain();  // nor communicating into it
      } catch (...) {
      }
      torn_ = wrote_in_place_;  // an update written back in place cannot be undone
      journal_.undo(backend_);  // the persistents as they were before this step
      written_changed();        // a write may have been cut short
      for (Mirror& m : mirrors_) m.loaded = kStale;  // the tensors still hold the state before the step
      throw;
    }
    if (copies_) copies_->drain();
    backend_.synchronize();
    store_mirrors();
    if (home_slots_ == 2)
      for (Home& h : homes_) h.current ^= std::uint8_t(h.written);  // the slot this step wrote holds the state now
    prefetched_ = !early_fetch_count_zero();
  }

  // The next step fetches everything itself: after anything outside a step
  // wrote the arena (an audit).
  void forget_prefetch() { prefetched_ = false; }
  // After the host-resident parameters and optimizer state this step reads
  // were written outside any step (a loaded checkpoint, edited weights):
  // this step, and every other that fetched them early, fetches them again.
  void storage_changed() {
    prefetched_ = false;
    for (auto& c : persistent_) c.second->fetch_add(1, std::memory_order_acq_rel);
  }
  // Host bytes kept to undo a step that fails part way (UndoJournal): zero
  // unless the plan reads or writes NVMe after its first update.
  std::size_t journal_bytes() const { return journal_.bytes(); }
  // Fetches into the arena performed so far (early ones included): what a
  // still-valid early fetch saves.
  std::uint64_t fetches() const { return fetches_; }
  // Collectives run beside compute: seconds communicating, and seconds the
  // step waited for them ({0, 0} where they run in place).
  std::pair<double, double> communication_seconds() const {
    return comms_ ? std::pair{comms_->busy_seconds(), comms_->waited_seconds()} : std::pair{0.0, 0.0};
  }

  void* address(ValueId v) const { return address_.at(std::size_t(v)); }
  std::size_t arena_bytes() const { return arena_bytes_; }

  // Beyond the arena lies a canary region: a step must never touch it.
  static constexpr std::size_t kCanaryBytes = 4096;
  static constexpr unsigned char kWatermark = 0xA5;

  // For audits: fill the arena and the canary with one byte value...
  void fill(unsigned char pattern) {
    prefetched_ = false;
    if (!mirrors_.empty()) backend_.synchronize();  // a step's kernels may still be running
    filled_with_ = pattern;
    backend_.fill(arena_, pattern, arena_bytes_ + kCanaryBytes);
  }
  // ...and, after a step, find one past the highest byte that differs from
  // it: the high-water mark of what the step actually wrote. Scans down from
  // the top through a small host window, so an audit costs no arena-sized copy.
  // One past the highest arena byte any step has written since the arena was
  // last filled: the measured device high-water mark. (A value whose top
  // bytes equal the fill byte would hide them; audit() uses two patterns for
  // an exact answer, this reading is for progress reports.)
  std::size_t high_water() const { return touched_up_to(filled_with_); }
  std::size_t touched_up_to(unsigned char pattern) const {
    unsigned char window[1 << 16];
    std::size_t end = arena_bytes_ + kCanaryBytes;
    while (end > 0) {
      std::size_t begin = end > sizeof window ? end - sizeof window : 0;
      backend_.copy_to_host(window, arena_ + begin, end - begin);
      for (std::size_t i = end - begin; i > 0; --i)
        if (window[i - 1] != pattern) return begin + i;
      end = begin;
    }
    return 0;
  }

 private:
  // Resolves every operand address into `m` and binds every kernel.
  void bind(const Plan& plan, Memory& m) {
    // Scratch space and in-place reuse were planned from one backend's
    // kernels; another backend's kernels may need different ones.
    if (graph_->kernel_queries().backend != backend_.name())
      fail("internal error: this graph was captured for backend '", graph_->kernel_queries().backend,
           "' but is run on '", backend_.name(), "'; capture it through compile() with that backend");
    if (plan.transfer_slots > 0)
      copies_.emplace(std::size_t(plan.transfer_slots), &backend_);  // a copy thread only if it has work
    // A communication thread only if a collective runs beside compute; then
    // every collective of the step runs there, in schedule order.
    std::size_t collectives = 0;
    bool overlapped = false;
    for (NodeId n : plan.schedule) {
      const Op& op = *graph_->node(n).op;
      collectives += op.is_collective();
      overlapped = overlapped || dynamic_cast<const ops::CollectiveStart*>(&op);
    }
    comms_.reset();
    if (overlapped) comms_.emplace(collectives);
    std::map<NodeId, std::size_t> comm_slot_of;  // a start's node -> its slot
    arena_ = m.arena.data();
    arena_bytes_ = plan.arena_bytes;
    nvme_ = m.nvme.get();
    home_slots_ = plan.nvme_home_slots;
    fill(kWatermark);  // so high_water() can tell what the steps have written
    address_.assign(graph_->num_values(), nullptr);
    mirrors_.clear();
    std::byte* mirror_base = m.arena.data() + (m.arena.bytes() - m.mirror_bytes);
    for (auto [v, offset] : mirror_layout(plan).first) {
      const Value& val = graph_->value(v);
      address_[std::size_t(v)] = mirror_base + offset;
      mirrors_.push_back({mirror_base + offset, val.external.raw(), val.meta.nbytes(), nullptr, kStale, false});
    }
    for (ValueId v = 0; v < ValueId(graph_->num_values()); ++v) {
      const Value& val = graph_->value(v);
      if (plan.offset_of[std::size_t(v)])
        address_[std::size_t(v)] = arena_ + *plan.offset_of[std::size_t(v)];
      else if (address_[std::size_t(v)])
        continue;  // a device copy of a persistent
      else if (val.external.defined())
        address_[std::size_t(v)] = val.external.raw();
      else if (val.kind == ValueKind::host)
        address_[std::size_t(v)] = m.host.at(*plan.tier_offset_of[std::size_t(v)]);
    }
    // The persistents whose home is the NVMe file, and the others this step
    // binds (another step may hold one of those in its file).
    homes_.clear();
    home_of_.assign(graph_->num_values(), -1);
    externals_.clear();
    for (ValueId v = 0; v < ValueId(graph_->num_values()); ++v) {
      const Value& val = graph_->value(v);
      if (!is_persistent(val.kind) || !val.external.defined()) continue;
      if (std::size_t(v) >= plan.nvme_home_of.size() || !plan.nvme_home_of[std::size_t(v)]) {
        externals_.push_back(val.external.raw());
        continue;
      }
      if (!nvme_) fail("internal error: ", plan::describe_value(*graph_, v), " lives on NVMe in a plan with no NVMe file");
      home_of_[std::size_t(v)] = int(homes_.size());
      homes_.push_back({val.external.raw(), val.meta.nbytes(), *plan.nvme_home_of[std::size_t(v)],
                        align_up(std::max<std::size_t>(val.meta.nbytes(), 1), plan::kTierAlignment)});
    }
    for (NodeId n : plan.schedule) {
      const Node& node = graph_->node(n);
      if (auto* t = node.op->as_transfer()) {
        bound_.push_back(bind_transfer(*t, node, plan));
        bound_.back().node = n;
        continue;
      }
      Bound b{node.op.get(), &backend_.kernel_for(*node.op), {}, {}, nullptr, 0};
      b.node = n;
      for (ValueId i : node.inputs) b.in.push_back(ref(i));
      for (ValueId o : node.results()) b.out.push_back(ref(o));
      if (node.has_workspace) {
        ValueId w = node.outputs.back();
        b.workspace = ref(w).data;
        b.workspace_bytes = graph_->value(w).meta.nbytes();
      }
      if (comms_) {
        if (dynamic_cast<const ops::CollectiveDone*>(node.op.get())) {
          auto it = comm_slot_of.find(graph_->value(node.inputs[0]).producer);
          if (it == comm_slot_of.end()) fail("internal error: ", node.op->name(), " waits for a collective never started");
          b.comm = Bound::Comm::done;
          b.comm_slot = it->second;
        } else if (node.op->is_collective()) {
          const bool started = dynamic_cast<const ops::CollectiveStart*>(node.op.get()) != nullptr;
          b.comm = started ? Bound::Comm::start : Bound::Comm::now;
          b.comm_slot = comm_slot_of.size();
          comm_slot_of[n] = b.comm_slot;
        }
      }
      bound_.push_back(std::move(b));
    }
    // Write generations: each write into host-resident storage (a write-back
    // home, an update in place) counts once its node has run; a fetch from
    // it remembers the count it copied.
    for (ValueId v = 0; v < ValueId(graph_->num_values()); ++v) {
      const Value& val = graph_->value(v);
      if (is_persistent(val.kind) && val.external.defined() &&
          !plan.offset_of[std::size_t(v)] && home_of_[std::size_t(v)] < 0)
        persistent_.emplace(val.external.raw(), WriteGenerations::of(val.external.raw()));
    }
    auto generation = [&](ValueId v) -> WriteGenerations::Counter* {
      // By the user's tensor, also where the kernels use a device copy of it.
      const Value& val = graph_->value(v);
      const void* storage = val.external.defined() && !plan.offset_of[std::size_t(v)] ? val.external.raw()
                                                                                      : address_[std::size_t(v)];
      auto it = persistent_.find(storage);
      return it == persistent_.end() ? nullptr : it->second.get();
    };
    for (Bound& b : bound_) {
      const Node& node = graph_->node(b.node);
      for (int k : node.op->mutated_inputs())
        if (auto* c = generation(node.inputs[std::size_t(k)]))
          if (std::find(b.writes.begin(), b.writes.end(), c) == b.writes.end()) b.writes.push_back(c);
      if (b.move.kind == ops::TransferKind::fetch_start && !b.kernel) b.source = generation(node.inputs[0]);
      // a write back counts when its copy is done
      if (b.move.kind == ops::TransferKind::write_back_start && !b.kernel) b.writes.clear();
    }
    for (Mirror& mi : mirrors_) {  // a constant has no count yet: nothing writes it but the user
      auto& c = persistent_[mi.host];
      if (!c) c = WriteGenerations::of(mi.host);
      mi.generation = c.get();
    }
    for (const Bound& b : bound_) {
      if (b.kernel) {
        for (int k : b.op->mutated_inputs())
          for (Mirror& mi : mirrors_)
            if (mi.device == b.in[std::size_t(k)].data) mi.written = true;
      } else if (b.move.dst) {  // a write back into a home the kernels also use
        for (Mirror& mi : mirrors_)
          if (mi.device == b.move.dst) mi.written = true;
      }
    }
    load_mirrors(true);
    plan_journal();
    fetched_at_.assign(bound_.size(), 0);
    // Fetches for the next step, issued after a position of this one.
    early_at_.assign(bound_.size(), {});
    early_.assign(bound_.size(), 0);
    for (auto& e : plan.early_fetches) {
      early_at_[std::size_t(e.after)].push_back(std::size_t(e.fetch));
      early_[std::size_t(e.fetch)] = 1;
    }
  }

  // A transfer, resolved: what the copy engine does at a start, or which
  // slot a done waits for.
  struct Move {
    ops::TransferKind kind = ops::TransferKind::evict_start;
    std::size_t slot = 0;
    void* dst = nullptr;
    const void* src = nullptr;
    std::size_t bytes = 0;
    std::uint64_t nvme_offset = 0;
    bool to_device = false;  // a fetch: host -> arena
    enum Via : std::uint8_t { memory, nvme_write, nvme_read } via = memory;
    int home = -1;  // an NVMe home's index (homes_): its slot is chosen when the copy starts
  };
  struct Bound {
    const Op* op;
    const Kernel* kernel;  // null for a transfer
    std::vector<TensorRef> in, out;
    void* workspace;
    std::size_t workspace_bytes;
    Move move{};
    NodeId node = -1;
    // A collective on the communication thread: started there and waited
    // at its done, or run there at once.
    enum class Comm : std::uint8_t { none, start, done, now } comm = Comm::none;
    std::size_t comm_slot = 0;
    std::vector<WriteGenerations::Counter*> writes;  // host-resident storage written once this has run
    WriteGenerations::Counter* source = nullptr;     // a fetch's host-resident source, if shared
  };

  Bound bind_transfer(const TransferOp& t, const Node& node, const Plan& plan) {
    Bound b{&t, nullptr, {}, {}, nullptr, 0};
    Move& m = b.move;
    m.kind = t.kind();
    m.slot = std::size_t(t.slot());
    if (!t.is_start()) return b;
    using K = ops::TransferKind;
    ValueId from = node.inputs[0];
    ValueId to = t.kind() == K::write_back_start ? node.inputs[1] : node.outputs[0];
    m.bytes = graph_->value(from).meta.nbytes();
    auto nvme_slot = [&](ValueId v) {
      if (!nvme_) fail("internal error: a transfer uses the NVMe tier, which this plan did not size");
      return std::uint64_t(*plan.tier_offset_of[std::size_t(v)]);
    };
    if (t.kind() == K::write_back_start && home_of_[std::size_t(to)] >= 0) {  // into its NVMe home
      m.via = Move::nvme_write;
      m.home = home_of_[std::size_t(to)];
      homes_[std::size_t(m.home)].written = true;
      m.src = address_[std::size_t(from)];
    } else if (t.kind() == K::fetch_start && home_of_[std::size_t(from)] >= 0) {  // from its NVMe home
      m.via = Move::nvme_read;
      m.home = home_of_[std::size_t(from)];
      m.dst = address_[std::size_t(to)];
    } else if (graph_->value(to).kind == ValueKind::nvme) {
      m.via = Move::nvme_write;
      m.nvme_offset = nvme_slot(to);
      m.src = address_[std::size_t(from)];
    } else if (graph_->value(from).kind == ValueKind::nvme) {
      m.via = Move::nvme_read;
      m.nvme_offset = nvme_slot(from);
      m.dst = address_[std::size_t(to)];
    } else {
      m.src = address_[std::size_t(from)];
      m.dst = address_[std::size_t(to)];
      m.to_device = t.kind() == K::fetch_start;
    }
    if ((m.via != Move::nvme_read && !m.src) || (m.via != Move::nvme_write && !m.dst))
      fail("internal error: ", t.name(), " of ", t.what(), " has no storage at one end");
    return b;
  }

  void transfer(const Move& m) {
    fetches_ += m.kind == ops::TransferKind::fetch_start;
    switch (m.via) {
      case Move::memory:
        if (m.kind == ops::TransferKind::evict_start || m.kind == ops::TransferKind::fetch_start ||
            m.kind == ops::TransferKind::write_back_start)
          copies_->copy(m.slot, m.dst, m.src, m.bytes, m.to_device);
        else
          copies_->wait(m.slot);
        return;
      case Move::nvme_write:
        wrote_in_place_ = wrote_in_place_ || (m.home >= 0 && home_slots_ == 1);
        return copies_->write_nvme(m.slot, *nvme_, nvme_offset(m), m.src, m.bytes);
      case Move::nvme_read: return copies_->read_nvme(m.slot, *nvme_, nvme_offset(m), m.dst, m.bytes);
    }
  }
  // A home is read from its current slot and written back into the other,
  // or, with one slot, into the one it was read from.
  std::uint64_t nvme_offset(const Move& m) const {
    if (m.home < 0) return m.nvme_offset;
    const Home& h = homes_[std::size_t(m.home)];
    const unsigned slot = home_slots_ == 1 || m.via == Move::nvme_read ? h.current : 1u - h.current;
    return h.offset + slot * h.slot_bytes;
  }

  // Before a run: the persistents this step binds that another step holds
  // in its NVMe file come back into their tensors; and this step's homes
  // take what their tensors hold where a tensor holds its bytes (the first
  // run, or after they were brought back for a checkpoint or another step,
  // which may have changed them), giving the tensor's pages back.
  void bring_back_others() {
    if (NvmeHomes::registry().held() == 0) return;
    for (const void* e : externals_) NvmeHomes::registry().bring_back(e, this);
  }
  void take_homes() {
    for (std::size_t i = 0; i < homes_.size(); ++i) {
      Home& h = homes_[i];
      NvmeHomes::registry().bring_back(h.host, this);  // from another step's file first
      if (!h.in_host) continue;
      nvme_->write(h.offset + h.current * h.slot_bytes, h.host, h.bytes);
      NvmeHomes::release_pages(h.host, h.bytes);
      h.in_host = false;
      NvmeHomes::registry().hold(h.host, this, [this, i] {
        if (torn_) fail(torn_message());
        Home& back = homes_[i];
        nvme_->read(back.offset + back.current * back.slot_bytes, back.host, back.bytes);
        back.in_host = true;
      });
    }
  }
  void run_collective(const Bound& b, std::uint64_t step) {
    if (b.comm == Bound::Comm::done) return comms_->wait(b.comm_slot);
    // The kernel reads what compute wrote before it (a GPU's stream).
    backend_.synchronize();
    comms_->start(b.comm_slot, *b.kernel, *b.op, KernelArgs{b.in, b.out, step, b.workspace, b.workspace_bytes});
    if (b.comm == Bound::Comm::now) comms_->wait(b.comm_slot);
  }
  TensorRef ref(ValueId v) const {
    const Value& val = graph_->value(v);
    if (!address_[std::size_t(v)]) fail("internal: value ", v, " (", val.meta.str(), ") has no storage in the plan");
    return {address_[std::size_t(v)], val.meta.dtype, &val.meta.shape};
  }

  std::shared_ptr<const Graph> graph_;
  Backend& backend_;
  Memory memory_;
  unsigned char filled_with_ = kWatermark;
  std::optional<CopyEngine> copies_;  // after memory_: destroyed first, so no copy outlives what it copies into
  std::optional<CommEngine> comms_;   // likewise
  NvmeStore* nvme_ = nullptr;         // memory_.nvme's
  std::byte* arena_ = nullptr;        // memory_.arena's: the plan's arena_bytes_, then the canary
  std::size_t arena_bytes_ = 0;
  std::vector<void*> address_;
  std::vector<Bound> bound_;
  std::vector<std::vector<std::size_t>> early_at_;  // by position: early fetches issued after it
  std::vector<char> early_;                         // by position: an early fetch
  bool prefetched_ = false;
  // Homes of one slot (NvmeHomeOptions::slots): a run that failed after it
  // started writing one back left the state part updated, and nothing may
  // run or read it since.
  int home_slots_ = 2;
  bool wrote_in_place_ = false;
  bool torn_ = false;
  static std::string torn_message() {
    return "a step failed after writing parameters or optimizer state back in place on NVMe "
           "(PlanOptions::nvme_offload.slots = 1): they are part updated, so this step neither runs again nor hands "
           "them back. Compile the step again and load the last checkpoint (io::load_checkpoint); with 2 slots (the "
           "default) a step that fails leaves the state it started from";
  }
  std::vector<std::uint64_t> fetched_at_;  // by position: its source's generation when fetched early
  // The write generations of the host-resident parameters and state the
  // step reads or writes, by address.
  std::map<const void*, std::shared_ptr<WriteGenerations::Counter>> persistent_;
  std::uint64_t fetches_ = 0;
  UndoJournal journal_;
  // The device copies of persistents (mirror_layout), on a backend that is
  // not host_addressable; empty on the CPU.
  static constexpr std::uint64_t kStale = ~std::uint64_t(0);
  struct Mirror {
    void* device;
    const void* host;  // the user's tensor
    std::size_t bytes;
    WriteGenerations::Counter* generation;  // the tensor's write count...
    std::uint64_t loaded;                   // ...when the device copy was loaded or stored
    bool written;                           // a kernel of the step writes it
  };
  std::vector<Mirror> mirrors_;

  // Persistents whose home is the NVMe file (plan/nvme_home.hpp): two slots
  // each, `current` the one holding the state; a run reads it and writes
  // back into the other, which becomes current once the run has succeeded,
  // so a run that fails part way leaves the state it started from. With one
  // slot (home_slots_) the write back goes where the read came from.
  struct Home {
    void* host;  // the user's tensor: its bytes only while in_host
    std::size_t bytes;
    std::uint64_t offset;      // the first slot's; the second follows
    std::uint64_t slot_bytes;  // aligned for O_DIRECT
    std::uint8_t current = 0;
    bool written = false;  // the step writes it back
    bool in_host = true;   // the tensor holds the bytes (the file's slot may be stale)
  };
  std::vector<Home> homes_;
  std::vector<int> home_of_;             // by value id: index in homes_, or -1
  std::vector<const void*> externals_;   // the other persistents' storage

  // What a failed step must put back: the persistents written in place, and
  // the homes written back to, before the step's last NVMe transfer (an I/O
  // error is the failure a correct plan can still meet part way).
  void plan_journal() {
    journal_ = UndoJournal{};
    std::vector<char> slot_is_nvme(64, 0);
    std::size_t last_fallible = 0;
    bool any = false;
    for (std::size_t i = 0; i < bound_.size(); ++i) {
      const Bound& b = bound_[i];
      if (b.kernel) continue;
      if (b.move.slot >= slot_is_nvme.size()) slot_is_nvme.resize(b.move.slot + 1, 0);
      const bool start = b.op->as_transfer()->is_start();
      if (start) slot_is_nvme[b.move.slot] = b.move.via != Move::memory;
      if (slot_is_nvme[b.move.slot]) last_fallible = i, any = true;
    }
    if (!any) return;
    for (std::size_t i = 0; i < last_fallible; ++i) {
      const Bound& b = bound_[i];
      const Node& node = graph_->node(b.node);
      if (b.kernel) {
        for (int k : node.op->mutated_inputs()) {
          const ValueId v = node.inputs[std::size_t(k)];
          if (is_persistent(graph_->value(v).kind))  // written where it lives (an arena copy goes home by a write back)
            journal_.add(i, address_[std::size_t(v)], graph_->value(v).meta.nbytes(), UndoJournal::Where::device);
        }
      } else if (b.move.kind == ops::TransferKind::write_back_start && b.move.via == Move::memory) {
        journal_.add(i, b.move.dst, b.move.bytes, UndoJournal::Where::host);
      }
    }
    journal_.reserve();
  }

  // Device copies of the persistents the plan keeps on the device, for a
  // backend whose kernels cannot use host memory (Backend::host_addressable):
  // a persistent that a kernel reads or writes and that the plan left outside
  // the arena (a parameter, an optimizer state, a constant). Each gets an
  // aligned slot after the canary, in the one block the step reserves; the
  // plan counts their bytes as persistent_bytes (the slots' alignment adds
  // under 256 bytes each). Returns the slots and their total.
  std::pair<std::vector<std::pair<ValueId, std::size_t>>, std::size_t> mirror_layout(const Plan& plan) const {
    std::vector<std::pair<ValueId, std::size_t>> slots;
    std::size_t total = 0;
    if (backend_.host_addressable()) return {slots, total};
    std::vector<char> used(graph_->num_values(), 0);
    for (NodeId n : plan.schedule) {
      const Node& node = graph_->node(n);
      if (node.op->as_transfer()) continue;
      for (ValueId v : node.inputs) used[std::size_t(v)] = 1;
      for (ValueId v : node.outputs) used[std::size_t(v)] = 1;
    }
    for (ValueId v = 0; v < ValueId(graph_->num_values()); ++v) {
      const Value& val = graph_->value(v);
      if (!used[std::size_t(v)] || !val.external.defined() || plan.offset_of[std::size_t(v)]) continue;
      slots.emplace_back(v, total);
      total += align_up(val.meta.nbytes());
    }
    return {slots, total};
  }

  // Loads the device copies whose tensors were written since they were
  // loaded (by another step, a checkpoint, storage_changed()), or all.
  void load_mirrors(bool all) {
    bool loaded = false;
    for (Mirror& m : mirrors_) {
      const std::uint64_t now = m.generation->load(std::memory_order_acquire);
      if (!all && m.loaded == now) continue;
      backend_.copy_to_device(m.device, m.host, m.bytes);
      m.loaded = now;
      loaded = true;
    }
    if (loaded) backend_.synchronize();
  }
  // After a step: the persistents it wrote go back to the user's tensors,
  // so every other step, a checkpoint and the user read this step's update.
  void store_mirrors() {
    for (Mirror& m : mirrors_)
      if (m.written) backend_.copy_to_host(const_cast<void*>(m.host), m.device, m.bytes);
    for (Mirror& m : mirrors_) m.loaded = m.generation->load(std::memory_order_acquire);
  }

  bool still_fetched(std::size_t i) const {
    const WriteGenerations::Counter* c = bound_[i].source;
    return !c || c->load(std::memory_order_acquire) == fetched_at_[i];
  }
  void written_changed() {
    for (const Bound& b : bound_)
      for (WriteGenerations::Counter* c : b.writes) c->fetch_add(1, std::memory_order_acq_rel);
  }
  bool early_fetch_count_zero() const {
    for (auto& e : early_at_)
      if (!e.empty()) return false;
    return true;
  }
};

}  // namespace frugal
