#pragma once
// The NVMe tier's speed in one directory: write and read 32 MiB with
// O_DIRECT through an anonymous file there, so the page cache does not flatter
// the numbers. Plain pwrite/pread: this stands in until the NVMe store
// itself (io_uring) is what gets timed.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "../core/bytes.hpp"
#include "../plan/device_profile.hpp"

namespace frugal {

namespace nvme_probe {

inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

[[noreturn]] inline void io_failed(const std::string& dir, const char* what, int err) {
  if (err == ENOSPC)
    fail<IoError>("measuring NVMe speed in '", dir, "': the directory's disk is full (", what,
                  "): free space there or give another directory");
  fail<IoError>("measuring NVMe speed in '", dir, "': ", what, " failed: ", std::strerror(err));
}

inline void write_all(int fd, const char* buf, std::size_t n, off_t off, const std::string& dir) {
  while (n > 0) {
    ssize_t w = ::pwrite(fd, buf, n, off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) io_failed(dir, "pwrite", w < 0 ? errno : ENOSPC);
    buf += w, n -= std::size_t(w), off += w;
  }
}

inline void read_all(int fd, char* buf, std::size_t n, off_t off, const std::string& dir) {
  while (n > 0) {
    ssize_t r = ::pread(fd, buf, n, off);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) io_failed(dir, "pread", errno);
    if (r == 0) fail<IoError>("measuring NVMe speed in '", dir, "': the probe file ended early");
    buf += r, n -= std::size_t(r), off += r;
  }
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  std::size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

}  // namespace nvme_probe

// Fills p's nvme_* fields from a short probe of `dir`.
inline void measure_nvme(DeviceProfile& p, const std::string& dir) {
  using namespace nvme_probe;
  constexpr std::size_t kTotal = 32_MiB, kChunk = 4_MiB, kBlock = 4096;
  constexpr int kChunks = int(kTotal / kChunk);
  if (dir.empty()) fail("measure_nvme: no directory given");

  // An anonymous file vanishes with the process, even if it is killed here.
  Fd f;
  f.fd = ::open(dir.c_str(), O_TMPFILE | O_RDWR | O_DIRECT | O_CLOEXEC, 0600);
  bool direct = f.fd >= 0;
  if (f.fd < 0 && (errno == EINVAL || errno == EOPNOTSUPP || errno == EISDIR)) {
    // No O_TMPFILE or no O_DIRECT here: a named file, unlinked at once.
    std::string name = dir + "/.frugal-nvme-probe-XXXXXX";
    f.fd = ::mkostemp(name.data(), O_CLOEXEC);
    if (f.fd >= 0) {
      ::unlink(name.c_str());
      direct = ::fcntl(f.fd, F_SETFL, O_DIRECT) == 0;
    }
  }
  if (f.fd < 0)
    fail<IoError>("cannot measure NVMe speed in '", dir, "': ", std::strerror(errno),
                  ": give an existing directory you can write to");
  if (!direct) {
    static std::atomic<bool> said{false};
    if (!said.exchange(true))
      std::fprintf(stderr,
                   "frugal: '%s' does not support O_DIRECT; its NVMe speed is measured through the page cache "
                   "(with fdatasync), which may flatter it\n",
                   dir.c_str());
  }
  if (int e = ::posix_fallocate(f.fd, 0, off_t(kTotal)); e == ENOSPC) io_failed(dir, "posix_fallocate", e);

  std::unique_ptr<char, decltype(&std::free)> buf(static_cast<char*>(std::aligned_alloc(kBlock, kChunk)), &std::free);
  if (!buf) fail("measure_nvme: cannot allocate a ", format_bytes(kChunk), " buffer");
  std::memset(buf.get(), 0x5a, kChunk);

  // With O_DIRECT each chunk is one device transfer: the median chunk is the
  // rate. Through the page cache only the whole pass with its sync is honest.
  std::vector<double> chunk_s;
  double t0 = now_s();
  for (int c = 0; c < kChunks; ++c) {
    double c0 = now_s();
    write_all(f.fd, buf.get(), kChunk, off_t(c) * off_t(kChunk), dir);
    chunk_s.push_back(now_s() - c0);
  }
  if (!direct && ::fdatasync(f.fd) != 0) io_failed(dir, "fdatasync", errno);
  double write_s = direct ? median(chunk_s) * kChunks : now_s() - t0;

  if (!direct) ::posix_fadvise(f.fd, 0, 0, POSIX_FADV_DONTNEED);
  chunk_s.clear();
  t0 = now_s();
  for (int c = 0; c < kChunks; ++c) {
    double c0 = now_s();
    read_all(f.fd, buf.get(), kChunk, off_t(c) * off_t(kChunk), dir);
    chunk_s.push_back(now_s() - c0);
  }
  double read_s = direct ? median(chunk_s) * kChunks : now_s() - t0;

  // One block at scattered offsets: the fixed cost of a request.
  if (!direct) ::posix_fadvise(f.fd, 0, 0, POSIX_FADV_DONTNEED);
  std::vector<double> lat;
  for (int i = 0; i < 9; ++i) {
    off_t off = off_t((std::size_t(i) * 7 % kChunks) * kChunk + std::size_t(i) * 5 * kBlock);
    double c0 = now_s();
    read_all(f.fd, buf.get(), kBlock, off, dir);
    lat.push_back(now_s() - c0);
  }

  std::error_code ec;
  auto canon = std::filesystem::weakly_canonical(dir, ec);
  p.nvme_write_bytes = double(kTotal) / write_s;
  p.nvme_read_bytes = double(kTotal) / read_s;
  p.nvme_latency_s = median(lat);
  p.nvme_dir = ec ? dir : canon.string();
}

}  // namespace frugal
