#pragma once
// A plan explained: a text summary, one JSON object for scripts, and an SVG
// memory timeline (values as rectangles of offset x time).
#include <algorithm>
#include <cstdio>
#include <map>
#include <sstream>

#include "../core/json.hpp"
#include "../core/xml.hpp"
#include "plan.hpp"

namespace frugal::plan {

// Where the bytes of a buffer belong, for the categories people ask about.
inline std::string category_of(const Graph& g, ValueId v) {
  const Value& val = g.value(v);
  if (is_persistent(val.kind)) return persistent_category(val.kind);
  if (val.kind == ValueKind::input) return "inputs";
  if (val.is_workspace) return g.node(val.producer).op->is_collective() ? "communication" : "workspace";
  switch (g.node(val.producer).phase) {
    case Phase::forward: return "activations";
    case Phase::backward: return "gradients";
    case Phase::optimizer: return "optimizer state";
  }
  return "activations";
}

inline const std::vector<std::string>& categories() {
  static const std::vector<std::string> c{"parameters", "gradients", "optimizer state", "buffers", "constants",
                                          "activations", "inputs", "workspace", "communication"};
  return c;
}

inline std::string describe_value(const Graph& g, ValueId v) {
  const Value& val = g.value(v);
  if (val.producer < 0) return cat(value_kind_name(val.kind), " '", val.name, "' ", val.meta.str());
  const Node& n = g.node(val.producer);
  if (auto* t = n.op->as_transfer())  // a budget plan's copy: say of what
    return cat(t->name(), " (", phase_name(n.phase), ") of ", t->what());
  return cat(n.op->name(), " (", phase_name(n.phase), ") ", val.meta.str());
}

struct Breakdown {
  std::map<std::string, std::size_t> bytes;  // at the peak, by category
  std::vector<std::size_t> live;             // buffers live at the peak, largest first
  std::size_t total = 0;
};

inline Breakdown at_peak(const Graph& g, const Plan& p) {
  Breakdown b;
  for (auto& c : categories()) b.bytes[c] = 0;
  for (auto& [k, v] : p.persistent_by_kind) b.bytes[k] += v;
  for (std::size_t i = 0; i < p.intervals.size(); ++i) {
    const auto& iv = p.intervals[i];
    if (iv.first <= p.peak_position && p.peak_position <= iv.last) {
      b.bytes[category_of(g, iv.value)] += iv.bytes;
      b.live.push_back(i);
    }
  }
  std::sort(b.live.begin(), b.live.end(),
            [&](std::size_t x, std::size_t y) { return p.intervals[x].bytes > p.intervals[y].bytes; });
  for (auto& [_, v] : b.bytes) b.total += v;
  return b;
}

// The first position of the backward in a schedule, or -1 where it has none.
inline int backward_start(const Graph& g, const std::vector<NodeId>& schedule) {
  for (std::size_t t = 0; t < schedule.size(); ++t)
    if (g.node(schedule[t]).phase == Phase::backward) return int(t);
  return -1;
}

// Activations the forward leaves for the backward: arena bytes of forward
// values live where the backward starts. What torch.utils.checkpoint
// minimises, and what PlanOptions::least_saved_activations lowers; 0 for a
// step with no backward.
inline std::size_t saved_for_backward_bytes(const Graph& g, const Plan& p) {
  const int at = backward_start(g, p.schedule);
  if (at < 0) return 0;
  std::size_t bytes = 0;
  for (const auto& iv : p.intervals) {
    const Value& v = g.value(iv.value);
    if (v.kind == ValueKind::activation && v.producer >= 0 && g.node(v.producer).phase == Phase::forward &&
        iv.first < at && at <= iv.last)
      bytes += iv.bytes;
  }
  return bytes;
}

// The budget solve's outcome: what it fits in, what it decided and why.
inline std::string budget_summary(const Graph& g, const Plan& p, std::size_t show = 12) {
  std::ostringstream os;
  char ms[64];
  std::snprintf(ms, sizeof ms, "%.2f", p.predicted_step_ms);
  // min_feasible_bytes is 0 when the budget did not bind: then nothing was
  // evicted and the least the step could run in was not searched for.
  os << "budget " << format_bytes(p.budget_bytes) << ": the step needs " << format_bytes(p.total_bytes())
     << " on the device (unconstrained " << format_bytes(p.unconstrained_bytes) << ", "
     << (p.min_feasible_bytes ? "smallest feasible " + format_bytes(p.min_feasible_bytes)
                              : std::string("the budget does not bind, so the smallest feasible budget was not searched for"))
     << "), predicted " << ms << " ms per step\n";
  if (!p.priced_with.empty()) os << "  priced with " << p.priced_with << "\n";
  if (p.least_memory_fallback)
    os << "  no priced plan fit the budget: the least-memory plan, less the evictions the budget does not need\n";
  if (p.zero_stage >= 0) os << "  ZeRO stage " << p.zero_stage << ": " << p.zero_reason << "\n";
  if (!p.collectives.empty()) os << "  collectives: " << p.collectives << "\n";
  if (!p.optimizer_offload.empty()) os << "  optimizer offload: " << p.optimizer_offload << "\n";
  if (p.decisions.empty()) return os.str();
  os << "  decisions: " << p.count(Choice::recompute) << " recompute, " << p.count(Choice::host) << " swap to host, "
     << p.count(Choice::nvme) << " spill to NVMe, " << p.count(Choice::host_update) << " update on the host, "
     << p.count(Choice::nvme_home) << " live on NVMe";
  if (p.offloaded_bytes) os << "; " << format_bytes(p.offloaded_bytes) << " of parameters/state live on the host";
  if (p.nvme_home_bytes) os << "; " << format_bytes(p.nvme_home_bytes) << " of parameters/state live on NVMe";
  os << "\n  host pool " << format_bytes(p.host_bytes) << ", NVMe " << format_bytes(p.nvme_bytes) << "\n";
  std::vector<std::size_t> order(p.decisions.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return p.decisions[a].bytes > p.decisions[b].bytes; });
  for (std::size_t k = 0; k < order.size() && k < show; ++k) {
    const auto& d = p.decisions[order[k]];
    os << "    " << format_bytes(d.bytes) << "  " << describe_value(g, d.value) << ": " << d.reason << "\n";
  }
  if (order.size() > show) os << "    ... and " << order.size() - show << " more\n";
  return os.str();
}

// " (parameters 1.2 MiB, optimizer state 2.3 MiB)": what the persistent
// bytes are, so a ZeRO stage's shard of the state shows.
inline std::string persistent_parts(const Plan& p) {
  std::string s;
  for (auto& [kind, bytes] : p.persistent_by_kind)
    if (bytes) s += cat(s.empty() ? " (" : ", ", kind, " ", format_bytes(bytes));
  return s.empty() ? s : s + ")";
}

inline std::string summary(const Graph& g, const Plan& p, std::size_t show_live = 8) {
  std::map<Phase, int> ops;
  for (NodeId n : p.schedule) ++ops[g.node(n).phase];
  Breakdown b = at_peak(g, p);
  std::ostringstream os;
  char ratio[32];
  std::snprintf(ratio, sizeof ratio, "%.3f", p.arena_ratio());
  os << "plan: " << p.schedule.size() << " ops (" << ops[Phase::forward] << " forward, " << ops[Phase::backward]
     << " backward, " << ops[Phase::optimizer] << " optimizer), " << p.intervals.size() << " arena buffers\n"
     << "  arena peak   " << format_bytes(p.peak_bytes) << "  (reserved " << format_bytes(p.arena_bytes)
     << "; live-bytes lower bound " << format_bytes(p.lower_bound_bytes) << ", ratio " << ratio << ")\n"
     << "  persistent   " << format_bytes(p.persistent_bytes) << persistent_parts(p) << "\n"
     << "  total        " << format_bytes(p.total_bytes()) << "\n"
     << "  at the peak (position " << p.peak_position << " of " << p.schedule.size() << "), by category:\n";
  for (auto& c : categories()) os << "    " << c << std::string(17 - c.size(), ' ') << format_bytes(b.bytes[c]) << "\n";
  os << "  live at the peak, largest first:\n";
  for (std::size_t k = 0; k < b.live.size() && k < show_live; ++k) {
    const auto& iv = p.intervals[b.live[k]];
    os << "    " << format_bytes(iv.bytes) << std::string(12 - std::min<std::size_t>(11, format_bytes(iv.bytes).size()), ' ')
       << describe_value(g, iv.value) << ", live " << iv.first << ".." << iv.last << "\n";
  }
  if (b.live.size() > show_live) os << "    ... and " << b.live.size() - show_live << " more\n";
  if (p.budget_bytes) os << budget_summary(g, p);
  else {
    if (p.zero_stage >= 0) os << "  ZeRO stage " << p.zero_stage << ": " << p.zero_reason << "\n";
    if (!p.collectives.empty()) os << "  collectives: " << p.collectives << "\n";
    if (!p.optimizer_offload.empty()) os << "  optimizer offload: " << p.optimizer_offload << "\n";
  }
  return os.str();
}

inline std::string json(const Graph& g, const Plan& p, const std::string& model) {
  Breakdown b = at_peak(g, p);
  std::ostringstream os;
  os << "{\"model\":\"" << json_escape(model) << "\",\"ops\":" << p.schedule.size()
     << ",\"buffers\":" << p.intervals.size() << ",\"peak_bytes\":" << p.peak_bytes
     << ",\"lower_bound_bytes\":" << p.lower_bound_bytes << ",\"arena_bytes\":" << p.arena_bytes
     << ",\"arena_ratio\":" << p.arena_ratio() << ",\"persistent_bytes\":" << p.persistent_bytes
     << ",\"total_bytes\":" << p.total_bytes() << ",\"peak_position\":" << p.peak_position << ",\"by_category\":{";
  bool first = true;
  for (auto& c : categories()) {
    os << (first ? "" : ",") << "\"" << c << "\":" << b.bytes[c];
    first = false;
  }
  os << "},\"live_at_peak\":[";
  for (std::size_t k = 0; k < b.live.size(); ++k) {
    const auto& iv = p.intervals[b.live[k]];
    os << (k ? "," : "") << "{\"bytes\":" << iv.bytes << ",\"category\":\"" << category_of(g, iv.value)
       << "\",\"what\":\"" << json_escape(describe_value(g, iv.value)) << "\",\"first\":" << iv.first
       << ",\"last\":" << iv.last << "}";
  }
  os << "],\"fused_chains\":" << p.fused_chains << ",\"fused_away_bytes\":" << p.fused_away_bytes
     << ",\"saved_for_backward_bytes\":" << saved_for_backward_bytes(g, p);
  if (p.zero_stage >= 0)
    os << ",\"zero_stage\":" << p.zero_stage << ",\"zero_reason\":\"" << json_escape(p.zero_reason) << "\"";
  if (!p.collectives.empty()) os << ",\"collectives\":\"" << json_escape(p.collectives) << "\"";
  if (!p.optimizer_offload.empty()) os << ",\"optimizer_offload\":\"" << json_escape(p.optimizer_offload) << "\"";
  if (p.budget_bytes) {
    os << ",\"budget_bytes\":" << p.budget_bytes << ",\"min_feasible_bytes\":"  // null: not searched (the budget does not bind)
       << (p.min_feasible_bytes ? std::to_string(p.min_feasible_bytes) : std::string("null"))
       << ",\"unconstrained_bytes\":" << p.unconstrained_bytes << ",\"predicted_step_ms\":" << p.predicted_step_ms
       << ",\"priced_with\":\"" << json_escape(p.priced_with) << "\""
       << ",\"host_bytes\":" << p.host_bytes << ",\"nvme_bytes\":" << p.nvme_bytes
       << ",\"offloaded_bytes\":" << p.offloaded_bytes << ",\"nvme_home_bytes\":" << p.nvme_home_bytes
       << ",\"nvme_home_slots\":" << p.nvme_home_slots << ",\"decision_counts\":{\"recompute\":"
       << p.count(Choice::recompute) << ",\"swap_host\":" << p.count(Choice::host)
       << ",\"spill_nvme\":" << p.count(Choice::nvme) << ",\"update_on_host\":" << p.count(Choice::host_update)
       << ",\"nvme_home\":" << p.count(Choice::nvme_home) << "},\"decisions\":[";
    for (std::size_t k = 0; k < p.decisions.size(); ++k) {
      const auto& d = p.decisions[k];
      os << (k ? "," : "") << "{\"what\":\"" << json_escape(describe_value(g, d.value)) << "\",\"choice\":\""
         << choice_name(d.choice) << "\",\"bytes\":" << d.bytes << ",\"from\":" << d.from << ",\"to\":" << d.to
         << ",\"between_steps\":" << (d.wraps ? "true" : "false") << ",\"cost_ms\":" << d.cost_ms
         << ",\"reason\":\"" << json_escape(d.reason) << "\"}";
    }
    os << "]";
  }
  os << "}";
  return os.str();
}

inline const char* category_colour(const std::string& c) {
  if (c == "activations") return "#4e79a7";
  if (c == "gradients") return "#e15759";
  if (c == "inputs") return "#59a14f";
  if (c == "optimizer state") return "#f28e2b";
  if (c == "parameters") return "#9c755f";
  if (c == "buffers") return "#edc948";
  if (c == "constants") return "#76b7b2";
  if (c == "communication") return "#b07aa1";
  return "#bab0ac";
}

// The arena over time: x is the schedule position, y the arena offset.
inline std::string svg(const Graph& g, const Plan& p, const std::string& title) {
  const double W = 1000, H = 560, left = 80, right = 190, top = 50, bottom = 50;
  const double pw = W - left - right, ph = H - top - bottom;
  const double steps = double(std::max<std::size_t>(p.schedule.size(), 1));
  const double bytes = double(std::max<std::size_t>(p.arena_bytes, 1));
  auto X = [&](double t) { return left + pw * t / steps; };
  auto Y = [&](double b) { return top + ph - ph * b / bytes; };
  std::ostringstream os;
  os.precision(6);
  os << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << H
     << "\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
     << "<text x=\"" << left << "\" y=\"22\" font-size=\"16\" font-weight=\"bold\">" << xml_escape(title)
     << "</text>\n<text x=\"" << left << "\" y=\"40\">arena " << format_bytes(p.arena_bytes) << ", peak "
     << format_bytes(p.peak_bytes) << ", lower bound " << format_bytes(p.lower_bound_bytes) << ", persistent "
     << format_bytes(p.persistent_bytes) << "</text>\n"
     << "<rect x=\"" << left << "\" y=\"" << top << "\" width=\"" << pw << "\" height=\"" << ph
     << "\" fill=\"#f7f7f7\" stroke=\"#999\"/>\n";
  for (std::size_t i = 0; i < p.intervals.size(); ++i) {
    const auto& iv = p.intervals[i];
    std::string c = category_of(g, iv.value);
    double x0 = X(iv.first), x1 = X(iv.last + 1), y0 = Y(double(p.offsets[i] + iv.bytes)), y1 = Y(double(p.offsets[i]));
    os << "<rect x=\"" << x0 << "\" y=\"" << y0 << "\" width=\"" << std::max(x1 - x0, 0.5) << "\" height=\""
       << std::max(y1 - y0, 0.5) << "\" fill=\"" << category_colour(c)
       << "\" fill-opacity=\"0.85\" stroke=\"white\" stroke-width=\"0.3\"><title>"
       << xml_escape(describe_value(g, iv.value)) << ": " << format_bytes(iv.bytes) << " at offset " << p.offsets[i]
       << ", positions " << iv.first << ".." << iv.last << "</title></rect>\n";
  }
  // Budget decisions along the time axis: transfers (evictions and fetches)
  // and recomputations, as ticks under the arena.
  for (std::size_t t = 0; t < p.schedule.size(); ++t) {
    const Node& n = g.node(p.schedule[t]);
    const char* colour = nullptr;
    std::string what;
    if (auto* tr = n.op->as_transfer()) {
      if (!tr->is_start()) continue;
      bool nvme = false;
      for (ValueId v : n.inputs) nvme = nvme || g.value(v).kind == ValueKind::nvme;
      for (ValueId v : n.outputs) nvme = nvme || g.value(v).kind == ValueKind::nvme;
      colour = nvme ? "#8c564b" : "#b07aa1";
      what = tr->name() + " " + tr->what();
    } else if (p.original_nodes && p.schedule[t] >= p.original_nodes && !n.op->is_view()) {
      colour = "#2ca02c";
      what = "recompute " + n.op->name();
    }
    if (!colour) continue;
    os << "<rect x=\"" << X(double(t)) << "\" y=\"" << top + ph + 4 << "\" width=\"" << std::max(X(1) - X(0), 1.0)
       << "\" height=\"8\" fill=\"" << colour << "\"><title>" << xml_escape(what) << "</title></rect>\n";
  }
  // The peak: where the most bytes are live, and the highest byte written.
  os << "<line x1=\"" << X(p.peak_position + 0.5) << "\" y1=\"" << top << "\" x2=\"" << X(p.peak_position + 0.5)
     << "\" y2=\"" << top + ph << "\" stroke=\"black\" stroke-dasharray=\"4 3\"/>\n"
     << "<text x=\"" << X(p.peak_position + 0.5) + 4 << "\" y=\"" << top + 14 << "\">peak: "
     << format_bytes(p.lower_bound_bytes) << " live</text>\n"
     << "<line x1=\"" << left << "\" y1=\"" << Y(double(p.peak_bytes)) << "\" x2=\"" << left + pw << "\" y2=\""
     << Y(double(p.peak_bytes)) << "\" stroke=\"#d00\" stroke-dasharray=\"2 2\"/>\n";
  // Axes.
  for (int k = 0; k <= 4; ++k) {
    double b = bytes * k / 4;
    os << "<text x=\"" << left - 6 << "\" y=\"" << Y(b) + 4 << "\" text-anchor=\"end\">"
       << format_bytes(std::size_t(b)) << "</text>\n";
  }
  os << "<text x=\"" << left + pw / 2 << "\" y=\"" << H - 14 << "\" text-anchor=\"middle\">schedule position ("
     << p.schedule.size() << " ops: forward, backward, optimizer)</text>\n"
     << "<text x=\"16\" y=\"" << top + ph / 2 << "\" transform=\"rotate(-90 16 " << top + ph / 2
     << ")\" text-anchor=\"middle\">arena offset</text>\n";
  double ly = top + 10;
  for (auto& c : categories()) {
    os << "<rect x=\"" << left + pw + 16 << "\" y=\"" << ly << "\" width=\"14\" height=\"14\" fill=\""
       << category_colour(c) << "\"/><text x=\"" << left + pw + 36 << "\" y=\"" << ly + 11 << "\">" << xml_escape(c)
       << "</text>\n";
    ly += 22;
  }
  os << "<line x1=\"" << left + pw + 16 << "\" y1=\"" << ly + 7 << "\" x2=\"" << left + pw + 30 << "\" y2=\""
     << ly + 7 << "\" stroke=\"#d00\" stroke-dasharray=\"2 2\"/><text x=\"" << left + pw + 36 << "\" y=\"" << ly + 11
     << "\">highest byte written</text>\n";
  if (!p.decisions.empty()) {
    const std::pair<const char*, const char*> marks[] = {
        {"#b07aa1", "host transfer"}, {"#8c564b", "NVMe transfer"}, {"#2ca02c", "recompute"}};
    for (auto [colour, label] : marks) {
      ly += 22;
      os << "<rect x=\"" << left + pw + 16 << "\" y=\"" << ly + 3 << "\" width=\"14\" height=\"8\" fill=\"" << colour
         << "\"/><text x=\"" << left + pw + 36 << "\" y=\"" << ly + 11 << "\">" << label << "</text>\n";
    }
  }
  os << "</svg>\n";
  return os.str();
}

// One row per rank of a data-parallel job (plan_training with a
// communicator for each rank): where each rank's device bytes go, and what
// it keeps on the host and NVMe.
struct RankRow {
  std::size_t parameters = 0, optimizer_state = 0, gradients = 0, activations = 0, scratch = 0, communication = 0,
              total = 0, host = 0, nvme = 0;
  std::size_t host_state = 0, host_parameters = 0;  // of host: optimizer state (offloaded) and parameters
  std::size_t nvme_state = 0, nvme_parameters = 0;  // living on NVMe between steps (Plan::nvme_home_slots each in `nvme`)
  int zero_stage = -1;
};
template <class PlannedSteps>
std::vector<RankRow> rank_rows(const PlannedSteps& steps) {
  std::vector<RankRow> rows;
  for (const auto& s : steps) {
    const Plan& p = s.plan;
    Breakdown b = at_peak(*s.graph, p);
    RankRow r;
    r.parameters = b.bytes["parameters"];
    r.optimizer_state = b.bytes["optimizer state"];
    r.gradients = b.bytes["gradients"];
    r.activations = b.bytes["activations"] + b.bytes["inputs"];
    r.scratch = b.bytes["workspace"] + b.bytes["buffers"] + b.bytes["constants"];
    r.communication = b.bytes["communication"];
    r.total = p.total_bytes();
    r.host = p.host_bytes + p.offloaded_bytes;
    auto on_host = [&](const char* kind) {
      auto it = p.offloaded_by_kind.find(kind);
      return it == p.offloaded_by_kind.end() ? std::size_t(0) : it->second;
    };
    r.host_state = on_host("optimizer state");
    r.host_parameters = on_host("parameters");
    r.nvme = p.nvme_bytes;
    auto on_nvme = [&](const char* kind) {
      auto it = p.nvme_home_by_kind.find(kind);
      return it == p.nvme_home_by_kind.end() ? std::size_t(0) : it->second;
    };
    r.nvme_state = on_nvme("optimizer state");
    r.nvme_parameters = on_nvme("parameters");
    r.zero_stage = p.zero_stage;
    rows.push_back(r);
  }
  return rows;
}
template <class PlannedSteps>
std::string ranks_table(const PlannedSteps& steps) {
  std::ostringstream os;
  os << "  rank  stage  parameters  optimizer state  gradients*  activations*  scratch*  communication*  device total"
        "  |  host  of it state  of it parameters  |  NVMe  of it state  of it parameters\n";
  auto rows = rank_rows(steps);
  for (std::size_t k = 0; k < rows.size(); ++k) {
    const RankRow& r = rows[k];
    char line[400];
    std::snprintf(line, sizeof line,
                  "  %4zu  %5d  %10s  %15s  %10s  %12s  %8s  %15s  %12s  |  %4s  %11s  %16s  |  %4s  %11s  %16s\n",
                  k, r.zero_stage,
                  format_bytes(r.parameters).c_str(), format_bytes(r.optimizer_state).c_str(),
                  format_bytes(r.gradients).c_str(), format_bytes(r.activations).c_str(), format_bytes(r.scratch).c_str(),
                  format_bytes(r.communication).c_str(), format_bytes(r.total).c_str(), format_bytes(r.host).c_str(),
                  format_bytes(r.host_state).c_str(), format_bytes(r.host_parameters).c_str(),
                  format_bytes(r.nvme).c_str(), format_bytes(r.nvme_state).c_str(),
                  format_bytes(r.nvme_parameters).c_str());
    os << line;
  }
  os << "  (* live at the rank's peak; the device total also counts the arena's packing; the host holds swapped\n"
        "   values, parameters staged from there, and optimizer state updated there; NVMe holds spilled values and\n"
     << (!steps.empty() && steps.front().plan.nvme_home_slots == 1
             ? "   one slot of each parameter and state living there between steps, written back in place)\n"
             : "   two slots of each parameter and state living there between steps)\n");
  if (!steps.empty() && steps.front().plan.zero_stage >= 0)
    os << "  rank 0: ZeRO stage " << steps.front().plan.zero_stage << ": " << steps.front().plan.zero_reason << "\n";
  if (!steps.empty() && !steps.front().plan.collectives.empty())
    os << "  rank 0: collectives " << steps.front().plan.collectives << "\n";
  if (!steps.empty() && !steps.front().plan.optimizer_offload.empty())
    os << "  rank 0: optimizer offload: " << steps.front().plan.optimizer_offload << "\n";
  return os.str();
}
template <class PlannedSteps>
std::string ranks_json(const PlannedSteps& steps, const std::string& model) {
  std::ostringstream os;
  os << "{\"model\":\"" << json_escape(model) << "\",\"ranks\":[";
  auto rows = rank_rows(steps);
  for (std::size_t k = 0; k < rows.size(); ++k) {
    const RankRow& r = rows[k];
    os << (k ? "," : "") << "{\"rank\":" << k << ",\"zero_stage\":" << r.zero_stage << ",\"parameters\":" << r.parameters
       << ",\"optimizer_state\":" << r.optimizer_state << ",\"gradients\":" << r.gradients
       << ",\"activations\":" << r.activations << ",\"scratch\":" << r.scratch << ",\"communication\":" << r.communication
       << ",\"device_total\":" << r.total << ",\"host\":" << r.host << ",\"host_optimizer_state\":" << r.host_state
       << ",\"host_parameters\":" << r.host_parameters << ",\"nvme\":" << r.nvme
       << ",\"nvme_optimizer_state\":" << r.nvme_state << ",\"nvme_parameters\":" << r.nvme_parameters
       << ",\"zero_reason\":\""
       << json_escape(steps[k].plan.zero_reason) << "\",\"collectives\":\"" << json_escape(steps[k].plan.collectives)
       << "\"}";
  }
  os << "]}";
  return os.str();
}

}  // namespace frugal::plan
