#pragma once
// Character-level text for language models: the vocabulary is the sorted set
// of distinct bytes in the text (65 for Tiny Shakespeare), and a training
// batch is B random windows of T+1 characters (inputs and next-character
// targets), drawn from a stream keyed by (seed, step) so a resumed run draws
// the same batches.
#include <algorithm>
#include <array>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "../core/error.hpp"
#include "../core/rng.hpp"
#include "../core/tensor.hpp"

namespace frugal::data {

class CharVocab {
 public:
  CharVocab() = default;
  // The distinct bytes of `text`, in byte order.
  explicit CharVocab(const std::string& text) {
    std::array<bool, 256> seen{};
    for (unsigned char c : text) seen[c] = true;
    for (int c = 0; c < 256; ++c)
      if (seen[std::size_t(c)]) chars_.push_back(char(c));
    index_.fill(-1);
    for (std::size_t i = 0; i < chars_.size(); ++i) index_[static_cast<unsigned char>(chars_[i])] = int(i);
  }
  std::int64_t size() const { return std::int64_t(chars_.size()); }
  const std::string& chars() const { return chars_; }
  std::int32_t encode(char c) const {
    int i = index_[static_cast<unsigned char>(c)];
    if (i < 0) fail<DataError>("CharVocab: character ", int(static_cast<unsigned char>(c)), " is not in the vocabulary");
    return i;
  }
  std::vector<std::int32_t> encode(const std::string& s) const {
    std::vector<std::int32_t> out;
    out.reserve(s.size());
    for (char c : s) out.push_back(encode(c));
    return out;
  }
  char decode(std::int64_t id) const {
    if (id < 0 || id >= size()) fail<DataError>("CharVocab: id ", id, " is outside [0, ", size(), ")");
    return chars_[std::size_t(id)];
  }

 private:
  std::string chars_;
  std::array<int, 256> index_{};
};

inline std::string read_text_file(const std::filesystem::path& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail<DataError>("cannot open text file ", path.string());
  std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (s.empty()) fail<DataError>(path.string(), ": the file is empty");
  return s;
}

// A token stream split into a training head and a validation tail (the last
// `val_fraction`, as nanoGPT splits Tiny Shakespeare 90/10).
struct TokenSplit {
  std::vector<std::int32_t> train, val;
};
inline TokenSplit split_tokens(std::vector<std::int32_t> all, double val_fraction) {
  if (!(val_fraction > 0 && val_fraction < 1))
    fail("split_tokens: the validation fraction must lie in (0, 1), got ", val_fraction);
  auto n_train = std::size_t(double(all.size()) * (1 - val_fraction));
  TokenSplit s;
  s.val.assign(all.begin() + std::ptrdiff_t(n_train), all.end());
  all.resize(n_train);
  s.train = std::move(all);
  return s;
}

// Fills x and y (i32 [B, T]) with B windows of `tokens`: y is x shifted by one.
// Window b of draw `draw` starts at a position from Philox(seed) at counter
// (draw, b), so batches depend only on (seed, draw), not on what came before.
inline void random_windows(const std::vector<std::int32_t>& tokens, std::uint64_t seed, std::uint64_t draw, Tensor& x,
                           Tensor& y) {
  const std::int64_t B = x.shape()[0], T = x.shape()[1];
  if (std::int64_t(tokens.size()) < T + 2)
    fail<DataError>("random_windows: ", tokens.size(), " tokens are too few for windows of ", T + 1);
  const std::uint64_t span = tokens.size() - std::size_t(T) - 1;
  Philox ph(seed);
  auto* xd = x.data<std::int32_t>();
  auto* yd = y.data<std::int32_t>();
  for (std::int64_t b = 0; b < B; ++b) {
    auto blk = ph(draw, std::uint64_t(b));
    std::uint64_t r = (std::uint64_t(blk.v[0]) << 32) | blk.v[1];
    std::size_t start = std::size_t(r % span);
    std::copy_n(tokens.begin() + std::ptrdiff_t(start), T, xd + b * T);
    std::copy_n(tokens.begin() + std::ptrdiff_t(start) + 1, T, yd + b * T);
  }
}

}  // namespace frugal::data
