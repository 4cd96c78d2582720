#pragma once
// What one device does per second: the cost model's only view of the
// hardware. runtime/calibrate.hpp measures these numbers on the machine and
// caches them as the flat JSON written here; plan/ only reads them, so the
// same planner prices a laptop run and a simulated cluster alike.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <span>
#include <string>
#include <string_view>

#include "../core/error.hpp"
#include "../core/json.hpp"
#include "../graph/op.hpp"

namespace frugal {

struct DeviceProfile {
  // Bumped when fields change meaning, so an old cache is recalibrated.
  static constexpr int kVersion = 1;

  std::string backend;
  int threads = 1;
  std::string machine;         // CPU model (and count), so another machine's cache is not reused
  double gemm_flops = 0;       // flop/s of large f32 GEMMs
  double stream_bytes = 0;     // bytes/s of memory-bound elementwise ops
  double op_latency_s = 0;     // fixed cost of launching one op
  double copy_bytes = 0;       // bytes/s between device and host (a memcpy on the CPU backend)
  double copy_latency_s = 0;
  double nvme_write_bytes = 0;  // bytes/s; 0 when no NVMe directory was measured
  double nvme_read_bytes = 0;
  double nvme_latency_s = 0;
  std::string nvme_dir;         // where the NVMe numbers were measured ("" when none)
  // How much longer compute takes while a copy runs beside it: 0.25 means
  // an op overlapped with a transfer takes 1.25 times as long.
  double overlap_slowdown = 0;
  // Bytes/s of host memory that an optimizer update moved to the host gets
  // (offload from a GPU); 0: the device is the host (the CPU backend), where
  // such an update costs what it costs on the device. Optional in JSON.
  double host_update_bytes = 0;
  // Evaluations per second of exp, log, tanh, erf and the like
  // (Cost::transcendentals), measured on the backend's GELU kernel over
  // operands in cache. 0: not measured (a profile from before the field),
  // and they are left out of the price. Optional in JSON.
  double transcendentals_per_s = 0;
  // Flop/s of arithmetic in small tiles (Cost::tile_flops), measured on the
  // backend's fused causal attention. 0: not measured, priced at gemm_flops.
  // Optional in JSON.
  double tile_flops = 0;

  // Conservative numbers (slow compute, slow links) for planning before, or
  // without, a calibration: an overestimated time costs speed, an
  // underestimated one would hide a transfer that is not really hidden.
  static DeviceProfile defaults(std::string backend, int threads) {
    if (threads < 1) fail("DeviceProfile::defaults: threads = ", threads, " must be at least 1");
    DeviceProfile p;
    p.backend = std::move(backend);
    p.threads = threads;
    if (p.backend == "cuda") {
      p.gemm_flops = 5e12;
      p.stream_bytes = 3e11;
      p.op_latency_s = 1e-5;
      p.copy_bytes = 5e9;  // pageable PCIe copies
      p.copy_latency_s = 1e-5;
      p.overlap_slowdown = 0.05;
      p.transcendentals_per_s = 5e11;
      p.tile_flops = 2e12;
    } else {
      // Near what calibration measures on a 2-core AVX-512 VM (11-22 Gflop/s
      // on a 512-square GEMM, 3-5 GB/s streaming, 4-7 GB/s memcpy).
      p.gemm_flops = 1e10 * threads;
      p.stream_bytes = 4e9;
      p.op_latency_s = 2e-6;
      p.copy_bytes = 5e9;
      p.copy_latency_s = 1e-6;
      p.overlap_slowdown = 0.5;  // the copy thread takes a core from compute
      p.transcendentals_per_s = 5e8 * threads;  // 2 ns each: a vectorised GELU measures 1 ns or less per element
      p.tile_flops = 4e9 * threads;              // 40% of the GEMM rate, as attention measures
    }
    return p;
  }

  bool has_nvme() const { return nvme_write_bytes > 0 && nvme_read_bytes > 0; }

  // A roofline: the op is bound by its arithmetic (its flops, tile flops
  // and transcendentals) or by its memory traffic, whichever takes longer,
  // plus a fixed launch cost.
  double op_seconds(const Cost& c) const {
    const double special = transcendentals_per_s > 0 ? c.transcendentals / transcendentals_per_s : 0;
    const double tiles = c.tile_flops / (tile_flops > 0 ? tile_flops : gemm_flops);
    return op_latency_s + std::max(c.flops / gemm_flops + tiles + special, c.bytes / stream_bytes);
  }
  double op_seconds(const Op& op, std::span<const TensorMeta> in, std::span<const TensorMeta> out) const {
    return op_seconds(op.cost(in, out));
  }
  double copy_seconds(std::size_t bytes) const { return copy_latency_s + double(bytes) / copy_bytes; }
  double nvme_write_seconds(std::size_t bytes) const {
    require_nvme("nvme_write_seconds");
    return nvme_latency_s + double(bytes) / nvme_write_bytes;
  }
  double nvme_read_seconds(std::size_t bytes) const {
    require_nvme("nvme_read_seconds");
    return nvme_latency_s + double(bytes) / nvme_read_bytes;
  }

  std::string to_json() const;
  static DeviceProfile from_json(std::string_view text, const std::string& source_name);

 private:
  void require_nvme(const char* what) const {
    if (!has_nvme())
      fail("DeviceProfile::", what, ": the ", backend, " profile (", threads,
           " threads) has no NVMe numbers: calibrate it with an NVMe directory, "
           "load_or_calibrate(backend, threads, \"/path/on/nvme\")");
  }
};

namespace detail {

// Shortest text that reads back as the same double, so a round trip is exact.
inline std::string json_number(double v) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

// A profile's fields: one JSON object of strings and numbers. Errors name
// the source and the field.
class ProfileFields {
 public:
  ProfileFields(std::string_view text, const std::string& source)
      : root_(parse_json_object(text, source + ": not a device profile: its text")), source_(source) {}

  bool has(const std::string& key) const { return root_.find(key) != nullptr; }
  const Json& field(const std::string& key) const {
    const Json* f = root_.find(key);
    if (!f) fail<DataError>(source_, ": field '", key, "' is missing");
    return *f;
  }
  std::string string(const std::string& key) const {
    const Json& f = field(key);
    if (f.kind != Json::Kind::string)
      fail<DataError>(source_, ": field '", key, "' should be a string, found ", f.describe());
    return f.str;
  }
  double number(const std::string& key) const {
    const Json& f = field(key);
    if (f.kind == Json::Kind::string)
      fail<DataError>(source_, ": field '", key, "' should be a number, found the string \"", f.str, "\"");
    if (f.kind != Json::Kind::number)
      fail<DataError>(source_, ": field '", key, "' should be a number, found ", f.describe());
    if (!std::isfinite(f.number)) fail<DataError>(source_, ": field '", key, "' is '", f.str, "', not a finite number");
    return f.number;
  }

 private:
  Json root_;
  const std::string& source_;
};

}  // namespace detail

inline std::string DeviceProfile::to_json() const {
  std::string o = "{\n";
  auto key = [&](const char* k) {
    if (o.size() > 2) o += ",\n";
    o += "  \"";
    o += k;
    o += "\": ";
  };
  auto str = [&](const char* k, const std::string& v) {
    key(k);
    o += json_quote(v);
  };
  auto num = [&](const char* k, double v) {
    key(k);
    o += detail::json_number(v);
  };
  num("version", kVersion);
  str("backend", backend);
  num("threads", threads);
  str("machine", machine);
  num("gemm_flops", gemm_flops);
  num("stream_bytes", stream_bytes);
  num("op_latency_s", op_latency_s);
  num("copy_bytes", copy_bytes);
  num("copy_latency_s", copy_latency_s);
  num("nvme_write_bytes", nvme_write_bytes);
  num("nvme_read_bytes", nvme_read_bytes);
  num("nvme_latency_s", nvme_latency_s);
  str("nvme_dir", nvme_dir);
  num("overlap_slowdown", overlap_slowdown);
  num("host_update_bytes", host_update_bytes);
  num("transcendentals_per_s", transcendentals_per_s);
  num("tile_flops", tile_flops);
  o += "\n}\n";
  return o;
}

inline DeviceProfile DeviceProfile::from_json(std::string_view text, const std::string& source_name) {
  detail::ProfileFields j(text, source_name);
  auto at_least = [&](const char* k, double lo, bool strictly) {
    double v = j.number(k);
    if (strictly ? !(v > lo) : !(v >= lo))
      fail<DataError>(source_name, ": field '", k, "' is ", v, ", must be ", strictly ? "above " : "at least ", lo);
    return v;
  };
  double version = j.number("version");
  if (version != kVersion)
    fail<DataError>(source_name, ": field 'version' is ", version, ", this build reads version ", kVersion,
                    " (recalibrate to replace it)");
  DeviceProfile p;
  p.backend = j.string("backend");
  if (p.backend.empty()) fail<DataError>(source_name, ": field 'backend' is empty");
  double threads = at_least("threads", 1, false);
  if (threads != std::floor(threads) || threads > 1e6)
    fail<DataError>(source_name, ": field 'threads' is ", threads, ", not a whole number of threads");
  p.threads = int(threads);
  p.machine = j.string("machine");
  p.gemm_flops = at_least("gemm_flops", 0, true);
  p.stream_bytes = at_least("stream_bytes", 0, true);
  p.op_latency_s = at_least("op_latency_s", 0, false);
  p.copy_bytes = at_least("copy_bytes", 0, true);
  p.copy_latency_s = at_least("copy_latency_s", 0, false);
  p.nvme_write_bytes = at_least("nvme_write_bytes", 0, false);
  p.nvme_read_bytes = at_least("nvme_read_bytes", 0, false);
  p.nvme_latency_s = at_least("nvme_latency_s", 0, false);
  p.nvme_dir = j.string("nvme_dir");
  p.overlap_slowdown = at_least("overlap_slowdown", 0, false);
  if (j.has("host_update_bytes")) p.host_update_bytes = at_least("host_update_bytes", 0, false);
  if (j.has("transcendentals_per_s")) p.transcendentals_per_s = at_least("transcendentals_per_s", 0, false);
  if (j.has("tile_flops")) p.tile_flops = at_least("tile_flops", 0, false);
  return p;
}

}  // namespace frugal
