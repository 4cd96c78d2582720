#pragma once
// A training state cut into one slice per rank, which put back together is
// the whole state at any other rank count and ZeRO stage: what an elastic
// job (dist/elastic.hpp) keeps, replicates on a neighbour and sends to new
// ranks, where a job that changes size would otherwise write a checkpoint
// and read it back.
//
// The whole state is what io::save_gathered_checkpoint would write: the
// model's tensors and the optimizer's state, each under its checkpoint name
// and with the whole tensor's shape. Rank r of n holds, for each of them,
// elements ZeroShard::of(numel, r, n): exactly the shard it trains where
// ZeRO shards that tensor, and that part of its own whole copy where it
// does not. So every rank's slice is cut from what it holds, with no
// communication, and the n slices cover each tensor once. Loading takes
// them in rank order, assembles the whole tensors in memory and loads those
// as io::load_gathered_checkpoint does, with all its checks.
#include <cstdint>
#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

#include "gathered_checkpoint.hpp"

namespace frugal::io {

struct StateSlice {
  std::int64_t step = 0;  // the optimizer's step count: which state this is a slice of
  int rank = 0, ranks = 1;
  std::uint64_t layout = 0;  // a hash of the state's names, dtypes, whole shapes and optimizer kind
  Metadata metadata;         // the caller's entries (the reserved checkpoint keys are refused)
  std::vector<char> bytes;   // each tensor's slice, in the state's order
};

namespace detail {

// One tensor of the whole state, and where this rank holds it.
struct StateEntry {
  std::string name;
  Shape shape;  // the whole tensor's
  DType dtype;
  Tensor live;  // the whole tensor, or this rank's ZeRO shard of it
};

inline void mix(std::uint64_t& h, const void* data, std::size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 0x100000001b3ull;  // FNV-1a
}

// The state's tensors in checkpoint order: the model's, then the
// optimizer's. Under ZeRO stage 3 the trained parameters are the
// optimizer's shards (the module's tensors keep what they held at compile).
inline std::vector<StateEntry> state_entries(const nn::Module& model, const Optimizer& opt) {
  NvmeHomes::registry().bring_back_all();  // tensors a step keeps on NVMe (io/checkpoint.hpp)
  std::unordered_map<const void*, Tensor> shard_of;
  for (const auto& s : opt.parameter_shards()) shard_of.emplace(opt.params().at(s.param).raw(), s.tensor);
  std::vector<StateEntry> out;
  for (auto& [name, t] : model_tensors(model)) {
    auto it = shard_of.find(t.raw());
    out.push_back({name, t.shape(), t.dtype(), it == shard_of.end() ? t : it->second});
  }
  const auto state = opt.state();
  const NamedTensors names = optimizer_tensors(model, opt, state);
  for (std::size_t i = 0; i < state.size(); ++i) {
    // A parameter's state has its shape, whether held whole, flat (ZeRO
    // over one rank) or as this rank's shard, so the layout is the same at
    // every stage and rank count.
    const auto& s = state[i];
    out.push_back({names[i].first, s.param != Optimizer::kNoParam ? opt.params().at(s.param).shape() : s.tensor.shape(),
                   s.tensor.dtype(), s.tensor});
  }
  return out;
}

inline std::uint64_t layout_hash(const std::vector<StateEntry>& entries, const std::string& kind) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  mix(h, kind.data(), kind.size());
  for (const auto& e : entries) {
    mix(h, e.name.data(), e.name.size() + 1);
    const auto dt = std::int32_t(e.dtype);
    mix(h, &dt, sizeof dt);
    for (std::int64_t d : e.shape.dims()) mix(h, &d, sizeof d);
  }
  return h;
}

}  // namespace detail

namespace detail {
inline void check_slice_args(int rank, int ranks, const Metadata& metadata) {
  if (ranks < 1 || rank < 0 || rank >= ranks) fail("capture_slice: rank ", rank, " of ", ranks, " is not a rank");
  for (const char* key : {"format", "step", "optimizer"})
    if (metadata.count(key)) fail("capture_slice: metadata key '", key, "' is reserved for the state itself");
}
// Copies rank `rank`'s slice of each entry to `at`, which has room for it.
inline void copy_slice(const std::vector<StateEntry>& entries, int rank, int ranks, char* at) {
  for (const auto& e : entries) {
    const std::int64_t whole = e.shape.numel();
    const ZeroShard z = ZeroShard::of(whole, rank, ranks);
    const std::size_t es = dtype_size(e.dtype), n = std::size_t(z.length) * es;
    const char* from = static_cast<const char*>(e.live.raw());
    if (e.live.numel() == whole)
      from += std::size_t(z.offset) * es;
    else
      shard_held(rank, ranks, whole, e.live.numel(), cat("capture_slice: '", e.name, "'"));
    if (n) std::memcpy(at, from, n);
    at += n;
  }
}
inline std::size_t slice_bytes(const std::vector<StateEntry>& entries, int rank, int ranks) {
  std::size_t n = 0;
  for (const auto& e : entries)
    n += std::size_t(ZeroShard::of(e.shape.numel(), rank, ranks).length) * dtype_size(e.dtype);
  return n;
}
// encode_slice's header: everything but the slice's bytes, which follow it.
inline void put_header(std::vector<char>& out, std::uint64_t layout, std::int64_t step, int rank, int ranks,
                       const Metadata& metadata, std::size_t bytes) {
  auto put = [&](const void* p, std::size_t n) {
    out.insert(out.end(), static_cast<const char*>(p), static_cast<const char*>(p) + n);
  };
  auto put_u64 = [&](std::uint64_t v) { put(&v, sizeof v); };
  put("FRGSLICE", 8);
  put_u64(layout);
  put_u64(std::uint64_t(step));
  put_u64(std::uint64_t(rank));
  put_u64(std::uint64_t(ranks));
  put_u64(metadata.size());
  for (auto& [k, v] : metadata) {
    put_u64(k.size());
    put(k.data(), k.size());
    put_u64(v.size());
    put(v.data(), v.size());
  }
  put_u64(bytes);
}
}  // namespace detail

// Rank `rank` of `ranks` cuts its slice of the state it trains, after
// `step` updates. Call it between steps, with the rank and count of the
// communicator the step was compiled over (a ZeRO shard cut over another
// count is refused, naming the tensor).
inline StateSlice capture_slice(const nn::Module& model, const Optimizer& opt, int rank, int ranks, std::int64_t step,
                                const Metadata& metadata = {}) {
  detail::check_slice_args(rank, ranks, metadata);
  const auto entries = detail::state_entries(model, opt);
  StateSlice out{step, rank, ranks, detail::layout_hash(entries, opt.kind()), metadata, {}};
  out.bytes.resize(detail::slice_bytes(entries, rank, ranks));
  detail::copy_slice(entries, rank, ranks, out.bytes.data());
  return out;
}

// capture_slice and encode_slice in one copy: the encoded slice is written
// into `out` from byte `at` on, and `out` sized to end with it. A caller
// that reuses `out` for every step's slice allocates and clears nothing.
inline void capture_encoded_slice(const nn::Module& model, const Optimizer& opt, int rank, int ranks, std::int64_t step,
                                  const Metadata& metadata, std::vector<char>& out, std::size_t at = 0) {
  detail::check_slice_args(rank, ranks, metadata);
  const auto entries = detail::state_entries(model, opt);
  const std::size_t bytes = detail::slice_bytes(entries, rank, ranks);
  std::vector<char> header;
  detail::put_header(header, detail::layout_hash(entries, opt.kind()), step, rank, ranks, metadata, bytes);
  out.resize(at + header.size() + bytes);
  std::memcpy(out.data() + at, header.data(), header.size());
  detail::copy_slice(entries, rank, ranks, out.data() + at + header.size());
}

// The whole state from every rank's slice (slices[r] is rank r's of
// slices.size()), as a checkpoint's contents in memory: `what` names it in
// errors. Refuses slices of another layout, step or rank count, or whose
// sizes are not their ranks' slices.
inline SafetensorsFile assemble_slices(const std::vector<StateSlice>& slices, const nn::Module& model,
                                       const Optimizer& opt, const std::string& what) {
  if (slices.empty()) fail(what, ": no slices to assemble");
  const auto entries = detail::state_entries(model, opt);
  const std::uint64_t layout = detail::layout_hash(entries, opt.kind());
  const int ranks = int(slices.size());
  std::vector<const char*> cursor;
  for (int r = 0; r < ranks; ++r) {
    const StateSlice& s = slices[std::size_t(r)];
    if (s.layout != layout)
      fail<DataError>(
          what, ": rank ", r,
          "'s slice is of another state (its tensors' names, shapes or dtypes, or the "
          "optimizer, differ from this rank's): every rank must train the same model with the same optimizer");
    if (s.rank != r || s.ranks != ranks || s.step != slices[0].step || s.metadata != slices[0].metadata)
      fail<DataError>(what, ": slice ", r, " is rank ", s.rank, "'s of ", s.ranks, " at step ", s.step, ", not rank ",
                      r, "'s of ", ranks, " at step ", slices[0].step, " with the others' metadata");
    const std::size_t want = detail::slice_bytes(entries, r, ranks);
    if (s.bytes.size() != want)
      fail<DataError>(what, ": rank ", r, "'s slice holds ", s.bytes.size(), " bytes where its share of the state is ",
                      want);
    cursor.push_back(s.bytes.data());
  }
  SafetensorsFile f;
  f.metadata = slices[0].metadata;
  f.metadata["format"] = kCheckpointFormat;
  f.metadata["step"] = std::to_string(slices[0].step);
  f.metadata["optimizer"] = opt.kind();
  for (const auto& e : entries) {
    Tensor whole(e.shape, e.dtype);
    const std::size_t es = dtype_size(e.dtype);
    for (int r = 0; r < ranks; ++r) {
      const ZeroShard z = ZeroShard::of(e.shape.numel(), r, ranks);
      const std::size_t n = std::size_t(z.length) * es;
      if (n) std::memcpy(static_cast<char*>(whole.raw()) + std::size_t(z.offset) * es, cursor[std::size_t(r)], n);
      cursor[std::size_t(r)] += n;
    }
    f.tensors.emplace_back(e.name, std::move(whole));
  }
  return f;
}

// A fingerprint of a whole state's bytes and step (FNV-1a): ranks that
// assembled the same state get the same number.
inline std::uint64_t state_hash(const SafetensorsFile& whole) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  detail::mix(h, whole.metadata.at("step").data(), whole.metadata.at("step").size());
  for (const auto& [name, t] : whole.tensors) detail::mix(h, t.raw(), t.nbytes());
  return h;
}

// Loads a whole state (assemble_slices) into rank `rank` of `ranks` of a
// step compiled over that many ranks, at any ZeRO stage: as
// io::load_gathered_checkpoint loads a file, with its errors. Then call
// step.set_steps_run(state.step) and step.parameters_changed().
inline TrainingState load_whole_state(const SafetensorsFile& whole, nn::Module& model, Optimizer& opt, int rank,
                                      int ranks, const std::string& what) {
  return detail::load_gathered(what, whole, model, opt, rank, ranks);
}

// A slice as bytes to send, and back; decoding checks every length.
inline std::vector<char> encode_slice(const StateSlice& s) {
  std::vector<char> out;
  detail::put_header(out, s.layout, s.step, s.rank, s.ranks, s.metadata, s.bytes.size());
  out.insert(out.end(), s.bytes.begin(), s.bytes.end());
  return out;
}

inline StateSlice decode_slice(const char* data, std::size_t bytes, const std::string& what) {
  std::size_t at = 0;
  auto take = [&](void* p, std::size_t n) {
    if (bytes - at < n) fail<DataError>(what, ": a state slice of ", bytes, " bytes ends early (at byte ", at, ")");
    std::memcpy(p, data + at, n);
    at += n;
  };
  auto u64 = [&] {
    std::uint64_t v;
    take(&v, sizeof v);
    return v;
  };
  auto text = [&] {
    std::string s(std::size_t(std::min<std::uint64_t>(u64(), bytes)), '\0');
    take(s.data(), s.size());
    return s;
  };
  char magic[8];
  take(magic, 8);
  if (std::memcmp(magic, "FRGSLICE", 8) != 0) fail<DataError>(what, ": not a frugal state slice");
  StateSlice s;
  s.layout = u64();
  s.step = std::int64_t(u64());
  s.rank = int(u64());
  s.ranks = int(u64());
  for (std::uint64_t n = u64(); n > 0; --n) {
    std::string k = text();
    s.metadata[k] = text();
  }
  s.bytes.resize(std::size_t(std::min<std::uint64_t>(u64(), bytes)));
  take(s.bytes.data(), s.bytes.size());
  if (at != bytes) fail<DataError>(what, ": ", bytes - at, " bytes follow the state slice");
  return s;
}

}  // namespace frugal::io
