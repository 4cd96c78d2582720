#pragma once
// A short calibration of the backend (under 1.5 s on a 2-core CPU): the
// rates the cost model needs, each timed through the backend's own kernels
// and copies, as the median of a few repeats. load_or_calibrate caches the
// result per machine, backend and thread count, so a program pays for it
// once.
//
// Where the time goes: on a virtual machine the first touch of a page can
// cost microseconds (150 MB/s here), more than the measurements themselves.
// So all kernels share one 48 MiB device pool, touched once, and the host
// side of the copies asks for transparent huge pages.
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "../ops/attention.hpp"
#include "../ops/binary.hpp"
#include "../ops/gelu.hpp"
#include "../ops/matmul.hpp"
#include "backend.hpp"
#include "measure_nvme.hpp"
#include "threads.hpp"
#include "profile_cache.hpp"

namespace frugal {

namespace calibration {

inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Median seconds of fn over up to `max_repeats` calls, after one call to
// warm up (BLAS buffers, thread wake-up). Repeats shrink, down to 3, when a
// call is slow, so a slow machine still calibrates quickly.
template <class Fn>
double median_seconds(Fn&& fn, int max_repeats = 5, double budget_s = 0.05) {
  double t0 = now_s();
  fn();
  double warm = now_s() - t0;
  int repeats = std::clamp(int(budget_s / std::max(warm, 1e-9)), 3, max_repeats);
  std::vector<double> t(std::size_t(repeats), 0.0);
  for (auto& s : t) {
    double a = now_s();
    fn();
    s = now_s() - a;
  }
  std::sort(t.begin(), t.end());
  std::size_t m = t.size() / 2;
  return t.size() % 2 ? t[m] : (t[m - 1] + t[m]) / 2;
}

// Device memory from the backend, every page touched, returned at scope exit.
class DeviceBuffer {
 public:
  DeviceBuffer(Backend& b, std::size_t bytes, unsigned char fill) : b_(b), p_(b.allocate(bytes)) {
    b_.fill(p_, fill, bytes);
  }
  ~DeviceBuffer() { b_.deallocate(p_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  char* get() const { return static_cast<char*>(p_); }

 private:
  Backend& b_;
  void* p_;
};

// Host memory on 2 MiB-aligned huge pages where the kernel grants them
// (one fault per 2 MiB instead of per 4 KiB), every page touched.
class HostBuffer {
 public:
  HostBuffer(std::size_t bytes, unsigned char fill) : bytes_(bytes + kHuge) {
    void* m = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) fail("calibrate: cannot map ", format_bytes(bytes), " of host memory: ", std::strerror(errno));
    map_ = static_cast<char*>(m);
    p_ = map_ + (kHuge - reinterpret_cast<std::uintptr_t>(map_) % kHuge) % kHuge;
    ::madvise(p_, bytes, MADV_HUGEPAGE);  // advice only: plain pages work too
    std::memset(p_, fill, bytes);
  }
  ~HostBuffer() { ::munmap(map_, bytes_); }
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  char* get() const { return p_; }

 private:
  static constexpr std::size_t kHuge = std::size_t(2) << 20;
  std::size_t bytes_;
  char* map_ = nullptr;
  char* p_ = nullptr;
};

// One op on f32 operands of the given shapes, laid out one after another in
// device memory from `base`, run through the backend's kernel exactly as the
// executor runs it.
class TimedOp {
 public:
  TimedOp(Backend& b, std::shared_ptr<const Op> op, std::vector<Shape> in_shapes, char* base, std::size_t room)
      : b_(b), op_(std::move(op)), in_shapes_(std::move(in_shapes)) {
    for (auto& s : in_shapes_) in_meta_.push_back({DType::f32, s});
    out_meta_ = op_->infer(in_meta_);
    for (auto& m : out_meta_) out_shapes_.push_back(m.shape);
    std::size_t at = 0;
    for (std::size_t i = 0; i < in_shapes_.size(); ++i) {
      in_.push_back({base + at, DType::f32, &in_shapes_[i]});
      at += align_up(in_meta_[i].nbytes());
    }
    for (std::size_t i = 0; i < out_shapes_.size(); ++i) {
      out_.push_back({base + at, out_meta_[i].dtype, &out_shapes_[i]});
      at += align_up(out_meta_[i].nbytes());
    }
    if (at > room)
      fail("calibrate: ", op_->name(), " needs ", format_bytes(at), " but the pool has ", format_bytes(room));
    kernel_ = &b.kernel_for(*op_);
  }
  // `calls` back-to-back runs, then a synchronize.
  void run(int calls = 1) const {
    for (int i = 0; i < calls; ++i) (*kernel_)(*op_, KernelArgs{in_, out_, 0, nullptr, 0});
    b_.synchronize();
  }
  Cost cost() const { return op_->cost(in_meta_, out_meta_); }

 private:
  Backend& b_;
  std::shared_ptr<const Op> op_;
  std::vector<Shape> in_shapes_, out_shapes_;
  std::vector<TensorMeta> in_meta_, out_meta_;
  std::vector<TensorRef> in_, out_;
  const Kernel* kernel_ = nullptr;
};

// Copies device -> host in 8 MiB pieces until destroyed: the traffic a swap
// puts beside compute. It only reads device memory, so it may share it with
// the inputs of the op being timed.
class BackgroundCopy {
 public:
  BackgroundCopy(Backend& b, void* host, const void* dev, std::size_t bytes) {
    thread_ = std::thread([this, &b, host, dev, bytes] {
      constexpr std::size_t piece = std::size_t(8) << 20;
      running_ = true;
      while (!stop_)
        for (std::size_t off = 0; off < bytes && !stop_; off += piece)
          b.copy_to_host(static_cast<char*>(host) + off, static_cast<const char*>(dev) + off,
                         std::min(piece, bytes - off));
    });
    while (!running_) std::this_thread::yield();
  }
  ~BackgroundCopy() {
    stop_ = true;
    thread_.join();
  }

 private:
  std::atomic<bool> stop_{false}, running_{false};
  std::thread thread_;
};

}  // namespace calibration

// The machine a profile was measured on, and the kernels' run-time choices
// (Backend::kernel_variant): a cache written under other kernels (another
// GEMM engine, a capped instruction set) is measured again.
inline std::string profile_machine(const Backend& backend) {
  const std::string v = backend.kernel_variant();
  return v.empty() ? machine_name() : cat(machine_name(), " [", v, "]");
}

// Measures `backend` with `threads` threads (and the NVMe tier in nvme_dir,
// when one is given), on the calling thread with `threads` OpenMP threads, as
// a step runs; the caller's own count is restored afterwards.
inline DeviceProfile calibrate(Backend& backend, int threads, const std::string& nvme_dir = "") {
  using namespace calibration;
  if (threads < 1) fail("calibrate: threads = ", threads, " must be at least 1");
  ScopedThreads scoped(threads);  // the caller's own count comes back afterwards
  DeviceProfile p;
  p.backend = backend.name();
  p.threads = threads;
  p.machine = profile_machine(backend);

  // 0x3f bytes read as 0.747f: finite and far from denormals, so no slow
  // path is timed, and sums and products of them stay finite.
  constexpr std::size_t kPool = 48_MiB;
  DeviceBuffer pool(backend, kPool, 0x3f);
  HostBuffer host(kPool, 0x3f);

  {  // large f32 GEMM: the flop rate of matmul, linear and convolution
    TimedOp gemm(backend, std::make_shared<ops::MatMul>(false, false), {Shape{512, 512}, Shape{512, 512}}, pool.get(),
                 kPool);
    p.gemm_flops = gemm.cost().flops / median_seconds([&] { gemm.run(); });
  }
  {  // tiny ops: what every op pays whatever its size
    TimedOp tiny(backend, std::make_shared<ops::Binary<math::Add>>(), {Shape{64}, Shape{64}}, pool.get(), kPool);
    constexpr int calls = 200;
    p.op_latency_s = median_seconds([&] { tiny.run(calls); }) / calls;
  }
  {  // host <-> device copies; the slower direction is the one planned for
    double to_dev = median_seconds([&] {
      backend.copy_to_device(pool.get(), host.get(), kPool);
      backend.synchronize();
    });
    double to_host = median_seconds([&] {
      backend.copy_to_host(host.get(), pool.get(), kPool);
      backend.synchronize();
    });
    p.copy_bytes = double(kPool) / std::max(to_dev, to_host);
    constexpr int calls = 1000;
    p.copy_latency_s = median_seconds([&] {
                         for (int i = 0; i < calls; ++i) backend.copy_to_device(pool.get(), host.get(), 64);
                         backend.synchronize();
                       }) /
                       calls;
  }
  {  // memory-bound elementwise op over three 16 MiB operands: the stream
     // rate, alone and then with a copy reading its first input beside it
    std::int64_t n = std::int64_t(16_MiB / 4);
    TimedOp add(backend, std::make_shared<ops::Binary<math::Add>>(), {Shape{n}, Shape{n}}, pool.get(), kPool);
    double alone = median_seconds([&] { add.run(); });
    p.stream_bytes = add.cost().bytes / alone;
    double beside;
    {
      BackgroundCopy copy(backend, host.get(), pool.get(), 16_MiB);
      beside = median_seconds([&] { add.run(); });
    }
    p.overlap_slowdown = std::max(0.0, beside / alone - 1);
  }
  {  // transcendentals: the GELU of 64K elements in cache (256 KiB of f32 in,
     // as much out), bound by its erf and not by memory
    TimedOp gelu(backend, std::make_shared<ops::Unary<math::GeluErfPoly>>(), {Shape{65536}}, pool.get(), kPool);
    constexpr int calls = 8;
    p.transcendentals_per_s = calls * gelu.cost().transcendentals / median_seconds([&] { gelu.run(calls); });
  }
  {  // small tiles: causal attention and its backward (every training step
     // runs both; the backward's products are the larger, and faster) over
     // 8 heads of 128 positions, 32 deep (the samples' head size; GPT-2's is
     // 64), less their exps
    const Shape head{8, 128, 32}, lse{8, 128};
    TimedOp fwd(backend, std::make_shared<ops::CausalAttention>(), {head, head, head}, pool.get(), kPool);
    TimedOp bwd(backend, std::make_shared<ops::CausalAttentionGrad>(1 / std::sqrt(32.0)),
                {head, head, head, head, lse, head}, pool.get() + 8_MiB, kPool - 8_MiB);
    const Cost a = fwd.cost(), b = bwd.cost();
    const double took = median_seconds([&] { fwd.run(); }) + median_seconds([&] { bwd.run(); }) -
                        (a.transcendentals + b.transcendentals) / p.transcendentals_per_s;
    // The exps cannot take all of it; if noise says they did, the GEMM rate stands.
    p.tile_flops = took > 0 ? std::min(p.gemm_flops, (a.tile_flops + b.tile_flops) / took) : p.gemm_flops;
  }
  if (!nvme_dir.empty()) measure_nvme(p, nvme_dir);
  return p;
}

namespace calibration {

inline void say_once(std::atomic<bool>& said, const std::string& line) {
  if (!said.exchange(true)) std::fprintf(stderr, "frugal: %s\n", line.c_str());
}

inline void store(const DeviceProfile& p, const std::filesystem::path& file) {
  static std::atomic<bool> said{false};
  try {
    write_profile_atomically(p, file);
  } catch (const IoError& e) {
    say_once(said, cat(e.what(), "; the device profile is not cached, so the next run calibrates again"));
  }
}

}  // namespace calibration

// The cached profile for this machine, backend and thread count, calibrated
// (and cached) when there is none, it is from another machine, or NVMe
// numbers for nvme_dir are wanted and missing. FRUGAL_PROFILE=<file> forces
// a profile file (an error if it is unreadable or incomplete).
inline DeviceProfile load_or_calibrate(Backend& backend, int threads, const std::string& nvme_dir = "") {
  using namespace calibration;
  if (const char* forced = std::getenv("FRUGAL_PROFILE"); forced && *forced) return read_profile_file(forced);

  auto dir = profile_cache_dir();
  if (!dir) {
    static std::atomic<bool> said{false};
    say_once(said, "no cache directory for the device profile (set FRUGAL_CACHE_DIR, XDG_CACHE_HOME or HOME); "
                   "calibrating every run");
    return calibrate(backend, threads, nvme_dir);
  }
  std::error_code ec;
  std::filesystem::create_directories(*dir, ec);
  if (ec) {
    static std::atomic<bool> said{false};
    say_once(said, cat("cannot create the device profile cache directory '", dir->string(), "': ", ec.message(),
                       "; calibrating without a cache"));
    return calibrate(backend, threads, nvme_dir);
  }
  std::filesystem::path file = *dir / profile_cache_file_name(backend.name(), threads);

  std::optional<DeviceProfile> cached;
  if (std::filesystem::exists(file, ec)) {
    try {
      cached = read_profile_file(file);
    } catch (const DataError& e) {
      std::fprintf(stderr, "frugal: %s; recalibrating over it\n", e.what());
    }
  }
  // A cache without transcendentals or tile flops is from a build that did
  // not measure them.
  if (cached && cached->machine == profile_machine(backend) && cached->backend == backend.name() &&
      cached->threads == threads && cached->transcendentals_per_s > 0 && cached->tile_flops > 0) {
    if (nvme_dir.empty()) return *cached;
    auto want = std::filesystem::weakly_canonical(nvme_dir, ec);
    if (cached->has_nvme() && cached->nvme_dir == (ec ? nvme_dir : want.string())) return *cached;
    // The compute and copy numbers still hold: only the NVMe is new.
    DeviceProfile p = *cached;
    measure_nvme(p, nvme_dir);
    store(p, file);
    return p;
  }
  DeviceProfile p = calibrate(backend, threads, nvme_dir);
  store(p, file);
  return p;
}

}  // namespace frugal
