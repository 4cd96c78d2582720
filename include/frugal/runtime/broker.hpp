#pragma once
// A memory broker: one device budget shared by several compiled steps that
// live at once (a training step and its evaluation step, retraining beside
// inference). Each step gets a share, between the least it can be planned
// in and what it needs with nothing evicted; a persistent tensor two steps
// keep on the device (the weights training and evaluation share) is counted
// once. Steps join and leave at run time, and the others are planned again
// within their new shares, so the sum of what is allocated never exceeds the
// budget: a step that cannot fit is refused when it asks to join, with the
// bytes it needs, never by running out of memory later.
//
// The broker owns the steps it plans: broker.step(id) stays the same object
// (its plan may change) until the step leaves. A step planned again keeps
// its step counter and reads the same parameters and optimizer state (they
// are the user's tensors), so its results are bitwise those of the step
// planned alone: only where bytes live changes. A step may also re-plan
// itself on measured op times (CompileOptions::replan), in the arena it
// reserved: the broker takes such a re-plan only if all steps' device bytes
// still add up within the budget with it, since a re-plan can move a weight
// another step counts as shared (replan_fits; Step::replan_declined says
// why one was not taken).
#include <algorithm>
#include <cstddef>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "../plan/offload.hpp"
#include "compile.hpp"
#include "step.hpp"

namespace frugal {

// The persistents (by the storage of their tensor) that `plan` keeps on
// the device, with their bytes: the parameters, optimizer state and
// constants it counts in Plan::persistent_bytes. On the CPU backend that is
// the user's tensor itself, so two steps keeping it there hold it once; on
// a GPU each step has its own device copy (Step::device_copies).
inline std::vector<std::pair<const void*, std::size_t>> device_persistents(const Graph& g, const Plan& plan) {
  const std::vector<char> on_host = plan::persistents_on_host(g, plan.schedule);
  std::vector<std::pair<const void*, std::size_t>> out;
  for (ValueId v = 0; v < ValueId(g.num_values()); ++v) {
    const Value& val = g.value(v);
    if (!is_persistent(val.kind) || on_host[std::size_t(v)]) continue;
    // A persistent with no tensor of the user's is the step's own.
    out.emplace_back(val.external.defined() ? val.external.raw() : static_cast<const void*>(&val), val.meta.nbytes());
  }
  return out;
}

class MemoryBroker {
 public:
  // Plans one step within `budget` (its share), e.g. a lambda calling
  // compile() or compile_inference() with it; and what that would plan,
  // allocating nothing (plan_training(), plan_inference() with the same
  // arguments). Both are called again whenever the step's share changes, and
  // must describe the same step each time.
  using Compiler = std::function<Step(const Budget&)>;
  using Planner = std::function<PlannedStep(const Budget&)>;
  using Id = int;

  // `total.device`: the device bytes all steps together may hold. The host
  // pool (`total.host`) is split evenly between the steps; every step may
  // spill to `total.nvme_dir`.
  explicit MemoryBroker(Budget total) : total_(std::move(total)) {
    if (total_.device == 0)
      fail<BudgetError>("memory broker: a device budget of 0 bytes; give the bytes all its steps may hold together");
  }
  MemoryBroker(const MemoryBroker&) = delete;
  MemoryBroker& operator=(const MemoryBroker&) = delete;

  // Admits a step: finds what it needs, re-shares the budget and plans every
  // step whose share changed. Throws BudgetError, with the device bytes the
  // broker would need (smallest_feasible_bytes), when the step cannot fit
  // beside the others at their least; the others are then as they were.
  Id join(std::string name, Compiler compile, Planner plan) {
    if (!compile || !plan) fail("memory broker: step '", name, "' needs both a compiler and a planner");
    const Id id = next_id_++;
    members_.emplace(id, Member{.name = std::move(name), .compile = std::move(compile), .plan = std::move(plan)});
    order_.push_back(id);
    try {
      probe(id);
      std::map<Id, std::size_t> share;
      if (!find_shares(share)) throw BudgetError(refusal(id), needed_bytes());
      apply(share);
    } catch (...) {
      members_.erase(id);
      order_.pop_back();
      restore();
      throw;
    }
    return id;
  }

  // Releases a step and gives its bytes to the others.
  void leave(Id id) {
    member(id);  // names a step that is not there
    members_.erase(id);
    order_.erase(std::find(order_.begin(), order_.end(), id));
    restore();
  }

  // The step, planned in its share. The same object until it leaves (its
  // plan changes when its share does); run it as any Step.
  Step& step(Id id) { return *member(id).step; }
  const Step& step(Id id) const { return *members_.at(checked(id)).step; }
  std::size_t size() const { return members_.size(); }
  const Budget& budget() const { return total_; }

  // What one step holds and was given.
  struct Share {
    Id id = 0;
    std::string name;
    std::size_t budget = 0;         // the device budget it was planned in
    std::size_t least = 0;          // the least it can be planned in, alone
    std::size_t unconstrained = 0;  // what it needs with nothing evicted
    std::size_t arena = 0;          // its plan's arena
    std::size_t persistents = 0;    // the persistents it keeps on the device
    std::size_t shared = 0;         // of those, bytes a step that joined earlier already keeps there
  };
  std::vector<Share> shares() const {
    std::vector<const Plan*> plans;
    std::vector<const Graph*> graphs;
    std::vector<char> copies;
    for (Id id : order_) {
      const Step& s = *members_.at(id).step;
      plans.push_back(&s.plan());
      graphs.push_back(&s.graph());
      copies.push_back(s.device_copies());
    }
    return shares_of(graphs, plans, copies, /*running=*/true);
  }

  // The device bytes the plans hold together: every arena, and every
  // persistent on the device once, however many steps keep it there.
  std::size_t planned_device_bytes() const { return total_of(shares()); }
  // The same, measured: each arena's high-water mark so far (Step::
  // measured_arena_bytes, over every plan it ran) instead of its size,
  // beside the persistents the steps' plans keep on the device now.
  std::size_t measured_device_bytes() const {
    std::size_t sum = 0;
    for (const Share& s : shares())
      sum += members_.at(s.id).step->measured_arena_bytes() + s.persistents - s.shared;
    return sum;
  }

  // Whether step `id` may run `plan` (a re-plan of it on measured times,
  // in the arena it reserved) beside the others: "" if the device bytes of
  // all steps, each persistent on the device once, stay within the budget
  // with it, else why not. Taken, it is what the broker counts for the step
  // from then on. Steps call it from the threads they run in.
  std::string replan_fits(Id id, const Graph& g, const Plan& plan) {
    std::lock_guard hold(replan_lock_);
    Member& m = member(id);
    auto candidate = device_persistents(g, plan);
    const std::size_t arena = std::max(m.reserved_arena, plan.arena_bytes);
    std::size_t total = 0;
    std::set<const void*> seen;
    for (Id k : order_) {
      const Member& o = members_.at(k);
      total += k == id ? arena : o.reserved_arena;
      for (const auto& [storage, bytes] : k == id ? candidate : o.on_device)
        if (o.copies || seen.insert(storage).second) total += bytes;
    }
    if (total > total_.device)
      return cat("memory broker: step '", m.name, "' kept its plan: its re-plan on measured times would keep other "
                 "parameters or optimizer state on the device, ", format_bytes(total), " for all steps against a "
                 "budget of ", format_bytes(total_.device));
    m.on_device = std::move(candidate);
    return "";
  }

  // One line per step: its share, least, arena and persistents.
  std::string summary() const {
    const std::vector<Share> all = shares();
    std::string out = cat("memory broker: ", format_bytes(total_of(all)), " of ", format_bytes(total_.device),
                          " planned over ", all.size(), " step", all.size() == 1 ? "" : "s", "\n");
    for (const Share& s : all)
      out += cat("  ", s.name, ": share ", format_bytes(s.budget), " (least ", format_bytes(s.least),
                 ", unconstrained ", format_bytes(s.unconstrained), "): arena ", format_bytes(s.arena),
                 ", persistents ", format_bytes(s.persistents),
                 s.shared ? cat(", of which ", format_bytes(s.shared), " an earlier step holds") : std::string(), "\n");
    return out;
  }

 private:
  struct Member {
    std::string name;
    Compiler compile;
    Planner plan;
    std::optional<Step> step;
    std::size_t least = 0, unconstrained = 0;
    std::size_t budget = 0;  // what `step` was planned in
    std::size_t credit = 0;  // persistents assumed kept on the device by an earlier step
    // What re-plans are checked against: the arena its executor reserved,
    // the persistents its plan (or a re-plan taken since) keeps on the
    // device, and whether those are device copies of its own.
    std::size_t reserved_arena = 0;
    std::vector<std::pair<const void*, std::size_t>> on_device;
    bool copies = false;
  };

  Id checked(Id id) const {
    if (!members_.count(id)) fail("memory broker: no step ", id, " (it left, or never joined)");
    return id;
  }
  Member& member(Id id) { return members_.at(checked(id)); }

  Budget budget_for(std::size_t device) const {
    Budget b = total_;
    b.device = device;
    b.host = members_.empty() ? 0 : total_.host / members_.size();
    return b;
  }

  // Shares from plans, in joining order: a persistent counts for the first
  // step that keeps it on the device, and is `shared` in the later ones.
  // A step with device copies of its own shares none.
  // `running`: these are the steps' current plans, whose arenas are the
  // ones their executors reserved (a re-plan runs in it); else plans
  // considered for new shares, each with an arena of its own to come.
  std::vector<Share> shares_of(const std::vector<const Graph*>& graphs, const std::vector<const Plan*>& plans,
                               const std::vector<char>& copies, bool running) const {
    std::vector<Share> out;
    std::set<const void*> seen;
    for (std::size_t k = 0; k < order_.size(); ++k) {
      const Member& m = members_.at(order_[k]);
      // A re-planned step still holds the arena it reserved.
      const std::size_t arena = running ? std::max(plans[k]->arena_bytes, m.reserved_arena) : plans[k]->arena_bytes;
      Share s{.id = order_[k], .name = m.name, .budget = m.budget, .least = m.least,
              .unconstrained = m.unconstrained, .arena = arena};
      for (const auto& [storage, bytes] : device_persistents(*graphs[k], *plans[k])) {
        s.persistents += bytes;
        if (copies[k]) continue;
        if (!seen.insert(storage).second) s.shared += bytes;
      }
      out.push_back(std::move(s));
    }
    return out;
  }
  static std::size_t total_of(const std::vector<Share>& all) {
    std::size_t sum = 0;
    for (const Share& s : all) sum += s.arena + s.persistents - s.shared;
    return sum;
  }

  // The least and the unconstrained bytes of a step, from the planner's
  // refusal of a one-byte budget.
  void probe(Id id) {
    Member& m = member(id);
    try {
      const PlannedStep p = m.plan(budget_for(1));
      m.least = m.unconstrained = p.plan.total_bytes();  // it holds nothing on the device
    } catch (const BudgetError& e) {
      if (e.smallest_feasible_bytes == 0) throw;
      m.least = e.smallest_feasible_bytes;
      m.unconstrained = std::max(e.unconstrained_bytes, m.least);
    }
  }

  // The device bytes the steps need together at their least, less what
  // they are assumed to share.
  std::size_t needed_bytes() const {
    std::size_t need = 0;
    for (Id id : order_) {
      const Member& m = members_.at(id);
      need += m.least - std::min(m.least, m.credit);
    }
    return need;
  }

  std::string refusal(Id id) const {
    const Member& m = members_.at(id);
    std::string others;
    for (Id o : order_)
      if (o != id) others += cat(others.empty() ? "" : ", ", members_.at(o).name, " ", format_bytes(members_.at(o).least));
    const std::size_t need = needed_bytes();
    return cat("memory broker: step '", m.name, "' needs at least ", format_bytes(m.least), " (", m.least,
               " bytes) of device memory alone", m.credit ? cat(", ", format_bytes(m.credit), " of it held by other steps") : std::string(),
               "; ", others.empty() ? std::string("no other step holds any") : cat("the others need ", others, " at their least"),
               "; together ", need, " bytes (", format_bytes(need), ") against the budget of ", total_.device,
               " bytes (", format_bytes(total_.device), "). Raise the budget to at least ", need,
               " bytes, or let a step leave first");
  }

  // Shares for the assumed credits: each step from its least towards its
  // unconstrained bytes, all by the same fraction of the way. False if even
  // the least do not fit.
  bool solve_shares(std::map<Id, std::size_t>& share) const {
    std::size_t least = 0, room = 0;
    for (Id id : order_) {
      const Member& m = members_.at(id);
      least += m.least - std::min(m.least, m.credit);
      room += m.unconstrained - m.least;
    }
    if (least > total_.device) return false;
    const std::size_t spare = total_.device - least;
    const double fraction = room == 0 ? 1.0 : std::min(1.0, double(spare) / double(room));
    std::size_t given = 0;
    for (Id id : order_) {
      const Member& m = members_.at(id);
      // Rounded down, so the shares never add up past the budget.
      std::size_t extra = std::min(std::size_t(double(m.unconstrained - m.least) * fraction), spare - given);
      given += extra;
      share[id] = m.least + extra;
    }
    return true;
  }

  // Shares whose plans hold at most the budget together. Credits start
  // from the steps' plans at their least (what they keep on the device
  // there that an earlier step also keeps) and are then taken from the
  // plans at the shares found, a few rounds: wider shares while the plans
  // share more than assumed, narrower ones where they share less. Shares
  // found with no credit add up to at most the budget, so they always hold.
  // Plans only: nothing is allocated until apply().
  bool find_shares(std::map<Id, std::size_t>& share) {
    // The host pool is split evenly, so each step's least depends on how
    // many there are.
    if (total_.host)
      for (Id id : order_) probe(id);
    std::map<Id, std::size_t> at_least;
    for (Id id : order_) at_least[id] = members_.at(id).least;
    std::map<Id, std::size_t> credit = credits_at(at_least);
    std::optional<std::map<Id, std::size_t>> best;
    std::map<Id, std::size_t> best_credit;
    for (int round = 0; round < 4; ++round) {
      for (Id id : order_) member(id).credit = credit.at(id);
      std::map<Id, std::size_t> trial;
      if (!solve_shares(trial)) {
        if (round == 0) return false;  // not even the least fit, sharing what they can
        break;
      }
      std::vector<Share> planned;
      std::map<Id, std::size_t> actual = credits_at(trial, &planned);
      const bool fits = total_of(planned) <= total_.device;
      bool wider = false;
      for (Id id : order_) {
        wider |= actual.at(id) > credit.at(id);
        if (!fits) actual[id] = std::min(actual.at(id), credit.at(id));
      }
      if (fits) {
        best = std::move(trial);
        best_credit = credit;
        if (!wider) break;
      }
      credit = std::move(actual);
    }
    if (best) {
      for (Id id : order_) member(id).credit = best_credit.at(id);
      share = std::move(*best);
      return true;
    }
    for (Id id : order_) member(id).credit = 0;
    return solve_shares(share);
  }

  // The shared persistents of each step's plan at `shares` (and the shares).
  std::map<Id, std::size_t> credits_at(const std::map<Id, std::size_t>& shares, std::vector<Share>* out = nullptr) {
    std::vector<PlannedStep> planned;
    for (Id id : order_) planned.push_back(members_.at(id).plan(budget_for(shares.at(id))));
    std::vector<const Graph*> graphs;
    std::vector<const Plan*> plans;
    std::vector<char> copies;
    for (const PlannedStep& p : planned) {
      graphs.push_back(p.graph.get());
      plans.push_back(&p.plan);
      copies.push_back(p.device_copies);
    }
    std::vector<Share> all = shares_of(graphs, plans, copies, /*running=*/false);
    std::map<Id, std::size_t> credit;
    for (const Share& s : all) credit[s.id] = s.shared;
    if (out) *out = std::move(all);
    return credit;
  }

  // Plans the steps whose share changed: those that shrink first, so what
  // is allocated never adds up past the budget on the way.
  void apply(const std::map<Id, std::size_t>& share) {
    std::vector<Id> shrink, grow;
    for (Id id : order_) {
      const Member& m = members_.at(id);
      // A step that re-planned on measured times is planned again too: the
      // shares were found with the plan its share gives, whose device
      // persistents the others may count on.
      if (m.step && m.budget == share.at(id) && m.step->replans() == 0) continue;
      (m.step && share.at(id) > m.budget ? grow : shrink).push_back(id);
    }
    for (const auto* list : {&shrink, &grow})
      for (Id id : *list) {
        Member& m = member(id);
        std::int64_t steps = 0;
        const bool first = !m.step;
        if (m.step) {
          steps = m.step->steps_run();
          m.step.reset();  // its memory goes before its new plan's comes
        }
        m.budget = share.at(id);
        m.step.emplace(m.compile(budget_for(m.budget)));
        // A step's first compile can fix what its planner plans from then
        // on: the ZeRO stage of its optimizer (Optimizer::zero_stage), which
        // the probe at its join left to a search over every stage. Probed
        // again, its least is that stage's, so no later share is cut below
        // what its compiler can plan in.
        if (first) probe(id);
        // A step may re-plan itself on measured op times (refined from
        // measurement, CompileOptions::replan) in the arena it reserved; the
        // broker takes the re-plan only if every step's device bytes still
        // add up within the budget with it (replan_fits).
        m.reserved_arena = m.step->plan().arena_bytes;
        m.on_device = device_persistents(m.step->graph(), m.step->plan());
        m.copies = m.step->device_copies();
        m.step->set_replan_check([this, id](const Graph& g, const Plan& p) { return replan_fits(id, g, p); });
        m.step->set_steps_run(steps);
      }
  }

  // After a step left or was refused: the others in shares that fit.
  void restore() {
    if (order_.empty()) return;
    std::map<Id, std::size_t> share;
    if (!find_shares(share)) fail("memory broker: internal error: steps that fitted before no longer fit");
    apply(share);
  }

  Budget total_;
  std::mutex replan_lock_;  // re-plans are checked from the threads steps run in
  std::map<Id, Member> members_;
  std::vector<Id> order_;  // joining order
  Id next_id_ = 1;
};

}  // namespace frugal
