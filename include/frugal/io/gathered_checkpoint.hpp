#pragma once
// Checkpoints of a data-parallel job that load at any rank count and ZeRO
// stage. io::save_checkpoint writes what one rank holds: under ZeRO its
// shards, which load back only at the same stage and rank count. Here every
// rank's shards are gathered whole, and rank 0 writes one file in
// io::save_checkpoint's format, the file one process training the same
// model would write; each rank loads it by taking its own shard of every
// tensor. So a job saved at 4 ranks and stage 3 resumes at 2 ranks and
// stage 1, or in one process without a communicator (io::load_checkpoint).
#include <exception>
#include <string>

#include "../ops/zero.hpp"
#include "checkpoint.hpp"

namespace frugal::io {

namespace detail {
// The rank's shard of a tensor of `whole` elements, checked against the
// `length` it holds (a shard cut over another rank count is refused).
inline ZeroShard shard_held(int rank, int ranks, std::int64_t whole, std::int64_t length, const std::string& what) {
  const ZeroShard s = ZeroShard::of(whole, rank, ranks);
  if (!s.every_rank_has_elements() || s.length != length)
    fail(what, ": rank ", rank, " of ", ranks, " holds ", length, " elements of a tensor of ", whole,
         ", not its ZeRO shard over these ranks (", s.length, "): call it with the communicator the step was compiled with");
  return s;
}
}  // namespace detail

// Every rank calls it, with the same path, on a file system rank 0 writes
// and every rank that loads it reads. Under ZeRO stage 3 the module's
// tensors receive the trained parameters too (as Step::gather_parameters).
// Written atomically by rank 0; an error writing it is raised on every
// rank. Call it between steps, after an update.
inline void save_gathered_checkpoint(const std::filesystem::path& path, const nn::Module& model, Optimizer& opt,
                                     std::int64_t step, Communicator& comm, const Metadata& metadata = {},
                                     const NamedTensors& extra = {}) {
  NvmeHomes::registry().bring_back_all();  // tensors a step keeps on NVMe (io/checkpoint.hpp)
  const std::string what = cat("save_gathered_checkpoint(", path.string(), ")");
  for (const auto& s : opt.parameter_shards()) {  // stage 3: the parameters trained
    Tensor whole = opt.params().at(s.param);
    const ZeroShard z = detail::shard_held(comm.rank(), comm.size(), whole.numel(), s.tensor.numel(), what);
    gather_shards(comm, z, s.tensor.raw(), whole.raw(), whole.dtype(), cat(what, ": parameter ", s.param));
  }
  std::vector<Optimizer::StateTensor> whole_state;
  for (const auto& s : opt.state()) {
    if (s.param == Optimizer::kNoParam || s.tensor.numel() == opt.params().at(s.param).numel()) {
      whole_state.push_back(s);
      continue;
    }
    const Tensor& p = opt.params().at(s.param);
    const ZeroShard z = detail::shard_held(comm.rank(), comm.size(), p.numel(), s.tensor.numel(), what);
    Tensor whole(p.shape(), s.tensor.dtype());
    gather_shards(comm, z, s.tensor.raw(), whole.raw(), whole.dtype(), cat(what, ": ", s.slot, " of parameter ", s.param));
    whole_state.push_back({s.param, s.slot, whole});
  }
  std::exception_ptr error;
  if (comm.rank() == 0) {
    try {
      detail::write_checkpoint(path, model, opt.kind(), detail::optimizer_tensors(model, opt, whole_state), step,
                               metadata, extra);
    } catch (...) {
      error = std::current_exception();
    }
  }
  std::int32_t failed = error ? 1 : 0;
  comm.broadcast(&failed, 1, DType::i32, 0, cat(what, ": whether rank 0 wrote it"));
  if (error) std::rethrow_exception(error);
  if (failed) fail(what, ": rank 0 could not write the checkpoint (its error says why); nothing was saved");
}

namespace detail {
// load_gathered_checkpoint from the contents `f` of such a file (`path`
// names it in errors), into the shards of rank `rank` of `ranks`.
inline TrainingState load_gathered(const std::filesystem::path& path, const SafetensorsFile& f, nn::Module& model,
                                   Optimizer& opt, int rank, int ranks) {
  NvmeHomes::registry().bring_back_all();  // tensors a step keeps on NVMe (io/checkpoint.hpp)
  auto slice = [&](const std::string&, const Tensor& live, const Tensor& file) -> std::optional<std::size_t> {
    const ZeroShard z = ZeroShard::of(file.numel(), rank, ranks);
    if (!z.every_rank_has_elements() || live.numel() != z.length) return std::nullopt;
    return std::size_t(z.offset) * dtype_size(file.dtype());
  };
  TrainingState out = load_checkpoint_into(path, f, model, opt, opt.state(), slice);
  const std::string what = cat("load_gathered_checkpoint(", path.string(), ")");
  for (const auto& s : opt.parameter_shards()) {
    const Tensor& whole = opt.params().at(s.param);
    const ZeroShard z = shard_held(rank, ranks, whole.numel(), s.tensor.numel(), what);
    const std::size_t es = dtype_size(whole.dtype());
    std::memcpy(s.tensor.raw(), static_cast<const char*>(whole.raw()) + std::size_t(z.offset) * es,
                std::size_t(z.length) * es);
  }
  return out;
}
}  // namespace detail

// Every rank calls it (no communication: each reads the file). Loads a
// checkpoint of whole tensors, as save_gathered_checkpoint or one process's
// io::save_checkpoint writes, into a step compiled at any ZeRO stage over
// `comm`: each sharded state tensor takes the rank's shard, and at stage 3
// each parameter shard is cut from the loaded parameter. Errors as
// io::load_checkpoint's. Then call step.set_steps_run(state.step) and
// step.parameters_changed() on the step, as after io::load_checkpoint.
inline TrainingState load_gathered_checkpoint(const std::filesystem::path& path, nn::Module& model, Optimizer& opt,
                                              Communicator& comm) {
  return detail::load_gathered(path, read_safetensors(path), model, opt, comm.rank(), comm.size());
}

}  // namespace frugal::io
