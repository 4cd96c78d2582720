#pragma once
// safetensors files (the format of huggingface/safetensors), so weights and
// checkpoints move to and from the Python ecosystem:
//   u64 little-endian N | N bytes of JSON header | data buffer
// The header maps each tensor name to {"dtype", "shape", "data_offsets":
// [begin, end]} (offsets into the data buffer), plus an optional
// "__metadata__" object of strings.
//
// Writing is deterministic (header sorted by name, no timestamps, data in
// header order) so identical state gives byte-identical files, and atomic
// (temporary file, fsync, rename, directory fsync) so a crash or a full
// disk never leaves a half-written file where a good one was. Reading is
// strict: every inconsistency is a DataError naming the file, never a crash
// or silently wrong tensors.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "../core/error.hpp"
#include "../core/json.hpp"
#include "../core/tensor.hpp"

namespace frugal::io {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; frugal reads and writes it in host order");

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;
using Metadata = std::map<std::string, std::string>;

// safetensors' dtype names, for the dtypes frugal has.
inline const char* safetensors_dtype(DType t) {
  switch (t) {
    case DType::f32: return "F32";
    case DType::f64: return "F64";
    case DType::bf16: return "BF16";
    case DType::f16: return "F16";
    case DType::i32: return "I32";
    case DType::i64: return "I64";
    case DType::u8: return "U8";
  }
  return "?";
}
inline bool dtype_from_safetensors(std::string_view name, DType& out) {
  for (DType t : {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32, DType::i64, DType::u8})
    if (name == safetensors_dtype(t)) {
      out = t;
      return true;
    }
  return false;
}

struct SafetensorsFile {
  Metadata metadata;
  NamedTensors tensors;  // in file order of data offsets
  bool contains(const std::string& name) const {
    for (auto& [n, _] : tensors)
      if (n == name) return true;
    return false;
  }
  const Tensor& at(const std::string& name) const {
    for (auto& [n, t] : tensors)
      if (n == name) return t;
    std::string some;
    for (std::size_t i = 0; i < tensors.size() && i < 8; ++i) {
      if (i) some += ", ";
      some += tensors[i].first;
    }
    if (tensors.size() > 8) some += ", ...";
    fail<DataError>(path.string(), ": no tensor named '", name, "' (the file has ", tensors.size(), " tensor",
                    tensors.size() == 1 ? "" : "s", some.empty() ? "" : ": ", some, ")");
  }
  std::filesystem::path path;
};

namespace detail {

// The header text: "__metadata__" first (as the reference implementation
// writes it), then the tensors sorted by name, padded with spaces to a
// multiple of 8 bytes so the data buffer starts aligned.
inline std::string safetensors_header(const std::vector<const std::pair<std::string, Tensor>*>& sorted,
                                      const Metadata& metadata) {
  std::string h = "{";
  bool first = true;
  if (!metadata.empty()) {
    h += "\"__metadata__\":{";
    bool f = true;
    for (auto& [k, v] : metadata) {
      if (!f) h += ',';
      h += json_quote(k);
      h += ':';
      h += json_quote(v);
      f = false;
    }
    h += "}";
    first = false;
  }
  std::size_t offset = 0;
  for (auto* nt : sorted) {
    const Tensor& t = nt->second;
    if (!first) h += ',';
    h += json_quote(nt->first);
    h += ":{\"dtype\":\"";
    h += safetensors_dtype(t.dtype());
    h += "\",\"shape\":[";
    for (int d = 0; d < t.shape().rank(); ++d) {
      if (d) h += ',';
      h += std::to_string(t.shape()[d]);
    }
    h += "],\"data_offsets\":[" + std::to_string(offset) + "," + std::to_string(offset + t.nbytes()) + "]}";
    offset += t.nbytes();
    first = false;
  }
  h += "}";
  h.append((8 - h.size() % 8) % 8, ' ');
  return h;
}

// The OS's reason for the last failed call, e.g. "No space left on device".
inline std::string os_reason(int err) { return std::strerror(err); }

// Writes all of [p, p + n) to fd, through short writes and EINTR; false and
// errno on failure.
inline bool write_all(int fd, const void* p, std::size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    ssize_t w = ::write(fd, c, std::min<std::size_t>(n, std::size_t(1) << 30));
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    if (w == 0) {
      errno = EIO;
      return false;
    }
    c += w;
    n -= std::size_t(w);
  }
  return true;
}

// Reads exactly n bytes at `offset`; the count read (less at end of file),
// or -1 with errno.
inline long long pread_all(int fd, void* p, std::size_t n, std::uint64_t offset) {
  char* c = static_cast<char*>(p);
  std::size_t got = 0;
  while (got < n) {
    ssize_t r = ::pread(fd, c + got, std::min<std::size_t>(n - got, std::size_t(1) << 30), off_t(offset + got));
    if (r < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    if (r == 0) break;
    got += std::size_t(r);
  }
  return (long long)got;
}

// Closes a descriptor once, whatever path leaves the scope.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  int release() {
    int f = fd;
    fd = -1;
    return f;
  }
};

}  // namespace detail

// Writes atomically: a temporary file beside `path` (same directory, unique
// name), written, fsync'd, renamed over `path`, then the directory fsync'd.
// On any failure (ENOSPC, EIO, permission) the temporary is removed, `path`
// is untouched (an earlier file there survives intact), and an IoError names
// the path and the OS reason. Duplicate names, the reserved name
// "__metadata__" and undefined tensors are Errors before anything is written.
inline void write_safetensors(const std::filesystem::path& path, const NamedTensors& tensors,
                              const Metadata& metadata = {}) {
  namespace fs = std::filesystem;
  std::vector<const std::pair<std::string, Tensor>*> sorted;
  for (auto& nt : tensors) {
    if (!nt.second.defined())
      fail(path.string(), ": cannot write tensor '", nt.first, "': it is undefined (a default-constructed Tensor)");
    if (nt.second.is_meta())
      fail(path.string(), ": cannot write tensor '", nt.first, "': it is a meta tensor (made inside a "
           "frugal::MetaScope), which has a shape and no data; save a model built outside the scope");
    if (nt.first == "__metadata__")
      fail(path.string(), ": cannot write a tensor named '__metadata__': safetensors reserves that name");
    sorted.push_back(&nt);
  }
  std::sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) { return a->first < b->first; });
  for (std::size_t i = 1; i < sorted.size(); ++i)
    if (sorted[i]->first == sorted[i - 1]->first)
      fail(path.string(), ": two tensors are named '", sorted[i]->first, "': names in a safetensors file are unique");
  std::string header = detail::safetensors_header(sorted, metadata);

  fs::path dir = path.parent_path();
  if (dir.empty()) dir = ".";
  if (path.filename().empty()) fail<IoError>(path.string(), ": cannot write: the path names no file");

  // A unique temporary in the same directory (so the rename is atomic):
  // the process id, a per-process counter and the clock, created O_EXCL.
  static std::atomic<std::uint64_t> counter{0};
  detail::Fd out;
  fs::path tmp;
  for (int attempt = 0; out.fd < 0; ++attempt) {
    auto now = std::uint64_t(std::chrono::steady_clock::now().time_since_epoch().count());
    tmp = dir / cat(".", path.filename().string(), ".tmp-", ::getpid(), "-", counter++, "-", now % 1000003);
    out.fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (out.fd < 0 && (errno != EEXIST || attempt > 100))
      fail<IoError>(path.string(), ": cannot create the temporary file ", tmp.string(), " beside it: ",
                    detail::os_reason(errno));
  }
  auto abandon = [&](const char* what) {
    int err = errno;
    if (out.fd >= 0) ::close(out.release());
    ::unlink(tmp.c_str());
    fail<IoError>(path.string(), ": ", what, ": ", detail::os_reason(err), " (the file is unchanged)");
  };

  std::uint64_t n = header.size();
  if (!detail::write_all(out.fd, &n, 8) || !detail::write_all(out.fd, header.data(), header.size()))
    abandon("cannot write the header");
  for (auto* nt : sorted)
    if (!detail::write_all(out.fd, nt->second.raw(), nt->second.nbytes())) abandon("cannot write the data");
  if (::fsync(out.fd) != 0) abandon("cannot sync the data to disk");
  if (::close(out.release()) != 0) abandon("cannot close the written file");
  if (::rename(tmp.c_str(), path.c_str()) != 0) abandon("cannot rename the temporary file over it");

  // The rename is durable only once the directory is synced. Some file
  // systems cannot sync a directory (EINVAL); there the rename is as durable
  // as they make it.
  detail::Fd d;
  d.fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (d.fd < 0 || (::fsync(d.fd) != 0 && errno != EINVAL))
    fail<IoError>(path.string(), ": written, but syncing its directory ", dir.string(),
                  " failed: ", detail::os_reason(errno), " (the new file may not survive a crash)");
}

// Strict: every problem is a DataError whose message starts with the file's
// path and says what is wrong (and, where useful, what to do).
inline SafetensorsFile read_safetensors(const std::filesystem::path& path) {
  const std::string p = path.string();
  detail::Fd in;
  in.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (in.fd < 0) fail<DataError>(p, ": cannot open: ", detail::os_reason(errno));
  struct stat st {};
  if (::fstat(in.fd, &st) != 0) fail<DataError>(p, ": cannot stat: ", detail::os_reason(errno));
  if (!S_ISREG(st.st_mode)) fail<DataError>(p, ": not a regular file");
  const std::uint64_t size = std::uint64_t(st.st_size);
  auto read_at = [&](void* dst, std::uint64_t n, std::uint64_t off, const char* what) {
    long long got = detail::pread_all(in.fd, dst, n, off);
    if (got < 0) fail<DataError>(p, ": cannot read ", what, ": ", detail::os_reason(errno));
    if (std::uint64_t(got) != n)
      fail<DataError>(p, ": truncated while reading ", what, " (the file shrank while it was read?)");
  };

  if (size < 8)
    fail<DataError>(p, ": the file is ", size, " bytes, shorter than the 8-byte header length: truncated or not a "
                    "safetensors file");
  std::uint64_t n = 0;
  read_at(&n, 8, 0, "the header length");
  if (n > size - 8)
    fail<DataError>(p, ": the header length ", n, " is larger than the file (", size,
                    " bytes): truncated or not a safetensors file");
  std::string header(n, '\0');
  read_at(header.data(), n, 8, "the header");
  Json root = parse_json(header, p + ": the header", 8);
  if (root.kind != Json::Kind::object)
    fail<DataError>(p, ": the header is ", root.describe(), ", not an object of tensors");

  SafetensorsFile f;
  f.path = path;
  struct Entry {
    std::string name;
    DType dtype;
    Shape shape;
    std::uint64_t begin, end;
  };
  std::vector<Entry> entries;
  for (auto& [name, v] : root.members) {
    if (name == "__metadata__") {
      if (v.kind != Json::Kind::object)
        fail<DataError>(p, ": \"__metadata__\" is ", v.describe(), ", not an object of strings");
      for (auto& [k, s] : v.members) {
        if (s.kind != Json::Kind::string)
          fail<DataError>(p, ": metadata entry '", k, "' is ", s.describe(), ", not a string");
        f.metadata[k] = s.str;
      }
      continue;
    }
    auto bad = [&](auto&&... what) { fail<DataError>(p, ": tensor '", name, "': ", what...); };
    if (v.kind != Json::Kind::object) bad("its entry is ", v.describe(), ", not an object");
    for (auto& [k, _] : v.members)
      if (k != "dtype" && k != "shape" && k != "data_offsets")
        bad("unknown key '", k, "' (expected dtype, shape and data_offsets)");
    const Json* dt = v.find("dtype");
    const Json* sh = v.find("shape");
    const Json* off = v.find("data_offsets");
    if (!dt || !sh || !off) bad("missing '", !dt ? "dtype" : !sh ? "shape" : "data_offsets", "'");
    Entry e{name, DType::f32, Shape{}, 0, 0};
    if (dt->kind != Json::Kind::string) bad("dtype is ", dt->describe(), ", not a string");
    if (!dtype_from_safetensors(dt->str, e.dtype))
      bad("unknown dtype '", dt->str, "' (frugal reads F32, F64, BF16, F16, I32, I64 and U8; convert the tensor "
          "to one of them before saving)");
    if (sh->kind != Json::Kind::array) bad("shape is ", sh->describe(), ", not an array");
    std::vector<std::int64_t> dims;
    std::uint64_t bytes = dtype_size(e.dtype);
    bool overflow = false;
    for (auto& d : sh->items) {
      if (!d.is_integer) bad("shape holds ", d.describe(), ", not an integer (dimensions are non-negative)");
      if (d.integer > std::uint64_t(INT64_MAX)) bad("shape dimension ", d.integer, " is too large");
      if (d.integer != 0 && bytes > UINT64_MAX / d.integer) overflow = true;
      else bytes *= d.integer;
      dims.push_back(std::int64_t(d.integer));
    }
    e.shape = Shape(dims);
    if (off->kind != Json::Kind::array || off->items.size() != 2 || !off->items[0].is_integer ||
        !off->items[1].is_integer)
      bad("data_offsets must be an array of two integers [begin, end]");
    e.begin = off->items[0].integer;
    e.end = off->items[1].integer;
    if (e.end < e.begin) bad("data_offsets [", e.begin, ", ", e.end, "] end before they begin");
    if (overflow || e.end - e.begin != bytes)
      bad("shape ", e.shape.str(), " of ", dt->str, " needs ", overflow ? std::string("more than 2^64") : cat(bytes),
          " bytes but data_offsets [", e.begin, ", ", e.end, "] span ", e.end - e.begin);
    entries.push_back(std::move(e));
  }

  // The data buffer is the tensors back to back: sorted by offset, each
  // begins where the last ended, from 0 to the end of the file.
  std::stable_sort(entries.begin(), entries.end(),
                   [](const Entry& a, const Entry& b) { return a.begin != b.begin ? a.begin < b.begin : a.end < b.end; });
  const std::uint64_t data_size = size - 8 - n;
  std::uint64_t expect = 0;
  const Entry* prev = nullptr;
  for (auto& e : entries) {
    if (e.begin < expect)
      fail<DataError>(p, ": tensors '", prev->name, "' [", prev->begin, ", ", prev->end, ") and '", e.name, "' [",
                      e.begin, ", ", e.end, ") overlap in the data buffer");
    if (e.begin > expect)
      fail<DataError>(p, ": the data buffer has a gap of ", e.begin - expect, " bytes before tensor '", e.name,
                      "' (offsets must be contiguous)");
    expect = e.end;
    prev = &e;
  }
  if (expect > data_size)
    fail<DataError>(p, ": truncated: the header promises ", expect, " bytes of data but the file has ", data_size);
  if (expect < data_size)
    fail<DataError>(p, ": ", data_size - expect, " bytes of trailing garbage after the last tensor's data (the "
                    "header accounts for ", expect, " of ", data_size, " data bytes)");

  MetaScope real(false);  // what a file holds is data, even read inside a MetaScope
  for (auto& e : entries) {
    Tensor t(e.shape, e.dtype);
    read_at(t.raw(), e.end - e.begin, 8 + n + e.begin, cat("tensor '", e.name, "'").c_str());
    f.tensors.emplace_back(e.name, std::move(t));
  }
  return f;
}

}  // namespace frugal::io
