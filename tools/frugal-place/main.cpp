// frugal-place: jobs onto servers, least energy cost plus lateness penalty
// (placement.hpp has the model and the solvers).
//
//   frugal-place JOBS.json [--solver anneal|greedy|exact] [--seed N] [--iterations N]
//                          [--compare] [--json] [--svg FILE]
//   frugal-place --random JOBS,SERVERS[,step|linear|exponential[,MAX_DEVICES]] [...]
//
// A job in JOBS.json may name a plan instead of its memory and time:
// {"name": "gpt", "plan": "gpt.plan.json", "steps": 20000, "deadline": ...},
// the file `frugal-plan ... --budget B --json` wrote: its "total_bytes" are the job's
// memory, steps x "predicted_step_ms" its seconds (relative paths are from
// JOBS.json's folder).
#include <charconv>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "placement.hpp"

using namespace frugal;
using namespace frugal::place;

namespace {

void usage(std::FILE* f) {
  std::fprintf(f,
               "usage: frugal-place JOBS.json [--solver anneal|greedy|exact] [--seed N] [--iterations N]\n"
               "                              [--compare] [--json] [--svg FILE]\n"
               "       frugal-place --random JOBS,SERVERS[,step|linear|exponential[,MAX_DEVICES]] [same options]\n"
               "               (a seeded random instance: --seed; servers of 1 to MAX_DEVICES (8) devices)\n"
               "Assigns jobs to the devices of servers, and orders them, for the least energy cost plus\n"
               "lateness penalty. JOBS.json: {\"price_per_kwh\": 0.3, \"servers\": [{\"name\", \"devices\",\n"
               "\"memory\", \"speed\", \"idle_watts\", \"busy_watts\"}], \"jobs\": [{\"name\", \"memory\" or\n"
               "\"plan\" + \"steps\", \"seconds\", \"deadline\", \"penalty\": \"step|linear|exponential\", \"weight\",\n"
               "\"scale\"}]}. Memory: bytes or a size such as \"24GiB\". Times in seconds from the start.\n"
               "  --solver     anneal (default: simulated annealing from the greedy answer), greedy\n"
               "               (earliest deadline first onto the device that finishes it first), exact\n"
               "               (every assignment; devices^jobs at most 2e7)\n"
               "  --compare    also run the other solvers and print each one's cost\n"
               "  --seed N, --iterations N   annealing's seed (1) and move count (400 per job, >= 200000)\n"
               "  --json       one JSON line: the costs and every job's device, start and finish\n"
               "  --svg FILE   a Gantt chart: a row per device, late jobs in red\n");
}

std::string read_file(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) fail("frugal-place: cannot read '", p.string(), "'");
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Jobs that name a plan get their memory and seconds from it.
Json with_plans(Json root, const std::filesystem::path& dir, const std::string& where) {
  const Json* jobs = root.find("jobs");
  if (!jobs || jobs->kind != Json::Kind::array) return root;
  for (auto& [key, value] : root.members) {
    if (key != "jobs") continue;
    for (std::size_t i = 0; i < value.items.size(); ++i) {
      Json& job = value.items[i];
      const Json* plan = job.find("plan");
      if (!plan) continue;
      const std::string w = cat(where, ": jobs[", i, "]");
      if (plan->kind != Json::Kind::string) fail(w, ": 'plan' must be a path");
      const std::filesystem::path path = std::filesystem::path(plan->str).is_absolute() ? std::filesystem::path(plan->str) : dir / plan->str;
      // Two top-level numbers of the plan's JSON, read by key: the plan
      // writes null where it searched nothing, which the strict reader
      // (core/json.hpp) refuses, and nothing else in it is needed here.
      const std::string text = read_file(path);
      auto number_of = [&](const std::string& key) {
        const std::string tag = "\"" + key + "\":";
        const std::size_t at = text.find(tag);
        double v = 0;
        if (at == std::string::npos ||
            std::from_chars(text.data() + at + tag.size(), text.data() + text.size(), v).ec != std::errc())
          fail(path.string(), ": not the JSON of `frugal-plan --budget ... --json` (no number for '", key,
               "'; the predicted step time is there only with a budget)");
        return v;
      };
      const double total = number_of("total_bytes"), ms = number_of("predicted_step_ms");
      const Json* steps = job.find("steps");
      if (!steps || !steps->is_integer || steps->integer == 0) fail(w, ": a job with a plan needs 'steps', a positive integer");
      if (job.find("memory") || job.find("seconds")) fail(w, ": give 'plan' or 'memory' and 'seconds', not both");
      Json memory = Json::at(Json::Kind::number, plan->pos), seconds = memory;
      memory.number = total;
      memory.is_integer = true;
      memory.integer = std::uint64_t(total);
      memory.str = std::to_string(memory.integer);
      seconds.number = ms * double(steps->integer) / 1000.0;
      seconds.str = std::to_string(seconds.number);
      job.members.push_back({"memory", memory});
      job.members.push_back({"seconds", seconds});
    }
  }
  return root;
}

std::string svg_gantt(const Instance& in, const Assignment& a, const Evaluation& e) {
  const std::vector<Device> dev = devices_of(in);
  const double row = 18, left = 110, width = 900;
  double end = e.horizon;
  for (const Job& j : in.jobs) end = std::max(end, j.deadline);
  end = std::max(end, 1e-9);
  const double height = row * double(dev.size()) + 40;
  std::ostringstream s;
  s << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << left + width + 20 << "\" height=\"" << height
    << "\" font-family=\"sans-serif\" font-size=\"10\">\n";
  s << "<text x=\"4\" y=\"14\">cost " << e.cost << " (energy " << e.energy_cost << ", penalty " << e.penalty
    << "), horizon " << e.horizon << " s; late jobs in red, deadlines as ticks</text>\n";
  for (std::size_t d = 0; d < dev.size(); ++d) {
    const double y = 24 + row * double(d);
    s << "<text x=\"4\" y=\"" << y + 12 << "\">" << json_escape(in.servers[std::size_t(dev[d].server)].name) << " #"
      << dev[d].index << "</text>\n";
    for (int j : a.order[d]) {
      const Job& job = in.jobs[std::size_t(j)];
      const double x0 = left + width * e.start[std::size_t(j)] / end, x1 = left + width * e.finish[std::size_t(j)] / end;
      const bool late = e.finish[std::size_t(j)] > job.deadline;
      s << "<rect x=\"" << x0 << "\" y=\"" << y << "\" width=\"" << std::max(x1 - x0, 0.5) << "\" height=\"" << row - 4
        << "\" fill=\"" << (late ? "#d9534f" : "#5b9bd5") << "\" stroke=\"white\"><title>" << json_escape(job.name)
        << ": " << e.start[std::size_t(j)] << "-" << e.finish[std::size_t(j)] << " s, deadline " << job.deadline
        << "</title></rect>\n";
      const double xd = left + width * job.deadline / end;
      s << "<line x1=\"" << xd << "\" x2=\"" << xd << "\" y1=\"" << y + row - 4 << "\" y2=\"" << y + row - 1
        << "\" stroke=\"black\"/>\n";
    }
  }
  s << "</svg>\n";
  return s.str();
}

}  // namespace

int main(int argc, char** argv) {
  std::string file, random, solver = "anneal", svg;
  AnnealOptions ao;
  bool json = false, compare = false;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string k = argv[i];
      auto value = [&]() -> std::string {
        if (i + 1 >= argc) fail("frugal-place: ", k, " needs a value");
        return argv[++i];
      };
      if (k == "--help" || k == "-h") {
        usage(stdout);
        return 0;
      } else if (k == "--random") random = value();
      else if (k == "--solver") solver = value();
      else if (k == "--seed") ao.seed = std::stoull(value());
      else if (k == "--iterations") ao.iterations = std::stoll(value());
      else if (k == "--json") json = true;
      else if (k == "--compare") compare = true;
      else if (k == "--svg") svg = value();
      else if (!k.empty() && k[0] == '-') fail("frugal-place: unknown option ", k, " (--help lists them)");
      else file = k;
    }
    if (file.empty() == random.empty()) {
      usage(stderr);
      return 2;
    }
    if (solver != "anneal" && solver != "greedy" && solver != "exact")
      fail("frugal-place: --solver must be anneal, greedy or exact, got '", solver, "'");
    Instance in;
    if (!random.empty()) {
      int jobs = 0, servers = 0, max_devices = 8;
      char kind[32] = "linear";
      if (std::sscanf(random.c_str(), "%d,%d,%31[a-z],%d", &jobs, &servers, kind, &max_devices) < 2 || jobs < 1 ||
          servers < 1 || max_devices < 1)
        fail("frugal-place: --random takes JOBS,SERVERS[,KIND[,MAX_DEVICES]], got '", random, "'");
      const std::string k = kind;
      const Penalty p = k == "step" ? Penalty::step : k == "exponential" ? Penalty::exponential : Penalty::linear;
      if (k != "step" && k != "linear" && k != "exponential") fail("frugal-place: unknown penalty kind '", k, "'");
      in = random_instance(jobs, servers, p, ao.seed, max_devices);
    } else {
      const std::filesystem::path path(file);
      in = parse_instance(with_plans(parse_json_object(read_file(path), file), path.parent_path(), file), file);
    }
    using clock = std::chrono::steady_clock;
    auto timed = [&](auto&& fn) {
      const auto t0 = clock::now();
      auto r = fn();
      return std::pair{std::move(r), std::chrono::duration<double>(clock::now() - t0).count()};
    };
    const auto [greedy_answer, greedy_s] = timed([&] { return greedy(in); });
    const double greedy_cost = evaluate(in, greedy_answer).cost;
    std::optional<double> anneal_cost, exact_cost;
    double anneal_s = 0, exact_s = 0;
    Assignment chosen = greedy_answer;
    double seconds = greedy_s;
    if (solver == "anneal" || compare) {
      auto [r, s] = timed([&] { return anneal(in, greedy_answer, ao); });
      anneal_cost = r.best_cost, anneal_s = s + greedy_s;
      if (solver == "anneal") chosen = r.best, seconds = anneal_s;
    }
    if (solver == "exact" || compare) {
      auto [r, s] = timed([&] { return exact(in); });
      if (r) {
        exact_cost = evaluate(in, *r).cost, exact_s = s;
        if (solver == "exact") chosen = *r, seconds = s;
      } else if (solver == "exact") {
        fail("frugal-place: exact search is for small instances (devices^jobs at most 2e7); this one has ",
             devices_of(in).size(), " devices and ", in.jobs.size(), " jobs: use --solver anneal");
      }
    }
    const Evaluation e = evaluate(in, chosen);
    const std::vector<Device> dev = devices_of(in);
    if (!svg.empty()) {
      std::ofstream f(svg);
      f << svg_gantt(in, chosen, e);
      if (!f) fail("frugal-place: cannot write '", svg, "'");
    }
    if (json) {
      std::ostringstream o;
      o.precision(10);
      o << "{\"solver\":\"" << solver << "\",\"jobs_count\":" << in.jobs.size() << ",\"devices\":" << dev.size()
        << ",\"cost\":" << e.cost << ",\"energy_kwh\":" << e.joules / 3.6e6 << ",\"energy_cost\":" << e.energy_cost
        << ",\"penalty\":" << e.penalty << ",\"horizon_s\":" << e.horizon << ",\"solve_s\":" << seconds
        << ",\"greedy_cost\":" << greedy_cost << ",\"greedy_s\":" << greedy_s;
      if (anneal_cost) o << ",\"anneal_cost\":" << *anneal_cost << ",\"anneal_s\":" << anneal_s;
      if (exact_cost) o << ",\"exact_cost\":" << *exact_cost << ",\"exact_s\":" << exact_s;
      o << ",\"jobs\":[";
      for (std::size_t j = 0; j < in.jobs.size(); ++j) {
        const Device& d = dev[std::size_t(e.device_of[j])];
        o << (j ? "," : "") << "{\"name\":\"" << json_escape(in.jobs[j].name) << "\",\"server\":\""
          << json_escape(in.servers[std::size_t(d.server)].name) << "\",\"device\":" << d.index
          << ",\"start\":" << e.start[j] << ",\"finish\":" << e.finish[j] << ",\"deadline\":" << in.jobs[j].deadline
          << ",\"penalty\":" << penalty_of(in.jobs[j], e.finish[j]) << "}";
      }
      o << "]}";
      std::cout << o.str() << "\n";
      return 0;
    }
    std::printf("%zu jobs on %zu devices of %zu servers, solver %s (%.3f s)\n", in.jobs.size(), dev.size(),
                in.servers.size(), solver.c_str(), seconds);
    std::printf("cost %.6g = energy %.6g (%.6g kWh at %.6g per kWh) + penalty %.6g; the last job ends at %.1f s\n", e.cost,
                e.energy_cost, e.joules / 3.6e6, in.price_per_kwh, e.penalty, e.horizon);
    if (compare) {
      std::printf("greedy %.6g", greedy_cost);
      if (anneal_cost) std::printf(", annealing %.6g (%.3f s)", *anneal_cost, anneal_s);
      if (exact_cost) {
        // Below a billionth: the same assignment, summed in another order.
        const double gap = anneal_cost ? 100 * (*anneal_cost / *exact_cost - 1) : 0.0;
        std::printf(", exact %.6g (%.3f s): annealing is %.3g%% above it", *exact_cost, exact_s, gap < 1e-7 ? 0.0 : gap);
      }
      else std::printf(", exact: too large to search");
      std::printf("\n");
    }
    for (std::size_t d = 0; d < dev.size(); ++d) {
      if (chosen.order[d].empty()) continue;
      std::printf("%s #%d:", in.servers[std::size_t(dev[d].server)].name.c_str(), dev[d].index);
      for (int j : chosen.order[d]) {
        const Job& job = in.jobs[std::size_t(j)];
        const double late = e.finish[std::size_t(j)] - job.deadline;
        std::printf(" %s [%.0f-%.0f%s]", job.name.c_str(), e.start[std::size_t(j)], e.finish[std::size_t(j)],
                    late > 0 ? cat(", ", late, " s late").c_str() : "");
      }
      std::printf("\n");
    }
    return 0;
  } catch (const std::exception& ex) {
    std::fprintf(stderr, "%s\n", ex.what());
    return 1;
  }
}
