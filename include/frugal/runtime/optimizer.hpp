#pragma once
// What compile() needs from an optimizer: the parameters it trains, a way to
// append each parameter's update to the captured graph, and a tick per step.
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "../graph/var.hpp"
#include "../ops/zero.hpp"
#include "nvme_homes.hpp"

namespace frugal {

class Optimizer {
 public:
  Optimizer() = default;
  // A copy is another optimizer, with a life of its own: it gets its own
  // token, and assigning keeps the target's (steps compiled with either
  // still point at the object they were compiled with).
  Optimizer(const Optimizer&) : alive_(std::make_shared<char>()) {}
  Optimizer& operator=(const Optimizer&) { return *this; }
  virtual ~Optimizer() = default;

  // Expires when this optimizer is destroyed. A Step does not own its
  // optimizer (it calls begin_step() on it every run), so it holds this and
  // fails with an error naming the optimizer instead of calling into freed
  // memory when the optimizer went out of scope first.
  std::weak_ptr<const void> liveness() const { return alive_; }
  virtual const std::vector<Tensor>& params() const = 0;
  // Appends the update of params()[index] given its gradient. Under ZeRO
  // sharding (CompileOptions::zero_stage 1 to 3) `grad` is this rank's shard
  // of the gradient, state_shape(index) the shard's shape, and the update op
  // goes through apply_update, which runs it on that shard of `param` (at
  // stage 3 `param` is the shard itself).
  virtual void append_update(Var param, Var grad, std::size_t index) = 0;
  // Called once before each step runs (advances step counters).
  virtual void begin_step() = 0;

  // Under ZeRO sharding, compile appends each sharded parameter's update
  // inside one of these: the optimizer's state for it is then the shard's.
  class ShardScope {
   public:
    // `whole_parameter`: the update's parameter is the whole one, whose
    // shard the update op runs on (stages 1, 2); false: it is the shard
    // itself (stage 3), and the op runs as it is.
    ShardScope(Optimizer& o, const ZeroShard& s, bool whole_parameter = true) : o_(o) {
      o_.shard_ = s;
      o_.wrap_ = whole_parameter;
      o_.sharded_applies_ = 0;
    }
    ~ShardScope() { o_.shard_.reset(); }
    ShardScope(const ShardScope&) = delete;
    ShardScope& operator=(const ShardScope&) = delete;
    // Update ops that went through apply_update: compile refuses an
    // optimizer whose updates bypass it (they would update the whole
    // parameter from the shard's gradient).
    int applies() const { return o_.sharded_applies_; }

   private:
    Optimizer& o_;
  };

  // What the optimizer keeps between steps, for checkpoints. `param` indexes
  // params(), or is kNoParam for optimizer-wide state (the steps-taken
  // counter of guarded updates). The tensors share storage with the ones the
  // compiled steps read and write, so copying into them restores the state.
  static constexpr std::size_t kNoParam = std::size_t(-1);
  struct StateTensor {
    std::size_t param;
    std::string slot;
    Tensor tensor;
  };
  // Only tensors that exist: optimizers create their state when a step is
  // compiled. The state of the step that trains (see trains()): an
  // optimizer reports it with trained_state().
  virtual std::vector<StateTensor> state() const { return {}; }

  // What one prepared training step trains, its layout: the tensor each
  // state_tensor call gave a slot of a parameter's update, by slot name and
  // parameter index, and its stage-3 parameter shards, by parameter index
  // (undefined where it has none).
  struct Layout {
    std::map<std::pair<std::string, std::size_t>, Tensor> state;
    std::vector<Tensor> shards;
  };
  // Compile calls it as it starts preparing a training step: what
  // state_tensor and parameter_shard give from then on is that step's
  // layout, prepared_layout().
  void begin_layout() { prepared_ = std::make_shared<Layout>(); }
  std::shared_ptr<const Layout> prepared_layout() {
    preparing();
    return prepared_;
  }
  // A stage search prepares every stage it tries, and plans the step at
  // the one it chose, maybe not the last: that step's layout `l` (as
  // prepared_layout() gave it) is the one prepared last again, so an
  // optimizer that only planned reports the plan's state and shards.
  void prepared_again(std::shared_ptr<const Layout> l) {
    prepared_ = std::const_pointer_cast<Layout>(std::move(l));  // made by begin_layout: this optimizer's own
  }
  // The step of layout `l` trains: a Step calls it when it is made and
  // before each run (and, if the run fails, gives back the layout before).
  // Planning alone (plan_training, dist::PlanOnly, frugal-plan --ranks, a
  // stage search's trials) never does. state() and parameter_shards(), and
  // so checkpoints, describe this layout: a checkpoint taken after another
  // layout was planned is the trained step's, and one loaded after a step
  // was compiled at another stage or rank count (io::load_gathered_checkpoint
  // resharding a run) loads into that step's. Until a step is made, they
  // describe the layout prepared last.
  void trains(std::shared_ptr<const Layout> l) { trained_ = std::move(l); }
  std::shared_ptr<const Layout> trained_layout() const { return trained_; }
  // A step's run begins: its layout `l` trains (if it has one) and the
  // step count advances (begin_step()). Returns what undo_run gives back
  // if the run fails, which then counts for nothing.
  struct RunStart {
    std::int64_t steps = 0;
    std::shared_ptr<const Layout> trained;
  };
  RunStart start_run(std::shared_ptr<const Layout> l) {
    RunStart before{steps(), trained_};
    if (l) trains(std::move(l));
    begin_step();
    return before;
  }
  void undo_run(const RunStart& before) {
    set_steps(before.steps);
    trains(before.trained);
  }

  // The ZeRO stage this optimizer's steps train at; unset until compile
  // makes its first training step over a communicator, which fixes it.
  // Every later compile on this optimizer takes it (CompileOptions::
  // zero_stage unset) or must pin the same. A stage lays the state out its
  // own way (whole tensors at 0, this rank's shard at 1 and 2, the
  // parameter shards at 3), so steps of two stages would each train state
  // of their own, and the optimizer would silently hold two runs.
  // Planning alone reads it and never sets it. At stages 1 to 3 each rank
  // holds its shard of the state, cut for the rank count the stage was
  // fixed over (zero_ranks()), which compile holds every later step to.
  std::optional<int> zero_stage() const { return zero_stage_; }
  int zero_ranks() const { return zero_ranks_; }
  void fix_zero_stage(int stage, int ranks) {
    zero_stage_ = stage;
    zero_ranks_ = ranks;
  }

  // ZeRO stage 3: this rank's shard of params()[index], the parameter the
  // step trains in its place. One per layout (the elements it holds), kept
  // while the optimizer lives, as state_tensor keeps the state: steps
  // compiled at a layout share its shard, and a step planned at another
  // (dist::PlanOnly for another rank or rank count, as frugal-plan --ranks
  // does) gets one of its own instead of replacing the trained one. The
  // price, as there: a layout's shard stays allocated once seen.
  //
  // A layout's shard is made from the parameter's elements the first time
  // that layout is seen, never again: the step trains the shard and leaves
  // the parameter as it was (Step::gather_parameters and
  // io::save_gathered_checkpoint write the trained values into it), so a
  // shard unlike its parameter is the normal case, not a sign that the
  // parameter is newer, and cutting it again would drop the training. So,
  // as with state_tensor, a layout found again is as its steps left it:
  // what trained at another layout or stage since, or was written into the
  // parameter (io::load_weights), does not reach it. Checkpoints load into
  // the shards of the step that trains (parameter_shards); to move
  // training to another layout, io::load_gathered_checkpoint cuts them from
  // the loaded parameters.
  Tensor parameter_shard(std::size_t index, const ZeroShard& s) {
    const Tensor& p = params().at(index);
    Tensor& t = shard_layouts_[{index, s.offset, s.length}];
    if (!t.defined()) {
      MetaScope meta(p.is_meta());  // planned, not run: a shard of shapes
      t = Tensor(Shape{s.length}, p.dtype());
      if (!p.is_meta()) {
        NvmeHomes::registry().bring_back(p.raw());  // a parameter another step keeps on NVMe
        const std::size_t es = dtype_size(p.dtype());
        std::memcpy(t.raw(), static_cast<const char*>(p.raw()) + std::size_t(s.offset) * es,
                    std::size_t(s.length) * es);
      }
    }
    Layout& l = preparing();
    if (l.shards.size() < params().size()) l.shards.resize(params().size());
    l.shards[index] = t;
    return t;
  }
  // The stage-3 shards of the step that trains (trains()), as checkpoint
  // state ("parameter_shard" of each), as state() is that step's state:
  // none below stage 3 or for a parameter too small to shard, so a
  // checkpoint does not save, nor io::save_gathered_checkpoint gather into
  // the parameters, the shards of a layout that step does not train.
  std::vector<StateTensor> parameter_shards() const {
    const Layout* l = trained_ ? trained_.get() : prepared_.get();
    std::vector<StateTensor> out;
    if (!l) return out;
    for (std::size_t i = 0; i < l->shards.size(); ++i)
      if (l->shards[i].defined()) {
        NvmeHomes::registry().bring_back(l->shards[i].raw());  // from NVMe, where a step keeps them (nn::Module::named_parameters)
        out.push_back({i, "parameter_shard", l->shards[i]});
      }
    return out;
  }

  // "adamw", "sgd": a checkpoint of one kind does not load into another.
  virtual std::string kind() const = 0;
  // The host step count (bias corrections use it), and setting it as a
  // resumed run does.
  virtual std::int64_t steps() const = 0;
  virtual void set_steps(std::int64_t n) = 0;

 protected:
  // The shape of the state params()[index]'s update keeps: the parameter's,
  // or under a ShardScope the shard's (one dimension of its length).
  Shape state_shape(std::size_t index) const {
    return shard_ ? Shape{shard_->length} : params().at(index).shape();
  }
  // A state tensor of params()[index]'s update, of state_shape(index),
  // for the elements the update trains (the whole parameter's, or under a
  // ShardScope the shard's, from its offset): the tensor of that layout
  // this slot had before (`t` itself when it is that one), else a new
  // zeroed one. Of the parameter's dtype unless `dtype` says otherwise (f32
  // state of a 16-bit parameter). `slot` names the state ("momentum",
  // "exp_avg"). `t` is the tensor the slot holds now: one state_tensor
  // gave it is filed already; one the optimizer made itself is filed as
  // the state of the elements from the parameter's first on.
  //
  // Every layout a slot was given is kept, with its values: a step prepared
  // at another ZeRO stage or rank count (a trial the planner prices, a
  // broker probing a new step) gets state of its own layout and the slot
  // points at it, but preparing at a layout seen before finds that layout's
  // tensor again, so a step re-prepared at its own stage (a re-plan, the
  // next shape of a ShapeCache) goes on from the state it trained. A layout
  // is the elements held, not only their count: rank 1's shard of a
  // parameter planned with rank 0's optimizer (dist::PlanOnly) is as long
  // as rank 0's but gets state of its own. The price: a kept layout's bytes
  // stay allocated while the optimizer lives (a trial's shard is 1/N of the
  // parameter's state). Not a resharding, so compile holds an optimizer's
  // steps to one ZeRO stage (zero_stage()); a step that trains at another
  // rank count, then at the first again finds the first one's state as it
  // left it, not what the other trained since (to change stages or rank
  // counts mid-run, go through a gathered checkpoint,
  // io::save_gathered_checkpoint).
  Tensor state_tensor(const char* slot, const Tensor& t, std::size_t index, std::optional<DType> dtype = {}) {
    const Shape s = state_shape(index);
    const Tensor& p = params().at(index);
    const DType dt = dtype.value_or(p.dtype());
    if (t.defined() && !filed_.count(t.raw())) file({slot, index, 0, t.shape().str(), t.dtype()}, t);
    const StateKey key{slot, index, shard_ ? shard_->offset : 0, s.str(), dt};
    auto it = layouts_.find(key);
    Tensor out;
    if (it != layouts_.end()) {
      out = it->second;
    } else {
      MetaScope meta(p.is_meta());  // a meta parameter's state is planned, never allocated
      out = Tensor(s, dt);
      file(key, out);
    }
    preparing().state[{slot, index}] = out;
    return out;
  }
  // The same, for a slot known by where `t` lives (the optimizer's own
  // member, e.g. m_[i], whose address stays put): for optimizers written
  // before slots had names.
  Tensor state_tensor(const Tensor& t, std::size_t index, std::optional<DType> dtype = {}) {
    return state_tensor(cat("slot at ", static_cast<const void*>(&t)).c_str(), t, index, dtype);
  }
  // A copy of the elements of params()[index] its update trains, of
  // state_shape(index): the whole parameter, or under a ShardScope the
  // shard's, read at stage 3 from the rank's parameter shard (which the
  // steps train in the parameter's place, so it may be ahead of it). For
  // state made from the parameter's values (AdamW's master weights). Bytes
  // a step keeps on NVMe are brought back first.
  Tensor trained_elements(std::size_t index) const {
    const Tensor& p = params().at(index);
    if (p.is_meta()) {  // planned, not run: shapes only
      MetaScope meta;
      return Tensor(state_shape(index), p.dtype());
    }
    const std::size_t es = dtype_size(p.dtype());
    Tensor out(state_shape(index), p.dtype());
    if (shard_ && !wrap_) {
      auto it = shard_layouts_.find({index, shard_->offset, shard_->length});
      if (it == shard_layouts_.end())
        fail("internal error: ZeRO stage 3 state of parameter ", index, " is made before its parameter shard");
      NvmeHomes::registry().bring_back(it->second.raw());
      std::memcpy(out.raw(), it->second.raw(), out.nbytes());
      return out;
    }
    NvmeHomes::registry().bring_back(p.raw());
    const std::size_t from = shard_ ? std::size_t(shard_->offset) * es : 0;
    std::memcpy(out.raw(), static_cast<const char*>(p.raw()) + from, out.nbytes());
    return out;
  }
  // The tensor of `slot` (as state_tensor was given it) of params()[index]'s
  // update in the layout of the step that trains (trains()), or before a
  // step is made, of the one prepared last, for state() and the like to
  // report; `latest`, the tensor the slot holds now (what state_tensor gave
  // it last), where that layout has none (it does not update the
  // parameter).
  Tensor trained_state(const char* slot, std::size_t index, const Tensor& latest) const {
    if (const Layout* l = trained_ ? trained_.get() : prepared_.get()) {
      auto it = l->state.find({slot, index});
      if (it != l->state.end()) return it->second;
    }
    return latest;
  }
  // Appends an update op whose input 0 is the parameter it writes; under a
  // ShardScope it runs on the shard (ops::ShardedUpdate).
  std::vector<Var> apply_update(std::shared_ptr<Op> op, std::vector<Var> inputs) {
    if (!shard_ || !wrap_) {
      sharded_applies_ += shard_.has_value();
      return frugal::apply(std::move(op), inputs);
    }
    ++sharded_applies_;
    return frugal::apply(std::make_shared<ops::ShardedUpdate>(std::move(op), *shard_), inputs);
  }

 private:
  std::shared_ptr<char> alive_ = std::make_shared<char>();
  std::optional<ZeroShard> shard_;
  bool wrap_ = true;
  int sharded_applies_ = 0;
  // state_tensor's key of a layout of a slot: slot, parameter index, offset
  // of the first element held, shape, dtype.
  using StateKey = std::tuple<std::string, std::size_t, std::int64_t, std::string, DType>;
  void file(const StateKey& key, const Tensor& t) {
    layouts_[key] = t;
    filed_.insert(t.raw());
  }
  Layout& preparing() {
    if (!prepared_) begin_layout();
    return *prepared_;
  }
  std::shared_ptr<Layout> prepared_;        // the training step prepared last (or being prepared)
  std::shared_ptr<const Layout> trained_;   // the step that trains (trains())
  std::optional<int> zero_stage_;           // fixed by the first step compiled over a communicator
  int zero_ranks_ = 1;                      // and over how many ranks
  // parameter_shard's: every layout of every parameter, by index, offset, length
  std::map<std::tuple<std::size_t, std::int64_t, std::int64_t>, Tensor> shard_layouts_;
  std::map<StateKey, Tensor> layouts_;  // state_tensor's: every layout of every slot
  std::set<const void*> filed_;         // the storage of each tensor in layouts_
};

}  // namespace frugal
