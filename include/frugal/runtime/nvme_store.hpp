#pragma once
// STUB
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>
namespace frugal {
class NvmeStore {
 public:
  static constexpr std::size_t kAlignment = 4096;
  NvmeStore(const std::string&, std::size_t bytes, std::size_t = 0) : mem_(bytes + 4096) {}
  void write(std::uint64_t off, const void* src, std::size_t n) { std::memcpy(mem_.data() + off, src, n); }
  void read(std::uint64_t off, void* dst, std::size_t n) { std::memcpy(dst, mem_.data() + off, n); }
  const char* engine() const { return "stub"; }
 private:
  std::vector<char> mem_;
};
}
