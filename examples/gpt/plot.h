// A line chart written as a standalone SVG file: axes with ticks, one polyline per series and a
// legend. Enough for a loss curve without a plotting dependency.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace gpt {

struct Series {
  std::string name;
  std::vector<double> x, y;
  bool line = true;      // a polyline through the points
  bool markers = false;  // a dot on each point (a series of one point needs it to show)
  // For a reference line (a yardstick beside the data): its own colour, dashes and width. A line
  // with a width of its own is left out of the nested widths of the others.
  std::string color = {};  // "#7f7f7f"; empty: the palette's, by the series' place
  std::string dash = {};   // SVG stroke-dasharray, "6 4"; empty: solid
  double width = 0;  // stroke width; 0: the nested widths (each line thinner than the one before)
};

struct Chart {
  std::string title, x_label, y_label;
  std::vector<Series> series;
};

// Throws std::runtime_error when the file cannot be written.
void write_svg(const std::filesystem::path& path, const Chart& chart);
// Several charts side by side in one file (panels).
void write_svg(const std::filesystem::path& path, const std::vector<Chart>& panels);

}  // namespace gpt
