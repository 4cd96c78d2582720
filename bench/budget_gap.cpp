// How far the greedy budget solver lands from the optimum: problems shaped
// like a training step, 10 to 40 positions, each at budgets from the
// unconstrained peak down to the least feasible one, solved by the greedy
// (plan/budget_greedy.hpp) and exactly by GLPK (plan/budget_exact.hpp).
//
//   budget_gap [--positions 10,20,30,40] [--seeds N] [--levels N] [--time-limit S] [--stray-bytes N]
//   budget_gap --real [--exact-all] [--time-limit S] [--bound-nodes N] [--bound-rounds N] [--only NAME]
//                     [--write-mps DIR]
//
// --real runs compile's least-memory search on real captured steps against
// the row-generation lower bound (plan::least_memory_row_bound; --bound-nodes
// and --bound-rounds set its GLPK effort, 2000 nodes and 12 rounds by
// default) and, where built with CBC, CBC's bound from the answer found
// (plan::cbc_least_peak, 20,000 nodes; "(CBC)" where it proves the least to
// its tolerance, a millionth);
// "local search alone" is the search without CBC (what a build without CBC
// gets). --only runs the steps whose name contains NAME; --write-mps writes
// each step's least-peak integer program to DIR as free MPS for another
// solver.
//
// --stray-bytes adds up to N odd bytes to every activation, so that no row's
// bytes share a large common step (which makes GLPK's work harder).
//
// Gaps are the greedy's extra cost over the exact answer's, as a share of
// the exact answer's added cost and as a share of the whole predicted step.
#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <frugal/core/bytes.hpp>
#include <frugal/plan/budget_exact.hpp>
#include <frugal/plan/budget_least.hpp>
#include <frugal/plan/budget_solve.hpp>

#include "../tools/model_zoo.hpp"

using namespace frugal;
using plan::BudgetProblem;

namespace {

// The machine the costs are priced for: a GPU-class device behind PCIe 4.
struct Rates {
  double matmul_tflops = 40;  // sustained on the forward matmuls
  double memory_gbps = 1500;  // elementwise ops are bound by device memory traffic
  double host_gbps = 12;      // device <-> pinned host, each way
  double nvme_gbps = 3;       // host <-> NVMe
};

double transfer_ms(std::int64_t bytes, double gbps) { return double(bytes) / (gbps * 1e6); }

// A step of L layers; positions 0..L-1 run the forward ops, L..2L-1 the
// backward ones (layer k's at 2L-1-k, about twice its forward time). Layers
// alternate, as in a transformer or a ResNet, between matmul-like ones
// (heavy compute, keep only their input) and elementwise ones (norm,
// activation: cheap, keep their own output too). Layer k's output a_k is the
// next layer's input, needed again by layer k+1's backward; an elementwise
// layer also saves s_k for its own backward. A saved value between its last
// forward use and its backward use may be kept, swapped to host (freed once
// the copy out has run beside the window's ops, back when the fetch starts;
// costs what the window's compute cannot hide), recomputed (freed over the
// whole window; costs the producer's forward time and needs the producer's
// input kept, not itself evicted) or, on the larger values, spilled to NVMe.
BudgetProblem step_problem(int positions, std::uint64_t seed, int stray_bytes = 0, const Rates& rates = {}) {
  std::mt19937_64 rng(seed);
  auto uni = [&](double a, double b) { return std::uniform_real_distribution<double>(a, b)(rng); };
  const int L = positions / 2;
  BudgetProblem p;
  p.positions = 2 * L;
  p.op_ms.assign(std::size_t(p.positions), 0);
  const std::int64_t batch_rows = std::int64_t(1) << int(uni(12, 16));  // tokens or pixels per step
  const std::int64_t width = 256 * std::int64_t(uni(2, 9));
  const std::int64_t params = 2 * width * width * 4 * L;  // fp32 weights of the matmul layers
  p.base.assign(std::size_t(p.positions), 3 * params);  // weights, gradients, one optimizer state
  struct Value {
    std::int64_t bytes;
    int producer, last_forward, backward;
    int input;           // the candidate holding the producer's input, or -1
    int candidate = -1;  // its index among the candidates, when it has an idle window
  };
  std::vector<Value> values;
  int candidates = 0;
  auto add_value = [&](Value v) {
    if (v.backward - v.last_forward >= 2) v.candidate = candidates++;
    values.push_back(v);
    return v.candidate;
  };
  int output_candidate = -1;  // the previous layer's output, this layer's input
  for (int k = 0; k < L; ++k) {
    // Three kinds of layer: a matmul (some are 4x up-projections), an
    // attention-like mixing op (quadratic compute, a large saved output), and
    // an elementwise one (norm or activation: memory-bound, saves its output).
    const int kind = k % 3;
    const int mult = kind == 0 ? (uni(0, 1) < 0.3 ? 4 : 1) : kind == 1 ? int(uni(1, 3)) : 1;
    const std::int64_t act = batch_rows * width * 4 * mult + (stray_bytes > 0 ? std::int64_t(uni(0, stray_bytes)) : 0);
    const double fwd_ms = kind == 0   ? 2.0 * double(batch_rows) * double(width) * double(width * mult) / (rates.matmul_tflops * 1e9)
                          : kind == 1 ? 4.0 * double(batch_rows) * double(width) * uni(512, 4096) / (rates.matmul_tflops * 1e9)
                                      : 3.0 * double(act) / (rates.memory_gbps * 1e6);
    p.op_ms[std::size_t(k)] = fwd_ms;
    p.op_ms[std::size_t(2 * L - 1 - k)] = 2 * fwd_ms;
    p.base[std::size_t(k)] += act / 2;  // the running op's workspace
    const int input = output_candidate;
    output_candidate = k + 1 < L ? add_value({act, k, k + 1, 2 * L - 2 - k, input}) : -1;
    if (kind != 0) add_value({act, k, k, 2 * L - 1 - k, input});
  }
  std::int64_t saved_bytes = 0;
  for (const Value& val : values) {
    for (int t = val.producer; t <= val.backward; ++t) p.base[std::size_t(t)] += val.bytes;
    if (val.candidate < 0) continue;
    saved_bytes += val.bytes;
    plan::Candidate c;
    c.bytes = std::size_t(val.bytes);
    c.before = val.last_forward;
    c.after = val.backward;
    c.options.emplace_back();
    const plan::Span window{val.last_forward + 1, val.backward - 1};
    double window_ms = 0;
    for (int t = window.first; t <= window.last; ++t) window_ms += p.op_ms[std::size_t(t)];
    auto transfer = [&](plan::Choice kind, double copy_ms) {
      plan::Option o;
      o.choice = kind;
      int out = window.first;
      for (double done = 0; out <= window.last && done < copy_ms; ++out) done += p.op_ms[std::size_t(out)];
      int in = window.last + 1;
      for (double done = 0; in > window.first && done < copy_ms;) done += p.op_ms[std::size_t(--in)];
      o.out_done = out;
      o.in_start = in;
      o.cost_ms = std::max(0.0, 2 * copy_ms - window_ms) + 0.02;  // plus launch and event overhead
      if (out <= in - 1) o.device.push_back({{out, in - 1}, -val.bytes});
      (kind == plan::Choice::host ? o.host : o.nvme).push_back({window, val.bytes});
      std::ostringstream why;
      why << plan::choice_name(kind) << ": " << copy_ms << " ms each way against " << window_ms << " ms of compute";
      o.reason = why.str();
      return o;
    };
    c.options.push_back(transfer(plan::Choice::host, transfer_ms(val.bytes, rates.host_gbps)));
    plan::Option re;
    re.choice = plan::Choice::recompute;
    re.cost_ms = p.op_ms[std::size_t(val.producer)];
    re.device.push_back({window, -val.bytes});
    if (val.input >= 0) re.requires_.push_back({val.input, 1u});
    re.reason = "recompute: one forward op";
    c.options.push_back(re);
    if (val.bytes >= 64 * std::int64_t(1 << 20))
      c.options.push_back(transfer(plan::Choice::nvme, transfer_ms(val.bytes, rates.nvme_gbps) +
                                                           transfer_ms(val.bytes, rates.host_gbps)));
    p.candidates.push_back(std::move(c));
  }
  p.host_budget = std::max<std::int64_t>(1, saved_bytes / 2);  // the host pool holds half of what could be swapped
  return p;
}

double step_ms(const BudgetProblem& p) {
  double s = 0;
  for (double ms : p.op_ms) s += ms;
  return s;
}

struct Summary {
  std::vector<double> gap_extra, gap_step, exact_seconds;
  int rows = 0, greedy_infeasible = 0, not_optimal = 0;
  std::vector<std::string> least_rows;  // the least feasible budget, exact against greedy, per problem
  std::vector<double> least_ratio;      // greedy's least over the exact least
  std::vector<double> search_ratio;     // the least-memory local search's least over the exact least
  std::vector<double> search_bound_ratio, exact_bound_ratio;  // over least_memory_lower_bound
  int search_infeasible = 0;
};

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

void print_header() {
  std::printf("| problem | positions | candidates | budget | of peak | greedy ms | exact ms | gap (of added) | gap (of step) | exact s |\n");
  std::printf("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
}

// One row: `p` at `target`, solved both ways.
void gap_row(const std::string& source, const BudgetProblem& p, std::int64_t target, double time_limit_s, Summary& sum) {
  const std::int64_t peak = *std::max_element(p.base.begin(), p.base.end());
  plan::Solution greedy = plan::solve_greedy(p, target);
  plan::ExactResult exact = plan::solve_exact(p, target, time_limit_s);
  ++sum.rows;
  sum.exact_seconds.push_back(exact.seconds);
  if (!exact.optimal) ++sum.not_optimal;
  const double base_ms = step_ms(p);
  char greedy_ms[32], exact_ms[32], gap_a[32], gap_s[32];
  std::snprintf(greedy_ms, sizeof greedy_ms, greedy.feasible ? "%.3f" : "infeasible", greedy.eval.cost_ms);
  if (exact.solution.feasible)
    std::snprintf(exact_ms, sizeof exact_ms, "%.3f%s", exact.solution.eval.cost_ms, exact.optimal ? "" : " (not proved)");
  else
    std::snprintf(exact_ms, sizeof exact_ms, "infeasible");
  std::snprintf(gap_a, sizeof gap_a, "-");
  std::snprintf(gap_s, sizeof gap_s, "-");
  if (greedy.feasible && exact.solution.feasible) {
    const double extra = greedy.eval.cost_ms - exact.solution.eval.cost_ms;
    const double of_step = 100 * extra / (base_ms + exact.solution.eval.cost_ms);
    sum.gap_step.push_back(of_step);
    std::snprintf(gap_s, sizeof gap_s, "%.2f%%", of_step);
    if (exact.solution.eval.cost_ms > 1e-9) {
      const double of_added = 100 * extra / exact.solution.eval.cost_ms;
      sum.gap_extra.push_back(of_added);
      std::snprintf(gap_a, sizeof gap_a, "%.1f%%", of_added);
    } else if (extra <= 1e-9) {
      sum.gap_extra.push_back(0);
      std::snprintf(gap_a, sizeof gap_a, "0.0%%");
    }
  } else if (exact.solution.feasible) {
    ++sum.greedy_infeasible;
  }
  std::printf("| %s | %d | %zu | %s | %.2f | %s | %s | %s | %s | %.3f |\n", source.c_str(), p.positions, p.candidates.size(),
              format_bytes(std::size_t(target)).c_str(), double(target) / double(peak), greedy_ms, exact_ms, gap_a, gap_s,
              exact.seconds);
  std::fflush(stdout);
}

// Rows for `p` at `levels` budgets from its unconstrained peak down to its
// least feasible one. The hook for problems built from real graphs: once
// plan::build_budget_problem(...) exists, pass what it returns here, e.g.
//   gap_rows("gpt 2x64", plan::build_budget_problem(graph, plan, profile, budget), levels, limit, sum);
void gap_rows(const std::string& source, const BudgetProblem& p, int levels, double time_limit_s, Summary& sum) {
  const std::int64_t peak = *std::max_element(p.base.begin(), p.base.end());
  plan::ExactResult least = plan::solve_exact_min_memory(p, time_limit_s);
  if (!least.solution.feasible) {
    std::printf("| %s | %d | %zu | - | - | - | - | - | - | %.3f |  (%s)\n", source.c_str(), p.positions, p.candidates.size(),
                least.seconds, least.status.c_str());
    return;
  }
  const std::int64_t floor = least.solution.eval.device_peak;
  const plan::Solution greedy_least = plan::solve_min_memory(p);
  const std::int64_t greedy_floor = greedy_least.eval.device_peak;
  sum.least_ratio.push_back(double(greedy_floor) / double(floor));
  // What compile's least-memory search does on steps too large for the exact
  // solver (plan/budget_least.hpp), and the lower bound it is held to.
  const plan::Solution search = plan::least_memory_heuristic(p);
  const std::int64_t bound = plan::least_memory_lower_bound(p);
  sum.search_ratio.push_back(double(search.eval.device_peak) / double(floor));
  sum.search_bound_ratio.push_back(double(search.eval.device_peak) / double(bound));
  sum.exact_bound_ratio.push_back(double(floor) / double(bound));
  if (!search.feasible) ++sum.search_infeasible;
  char row[768];
  std::snprintf(row, sizeof row, "| %s | %d | %zu | %s | %s (%.2f)%s | %s (%.2f) | %.2f | %s | %.4f | %s | %.4f | %.3f |", source.c_str(),
                p.positions, p.candidates.size(), format_bytes(std::size_t(peak)).c_str(), format_bytes(std::size_t(floor)).c_str(),
                double(floor) / double(peak), least.optimal ? "" : " (not proved)", format_bytes(std::size_t(greedy_floor)).c_str(),
                double(greedy_floor) / double(peak), double(greedy_floor) / double(floor),
                format_bytes(std::size_t(search.eval.device_peak)).c_str(), double(search.eval.device_peak) / double(floor),
                format_bytes(std::size_t(bound)).c_str(), double(search.eval.device_peak) / double(bound), least.seconds);
  sum.least_rows.push_back(row);
  for (int l = 0; l < levels; ++l) {
    const double s = levels == 1 ? 0 : 1.0 - double(l) / double(levels - 1);  // 1: the peak, 0: the least
    gap_row(source, p, floor + std::int64_t(s * double(peak - floor)), time_limit_s, sum);
  }
}

// The least-memory search (plan/budget_least.hpp, what compile runs: reads
// no price) on the budget problems of real captured training steps, against
// the lower bound least_memory_lower_bound states, and against the exact
// least where the step is small enough for the exact solver.
struct RealStep {
  std::string name;
  zoo::Config cfg;
  std::size_t host = 0;
};

struct BoundEffort {
  int nodes = 2000, rounds = 12;
  std::string only;  // run the real steps whose name contains this
  std::string mps_dir;  // write each step's least-peak program here, for another solver
};

// The least-peak integer program (budget_ilp.hpp, every row) as a free-MPS
// file, so another MIP solver can check the gap: `cbc FILE solve`. Its peak
// column is in units of the model's peak_unit bytes, printed to stderr.
void write_mps(const plan::BudgetProblem& p, const std::string& dir, const std::string& name) {
#ifdef FRUGAL_HAVE_GLPK
  plan::detail::IlpModel m = plan::detail::build_ilp(p, 0, true);
  if (!m.infeasible.empty()) return;
  std::string file = name;
  for (char& c : file)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  file = dir + "/" + file + ".mps";
  glp_prob* lp = plan::detail::glpk_problem(m);
  if (glp_write_mps(lp, GLP_MPS_FILE, nullptr, file.c_str()) != 0) std::fprintf(stderr, "budget_gap: cannot write %s\n", file.c_str());
  else std::fprintf(stderr, "%s: peak unit %.0f bytes, floor %lld\n", file.c_str(), m.peak_unit, static_cast<long long>(m.peak_floor));
  glp_delete_prob(lp);
#else
  (void)p, (void)dir, (void)name;
  std::fprintf(stderr, "budget_gap: --write-mps needs GLPK\n");
#endif
}

void real_rows(double time_limit_s, bool exact_all, const BoundEffort& effort) {
  std::vector<RealStep> steps{
      {"mlp 2x32 (a 36-op step)", {.family = "mlp", .batch = 16, .layers = 1, .width = 32, .features = 16}},
      {"mlp 2x256", {.family = "mlp", .batch = 64, .layers = 2, .width = 256, .features = 128}},
      {"gpt 2x32", {.family = "gpt", .batch = 2, .layers = 2, .width = 32, .seq = 16, .heads = 2, .vocab = 64}},
      {"gpt 2x32, 64 KiB host", {.family = "gpt", .batch = 2, .layers = 2, .width = 32, .seq = 16, .heads = 2, .vocab = 64}, 64 << 10},
      {"gpt (frugal-plan's default)", {.family = "gpt"}},
      {"gpt default, 8 MiB host", {.family = "gpt"}, 8 << 20},
      {"gpt 4x128 seq 128 (the README's sample)", {.family = "gpt", .batch = 16, .layers = 4, .width = 128, .seq = 128, .heads = 4, .vocab = 65}},
      {"resnet 1x4 8px", {.family = "resnet", .batch = 2, .layers = 1, .width = 4, .image = 8}},
      {"resnet-20 batch 8", {.family = "resnet", .batch = 8, .layers = 3, .width = 16}},
      {"gcn 2x16", {.family = "gcn", .batch = 32, .layers = 2, .width = 16, .features = 16, .classes = 4}},
      {"gcn 2x64, 1 MiB host", {.family = "gcn", .batch = 512, .layers = 2, .width = 64, .features = 128}, 1 << 20},
  };
  std::printf("| step | positions | candidates | unconstrained | lower bound | least found (abstract) | found / bound | local search alone / bound | exact least | compile's smallest feasible (placed) | search s | bound s |\n");
  std::printf("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  std::vector<double> ratios;
  for (const RealStep& rs : steps) {
    if (!effort.only.empty() && rs.name.find(effort.only) == std::string::npos) continue;
    zoo::Workload w = zoo::make(rs.cfg);
    PlannedStep ps = zoo::plan(w);
    auto cm = std::make_shared<plan::CostModel>(DeviceProfile::defaults("cpu", 2));
    plan::PriceModel price = plan::prices_from(cm);
    const plan::Prices prices = plan::step_prices(price, *ps.graph, ps.plan.schedule);
    const Budget budget{.device = 1, .host = rs.host};
    auto built = plan::build_budget_problem(*ps.graph, ps.plan.schedule, ps.roots, budget, prices);
    const auto t0 = std::chrono::steady_clock::now();
    const plan::MemoryView view = plan::memory_view(built.problem);
    if (!effort.mps_dir.empty()) write_mps(view.problem, effort.mps_dir, rs.name);
    const plan::Solution least = plan::least_memory(view.problem);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const std::int64_t local = plan::least_memory_heuristic(view.problem).eval.device_peak;
    // The larger of the position-wise and linear-relaxation bound and the
    // row-generation bound (integer, some positions' rows at a time).
    const auto b0 = std::chrono::steady_clock::now();
    bool row_exact = false;
    std::int64_t bound = plan::least_memory_row_bound(view.problem, effort.nodes, effort.rounds, &row_exact);
    std::string exact = row_exact ? cat(bound, " (rows)") : "-";
    if (plan::kHaveCbc && !row_exact) {  // CBC's proof, from the answer found (20,000 nodes)
      const plan::CbcLeast c = plan::cbc_least_peak(view.problem, least, 20000, 600);
      bound = std::max(bound, c.bound);
      if (c.proved) exact = cat(c.solution.eval.device_peak, " (CBC)");
    }
    const double bound_secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - b0).count();
    if (!row_exact && (exact_all || built.problem.positions <= plan::kExactPositions)) {
      plan::ExactResult r = plan::solve_exact_min_memory(view.problem, time_limit_s);
      exact = r.solution.feasible ? cat(r.solution.eval.device_peak, r.optimal ? "" : " (not proved)") : r.status;
    }
    std::size_t placed = 0;
    try {
      placed = zoo::plan(w, Budget{.device = ps.plan.total_bytes() - 1, .host = rs.host}).plan.min_feasible_bytes;
    } catch (const BudgetError& e) {
      placed = e.smallest_feasible_bytes;
    }
    const double ratio = double(least.eval.device_peak) / double(std::max<std::int64_t>(bound, 1));
    ratios.push_back(ratio);
    std::printf("| %s | %d | %zu | %zu | %lld | %lld | %.4f | %.4f | %s | %zu | %.3f | %.1f |\n", rs.name.c_str(),
                built.problem.positions, built.problem.candidates.size(), ps.plan.total_bytes(),
                static_cast<long long>(bound), static_cast<long long>(least.eval.device_peak), ratio,
                double(local) / double(std::max<std::int64_t>(bound, 1)), exact.c_str(), placed, secs, bound_secs);
    std::fflush(stdout);
  }
  std::printf("\nLeast memory found over the lower bound on %zu real steps: median %.4f, max %.4f.\n", ratios.size(),
              median(ratios), *std::max_element(ratios.begin(), ratios.end()));
}

std::vector<int> parse_list(const std::string& s) {
  std::vector<int> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) out.push_back(std::stoi(item));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> sizes{10, 16, 20, 26, 30, 36, 40};
  int seeds = 2, levels = 6, stray_bytes = 0;
  double time_limit_s = 20;
  bool real = false, exact_all = false;
  BoundEffort effort;
  for (int i = 1; i < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--real" || a == "--exact-all") {
      (a == "--real" ? real : exact_all) = true;
      --i;
      continue;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "budget_gap: %s needs a value\n", a.c_str());
      return 2;
    }
    if (a == "--positions") sizes = parse_list(argv[i + 1]);
    else if (a == "--seeds") seeds = std::stoi(argv[i + 1]);
    else if (a == "--levels") levels = std::stoi(argv[i + 1]);
    else if (a == "--time-limit") time_limit_s = std::stod(argv[i + 1]);
    else if (a == "--stray-bytes") stray_bytes = std::stoi(argv[i + 1]);
    else if (a == "--bound-nodes") effort.nodes = std::stoi(argv[i + 1]);
    else if (a == "--bound-rounds") effort.rounds = std::stoi(argv[i + 1]);
    else if (a == "--only") effort.only = argv[i + 1];
    else if (a == "--write-mps") effort.mps_dir = argv[i + 1];
    else {
      std::fprintf(stderr, "budget_gap: unknown option '%s': use --real [--exact-all] [--time-limit S] [--bound-nodes N] [--bound-rounds N] [--only NAME] [--write-mps DIR], or --positions 10,20,40 --seeds N --levels N --time-limit S --stray-bytes N\n",
                   a.c_str());
      return 2;
    }
  }
  if (!plan::kExactSolverHasGlpk)
    std::fprintf(stderr, "budget_gap: built without GLPK; the exact answers come from exhaustive search (install libglpk-dev)\n");
  if (real) {
    real_rows(time_limit_s, exact_all, effort);
    return 0;
  }
  Summary sum;
  print_header();
  for (int n : sizes)
    for (int s = 1; s <= seeds; ++s) {
      const std::uint64_t seed = std::uint64_t(n) * 1000 + std::uint64_t(s);
      gap_rows("step seed " + std::to_string(seed), step_problem(n, seed, stray_bytes), levels, time_limit_s, sum);
    }
  std::printf("\n| problem | positions | candidates | unconstrained peak | least feasible, exact (of peak) | least reached by the greedy (of peak) | greedy / exact | least-memory search | search / exact | lower bound | search / bound | exact s |\n");
  std::printf("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  for (auto& row : sum.least_rows) std::printf("%s\n", row.c_str());
  std::vector<double> t = sum.exact_seconds;
  std::sort(t.begin(), t.end());
  std::printf("\n%d rows. Greedy gap to the optimum, share of the step: median %.2f%%, max %.2f%%; share of the added "
              "cost: median %.1f%%, max %.1f%%. Greedy infeasible where an answer exists: %d. Exact not proved optimal: %d. "
              "Exact solve time: median %.3f s, max %.3f s.\n",
              sum.rows, median(sum.gap_step), sum.gap_step.empty() ? 0 : *std::max_element(sum.gap_step.begin(), sum.gap_step.end()),
              median(sum.gap_extra), sum.gap_extra.empty() ? 0 : *std::max_element(sum.gap_extra.begin(), sum.gap_extra.end()),
              sum.greedy_infeasible, sum.not_optimal, median(t), t.empty() ? 0 : t.back());
  std::printf("The greedy's least memory over the exact least: median %.3f, max %.3f.\n", median(sum.least_ratio),
              sum.least_ratio.empty() ? 0 : *std::max_element(sum.least_ratio.begin(), sum.least_ratio.end()));
  auto max_of = [](const std::vector<double>& v) { return v.empty() ? 0 : *std::max_element(v.begin(), v.end()); };
  std::printf("The least-memory search (plan/budget_least.hpp, reading no price) over the exact least: median %.4f, max "
              "%.4f; over the lower bound: median %.4f, max %.4f (the exact least over the bound: median %.4f, max %.4f). "
              "It found nothing on %d problems.\n",
              median(sum.search_ratio), max_of(sum.search_ratio), median(sum.search_bound_ratio), max_of(sum.search_bound_ratio),
              median(sum.exact_bound_ratio), max_of(sum.exact_bound_ratio), sum.search_infeasible);
}
