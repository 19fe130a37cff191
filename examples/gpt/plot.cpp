#include "plot.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <sstream>
#include <stdexcept>

namespace gpt {
namespace {

constexpr double kWidth = 720, kHeight = 420;
constexpr double kLeft = 70, kRight = 150, kTop = 40, kBottom = 55;  // margins around the plot area
constexpr std::array<const char*, 8> kColors = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e",
                                                "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"};

// Tick step of about `target` intervals over `span`: 1, 2 or 5 times a power of ten.
double nice_step(double span, int target) {
  const double raw = span / target;
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0}) {
    if (m * magnitude >= raw) return m * magnitude;
  }
  return 10.0 * magnitude;
}

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '&':
        out += "&amp;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string number(double v) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%g", std::abs(v) < 1e-12 ? 0.0 : v);
  return buffer;
}

struct Range {
  double lo = std::numeric_limits<double>::infinity(),
         hi = -std::numeric_limits<double>::infinity();
  void add(double v) {
    if (std::isfinite(v)) lo = std::min(lo, v), hi = std::max(hi, v);
  }
  // Widens to whole tick steps so the data does not touch the frame.
  double snap(int target) {
    if (!(lo <= hi)) lo = 0, hi = 1;
    if (hi - lo < 1e-12) lo -= 0.5, hi += 0.5;
    const double step = nice_step(hi - lo, target);
    lo = std::floor(lo / step) * step;
    hi = std::ceil(hi / step) * step;
    return step;
  }
};

// Draws `chart` in the panel whose left edge is at x0.
void draw_chart(std::ostringstream& svg, const Chart& chart, double x0) {
  const double left = x0 + kLeft;  // the plot area's left edge in the file
  Range xr, yr;
  for (const auto& s : chart.series) {
    for (double v : s.x) xr.add(v);
    for (double v : s.y) yr.add(v);
  }
  const double x_step = xr.snap(6), y_step = yr.snap(5);
  const double plot_w = kWidth - kLeft - kRight, plot_h = kHeight - kTop - kBottom;
  auto px = [&](double x) { return left + (x - xr.lo) / (xr.hi - xr.lo) * plot_w; };
  auto py = [&](double y) { return kTop + (yr.hi - y) / (yr.hi - yr.lo) * plot_h; };

  svg << "<text x=\"" << left + plot_w / 2 << "\" y=\"24\" text-anchor=\"middle\" font-size=\"15\">"
      << escape(chart.title) << "</text>\n";
  // Grid lines and tick labels.
  for (double x = xr.lo; x <= xr.hi + x_step / 2; x += x_step) {
    svg << "<line x1=\"" << px(x) << "\" y1=\"" << kTop << "\" x2=\"" << px(x) << "\" y2=\""
        << kTop + plot_h << "\" stroke=\"#e5e5e5\"/>\n"
        << "<text x=\"" << px(x) << "\" y=\"" << kTop + plot_h + 18 << "\" text-anchor=\"middle\">"
        << number(x) << "</text>\n";
  }
  for (double y = yr.lo; y <= yr.hi + y_step / 2; y += y_step) {
    svg << "<line x1=\"" << left << "\" y1=\"" << py(y) << "\" x2=\"" << left + plot_w << "\" y2=\""
        << py(y) << "\" stroke=\"#e5e5e5\"/>\n"
        << "<text x=\"" << left - 8 << "\" y=\"" << py(y) + 4 << "\" text-anchor=\"end\">"
        << number(y) << "</text>\n";
  }
  // Axes and their labels.
  svg << "<rect x=\"" << left << "\" y=\"" << kTop << "\" width=\"" << plot_w << "\" height=\""
      << plot_h << "\" fill=\"none\" stroke=\"black\"/>\n"
      << "<text x=\"" << left + plot_w / 2 << "\" y=\"" << kHeight - 14
      << "\" text-anchor=\"middle\">" << escape(chart.x_label) << "</text>\n"
      << "<text transform=\"translate(" << x0 + 18 << "," << kTop + plot_h / 2
      << ") rotate(-90)\" text-anchor=\"middle\">" << escape(chart.y_label) << "</text>\n";
  // Series, each thinner than the one before: identical curves (policies that must agree) show
  // as nested bands instead of hiding one another.
  const size_t n = chart.series.size();
  size_t lines_left = 0;  // lines still to draw, this one included: the first line is the widest
  for (const auto& s : chart.series) lines_left += s.line && s.width <= 0 ? 1 : 0;
  for (size_t i = 0; i < n; ++i) {
    const auto& s = chart.series[i];
    const std::string color = s.color.empty() ? kColors[i % kColors.size()] : escape(s.color);
    const std::string dash = s.dash.empty() ? "" : " stroke-dasharray=\"" + escape(s.dash) + "\"";
    if (s.line) {
      const double width = s.width > 0 ? s.width : 1.2 * static_cast<double>(lines_left--);
      svg << "<polyline fill=\"none\" stroke=\"" << color << '"' << dash << " stroke-width=\""
          << width << "\" stroke-linejoin=\"round\" points=\"";
      for (size_t j = 0; j < std::min(s.x.size(), s.y.size()); ++j) {
        if (std::isfinite(s.x[j]) && std::isfinite(s.y[j]))
          svg << px(s.x[j]) << ',' << py(s.y[j]) << ' ';
      }
      svg << "\"/>\n";
    }
    if (s.markers) {
      for (size_t j = 0; j < std::min(s.x.size(), s.y.size()); ++j) {
        if (std::isfinite(s.x[j]) && std::isfinite(s.y[j])) {
          svg << "<circle cx=\"" << px(s.x[j]) << "\" cy=\"" << py(s.y[j]) << "\" r=\"4\" fill=\""
              << color << "\"/>\n";
        }
      }
    }
    const double ly = kTop + 12 + 18 * static_cast<double>(i);
    if (s.line) {
      svg << "<line x1=\"" << left + plot_w + 12 << "\" y1=\"" << ly << "\" x2=\""
          << left + plot_w + 34 << "\" y2=\"" << ly << "\" stroke=\"" << color << '"' << dash
          << " stroke-width=\"2\"/>\n";
    }
    if (s.markers) {
      svg << "<circle cx=\"" << left + plot_w + 23 << "\" cy=\"" << ly << "\" r=\"4\" fill=\""
          << color << "\"/>\n";
    }
    svg << "<text x=\"" << left + plot_w + 40 << "\" y=\"" << ly + 4 << "\">" << escape(s.name)
        << "</text>\n";
  }
}

}  // namespace

void write_svg(const std::filesystem::path& path, const Chart& chart) {
  write_svg(path, std::vector<Chart>{chart});
}

void write_svg(const std::filesystem::path& path, const std::vector<Chart>& panels) {
  std::ostringstream svg;
  const double width = kWidth * static_cast<double>(std::max<size_t>(1, panels.size()));
  svg << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << kHeight
      << "\" font-family=\"sans-serif\" font-size=\"12\">\n"
      << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  for (size_t i = 0; i < panels.size(); ++i)
    draw_chart(svg, panels[i], kWidth * static_cast<double>(i));
  svg << "</svg>\n";

  std::ofstream out(path);
  out << svg.str();
  if (!out) throw std::runtime_error("cannot write " + path.string());
}

}  // namespace gpt
