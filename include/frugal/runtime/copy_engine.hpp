#pragma once
// STUB: synchronous
#include <cstring>
#include "nvme_store.hpp"
namespace frugal {
class CopyEngine {
 public:
  explicit CopyEngine(std::size_t) {}
  void copy(std::size_t, void* d, const void* s, std::size_t n) { std::memcpy(d, s, n); }
  void write_nvme(std::size_t, NvmeStore& st, std::uint64_t off, const void* s, std::size_t n) { st.write(off, s, n); }
  void read_nvme(std::size_t, NvmeStore& st, std::uint64_t off, void* d, std::size_t n) { st.read(off, d, n); }
  void wait(std::size_t) {}
  void drain() {}
  void reset_error() {}
};
}
