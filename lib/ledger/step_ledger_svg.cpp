// StepLedger::svg / write_svg: the memory timeline drawn as the GPT example draws its plots (a
// white plot area, light grid, sans-serif): memory in use over the marks, equally spaced, with
// the regions' forward boundaries (grey) and rebuilds (orange), the turn and the peak (red).
#include "engine/format_bytes.h"
#include "ledger/step_ledger_timeline_format.h"

#include <recompose/checkpoint_error.h>
#include <recompose/step_ledger.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>

namespace recompose {
namespace {

constexpr double kLeft = 80, kRight = 30, kTop = 40, kPlotHeight = 300, kLabels = 170;

std::string xml_escape(const std::string& s) {
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

std::string num(double v) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.1f", v);
  return buffer;
}

}  // namespace

std::string StepLedger::svg() const {
  const LedgerTimeline t = timeline();
  const auto n = static_cast<double>(t.marks.size());
  const double step = std::max(12.0, 640.0 / std::max(1.0, n - 1));
  const double plot_w = step * std::max(1.0, n - 1);
  const double width = kLeft + plot_w + kRight, height = kTop + kPlotHeight + kLabels;
  int64_t top = 1;
  for (const auto& m : t.marks) top = std::max({top, m.bytes, t.peak_bytes});
  auto px = [&](std::size_t i) { return kLeft + step * static_cast<double>(i); };
  auto py = [&](int64_t b) {
    return kTop + kPlotHeight * (1.0 - static_cast<double>(b) / static_cast<double>(top));
  };
  std::ostringstream svg;
  svg << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << num(width) << "\" height=\""
      << num(height) << "\" font-family=\"sans-serif\" font-size=\"12\">\n"
      << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      << "<text x=\"" << num(kLeft + plot_w / 2) << "\" y=\"24\" text-anchor=\"middle\" "
      << "font-size=\"15\">"
      << xml_escape("memory in use over the step (" +
                    (t.measured() ? t.source + ", " + t.device : "not measured on " + t.device) +
                    ")")
      << "</text>\n";
  // The marks: a line and a rotated label each.
  for (std::size_t i = 0; i < t.marks.size(); ++i) {
    const LedgerMark& m = t.marks[i];
    const bool rebuild = m.kind.rfind("rebuild", 0) == 0;
    const char* color = rebuild ? "#ffbb78" : m.region >= 0 ? "#e5e5e5" : "#c7c7c7";
    svg << "<line x1=\"" << num(px(i)) << "\" y1=\"" << kTop << "\" x2=\"" << num(px(i))
        << "\" y2=\"" << kTop + kPlotHeight << "\" stroke=\"" << color << "\"/>\n"
        << "<text transform=\"translate(" << num(px(i) + 3) << "," << kTop + kPlotHeight + 8
        << ") rotate(60)\" font-size=\"9\">" << xml_escape(detail::mark_name(m)) << "</text>\n";
  }
  svg << "<rect x=\"" << kLeft << "\" y=\"" << kTop << "\" width=\"" << num(plot_w)
      << "\" height=\"" << kPlotHeight << "\" fill=\"none\" stroke=\"black\"/>\n";
  if (t.turn >= 0) {
    const double x = px(static_cast<std::size_t>(t.turn));
    svg << "<line x1=\"" << num(x) << "\" y1=\"" << kTop << "\" x2=\"" << num(x) << "\" y2=\""
        << kTop + kPlotHeight << "\" stroke=\"#1f77b4\" stroke-dasharray=\"6,4\"/>\n"
        << "<text x=\"" << num(x + 4) << "\" y=\"" << kTop + 14
        << "\" fill=\"#1f77b4\">backward</text>\n";
  }
  if (!t.measured()) {
    svg << "<text x=\"" << num(kLeft + plot_w / 2) << "\" y=\"" << kTop + kPlotHeight / 2
        << "\" text-anchor=\"middle\">memory not measured (CPU: recompose::CpuMemoryCounting)"
        << "</text>\n</svg>\n";
    return svg.str();
  }
  for (int k = 0; k <= 4; ++k) {
    const int64_t b = top * k / 4;
    svg << "<text x=\"" << kLeft - 6 << "\" y=\"" << num(py(b) + 4) << "\" text-anchor=\"end\">"
        << xml_escape(detail::format_bytes(b)) << "</text>\n";
  }
  svg << "<polyline fill=\"none\" stroke=\"#2ca02c\" stroke-width=\"2\" "
      << "stroke-linejoin=\"round\" points=\"";
  for (std::size_t i = 0; i < t.marks.size(); ++i)
    svg << (i == 0 ? "" : " ") << num(px(i)) << "," << num(py(t.marks[i].bytes));
  svg << "\"/>\n";
  // The peak: a red bar over the interval it was reached in.
  const auto to = static_cast<std::size_t>(t.peak_mark);
  const double x0 = px(to == 0 ? 0 : to - 1), x1 = px(to);
  svg << "<line x1=\"" << num(x0) << "\" y1=\"" << num(py(t.peak_bytes)) << "\" x2=\""
      << num(std::max(x1, x0 + 4)) << "\" y2=\"" << num(py(t.peak_bytes))
      << "\" stroke=\"#d62728\" stroke-width=\"3\"/>\n"
      << "<text x=\"" << num(x1 + 4) << "\" y=\"" << num(py(t.peak_bytes) - 4)
      << "\" fill=\"#d62728\">" << xml_escape("peak " + detail::format_bytes(t.peak_bytes))
      << "</text>\n</svg>\n";
  return svg.str();
}

void StepLedger::write_svg(const std::string& path) const {
  std::ofstream out(path);
  out << svg();
  if (!out) throw CheckpointError("recompose: StepLedger::write_svg: cannot write '" + path + "'");
}

}  // namespace recompose
