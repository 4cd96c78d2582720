#pragma once
// Training progress for people: on a terminal, one bar redrawn in place
// (step/total, loss, throughput, device memory against the budget, ETA);
// otherwise plain lines every few steps, which logs and CI keep readable.
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>

#include <frugal/frugal.hpp>

namespace samples {

inline std::string format_duration(double seconds) {
  if (!(seconds >= 0) || seconds > 1e7) return "--:--";
  long s = long(seconds + 0.5);
  char buf[32];
  if (s >= 3600) std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", s / 3600, (s / 60) % 60, s % 60);
  else std::snprintf(buf, sizeof buf, "%ld:%02ld", s / 60, s % 60);
  return buf;
}

class Progress {
 public:
  // `unit`: what throughput counts ("img", "tok", "graph"); `per_step`: how
  // many of them one step processes.
  Progress(std::FILE* out, std::int64_t first, std::int64_t total, std::string unit, double per_step,
           std::size_t budget_bytes, std::int64_t log_every)
      : out_(out),
        tty_(isatty(fileno(out)) != 0),
        first_(first),
        total_(total),
        unit_(std::move(unit)),
        per_step_(per_step),
        budget_(budget_bytes),
        log_every_(log_every > 0 ? log_every : std::max<std::int64_t>(1, (total - first) / 20)),
        start_(Clock::now()),
        last_draw_(start_) {}

  // After step `step` (0-based) finished with this loss and device bytes in use.
  void update(std::int64_t step, double loss, std::size_t device_bytes) {
    const auto now = Clock::now();
    const std::int64_t done = step + 1 - first_;
    const double elapsed = seconds(start_, now);
    const double rate = elapsed > 0 ? double(done) / elapsed : 0;  // steps per second
    const double eta = rate > 0 ? double(total_ - step - 1) / rate : -1;
    smoothed_ = done == 1 ? loss : 0.9 * smoothed_ + 0.1 * loss;
    const bool last = step + 1 == total_;
    if (tty_) {
      if (!last && seconds(last_draw_, now) < 0.1) return;  // at most ten redraws a second
      last_draw_ = now;
      const int width = 24;
      const int filled = int(double(width) * double(step + 1) / double(std::max<std::int64_t>(total_, 1)));
      std::string bar(std::size_t(filled), '=');
      if (filled < width) bar += '>';
      bar.resize(std::size_t(width), ' ');
      std::fprintf(out_, "\r\033[K[%s] %lld/%lld  loss %.4f  %s %s/s  mem %s  ETA %s", bar.c_str(),
                   static_cast<long long>(step + 1), static_cast<long long>(total_), smoothed_,
                   rate_text(rate).c_str(), unit_.c_str(), memory_text(device_bytes).c_str(),
                   format_duration(eta).c_str());
      if (last) std::fputc('\n', out_);
    } else {
      if (!last && done % log_every_ != 0) return;
      std::fprintf(out_, "step %lld/%lld  loss %.4f  %s %s/s  mem %s  elapsed %s  ETA %s\n",
                   static_cast<long long>(step + 1), static_cast<long long>(total_), smoothed_,
                   rate_text(rate).c_str(), unit_.c_str(), memory_text(device_bytes).c_str(),
                   format_duration(elapsed).c_str(), format_duration(eta).c_str());
    }
    std::fflush(out_);
  }

  // A line of its own (an evaluation result) without breaking the bar.
  void note(const std::string& line) {
    if (tty_) std::fprintf(out_, "\r\033[K");
    std::fprintf(out_, "%s\n", line.c_str());
    std::fflush(out_);
  }

 private:
  using Clock = std::chrono::steady_clock;
  static double seconds(Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double>(b - a).count();
  }
  std::string rate_text(double steps_per_s) const {
    char buf[32];
    double r = steps_per_s * per_step_;
    if (r >= 1e4) std::snprintf(buf, sizeof buf, "%.1fk", r / 1e3);
    else std::snprintf(buf, sizeof buf, "%.0f", r);
    return buf;
  }
  std::string memory_text(std::size_t bytes) const {
    std::string s = frugal::format_bytes(bytes);
    if (budget_) s += " / " + frugal::format_bytes(budget_);
    return s;
  }

  std::FILE* out_;
  bool tty_;
  std::int64_t first_, total_;
  std::string unit_;
  double per_step_;
  std::size_t budget_;
  std::int64_t log_every_;
  Clock::time_point start_, last_draw_;
  double smoothed_ = 0;
};

}  // namespace samples
