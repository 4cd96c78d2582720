#pragma once
// Model weights and training checkpoints as safetensors files.
//
// Weights use PyTorch's state_dict names ("blocks.0.ln1.weight",
// "bn1.running_mean"), so a PyTorch user loads them with load_state_dict
// and frugal loads what PyTorch saved. A training checkpoint is ONE file
// (weights, optimizer state, the caller's own tensors and metadata), so the
// atomic write of write_safetensors makes the whole checkpoint atomic: a
// crash leaves the previous checkpoint or the new one, never a mix.
// Loading is strict and all-or-nothing: everything is checked before the
// first byte is copied, so a failed load leaves the model and optimizer as
// they were.
#include <charconv>
#include <functional>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "../nn/module.hpp"
#include "../runtime/nvme_homes.hpp"
#include "../runtime/optimizer.hpp"
#include "safetensors.hpp"

namespace frugal::io {

inline constexpr const char* kCheckpointFormat = "frugal-checkpoint-1";

namespace detail {

// Parameters, then buffers, under their state_dict names. Tensors a step
// keeps in its NVMe file between steps get their bytes back first: a file
// reads them, or a load writes them (and the step's next run takes that).
inline NamedTensors model_tensors(const nn::Module& model) {
  NvmeHomes::registry().bring_back_all();
  NamedTensors out = model.named_parameters();
  for (auto& nb : model.named_buffers()) out.push_back(std::move(nb));
  return out;
}

inline std::string shape_and_dtype(const Tensor& t) { return cat(dtype_name(t.dtype()), t.shape().str()); }

// Names of the optimizer's state tensors in a checkpoint:
// "optimizer.<param name>.<slot>" (the name of the module's parameter with
// the same storage), "optimizer.<index>.<slot>" for a parameter the module
// does not own, "optimizer.<slot>" for optimizer-wide state.
inline NamedTensors optimizer_tensors(const nn::Module& model, const Optimizer& opt,
                                      const std::vector<Optimizer::StateTensor>& state) {
  std::unordered_map<const void*, std::string> name_of;
  for (auto& [n, t] : model.named_parameters()) name_of.emplace(t.raw(), n);
  NamedTensors out;
  for (auto& s : state) {
    std::string owner;
    if (s.param != Optimizer::kNoParam) {
      auto it = name_of.find(opt.params().at(s.param).raw());
      owner = (it != name_of.end() ? it->second : std::to_string(s.param)) + ".";
    }
    out.emplace_back("optimizer." + owner + s.slot, s.tensor);
  }
  return out;
}
// The optimizer's state as it lives: its state() and, under ZeRO stage 3,
// the rank's parameter shards (the parameters it trains).
inline std::vector<Optimizer::StateTensor> live_state(const Optimizer& opt) {
  NvmeHomes::registry().bring_back_all();  // as model_tensors
  auto state = opt.state();
  for (auto& s : opt.parameter_shards()) state.push_back(s);
  return state;
}
inline NamedTensors optimizer_tensors(const nn::Module& model, const Optimizer& opt) {
  return optimizer_tensors(model, opt, live_state(opt));
}

// One tensor to copy from a file into a live one, checked beforehand: all
// of it, or (a ZeRO shard of a whole tensor in the file) dst's bytes from
// byte `from` on.
struct Copy {
  Tensor dst;
  const Tensor* src;
  std::size_t from = 0;
};

// Where a live tensor whose shape is not the file's takes its elements
// from (the byte offset of its shard), or nullopt: a mismatch.
using SliceOf = std::function<std::optional<std::size_t>(const std::string& name, const Tensor& live, const Tensor& file)>;

// Matches `expected` (name -> live tensor) against the file's tensors in
// `found`: every expected name present with the same shape and dtype, and
// nothing else, except expected names for which `may_miss` says yes.
// Returns the copies to make; throws a DataError naming the file, the
// tensor and both shapes otherwise.
template <class MayMiss>
std::vector<Copy> match(const std::filesystem::path& path, const NamedTensors& expected,
                        const std::vector<const std::pair<std::string, Tensor>*>& found, const char* what,
                        MayMiss may_miss, const SliceOf& slice_of = {}) {
  std::unordered_map<std::string, const Tensor*> in_file;
  for (auto* nt : found) in_file.emplace(nt->first, &nt->second);
  std::unordered_map<std::string, bool> wanted;
  std::vector<Copy> copies;
  for (auto& [name, live] : expected) {
    wanted[name] = true;
    auto it = in_file.find(name);
    if (it == in_file.end()) {
      if (may_miss(name)) continue;
      fail<DataError>(path.string(), ": ", what, " tensor '", name, "' (", shape_and_dtype(live),
                      ") is missing from the file");
    }
    const Tensor& t = *it->second;
    if (t.shape() != live.shape() || t.dtype() != live.dtype()) {
      std::optional<std::size_t> from;
      if (slice_of && t.dtype() == live.dtype()) from = slice_of(name, live, t);
      if (!from)
        fail<DataError>(path.string(), ": tensor '", name, "' is ", shape_and_dtype(t), " in the file but ",
                        shape_and_dtype(live), " in the ", what);
      copies.push_back({live, &t, *from});
      continue;
    }
    copies.push_back({live, &t});
  }
  std::vector<std::string> unexpected;
  for (auto* nt : found)
    if (!wanted.count(nt->first)) unexpected.push_back(nt->first);
  if (!unexpected.empty()) {
    std::string list;
    for (std::size_t i = 0; i < unexpected.size() && i < 8; ++i) {
      list += i ? ", '" : "'";
      list += unexpected[i];
      list += '\'';
    }
    if (unexpected.size() > 8) list += cat(" and ", unexpected.size() - 8, " more");
    fail<DataError>(path.string(), ": the file has ", unexpected.size(), " tensor", unexpected.size() == 1 ? "" : "s",
                    " the ", what, " does not: ", list);
  }
  return copies;
}

inline void apply(const std::vector<Copy>& copies) {
  for (auto& c : copies) std::memcpy(c.dst.raw(), static_cast<const char*>(c.src->raw()) + c.from, c.dst.nbytes());
}

inline std::vector<const std::pair<std::string, Tensor>*> all_of(const SafetensorsFile& f) {
  std::vector<const std::pair<std::string, Tensor>*> out;
  for (auto& nt : f.tensors) out.push_back(&nt);
  return out;
}

}  // namespace detail

// Model weights (parameters, then buffers) under their state_dict names,
// e.g. "blocks.0.ln1.weight", "bn1.running_mean": the file a PyTorch user
// loads with load_state_dict. `extra` goes into the file's metadata.
inline void save_weights(const std::filesystem::path& path, const nn::Module& model, const Metadata& extra = {}) {
  write_safetensors(path, detail::model_tensors(model), extra);
}

// Loads into the module's own tensors (in place: their storage is what
// compiled steps read; call parameters_changed() on a compiled step that
// keeps parameters off the device). Strict: a missing name, an unexpected
// name, a shape or dtype mismatch is a DataError naming the file, the tensor
// and both shapes, and nothing is loaded. If `allow_missing_buffers`,
// buffers absent from the file keep their values (PyTorch exports without
// them). Returns the file's metadata.
inline Metadata load_weights(const std::filesystem::path& path, nn::Module& model,
                             bool allow_missing_buffers = false) {
  SafetensorsFile f = read_safetensors(path);
  std::unordered_map<std::string, bool> is_buffer;
  for (auto& [n, _] : model.named_buffers()) is_buffer[n] = true;
  auto copies = detail::match(path, detail::model_tensors(model), detail::all_of(f), "model",
                              [&](const std::string& n) { return allow_missing_buffers && is_buffer.count(n); });
  detail::apply(copies);
  return f.metadata;
}

// A training checkpoint in ONE safetensors file (so it is atomic as a whole):
//   model tensors under their plain names (as save_weights);
//   optimizer state under "optimizer.<param name>.<slot>" ("optimizer.<index>.<slot>"
//   for a parameter the module does not own), optimizer-wide state under
//   "optimizer.<slot>";
//   `extra` tensors (the caller's own state, e.g. the loss history) under "extra.<name>";
//   metadata: "format": "frugal-checkpoint-1", "step": the step counter in
//   decimal, "optimizer": opt.kind(), plus the caller's entries (which may
//   not use those three keys).
// Identical state gives a byte-identical file (sorted header, no timestamps).
struct TrainingState {
  std::int64_t step = 0;
  Metadata metadata;  // the caller's entries, as saved (without format, step, optimizer)
  NamedTensors extra;  // under their names as saved (without "extra.")
};

namespace detail {
// A checkpoint of the model, `optimizer` (its tensors under their
// checkpoint names) and `extra`, for an optimizer of `kind`.
inline void write_checkpoint(const std::filesystem::path& path, const nn::Module& model, const std::string& kind,
                             const NamedTensors& optimizer, std::int64_t step, const Metadata& metadata,
                             const NamedTensors& extra) {
  if (step < 0) fail(path.string(), ": save_checkpoint: the step counter cannot be negative (got ", step, ")");
  Metadata md = metadata;
  for (const char* key : {"format", "step", "optimizer"})
    if (md.count(key))
      fail(path.string(), ": save_checkpoint: metadata key '", key,
           "' is reserved for the checkpoint itself; name your entry differently");
  md["format"] = kCheckpointFormat;
  md["step"] = std::to_string(step);
  md["optimizer"] = kind;
  NamedTensors all = detail::model_tensors(model);
  for (auto& nt : optimizer) all.push_back(nt);
  for (auto& [n, t] : extra) all.emplace_back("extra." + n, t);
  write_safetensors(path, all, md);
}
}  // namespace detail

inline void save_checkpoint(const std::filesystem::path& path, const nn::Module& model, const Optimizer& opt,
                            std::int64_t step, const Metadata& metadata = {}, const NamedTensors& extra = {}) {
  detail::write_checkpoint(path, model, opt.kind(), detail::optimizer_tensors(model, opt), step, metadata, extra);
}

namespace detail {
// load_checkpoint into the optimizer tensors `state` (its live state, or a
// part of it), each sliced from the file's where `slice_of` says so.
// `f` is the file's contents (read, or assembled in memory:
// io/state_slices.hpp), `path` what errors call it.
inline TrainingState load_checkpoint_into(const std::filesystem::path& path, const SafetensorsFile& f,
                                          nn::Module& model, Optimizer& opt,
                                          const std::vector<Optimizer::StateTensor>& state, const SliceOf& slice_of) {
  NvmeHomes::registry().bring_back_all();  // as model_tensors: the copies below write them
  const std::string p = path.string();
  auto md = f.metadata;
  auto format = md.find("format");
  if (format == md.end() || format->second != kCheckpointFormat)
    fail<DataError>(p, ": not a frugal checkpoint (its metadata 'format' is ",
                    format == md.end() ? std::string("missing") : "'" + format->second + "'", ", not '",
                    kCheckpointFormat, "'); for model weights alone use io::load_weights");
  auto kind = md.find("optimizer");
  if (kind == md.end() || kind->second != opt.kind())
    fail<DataError>(p, ": the checkpoint holds the state of optimizer '", kind == md.end() ? "?" : kind->second,
                    "' but it is being loaded into a '", opt.kind(), "' optimizer");
  auto step_it = md.find("step");
  TrainingState out;
  {
    const std::string s = step_it == md.end() ? "" : step_it->second;
    auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out.step);
    if (s.empty() || ec != std::errc() || end != s.data() + s.size() || out.step < 0)
      fail<DataError>(p, ": metadata 'step' is '", s, "', not a non-negative decimal step counter");
  }

  std::vector<const std::pair<std::string, Tensor>*> model_part, opt_part;
  for (auto& nt : f.tensors) {
    if (nt.first.starts_with("extra.")) out.extra.emplace_back(nt.first.substr(6), nt.second);
    else if (nt.first.starts_with("optimizer.")) opt_part.push_back(&nt);
    else model_part.push_back(&nt);
  }
  auto model_copies =
      detail::match(path, detail::model_tensors(model), model_part, "model", [](const std::string&) { return false; });
  // The optimizer's state is created when a step is compiled: before that it
  // has none, and the file's state would have nowhere to go.
  NamedTensors live = detail::optimizer_tensors(model, opt, state);
  for (auto* nt : opt_part) {
    bool exists = false;
    for (auto& [n, _] : live) exists = exists || n == nt->first;
    if (!exists && nt->first.ends_with(".parameter_shard"))
      fail<DataError>(p, ": tensor '", nt->first, "' is one rank's shard of a parameter that a ZeRO stage 3 step "
                      "trained; load this file into a step compiled at stage 3 over the same rank count, at the rank "
                      "that saved it (this optimizer has no such shard)");
    if (!exists && nt->first.ends_with(".master"))
      fail<DataError>(p, ": tensor '", nt->first, "' is the f32 master copy of a 16-bit parameter, saved by an "
                      "optimizer with master weights (optim::AdamWOptions::master_weights), but this '", opt.kind(),
                      "' optimizer keeps none for it: make it with master_weights = true (and load after compile())");
    if (!exists)
      fail<DataError>(p, ": optimizer state tensor '", nt->first, "' does not exist in the '", opt.kind(),
                      "' optimizer yet: load the checkpoint after compile(): the optimizer creates its state when "
                      "the step is compiled (and its steps_taken counter only under a loss scaler)");
  }
  // A master copy is not re-derived from the 16-bit parameter: that would
  // drop the bits the copy exists to keep, and resume another trajectory.
  for (std::size_t i = 0; i < state.size(); ++i) {
    if (state[i].slot != "master") continue;
    bool in_file = false;
    for (auto* nt : opt_part) in_file = in_file || nt->first == live[i].first;
    if (!in_file)
      fail<DataError>(p, ": tensor '", live[i].first, "' (the f32 master copy of a 16-bit parameter, ",
                      shape_and_dtype(live[i].second), ") is missing from the file: it was saved by an optimizer "
                      "without master weights. Load it into an optim::AdamW with master_weights = false, or load its "
                      "weights alone (io::load_weights) before compiling the master-weights step, which makes the "
                      "master copies from them (the moments then start from zero)");
  }
  auto opt_copies = detail::match(path, live, opt_part, "optimizer", [](const std::string&) { return false; }, slice_of);

  detail::apply(model_copies);
  detail::apply(opt_copies);
  opt.set_steps(out.step);
  md.erase("format");
  md.erase("step");
  md.erase("optimizer");
  out.metadata = std::move(md);
  return out;
}
}  // namespace detail

// Loads weights and optimizer state in place and returns the step and the
// rest. Errors (DataError naming the file, nothing loaded): not a frugal
// checkpoint, a different optimizer kind, any name/shape/dtype mismatch, an
// optimizer state tensor that does not exist yet (load after compile()).
// Sets opt.set_steps(step). Then, on each compiled step that trains on
// these tensors, call
//     step.set_steps_run(state.step);   // random ops key their streams by it
//     step.parameters_changed();        // refetch what a budget kept off the device
// and training continues the same trajectory, bit for bit.
// A ZeRO job's per-rank checkpoint loads back at the same stage and rank
// count; dist::load_checkpoint (dist/checkpoint.hpp) loads a gathered one
// at any.
inline TrainingState load_checkpoint(const std::filesystem::path& path, nn::Module& model, Optimizer& opt) {
  return detail::load_checkpoint_into(path, read_safetensors(path), model, opt, detail::live_state(opt), {});
}

}  // namespace frugal::io
