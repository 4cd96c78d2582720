#pragma once
// The gpt samples' text when the data directory has none.
#include <cstdint>
#include <string>
#include <vector>

#include <frugal/frugal.hpp>

namespace samples {

// With no text file: sentences of made-up words from a fixed lexicon with a
// Markov chain between them, so there is structure to learn.
inline std::string generated_text(std::uint64_t seed, std::size_t bytes) {
  frugal::Rng r(seed, 17);
  std::vector<std::string> words;
  for (int w = 0; w < 60; ++w) {
    std::string s;
    int len = 2 + int(r.below(6));
    for (int c = 0; c < len; ++c) s += char('a' + r.below(26));
    words.push_back(s);
  }
  std::string text;
  std::size_t prev = 0;
  while (text.size() < bytes) {
    std::size_t next = r.uniform() < 0.7 ? (prev * 7 + 3) % words.size() : std::size_t(r.below(words.size()));
    text += words[next];
    text += r.uniform() < 0.12 ? ".\n" : " ";
    prev = next;
  }
  return text;
}

}  // namespace samples
