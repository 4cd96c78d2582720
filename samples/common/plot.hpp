#pragma once
// The samples' --plot: one SVG with the loss curves (training loss per step,
// smoothed, and validation loss where it was measured) and device memory
// over one training step (the budgeted plan against the unconstrained one,
// with the budget and the measured peak).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <frugal/frugal.hpp>

namespace samples {

// Device bytes live at each schedule position: arena buffers plus the
// persistents the plan keeps on the device.
inline std::vector<double> device_bytes_per_position(const frugal::Plan& p) {
  std::vector<double> live(p.schedule.size() + 1, double(p.persistent_bytes));
  for (const auto& iv : p.intervals)
    for (int t = iv.first; t <= iv.last && t < int(live.size()); ++t) live[std::size_t(t)] += double(iv.bytes);
  return live;
}

struct PlotSeries {
  std::string label, colour;
  std::vector<double> x, y;
  bool dashed = false, points = false;
};

struct LossPlot {
  std::vector<float> train;                          // per step
  std::vector<std::pair<std::int64_t, double>> val;  // (step, loss)
  std::string metric_label = "validation loss";
};

struct MemoryPlot {
  std::vector<double> budgeted, unconstrained;  // per schedule position
  double budget = 0, measured = 0;
};

namespace plot_detail {
inline std::string num(double v) {
  std::ostringstream os;
  os.precision(5);
  os << v;
  return os.str();
}
// Draws series into the box (x0, y0, w, h) with axes from (xmin..xmax, ymin..ymax).
inline void panel(std::ostringstream& os, double x0, double y0, double w, double h, double xmin, double xmax,
                  double ymin, double ymax, const std::vector<PlotSeries>& series, const std::string& title,
                  const std::string& xlabel, bool bytes_axis) {
  if (xmax <= xmin) xmax = xmin + 1;
  if (ymax <= ymin) ymax = ymin + 1;
  auto X = [&](double x) { return x0 + w * (x - xmin) / (xmax - xmin); };
  auto Y = [&](double y) { return y0 + h - h * (y - ymin) / (ymax - ymin); };
  os << "<text x=\"" << x0 << "\" y=\"" << y0 - 10 << "\" font-size=\"14\" font-weight=\"bold\">"
     << frugal::xml_escape(title) << "</text>\n"
     << "<rect x=\"" << x0 << "\" y=\"" << y0 << "\" width=\"" << w << "\" height=\"" << h
     << "\" fill=\"#fafafa\" stroke=\"#999\"/>\n";
  for (int k = 0; k <= 4; ++k) {
    double v = ymin + (ymax - ymin) * k / 4;
    std::string label = bytes_axis ? frugal::format_bytes(std::size_t(std::max(v, 0.0))) : num(v);
    os << "<line x1=\"" << x0 << "\" x2=\"" << x0 + w << "\" y1=\"" << Y(v) << "\" y2=\"" << Y(v)
       << "\" stroke=\"#e4e4e4\"/><text x=\"" << x0 - 6 << "\" y=\"" << Y(v) + 4 << "\" text-anchor=\"end\">" << label
       << "</text>\n";
    double xv = xmin + (xmax - xmin) * k / 4;
    os << "<text x=\"" << X(xv) << "\" y=\"" << y0 + h + 16 << "\" text-anchor=\"middle\">" << num(std::round(xv))
       << "</text>\n";
  }
  os << "<text x=\"" << x0 + w / 2 << "\" y=\"" << y0 + h + 34 << "\" text-anchor=\"middle\">"
     << frugal::xml_escape(xlabel) << "</text>\n";
  double ly = y0 + 16;
  for (const PlotSeries& s : series) {
    if (s.x.empty()) continue;
    if (s.points) {
      for (std::size_t i = 0; i < s.x.size(); ++i)
        os << "<circle cx=\"" << X(s.x[i]) << "\" cy=\"" << Y(s.y[i]) << "\" r=\"3\" fill=\""
           << frugal::xml_escape(s.colour) << "\"/>\n";
    }
    if (s.x.size() > 1 || !s.points) {
      os << "<polyline fill=\"none\" stroke=\"" << frugal::xml_escape(s.colour) << "\" stroke-width=\"1.6\""
         << (s.dashed ? " stroke-dasharray=\"6 4\"" : "") << " points=\"";
      for (std::size_t i = 0; i < s.x.size(); ++i) os << X(s.x[i]) << "," << Y(std::clamp(s.y[i], ymin, ymax)) << " ";
      os << "\"/>\n";
    }
    os << "<line x1=\"" << x0 + w - 190 << "\" x2=\"" << x0 + w - 170 << "\" y1=\"" << ly - 4 << "\" y2=\"" << ly - 4
       << "\" stroke=\"" << frugal::xml_escape(s.colour) << "\" stroke-width=\"2\""
       << (s.dashed ? " stroke-dasharray=\"6 4\"" : "") << "/><text x=\"" << x0 + w - 164 << "\" y=\"" << ly << "\">"
       << frugal::xml_escape(s.label) << "</text>\n";
    ly += 16;
  }
}
}  // namespace plot_detail

inline std::string plot_svg(const std::string& title, const LossPlot& loss, const MemoryPlot& mem) {
  using plot_detail::panel;
  const double W = 1000, H = 760, left = 90, pw = 860, ph = 250;
  std::ostringstream os;
  os << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << H
     << "\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
     << "<text x=\"" << left << "\" y=\"26\" font-size=\"17\" font-weight=\"bold\">" << frugal::xml_escape(title)
     << "</text>\n";

  // Loss: raw training loss (light), its moving average, validation points.
  PlotSeries raw{"training loss", "#c6d9ee", {}, {}}, avg{"training loss (smoothed)", "#1f77b4", {}, {}};
  PlotSeries val{loss.metric_label, "#d62728", {}, {}, false, true};
  double ema = 0, lo = 1e300, hi = -1e300;
  for (std::size_t i = 0; i < loss.train.size(); ++i) {
    double v = loss.train[i];
    if (!std::isfinite(v)) continue;
    ema = i == 0 ? v : 0.95 * ema + 0.05 * v;
    raw.x.push_back(double(i + 1));
    raw.y.push_back(v);
    avg.x.push_back(double(i + 1));
    avg.y.push_back(ema);
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  for (auto& [s, v] : loss.val) {
    val.x.push_back(double(s));
    val.y.push_back(v);
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  if (lo > hi) lo = 0, hi = 1;
  double steps = std::max<double>(double(loss.train.size()), 1);
  panel(os, left, 70, pw, ph, 0, steps, std::max(0.0, lo - 0.05 * (hi - lo)), hi + 0.05 * (hi - lo), {raw, avg, val},
        "loss", "step", false);

  // Memory over one step.
  PlotSeries un{"unconstrained plan", "#7f7f7f", {}, {}, true};
  PlotSeries bu{"plan under the budget", "#2ca02c", {}, {}};
  double top = std::max(mem.budget, mem.measured);
  for (std::size_t i = 0; i < mem.unconstrained.size(); ++i) {
    un.x.push_back(double(i) / double(std::max<std::size_t>(mem.unconstrained.size() - 1, 1)));
    un.y.push_back(mem.unconstrained[i]);
    top = std::max(top, mem.unconstrained[i]);
  }
  for (std::size_t i = 0; i < mem.budgeted.size(); ++i) {
    bu.x.push_back(double(i) / double(std::max<std::size_t>(mem.budgeted.size() - 1, 1)));
    bu.y.push_back(mem.budgeted[i]);
    top = std::max(top, mem.budgeted[i]);
  }
  std::vector<PlotSeries> series{un, bu};
  if (mem.budget > 0) series.push_back({"budget", "#d62728", {0, 1}, {mem.budget, mem.budget}, true});
  if (mem.measured > 0) series.push_back({"measured peak", "#000000", {0, 1}, {mem.measured, mem.measured}, true});
  // x in 100ths of the step so the axis reads as "percent of the step".
  for (auto& s : series)
    for (auto& x : s.x) x *= 100;
  panel(os, left, 70 + ph + 110, pw, ph, 0, 100, 0, top * 1.08, series, "device memory over one training step",
        "progress through the step (% of its ops, forward, backward, update)", true);
  os << "</svg>\n";
  return os.str();
}

inline void write_text_file(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
  f.close();
  if (!f) frugal::fail<frugal::IoError>("cannot write ", path);
}

}  // namespace samples
