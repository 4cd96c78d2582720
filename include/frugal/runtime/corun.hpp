#pragma once
// Training beside inference on one device budget (Corun): a retraining step
// and as many serving steps as fit beside it, all planned by one
// MemoryBroker, run at once from their own threads.
//
// The serving steps read a model of their own (the deployed weights) while
// the training step updates another (the weights being retrained), so a
// query never sees a half-applied update and training never waits for a
// query. The trained weights reach the served model at publish(): a copy
// under an exclusive lock, taken between serving runs. Every serving step
// reads the same deployed tensors, so the broker counts them once however
// many streams are admitted.
//
// How many streams run is decided from plans, never by running out of
// memory: admit_streams() joins copies of the serving step to the broker
// one at a time until one is refused (the broker's refusal names the bytes
// it would need) or the cap is reached.
#include <condition_variable>
#include <mutex>
#include <string>
#include <vector>

#include "broker.hpp"

namespace frugal {

// What admit_streams() admitted, and why it stopped.
struct StreamAdmission {
  std::vector<MemoryBroker::Id> ids;  // the admitted serving steps, in order
  // When a stream was refused: the device bytes the broker would need for
  // one more, and its message; 0 and empty when the cap stopped admission.
  std::size_t next_needs_bytes = 0;
  std::string refusal;
};

// Joins copies of one serving step (named "<name> 1", "<name> 2", ...) to
// `broker` until `max_streams` are in or the broker refuses one. Steps
// already in the broker (the training step) keep their place: each join
// re-plans the members within the shares it finds, never past the budget.
// A first stream that cannot fit is a BudgetError, as broker.join throws it:
// a corun with no server is not one.
inline StreamAdmission admit_streams(MemoryBroker& broker, const std::string& name,
                                     const MemoryBroker::Compiler& compile, const MemoryBroker::Planner& plan,
                                     int max_streams) {
  if (max_streams < 1) fail("admit_streams: at most ", max_streams, " streams; give 1 or more");
  StreamAdmission out;
  for (int i = 1; i <= max_streams; ++i) {
    try {
      out.ids.push_back(broker.join(cat(name, " ", i), compile, plan));
    } catch (const BudgetError& e) {
      if (out.ids.empty()) throw;
      out.next_needs_bytes = e.smallest_feasible_bytes;
      out.refusal = e.what();
      break;
    }
  }
  return out;
}

// The deployed weights the serving steps read, and the weights being
// retrained that replace them at publish(). The two modules must have the
// same parameters and buffers (names and shapes): two instances of one
// model class (an nn::Module, or anything with named_parameters() and
// named_buffers()).
class ServedWeights {
 public:
  template <class Model>
  ServedWeights(const Model& trained, const Model& served) : from_(pairs(trained)), to_(pairs(served)) {
    if (from_.size() != to_.size())
      fail("ServedWeights: the trained model has ", from_.size(), " parameters and buffers, the served one ",
           to_.size(), "; give two instances of the same model");
    for (std::size_t i = 0; i < from_.size(); ++i) {
      const auto& [fn, ft] = from_[i];
      const auto& [tn, tt] = to_[i];
      if (fn != tn || ft.shape() != tt.shape() || ft.dtype() != tt.dtype())
        fail<ShapeError>("ServedWeights: trained '", fn, "' ", dtype_name(ft.dtype()), ft.shape().str(),
                         " against served '", tn, "' ", dtype_name(tt.dtype()), tt.shape().str(),
                         "; give two instances of the same model");
      if (ft.raw() == tt.raw())
        fail("ServedWeights: '", fn, "' is the same tensor in both models; serve a model of its own, or queries "
             "would read weights the training step is writing");
    }
  }

  // Held around each serving run: queries share the deployed weights. A
  // publish waiting for the readers to finish holds new readers back, so a
  // stream of back-to-back queries cannot starve it (a plain
  // std::shared_mutex prefers readers on glibc, and training would wait
  // forever behind streams that never pause).
  class Reading {
   public:
    explicit Reading(const ServedWeights& w) : w_(&w) {
      std::unique_lock hold(w_->lock_);
      w_->changed_.wait(hold, [&] { return !w_->publishing_; });
      ++w_->readers_;
    }
    Reading(const Reading&) = delete;
    Reading& operator=(const Reading&) = delete;
    ~Reading() { unlock(); }
    void unlock() {
      if (!w_) return;
      std::lock_guard hold(w_->lock_);
      if (--w_->readers_ == 0) w_->changed_.notify_all();
      w_ = nullptr;
    }

   private:
    const ServedWeights* w_;
  };
  Reading reading() const { return Reading(*this); }

  // Copies the trained weights into the served model, once no serving step
  // is running, and tells each serving step its weights changed (a plan
  // that keeps them on the host fetches them again). Call it from the
  // training thread between training runs: the trained weights are then
  // whole.
  void publish(const std::vector<Step*>& serving_steps) {
    std::unique_lock hold(lock_);
    changed_.wait(hold, [&] { return !publishing_; });  // one publisher at a time
    publishing_ = true;
    changed_.wait(hold, [&] { return readers_ == 0; });
    try {
      for (std::size_t i = 0; i < from_.size(); ++i) to_[i].second.copy_from(from_[i].second);
      for (Step* s : serving_steps) s->parameters_changed();
    } catch (...) {
      publishing_ = false;
      changed_.notify_all();
      throw;
    }
    ++version_;
    publishing_ = false;
    changed_.notify_all();
  }
  // How many times publish() has run.
  std::int64_t version() const {
    std::lock_guard hold(lock_);
    return version_;
  }

 private:
  template <class Model>
  static std::vector<std::pair<std::string, Tensor>> pairs(const Model& m) {
    auto out = m.named_parameters();
    for (auto& b : m.named_buffers()) out.push_back(std::move(b));
    return out;
  }
  std::vector<std::pair<std::string, Tensor>> from_, to_;
  mutable std::mutex lock_;
  mutable std::condition_variable changed_;
  mutable int readers_ = 0;
  bool publishing_ = false;
  std::int64_t version_ = 0;
};

}  // namespace frugal
