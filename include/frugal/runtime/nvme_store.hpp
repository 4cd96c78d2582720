#pragma once
// The NVMe tier: one anonymous file in Budget::nvme_dir, reserved whole when
// the step is compiled, read and written through page-aligned staging
// buffers so the transfers can bypass the page cache (O_DIRECT) whatever the
// alignment of the arena addresses they come from.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#ifdef FRUGAL_HAVE_LIBURING
#include <liburing.h>
#endif

#include "../core/bytes.hpp"
#include "../core/error.hpp"

namespace frugal {

namespace nvme_detail {

// Each fallback is announced once per process, not once per store or step.
inline std::atomic_flag said_buffered = ATOMIC_FLAG_INIT;
inline std::atomic_flag said_pread = ATOMIC_FLAG_INIT;
inline void say_once(std::atomic_flag& said, const std::string& line) {
  if (!said.test_and_set()) std::fprintf(stderr, "%s\n", line.c_str());
}

struct FileDescriptor {
  int fd = -1;
  FileDescriptor() = default;
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  ~FileDescriptor() {
    if (fd >= 0) ::close(fd);
  }
};

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

}  // namespace nvme_detail

namespace testing {
// A seam for tests of what a failing disk leaves behind: the NVMe read `n`
// reads from now (0: the next) fails once with an IoError, as a read that
// hits a bad sector would; -1 (the default) plants nothing. Process-wide.
inline std::atomic<long>& nvme_read_fault_in() {
  static std::atomic<long> n{-1};
  return n;
}
}  // namespace testing

class NvmeStore {
 public:
  // O_DIRECT wants buffer, offset and length aligned to the logical block
  // size; 4096 covers every NVMe drive formatted for 512 or 4096 bytes.
  static constexpr std::size_t kAlignment = 4096;

  // A file of `bytes` (rounded up to kAlignment) in `dir`, reserved now so a
  // full disk is found when the step is compiled, not halfway through it.
  // `staging_bytes` is split into a few chunks that keep several I/Os in
  // flight.
  NvmeStore(const std::string& dir, std::size_t bytes, std::size_t staging_bytes = 4 << 20)
      : dir_(dir), capacity_(align_up(bytes, kAlignment)) {
    open_file();
    reserve();
    allocate_staging(staging_bytes);
    choose_engine();
  }

  ~NvmeStore() {
#ifdef FRUGAL_HAVE_LIBURING
    if (ring_open_) io_uring_queue_exit(&ring_);
#endif
  }

  NvmeStore(const NvmeStore&) = delete;
  NvmeStore& operator=(const NvmeStore&) = delete;

  // Synchronous; called from the copy thread, one transfer at a time.
  // The padded tail up to the next kAlignment boundary is written too (with
  // zeros): callers size their slots rounded up to kAlignment.
  void write(std::uint64_t offset, const void* src, std::size_t bytes) {
    check_range(offset, bytes);
    transfer(true, offset, static_cast<std::byte*>(const_cast<void*>(src)), bytes);
  }
  void read(std::uint64_t offset, void* dst, std::size_t bytes) {
    check_range(offset, bytes);
    auto& fault = testing::nvme_read_fault_in();
    long n = fault.load();
    while (n >= 0 && !fault.compare_exchange_weak(n, n - 1)) {
    }
    if (n == 0)
      fail<IoError>("NVMe tier: read of ", bytes, " bytes at file offset ", offset, " in '", dir_,
                    "' failed: an I/O error planted by frugal::testing::nvme_read_fault_in()");
    transfer(false, offset, static_cast<std::byte*>(dst), bytes);
  }

  // A transfer the plan should never ask for: misaligned or past the end.
  void check_range(std::uint64_t offset, std::size_t bytes) const {
    if (offset % kAlignment != 0)
      fail("internal: NVMe transfer offset ", offset, " is not a multiple of ", kAlignment);
    if (offset > capacity_ || align_up(bytes, kAlignment) > capacity_ - offset)
      fail("internal: NVMe transfer of ", bytes, " bytes at offset ", offset, " runs past the ", capacity_,
           "-byte file in '", dir_, "'");
  }

  const char* engine() const { return uring_ ? "io_uring" : "pread/pwrite"; }
  bool direct() const { return direct_; }
  std::size_t bytes() const { return capacity_; }
  const std::string& dir() const { return dir_; }

 private:
  static constexpr int kMaxChunks = 4;

  struct Chunk {
    std::byte* buf = nullptr;
    std::uint64_t file_offset = 0;  // where this chunk's I/O starts in the file
    std::size_t user_pos = 0;       // where its bytes start in the caller's buffer
    std::size_t len = 0;            // the caller's bytes in it
    std::size_t io_len = 0;         // len rounded up to kAlignment
    std::size_t done = 0;           // bytes of io_len transferred so far
  };

  void open_file() {
    if (dir_.empty())
      fail<IoError>("NVMe tier: Budget::nvme_dir is empty: name a directory on a local disk with ",
                    format_bytes(capacity_), " free");
    struct stat st {};
    if (::stat(dir_.c_str(), &st) != 0)
      fail<IoError>("NVMe tier: cannot use directory '", dir_, "': ", std::strerror(errno),
                    ": create it or point Budget::nvme_dir elsewhere");
    if (!S_ISDIR(st.st_mode))
      fail<IoError>("NVMe tier: '", dir_, "' is not a directory: point Budget::nvme_dir at a directory");

    // Anonymous from the start, so nothing is left behind even if the
    // process is killed. O_TMPFILE where the filesystem has it; else a
    // unique name, unlinked at once.
    file_.fd = ::open(dir_.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    if (file_.fd < 0 && (errno == EOPNOTSUPP || errno == EISDIR || errno == EINVAL)) {
      std::string path = dir_ + "/frugal-nvme-XXXXXX";
      file_.fd = ::mkostemp(path.data(), O_CLOEXEC);
      if (file_.fd >= 0) ::unlink(path.c_str());
    }
    if (file_.fd < 0)
      fail<IoError>("NVMe tier: cannot create a file in '", dir_, "': ", std::strerror(errno),
                    ": make it writable or point Budget::nvme_dir elsewhere");

    // O_DIRECT is switched on after the file exists: an open(O_CREAT|O_DIRECT)
    // that the filesystem refuses can still leave the named file behind.
    const int flags = ::fcntl(file_.fd, F_GETFL);
    if (flags >= 0 && ::fcntl(file_.fd, F_SETFL, flags | O_DIRECT) == 0) {
      direct_ = true;
    } else {
      nvme_detail::say_once(nvme_detail::said_buffered,
                            cat("frugal: NVMe directory '", dir_, "' refuses O_DIRECT (", std::strerror(errno),
                                "): the NVMe tier goes through the page cache"));
    }
  }

  void reserve() {
    if (capacity_ == 0) return;
    int r;
    do r = ::posix_fallocate(file_.fd, 0, off_t(capacity_));
    while (r == EINTR);
    if (r != 0)
      fail<IoError>("NVMe tier: cannot reserve ", format_bytes(capacity_), " (", capacity_, " bytes) in '", dir_,
                    "': ", std::strerror(r),
                    ": free space there, point Budget::nvme_dir elsewhere, or raise Budget::host/device");
  }

  void allocate_staging(std::size_t staging_bytes) {
    chunk_bytes_ = std::clamp<std::size_t>(staging_bytes / kMaxChunks / kAlignment * kAlignment, kAlignment, 64 << 20);
    void* p = nullptr;
    if (::posix_memalign(&p, kAlignment, chunk_bytes_ * kMaxChunks) != 0 || !p)
      fail<BudgetError>("NVMe tier: cannot allocate ", format_bytes(chunk_bytes_ * kMaxChunks),
                        " of staging buffers: free host memory");
    staging_.reset(p);
    for (int c = 0; c < kMaxChunks; ++c) chunk_[c].buf = static_cast<std::byte*>(p) + std::size_t(c) * chunk_bytes_;
  }

  void choose_engine() {
    std::string why;
    const char* env = std::getenv("FRUGAL_NVME_IO");
    const std::string choice = env ? env : "";
    if (choice == "pread") {
      why = "FRUGAL_NVME_IO=pread";
    } else if (!choice.empty() && choice != "io_uring") {
      fail("FRUGAL_NVME_IO='", choice, "': use pread or io_uring (or leave it unset)");
    } else {
#ifdef FRUGAL_HAVE_LIBURING
      const int r = io_uring_queue_init(kMaxChunks, &ring_, 0);
      if (r == 0) {
        ring_open_ = uring_ = true;
        return;
      }
      why = cat("io_uring_queue_init: ", std::strerror(-r));
#else
      why = "frugal was built without liburing";
#endif
    }
    nvme_detail::say_once(nvme_detail::said_pread, cat("frugal: NVMe tier uses pread/pwrite: io_uring unavailable (", why, ")"));
  }

  // Starts chunk c: the caller's bytes for a write, its staging space for a read.
  void start_chunk(Chunk& k, bool is_write, std::uint64_t offset, std::byte* user, std::size_t pos, std::size_t bytes) {
    k.user_pos = pos;
    k.len = std::min(chunk_bytes_, bytes - pos);
    k.io_len = align_up(k.len, kAlignment);
    k.file_offset = offset + pos;
    k.done = 0;
    if (is_write) {
      std::memcpy(k.buf, user + pos, k.len);
      std::memset(k.buf + k.len, 0, k.io_len - k.len);
    }
  }

  [[noreturn]] void fail_transfer(bool is_write, std::uint64_t offset, std::size_t bytes, std::uint64_t at,
                                  int err) const {
    fail<IoError>("NVMe tier: ", is_write ? "write" : "read", " of ", format_bytes(bytes), " (", bytes,
                  " bytes) at offset ", offset, " of the file in '", dir_, "' failed at file offset ", at, ": ",
                  std::strerror(err), is_write ? ": free space there, or point Budget::nvme_dir elsewhere" : "");
  }

  void transfer(bool is_write, std::uint64_t offset, std::byte* user, std::size_t bytes) {
    if (bytes == 0) return;
#ifdef FRUGAL_HAVE_LIBURING
    if (uring_) return transfer_uring(is_write, offset, user, bytes);
#endif
    transfer_pread(is_write, offset, user, bytes);
  }

  // One chunk at a time: the fallback does not overlap memcpy with I/O.
  void transfer_pread(bool is_write, std::uint64_t offset, std::byte* user, std::size_t bytes) {
    Chunk& k = chunk_[0];
    for (std::size_t pos = 0; pos < bytes; pos += k.len) {
      start_chunk(k, is_write, offset, user, pos, bytes);
      while (k.done < k.io_len) {
        const off_t at = off_t(k.file_offset + k.done);
        const ssize_t r = is_write ? ::pwrite(file_.fd, k.buf + k.done, k.io_len - k.done, at)
                                   : ::pread(file_.fd, k.buf + k.done, k.io_len - k.done, at);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) fail_transfer(is_write, offset, bytes, std::uint64_t(at), errno);
        if (r == 0) fail_transfer(is_write, offset, bytes, std::uint64_t(at), is_write ? EIO : ENODATA);
        k.done += std::size_t(r);
      }
      if (!is_write) std::memcpy(user + pos, k.buf, k.len);
    }
  }

#ifdef FRUGAL_HAVE_LIBURING
  // Up to kMaxChunks I/Os in flight: a write copies the next chunk into
  // staging while the previous ones are written; a read reads ahead while
  // the finished chunks are copied out. On an error the I/Os in flight are
  // reaped before throwing, so the ring is clean for the next transfer.
  void transfer_uring(bool is_write, std::uint64_t offset, std::byte* user, std::size_t bytes) {
    int free_chunks[kMaxChunks];
    int n_free = 0;
    for (int c = kMaxChunks - 1; c >= 0; --c) free_chunks[n_free++] = c;
    int in_flight = 0;
    int err = 0;
    std::uint64_t err_at = UINT64_MAX;
    std::size_t pos = 0;

    auto submit = [&](int c) {
      Chunk& k = chunk_[c];
      io_uring_sqe* sqe = io_uring_get_sqe(&ring_);  // never null: at most kMaxChunks in flight
      const auto len = unsigned(k.io_len - k.done);
      if (is_write)
        io_uring_prep_write(sqe, file_.fd, k.buf + k.done, len, k.file_offset + k.done);
      else
        io_uring_prep_read(sqe, file_.fd, k.buf + k.done, len, k.file_offset + k.done);
      sqe->user_data = std::uint64_t(c);
      int r;
      do r = io_uring_submit(&ring_);
      while (r == -EINTR || r == -EAGAIN);
      if (r < 0) {
        // The ring itself is broken: finish on pread/pwrite from now on.
        uring_ = false;
        nvme_detail::say_once(nvme_detail::said_pread,
                              cat("frugal: NVMe tier uses pread/pwrite: io_uring unavailable (io_uring_submit: ",
                                  std::strerror(-r), ")"));
        fail_transfer(is_write, offset, bytes, k.file_offset + k.done, -r);
      }
      ++in_flight;
    };

    for (;;) {
      while (err == 0 && pos < bytes && n_free > 0) {
        const int c = free_chunks[--n_free];
        start_chunk(chunk_[c], is_write, offset, user, pos, bytes);
        pos += chunk_[c].len;
        submit(c);
      }
      if (in_flight == 0) break;

      io_uring_cqe* cqe = nullptr;
      int r;
      do r = io_uring_wait_cqe(&ring_, &cqe);
      while (r == -EINTR);
      if (r < 0) {
        uring_ = false;
        fail_transfer(is_write, offset, bytes, offset + pos, -r);
      }
      const int c = int(cqe->user_data);
      const int res = cqe->res;
      io_uring_cqe_seen(&ring_, cqe);
      --in_flight;

      Chunk& k = chunk_[c];
      if (res <= 0 && err == 0) err = res < 0 ? -res : (is_write ? EIO : ENODATA);
      if (res > 0) k.done += std::size_t(res);
      if (err == 0 && k.done < k.io_len) {
        submit(c);  // a short transfer: continue where it stopped
        continue;
      }
      // Chunks complete out of order: the error names the first byte that
      // did not make it, whichever chunk failed first.
      if (k.done < k.io_len) err_at = std::min(err_at, k.file_offset + k.done);
      if (err == 0 && !is_write) std::memcpy(user + k.user_pos, k.buf, k.len);
      free_chunks[n_free++] = c;
    }
    if (err != 0) fail_transfer(is_write, offset, bytes, err_at, err);
  }

  io_uring ring_{};
  bool ring_open_ = false;
#endif

  std::string dir_;
  std::size_t capacity_ = 0;
  nvme_detail::FileDescriptor file_;
  bool direct_ = false;
  bool uring_ = false;
  std::unique_ptr<void, nvme_detail::FreeDeleter> staging_;
  std::size_t chunk_bytes_ = 0;
  Chunk chunk_[kMaxChunks];
};

}  // namespace frugal
