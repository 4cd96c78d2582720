#pragma once
// Evaluation arithmetic on the host, in double: the samples score the
// logits their evaluation steps return.
#include <algorithm>
#include <cmath>
#include <cstdint>

namespace samples {

// -log softmax(row)[label], computed stably.
inline double row_nll(const float* row, std::int64_t classes, std::int64_t label) {
  double m = row[0], s = 0;
  for (std::int64_t c = 1; c < classes; ++c) m = std::max(m, double(row[c]));
  for (std::int64_t c = 0; c < classes; ++c) s += std::exp(double(row[c]) - m);
  return m + std::log(s) - double(row[label]);
}

// Whether the row's largest logit is the label's.
inline bool row_correct(const float* row, std::int64_t classes, std::int64_t label) {
  return std::max_element(row, row + classes) - row == label;
}

}  // namespace samples
