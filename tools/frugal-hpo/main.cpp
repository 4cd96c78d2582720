// frugal-hpo: asynchronous Bayesian search of hyperparameters, running any
// command that prints a JSON line (a frugal sample with --json) as trials on
// W workers at once (search.hpp has the Gaussian process and its numerics).
//
//   frugal-hpo --space SPACE.json --command 'TEMPLATE' --metric KEY [--maximize]
//              --trials N [--workers W] [--log LOG.jsonl] [--timeout S]
//              [--method gp|random] [--seed N] [--svg FILE] [--json]
//
// SPACE.json: {"lr": {"log_uniform": [1e-4, 0.1]}, "dropout": {"uniform": [0, 0.8]},
//              "hidden": {"integer": [8, 128]}, "act": {"choice": ["relu", "gelu"]}}
// TEMPLATE: a shell command; {name} is replaced by the trial's value of that
// hyperparameter, {trial} by the trial's number. A launcher goes in the
// template too ('mpirun -np 2 build/samples/gpt ... --lr {lr} --json').
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <frugal/core/json.hpp>

#include "search.hpp"

using namespace frugal;
using namespace frugal::hpo;

namespace {

void usage(std::FILE* f) {
  std::fprintf(f,
               "usage: frugal-hpo --space SPACE.json --command 'TEMPLATE' --metric KEY [--maximize] --trials N\n"
               "                  [--workers W] [--log LOG.jsonl] [--timeout SECONDS] [--method gp|random]\n"
               "                  [--seed N] [--svg FILE] [--json]\n"
               "Searches hyperparameters by running TEMPLATE (a shell command; {name} becomes the trial's value,\n"
               "{trial} its number) as trials, W at once, each new one as soon as a worker is free. A trial's\n"
               "result is KEY in the last JSON line it prints (a frugal sample's --json line).\n"
               "SPACE.json: {\"lr\": {\"log_uniform\": [1e-4, 0.1]}, \"dropout\": {\"uniform\": [0, 0.8]},\n"
               "             \"hidden\": {\"integer\": [8, 128]}, \"act\": {\"choice\": [\"relu\", \"gelu\"]}}\n"
               "  --method gp      Gaussian process (Matern 5/2) + expected improvement, pending trials by\n"
               "                   constant liar (default); random: uniform random search\n"
               "  --log FILE       every finished trial, one JSON line each, rewritten atomically per trial;\n"
               "                   an existing log is resumed (default hpo.jsonl)\n"
               "  --timeout S      a trial running longer is killed and recorded as failed (default: none)\n"
               "  --svg FILE       the best value against trials\n"
               "  --json           a final JSON line: the best trial and its hyperparameters\n");
}

struct Param {
  std::string name;
  enum Kind { uniform, log_uniform, integer, choice } kind = uniform;
  double lo = 0, hi = 1;
  std::vector<std::string> choices;
};

std::vector<Param> parse_space(const Json& root, const std::string& where) {
  std::vector<Param> space;
  for (const auto& [name, spec] : root.members) {
    const std::string w = cat(where, ": '", name, "'");
    if (spec.kind != Json::Kind::object || spec.members.size() != 1)
      fail(w, ": expected one of {\"uniform\": [lo, hi]}, {\"log_uniform\": [lo, hi]}, {\"integer\": [lo, hi]}, {\"choice\": [...]}");
    const auto& [kind, range] = spec.members[0];
    Param p;
    p.name = name;
    if (range.kind != Json::Kind::array) fail(w, ": '", kind, "' takes an array");
    if (kind == "choice") {
      p.kind = Param::choice;
      for (const Json& c : range.items) {
        if (c.kind != Json::Kind::string && c.kind != Json::Kind::number) fail(w, ": a choice is a string or a number");
        p.choices.push_back(c.str);  // a number as written
      }
      if (p.choices.empty()) fail(w, ": a choice of nothing");
    } else {
      if (kind == "uniform") p.kind = Param::uniform;
      else if (kind == "log_uniform") p.kind = Param::log_uniform;
      else if (kind == "integer") p.kind = Param::integer;
      else fail(w, ": unknown kind '", kind, "' (uniform, log_uniform, integer, choice)");
      if (range.items.size() != 2 || range.items[0].kind != Json::Kind::number || range.items[1].kind != Json::Kind::number)
        fail(w, ": '", kind, "' takes [lo, hi], two numbers");
      p.lo = range.items[0].number, p.hi = range.items[1].number;
      if (!(p.lo < p.hi)) fail(w, ": lo must be below hi");
      if (p.kind == Param::log_uniform && !(p.lo > 0)) fail(w, ": a log_uniform range must be positive");
      if (p.kind == Param::integer && (p.lo != std::floor(p.lo) || p.hi != std::floor(p.hi)))
        fail(w, ": an integer range takes integers");
    }
    space.push_back(p);
  }
  if (space.empty()) fail(where, ": no hyperparameters");
  return space;
}

// A point of the unit cube as the command's text for each hyperparameter.
std::string value_text(const Param& p, double u) {
  u = std::clamp(u, 0.0, 1.0);
  char buf[64];
  switch (p.kind) {
    case Param::uniform: std::snprintf(buf, sizeof buf, "%.6g", p.lo + u * (p.hi - p.lo)); break;
    case Param::log_uniform: std::snprintf(buf, sizeof buf, "%.6g", std::exp(std::log(p.lo) + u * std::log(p.hi / p.lo))); break;
    case Param::integer:
      std::snprintf(buf, sizeof buf, "%lld", (long long)std::min(p.hi, std::floor(p.lo + u * (p.hi - p.lo + 1))));
      break;
    case Param::choice: return p.choices[std::min(p.choices.size() - 1, std::size_t(u * double(p.choices.size())))];
  }
  return buf;
}

std::string command_for(std::string t, const std::vector<Param>& space, const std::vector<double>& u, int trial) {
  auto replace = [&](const std::string& key, const std::string& value) {
    for (std::size_t at; (at = t.find(key)) != std::string::npos;) t.replace(at, key.size(), value);
  };
  for (std::size_t i = 0; i < space.size(); ++i) replace("{" + space[i].name + "}", value_text(space[i], u[i]));
  replace("{trial}", std::to_string(trial));
  return t;
}

struct Trial {
  int number = 0;
  std::vector<double> unit;
  std::string status;  // ok, failed, timeout
  double value = 0;
  double seconds = 0;
  std::string command, reason;
};

std::string record(const Trial& t, const std::vector<Param>& space) {
  std::ostringstream o;
  o.precision(17);
  o << "{\"trial\":" << t.number << ",\"status\":\"" << t.status << "\"";
  if (t.status == "ok") o << ",\"value\":" << t.value;
  o << ",\"seconds\":" << t.seconds << ",\"unit\":[";
  for (std::size_t i = 0; i < t.unit.size(); ++i) o << (i ? "," : "") << t.unit[i];
  o << "],\"params\":{";
  for (std::size_t i = 0; i < space.size(); ++i)
    o << (i ? "," : "") << "\"" << json_escape(space[i].name) << "\":\"" << json_escape(value_text(space[i], t.unit[i])) << "\"";
  o << "},\"command\":\"" << json_escape(t.command) << "\"";
  if (!t.reason.empty()) o << ",\"reason\":\"" << json_escape(t.reason) << "\"";
  o << "}";
  return o.str();
}

// The whole log, written to a temporary file, synced and renamed over the
// old one: a kill at any moment leaves the previous log or the new one.
void write_log(const std::string& path, const std::vector<std::string>& lines) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) fail("frugal-hpo: cannot write '", tmp, "'");
  std::string all;
  for (const auto& l : lines) all += l + "\n";
  const bool ok = ::write(fd, all.data(), all.size()) == ssize_t(all.size()) && ::fsync(fd) == 0;
  ::close(fd);
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) fail("frugal-hpo: cannot write the log '", path, "' (disk full?)");
}

std::vector<Trial> read_log(const std::string& path, const std::vector<Param>& space) {
  std::vector<Trial> trials;
  std::ifstream f(path);
  std::string line;
  for (int n = 1; std::getline(f, line); ++n) {
    if (line.empty()) continue;
    const std::string w = cat(path, ": line ", n);
    const Json j = parse_json_object(line, w);
    Trial t;
    const Json* num = j.find("trial");
    const Json* status = j.find("status");
    const Json* unit = j.find("unit");
    if (!num || !num->is_integer || !status || status->kind != Json::Kind::string || !unit || unit->items.size() != space.size())
      fail(w, ": not a trial of this search space (give another --log, or the same --space)");
    t.number = int(num->integer);
    t.status = status->str;
    for (const Json& u : unit->items) t.unit.push_back(u.number);
    if (const Json* v = j.find("value"); v && t.status == "ok") t.value = v->number;
    if (const Json* c = j.find("command")) t.command = c->str;
    if (const Json* s = j.find("seconds")) t.seconds = s->number;
    if (const Json* r = j.find("reason")) t.reason = r->str;
    trials.push_back(t);
  }
  return trials;
}

// KEY in the last JSON line of a trial's output.
std::optional<double> metric_of(const std::string& output_file, const std::string& key, std::string& reason) {
  std::ifstream f(output_file);
  std::string line;
  std::optional<double> found;
  bool any = false;
  while (std::getline(f, line)) {
    const std::size_t at = line.find('{');
    if (at == std::string::npos) continue;
    try {
      const Json j = parse_json_object(std::string_view(line).substr(at), "trial output");
      any = true;
      const Json* v = j.find(key);
      found = v && v->kind == Json::Kind::number && std::isfinite(v->number) ? std::optional<double>(v->number) : std::nullopt;
    } catch (const std::exception&) {
    }
  }
  if (!found) reason = any ? cat("its last JSON line has no finite number '", key, "'") : "it printed no JSON line";
  return found;
}

// The trial with the best value, or none where every one failed.
const Trial* best_of(const std::vector<Trial>& trials, bool maximize) {
  const Trial* best = nullptr;
  for (const Trial& t : trials)
    if (t.status == "ok" && (!best || (maximize ? t.value > best->value : t.value < best->value))) best = &t;
  return best;
}

// The best value after each trial; none before the first that succeeded.
std::vector<std::optional<double>> best_so_far(const std::vector<Trial>& trials, bool maximize) {
  std::vector<std::optional<double>> best;
  std::optional<double> b;
  for (const Trial& t : trials) {
    if (t.status == "ok" && (!b || (maximize ? t.value > *b : t.value < *b))) b = t.value;
    best.push_back(b);
  }
  return best;
}

std::string svg_best(const std::vector<Trial>& trials, bool maximize, const std::string& metric) {
  std::vector<double> best;
  for (const auto& b : best_so_far(trials, maximize))
    if (b) best.push_back(*b);
  std::ostringstream s;
  const double w = 600, h = 300, left = 60, bottom = 30;
  s << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << w + left + 20 << "\" height=\"" << h + bottom + 20
    << "\" font-family=\"sans-serif\" font-size=\"11\">\n";
  if (!best.empty()) {
    const double lo = *std::min_element(best.begin(), best.end()), hi = *std::max_element(best.begin(), best.end());
    const double span = hi > lo ? hi - lo : 1;
    s << "<text x=\"4\" y=\"14\">best " << json_escape(metric) << " against trials: " << best.front() << " to "
      << best.back() << "</text>\n<polyline fill=\"none\" stroke=\"#5b9bd5\" stroke-width=\"2\" points=\"";
    for (std::size_t i = 0; i < best.size(); ++i)
      s << left + w * double(i) / double(std::max<std::size_t>(best.size() - 1, 1)) << ","
        << 20 + h * (1 - (best[i] - lo) / span) << " ";
    s << "\"/>\n";
  }
  s << "</svg>\n";
  return s.str();
}

}  // namespace

int main(int argc, char** argv) {
  std::string space_file, command, metric, log = "hpo.jsonl", method = "gp", svg;
  int trials = 0, workers = 1;
  double timeout = 0;
  std::uint64_t seed = 1;
  bool maximize = false, json = false;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string k = argv[i];
      auto value = [&]() -> std::string {
        if (i + 1 >= argc) fail("frugal-hpo: ", k, " needs a value");
        return argv[++i];
      };
      if (k == "--help" || k == "-h") {
        usage(stdout);
        return 0;
      } else if (k == "--space") space_file = value();
      else if (k == "--command") command = value();
      else if (k == "--metric") metric = value();
      else if (k == "--maximize") maximize = true;
      else if (k == "--trials") trials = std::stoi(value());
      else if (k == "--workers") workers = std::stoi(value());
      else if (k == "--log") log = value();
      else if (k == "--timeout") timeout = std::stod(value());
      else if (k == "--method") method = value();
      else if (k == "--seed") seed = std::stoull(value());
      else if (k == "--svg") svg = value();
      else if (k == "--json") json = true;
      else fail("frugal-hpo: unknown argument '", k, "' (--help lists them)");
    }
    if (space_file.empty() || command.empty() || metric.empty() || trials < 1) {
      usage(stderr);
      return 2;
    }
    if (workers < 1) fail("frugal-hpo: --workers must be at least 1");
    if (method != "gp" && method != "random") fail("frugal-hpo: --method must be gp or random, got '", method, "'");
    std::ifstream sf(space_file);
    if (!sf) fail("frugal-hpo: cannot read '", space_file, "'");
    std::stringstream ss;
    ss << sf.rdbuf();
    const std::vector<Param> space = parse_space(parse_json_object(ss.str(), space_file), space_file);

    std::vector<Trial> done = std::filesystem::exists(log) ? read_log(log, space) : std::vector<Trial>{};
    std::vector<std::string> lines;
    for (const Trial& t : done) lines.push_back(record(t, space));
    if (!done.empty()) std::fprintf(stderr, "frugal-hpo: resuming %s: %zu trials already run\n", log.c_str(), done.size());
    const std::string work = log + ".out";
    std::filesystem::create_directories(work);

    struct Running {
      Trial t;
      std::string out;
      std::chrono::steady_clock::time_point start;
    };
    std::map<pid_t, Running> running;
    int next = done.empty() ? 0 : done.back().number + 1;
    for (const Trial& t : done) next = std::max(next, t.number + 1);
    using clock = std::chrono::steady_clock;
    auto launch = [&] {
      std::vector<std::vector<double>> x, pending;
      std::vector<double> y;
      for (const Trial& t : done)
        if (t.status == "ok") x.push_back(t.unit), y.push_back(maximize ? -t.value : t.value);
      for (const auto& [pid, r] : running) pending.push_back(r.t.unit);
      Rng rng(seed, 1000 + std::uint64_t(next));
      Trial t;
      t.number = next++;
      if (method == "gp") {
        t.unit = suggest(x, y, pending, space.size(), rng);
      } else {
        for (std::size_t i = 0; i < space.size(); ++i) t.unit.push_back(rng.uniform());
      }
      t.command = command_for(command, space, t.unit, t.number);
      // Per search process: a trial left running by a killed search may
      // still be writing the file its number had then.
      const std::string out = cat(work, "/trial-", t.number, "-", ::getpid(), ".txt");
      std::fflush(nullptr);
      const pid_t pid = ::fork();
      if (pid < 0) fail("frugal-hpo: fork failed");
      if (pid == 0) {
        ::setpgid(0, 0);
        ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // the trial's shell dies with the search
        const int fd = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) ::dup2(fd, 1), ::dup2(fd, 2);
        ::execl("/bin/sh", "sh", "-c", t.command.c_str(), (char*)nullptr);
        ::_exit(127);
      }
      ::setpgid(pid, pid);
      running[pid] = {t, out, clock::now()};
    };
    auto report = [&](const Trial& t) {
      const Trial* best = best_of(done, maximize);
      if (t.status == "ok")
        std::fprintf(stderr, "trial %d: %s %.6g (best %.6g, trial %d) in %.1f s: %s\n", t.number, metric.c_str(), t.value,
                     best->value, best->number, t.seconds, t.command.c_str());
      else
        std::fprintf(stderr, "trial %d: %s (%s) in %.1f s: %s\n", t.number, t.status.c_str(), t.reason.c_str(), t.seconds,
                     t.command.c_str());
    };
    while (int(done.size()) < trials || !running.empty()) {
      while (int(done.size() + running.size()) < trials && int(running.size()) < workers) launch();
      int status = 0;
      const pid_t pid = ::waitpid(-1, &status, WNOHANG);
      if (pid > 0 && running.count(pid)) {
        Running r = std::move(running[pid]);
        running.erase(pid);
        Trial t = r.t;
        t.seconds = std::chrono::duration<double>(clock::now() - r.start).count();
        if (t.status.empty()) {
          if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
            const auto v = metric_of(r.out, metric, t.reason);
            t.status = v ? "ok" : "failed";
            if (v) t.value = *v;
          } else {
            t.status = "failed";
            t.reason = WIFSIGNALED(status) ? cat("killed by signal ", WTERMSIG(status))
                                           : cat("exit status ", WEXITSTATUS(status), " (its output: ", r.out, ")");
          }
        }
        done.push_back(t);
        lines.push_back(record(t, space));
        write_log(log, lines);
        report(t);
        continue;
      }
      if (timeout > 0)
        for (auto& [p, r] : running)
          if (r.t.status.empty() && std::chrono::duration<double>(clock::now() - r.start).count() > timeout) {
            ::kill(-p, SIGKILL);
            r.t.status = "timeout";
            r.t.reason = cat("over the --timeout of ", timeout, " s");
          }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    const Trial* best = best_of(done, maximize);
    int failed = 0;
    for (const Trial& d : done) failed += d.status != "ok";
    if (!svg.empty()) {
      std::ofstream f(svg);
      f << svg_best(done, maximize, metric);
    }
    if (!best) fail("frugal-hpo: all ", done.size(), " trials failed; the first said: ", done.front().reason);
    std::fprintf(stderr, "best %s %.6g at trial %d of %zu (%d failed): %s\n", metric.c_str(), best->value, best->number,
                 done.size(), failed, best->command.c_str());
    if (json) {
      std::ostringstream o;
      o.precision(10);
      o << "{\"metric\":\"" << json_escape(metric) << "\",\"best_value\":" << best->value << ",\"best_trial\":" << best->number
        << ",\"trials\":" << done.size() << ",\"failed\":" << failed << ",\"method\":\"" << method << "\",\"best_params\":{";
      for (std::size_t i = 0; i < space.size(); ++i)
        o << (i ? "," : "") << "\"" << json_escape(space[i].name) << "\":\"" << json_escape(value_text(space[i], best->unit[i]))
          << "\"";
      o << "},\"best_so_far\":[";
      const auto curve = best_so_far(done, maximize);
      for (std::size_t i = 0; i < curve.size(); ++i) {
        o << (i ? "," : "");
        if (curve[i]) o << *curve[i];
        else o << "null";  // no trial has succeeded yet
      }
      o << "]}";
      std::cout << o.str() << "\n";
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
