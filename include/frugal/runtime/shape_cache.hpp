#pragma once
// Steps whose input shapes change from run to run (sequences of varying
// length, graph mini-batches of varying size): one compiled step per
// distinct shape, kept in a cache that shares one device budget through a
// MemoryBroker.
//
// A shape seen for the first time is planned then, from the cost model
// alone (cold start), within the share the broker gives it beside the
// shapes already cached, and refined from measurement: after its first
// timed runs a step whose prediction missed re-plans with the measured op
// times (CompileOptions::replan, on unless turned off), in the arena it
// reserved, where the broker finds the cached steps still fit the budget
// with it (MemoryBroker::replan_fits). Each cached step is the
// static plan of its shape, so a run computes exactly what a step compiled
// for that shape alone computes: they share the parameters and optimizer
// state, which are the user's tensors. When a new shape does not fit beside
// the cached ones at their least, or the cache holds `max_steps`, the least
// recently run shapes leave first; a shape that does not fit alone is
// refused with the bytes it needs.
#include <list>
#include <memory>
#include <optional>
#include <map>
#include <string>
#include <vector>

#include "broker.hpp"

namespace frugal {

class ShapeCache {
 public:
  // The step for inputs of the given shapes (specs: the step function's
  // inputs, with this run's shapes) within `budget`, and what it would plan
  // (compile() and plan_training() with the same arguments, as a
  // MemoryBroker's compiler and planner).
  using Compiler = std::function<Step(const std::vector<InputSpec>&, const Budget&)>;
  using Planner = std::function<PlannedStep(const std::vector<InputSpec>&, const Budget&)>;

  // `specs`: the step's inputs, in order, with their names and element
  // types (their shapes are ignored: each run brings its own).
  ShapeCache(Budget total, std::vector<InputSpec> specs, Compiler compile, Planner plan, std::size_t max_steps = 8)
      : broker_(std::move(total)), specs_(std::move(specs)), compile_(std::move(compile)), plan_(std::move(plan)),
        max_steps_(max_steps) {
    if (max_steps_ == 0) fail("shape cache: max_steps must be at least 1");
    if (!compile_ || !plan_) fail("shape cache: needs both a compiler and a planner");
  }
  ShapeCache(const ShapeCache&) = delete;
  ShapeCache& operator=(const ShapeCache&) = delete;

  // Runs the step for these inputs' shapes, compiling it first if it is not
  // cached; returns the loss (as Step::run).
  float run(const std::vector<Tensor>& inputs) {
    Step& s = step_for(inputs);
    std::vector<const Tensor*> ptrs;
    for (const Tensor& t : inputs) ptrs.push_back(&t);
    return s.run_inputs(ptrs);
  }
  // The cached step for these inputs' shapes (compiled if needed), e.g. to
  // audit it or read its plan. Valid until a later call evicts it.
  Step& step_for(const std::vector<Tensor>& inputs) {
    const std::vector<Shape> shapes = shapes_of(inputs);
    const std::string key = name_of(shapes);
    auto it = cached_.find(key);
    if (it == cached_.end()) {
      it = cached_.emplace(key, admit(shapes, key)).first;
      ++compiled_;
    } else {
      ++hits_;
      recency_.erase(it->second.at);
    }
    recency_.push_front(key);
    it->second.at = recency_.begin();
    return broker_.step(it->second.id);
  }

  // ZeRO stage 3 (with a communicator): the steps train the optimizer's
  // parameter shards, which every cached step shares, and the module's
  // tensors hold the parameters only once gathered
  // (Step::gather_parameters, through the most recently run step). A
  // collective: every rank calls it. Elsewhere a no-op.
  void gather_parameters() {
    if (!recency_.empty()) broker_.step(cached_.at(recency_.front()).id).gather_parameters();
  }

  std::size_t cached() const { return cached_.size(); }
  std::size_t compiled() const { return compiled_; }  // shapes planned (again, after an eviction)
  std::size_t evicted() const { return evicted_; }
  std::size_t hits() const { return hits_; }
  const MemoryBroker& broker() const { return broker_; }

 private:
  struct Entry {
    MemoryBroker::Id id;
    std::list<std::string>::iterator at;  // in recency_
  };

  std::vector<Shape> shapes_of(const std::vector<Tensor>& inputs) const {
    if (inputs.size() != specs_.size())
      fail<ShapeError>("shape cache: the step takes ", specs_.size(), " inputs, got ", inputs.size());
    std::vector<Shape> key;
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      if (inputs[i].dtype() != specs_[i].meta.dtype)
        fail<ShapeError>("shape cache: input ", i, specs_[i].name.empty() ? "" : cat(" (", specs_[i].name, ")"), " is ",
                         dtype_name(inputs[i].dtype()), ", the step takes ", dtype_name(specs_[i].meta.dtype));
      key.push_back(inputs[i].shape());
    }
    return key;
  }
  std::string name_of(const std::vector<Shape>& key) const {
    std::string n = "shapes";
    for (const Shape& s : key) n += " " + s.str();
    return n;
  }
  void evict_oldest() {
    const std::string key = recency_.back();
    recency_.pop_back();
    broker_.leave(cached_.at(key).id);
    cached_.erase(key);
    ++evicted_;
  }
  Entry admit(const std::vector<Shape>& shapes, const std::string& key) {
    std::vector<InputSpec> specs = specs_;
    for (std::size_t i = 0; i < specs.size(); ++i) specs[i].meta.shape = shapes[i];
    while (cached_.size() >= max_steps_) evict_oldest();
    for (;;) {
      try {
        const MemoryBroker::Id id = broker_.join(
            key, [this, specs](const Budget& b) { return compile_(specs, b); },
            [this, specs](const Budget& b) { return plan_(specs, b); });
        return {id, {}};
      } catch (const BudgetError&) {
        if (cached_.empty()) throw;  // it does not fit alone: the broker named the bytes it needs
        evict_oldest();
      }
    }
  }

  MemoryBroker broker_;
  std::vector<InputSpec> specs_;
  Compiler compile_;
  Planner plan_;
  std::size_t max_steps_;
  std::map<std::string, Entry> cached_;  // by the inputs' shapes, spelled out
  std::list<std::string> recency_;       // most recently run first
  std::size_t compiled_ = 0, evicted_ = 0, hits_ = 0;
};

// A ShapeCache of training steps: `fn` over inputs typed like `specs`,
// trained with `opt`, all shapes within `total`.
//
// With a communicator, every shape's step trains at one ZeRO stage: the
// steps share the optimizer's state, whose layout is the stage's, and
// compile holds every step on an optimizer to the stage its first step
// fixed (Optimizer::zero_stage). Left unpinned, that stage is the
// planner's pick for the first shape at the whole budget, picked before
// anything is compiled: the broker plans the first shape at several
// budgets (its probes, then its share) before its step is made, and each
// of those plans must be at the stage the step will train.
template <class Fn>
std::unique_ptr<ShapeCache> cache_shapes(Fn fn, std::vector<InputSpec> specs, Optimizer& opt, Budget total,
                                         CompileOptions o = {}, std::size_t max_steps = 8) {
  auto first_pick = std::make_shared<std::optional<int>>();
  auto options = [fn, &opt, o, total, first_pick](const std::vector<InputSpec>& s) {
    CompileOptions c = o;
    if (!o.communicator || o.zero_stage || opt.zero_stage()) return c;  // pinned, or the optimizer's: compile's rule
    if (!*first_pick) *first_pick = plan_training(fn, s, opt, total, o).plan.zero_stage;
    c.zero_stage = *first_pick;
    return c;
  };
  return std::make_unique<ShapeCache>(
      std::move(total), std::move(specs),
      [fn, &opt, options](const std::vector<InputSpec>& s, const Budget& b) { return compile(fn, s, opt, b, options(s)); },
      [fn, &opt, options](const std::vector<InputSpec>& s, const Budget& b) {
        return plan_training(fn, s, opt, b, options(s));
      },
      max_steps);
}

}  // namespace frugal
