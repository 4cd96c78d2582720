#pragma once
// What one device does per second: the cost model's only view of the
// hardware. runtime/calibrate.hpp measures these numbers on the machine and
// caches them as the flat JSON written here; plan/ only reads them, so the
// same planner prices a laptop run and a simulated cluster alike.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <map>
#include <span>
#include <string>
#include <string_view>

#include "../core/error.hpp"
#include "../core/utf8.hpp"
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
    } else {
      // Near what calibration measures on a 2-core AVX-512 VM (11-22 Gflop/s
      // on a 512-square GEMM, 3-5 GB/s streaming, 4-7 GB/s memcpy).
      p.gemm_flops = 1e10 * threads;
      p.stream_bytes = 4e9;
      p.op_latency_s = 2e-6;
      p.copy_bytes = 5e9;
      p.copy_latency_s = 1e-6;
      p.overlap_slowdown = 0.5;  // the copy thread takes a core from compute
    }
    return p;
  }

  bool has_nvme() const { return nvme_write_bytes > 0 && nvme_read_bytes > 0; }

  // A roofline: the op is bound by its arithmetic or by its memory traffic,
  // whichever takes longer, plus a fixed launch cost.
  double op_seconds(const Op& op, std::span<const TensorMeta> in, std::span<const TensorMeta> out) const {
    Cost c = op.cost(in, out);
    return op_latency_s + std::max(c.flops / gemm_flops, c.bytes / stream_bytes);
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

inline void json_string(std::string& out, std::string_view s) {
  out += '"';
  for (char ch : s) {
    auto c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += ch;
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += ch;
    }
  }
  out += '"';
}

// Shortest text that reads back as the same double, so a round trip is exact.
inline std::string json_number(double v) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

// A flat JSON object of strings and numbers: all a profile needs, so no
// JSON library. Errors name the source and where reading stopped.
class FlatJson {
 public:
  struct Field {
    bool is_string = false;
    std::string text;  // the string's value, or the number as written
  };

  FlatJson(std::string_view text, const std::string& source) : s_(text), source_(source) {
    skip_space();
    expect('{');
    skip_space();
    if (peek() == '}') {
      ++pos_;
    } else {
      for (;;) {
        skip_space();
        std::string key = read_string();
        skip_space();
        expect(':');
        skip_space();
        Field f;
        if (peek() == '"') {
          f.is_string = true;
          f.text = read_string();
        } else {
          f.text = read_number_text();
        }
        if (!fields_.emplace(key, std::move(f)).second) bad(cat("field '", key, "' appears twice"));
        skip_space();
        if (peek() == ',') {
          ++pos_;
          continue;
        }
        expect('}');
        break;
      }
    }
    skip_space();
    if (pos_ != s_.size()) bad("unexpected text after the closing '}'");
  }

  const Field& field(const std::string& key) const {
    auto it = fields_.find(key);
    if (it == fields_.end()) fail<DataError>(source_, ": field '", key, "' is missing");
    return it->second;
  }
  std::string string(const std::string& key) const {
    const Field& f = field(key);
    if (!f.is_string) fail<DataError>(source_, ": field '", key, "' should be a string, found ", f.text);
    return f.text;
  }
  double number(const std::string& key) const {
    const Field& f = field(key);
    if (f.is_string)
      fail<DataError>(source_, ": field '", key, "' should be a number, found the string \"", f.text, "\"");
    double v = 0;
    auto r = std::from_chars(f.text.data(), f.text.data() + f.text.size(), v);
    if (r.ec != std::errc() || r.ptr != f.text.data() + f.text.size() || !std::isfinite(v))
      fail<DataError>(source_, ": field '", key, "' is '", f.text, "', not a finite number");
    return v;
  }

 private:
  [[noreturn]] void bad(const std::string& why) const {
    fail<DataError>(source_, ": not a device profile (a flat JSON object): ", why, " at byte ", pos_);
  }
  char peek() const { return pos_ < s_.size() ? s_[pos_] : '\0'; }
  void expect(char c) {
    if (peek() == c) {
      ++pos_;
      return;
    }
    if (pos_ >= s_.size()) bad(cat("expected '", c, "', found the end of the text"));
    bad(cat("expected '", c, "', found '", s_[pos_], "'"));
  }
  void skip_space() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) ++pos_;
  }
  std::string read_number_text() {
    std::size_t start = pos_;
    while (pos_ < s_.size() && std::string_view("+-0123456789.eE").find(s_[pos_]) != std::string_view::npos) ++pos_;
    if (pos_ == start) bad("expected a string or a number");
    return std::string(s_.substr(start, pos_ - start));
  }
  unsigned hex4() {
    if (pos_ + 4 > s_.size()) bad("a \\u escape needs four hex digits");
    unsigned v = 0;
    auto r = std::from_chars(s_.data() + pos_, s_.data() + pos_ + 4, v, 16);
    if (r.ptr != s_.data() + pos_ + 4) bad("a \\u escape needs four hex digits");
    pos_ += 4;
    return v;
  }
  std::string read_string() {
    expect('"');
    std::string out;
    for (;;) {
      if (pos_ >= s_.size()) bad("a string is not closed");
      char c = s_[pos_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) bad("a control character inside a string");
      if (c != '\\') {
        out += c;
        continue;
      }
      char e = peek();
      ++pos_;
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          unsigned cp = hex4();
          if (cp >= 0xD800 && cp < 0xDC00) {  // a surrogate pair
            if (peek() != '\\' || pos_ + 1 >= s_.size() || s_[pos_ + 1] != 'u') bad("an unpaired surrogate");
            pos_ += 2;
            unsigned lo = hex4();
            if (lo < 0xDC00 || lo >= 0xE000) bad("an unpaired surrogate");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          } else if (cp >= 0xDC00 && cp < 0xE000) {
            bad("an unpaired surrogate");
          }
          append_utf8(out, cp);
          break;
        }
        default: bad("an unknown escape in a string");
      }
    }
  }

  std::string_view s_;
  const std::string& source_;
  std::size_t pos_ = 0;
  std::map<std::string, Field> fields_;
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
    detail::json_string(o, v);
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
  o += "\n}\n";
  return o;
}

inline DeviceProfile DeviceProfile::from_json(std::string_view text, const std::string& source_name) {
  detail::FlatJson j(text, source_name);
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
  return p;
}

}  // namespace frugal
