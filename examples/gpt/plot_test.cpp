// --compare's plot: cost against saving, one dot per policy in each of its two panels; --sweep's
// reference lines and the yardsticks they draw.
#include "plot.h"
#include "cost_plot.h"
#include "reference_curves.h"

#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace {

std::string read(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

int count(const std::string& text, const std::string& what) {
  int n = 0;
  for (auto pos = text.find(what); pos != std::string::npos; pos = text.find(what, pos + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE("gpt --compare plots each policy's cost against what it saves") {
  const std::vector<gpt::PolicyCost> costs = {
      {"none", 1.0, 40.0, 90.0}, {"full", 1.31, 6.0, 52.0}, {"selective", 1.12, 15.0, 61.0}};
  const auto panels = gpt::cost_charts(costs, "CPU");
  REQUIRE(panels.size() == 2);
  CHECK(panels[0].x_label.find("held for backward") != std::string::npos);
  CHECK(panels[1].x_label.find("step peak") != std::string::npos);
  for (const auto& panel : panels) {
    CHECK(panel.y_label.find("step time") != std::string::npos);
    REQUIRE(panel.series.size() == costs.size());
    for (size_t i = 0; i < costs.size(); ++i) {
      const auto& s = panel.series[i];
      CHECK(s.name == costs[i].name);
      CHECK(s.x.size() == 1);
      CHECK(s.y == std::vector<double>{costs[i].time_x});
      CHECK(s.markers);
      CHECK_FALSE(s.line);
    }
  }
  CHECK(panels[0].series[1].x[0] == 6.0);
  CHECK(panels[1].series[1].x[0] == 52.0);

  const auto path = std::filesystem::temp_directory_path() / "recompose_gpt_cost_plot_test.svg";
  gpt::write_svg(path, panels);
  const std::string svg = read(path);
  std::filesystem::remove(path);
  // Two panels side by side, each with a dot and a legend dot per policy, and no line.
  CHECK(count(svg, "<circle") == 2 * 2 * static_cast<int>(costs.size()));
  CHECK(count(svg, "<polyline") == 0);
  CHECK(count(svg, ">selective</text>") == 2);
  CHECK(svg.find("width=\"1440\"") != std::string::npos);
}

TEST_CASE("a reference line keeps its colour, dashes and width, beside the nested widths") {
  gpt::Series data{"planner", {1, 2, 3}, {1.3, 1.1, 1.0}, true, true};
  gpt::Series reference{"line none -> full", {1, 3}, {1.4, 1.0}, true, false};
  reference.color = "#7f7f7f";
  reference.dash = "6 4";
  reference.width = 1.5;
  const gpt::Chart chart{"t", "x", "y", {data, reference}};
  const auto path = std::filesystem::temp_directory_path() / "recompose_gpt_reference_line.svg";
  gpt::write_svg(path, chart);
  const std::string svg = read(path);
  std::filesystem::remove(path);
  CHECK(count(svg, "<polyline") == 2);
  // The data's line is the only nested one: the first (and widest) of one, 1.2.
  CHECK(svg.find("stroke=\"#1f77b4\" stroke-width=\"1.2\"") != std::string::npos);
  CHECK(svg.find("stroke=\"#7f7f7f\" stroke-dasharray=\"6 4\" stroke-width=\"1.5\"") !=
        std::string::npos);
  // Its legend's line is dashed too, and it has no dots.
  CHECK(count(svg, "stroke-dasharray=\"6 4\"") == 2);
  CHECK(count(svg, "fill=\"#7f7f7f\"") == 0);
}

TEST_CASE("--sweep's yardsticks: the straight line none -> full and the fixed policies' hull") {
  // line(h) = 1 + (T_full - 1)(1 - h)/(1 - h_full)
  CHECK(gpt::straight_line_time(1.0, 0.1, 1.4) == doctest::Approx(1.0));
  CHECK(gpt::straight_line_time(0.1, 0.1, 1.4) == doctest::Approx(1.4));
  CHECK(gpt::straight_line_time(0.55, 0.1, 1.4) == doctest::Approx(1.2));
  CHECK(std::isnan(gpt::straight_line_time(0.5, 1.0, 1.4)));

  // none (1, 1), full (0.1, 1.4), selective (0.55, 1.15) under the line, every second mm
  // (0.4, 1.35) above the segment full -> selective, swap on CPU (1.02, 1.3) right of none, a
  // repeat of selective's h slower, and a point with no time.
  const std::vector<gpt::Point> fixed = {{1.0, 1.0},  {0.1, 1.4},  {0.55, 1.15}, {0.4, 1.35},
                                         {1.02, 1.3}, {0.55, 1.2}, {0.3, NAN}};
  const auto hull = gpt::lower_hull(fixed);
  REQUIRE(hull.size() == 4);
  CHECK(hull[0].h == 0.1);
  CHECK(hull[1].h == 0.55);
  CHECK(hull[1].t == 1.15);
  CHECK(hull[2].h == 1.0);
  CHECK(hull[3].h == 1.02);
  CHECK(gpt::hull_time(hull, 0.1) == doctest::Approx(1.4));
  CHECK(gpt::hull_time(hull, 0.4) == doctest::Approx(1.4 - 0.25 * 0.3 / 0.45));
  CHECK(gpt::hull_time(hull, 0.775) == doctest::Approx(1.075));
  CHECK(gpt::hull_time(hull, 1.0) == doctest::Approx(1.0));
  CHECK(std::isnan(gpt::hull_time(hull, 0.05)));  // fewer bytes than any fixed policy
  CHECK(std::isnan(gpt::hull_time(hull, 1.5)));
  CHECK(std::isnan(gpt::hull_time({}, 0.5)));
  // The hull is never above a fixed policy at its own h.
  for (const auto& p : fixed) {
    if (std::isfinite(p.t)) CHECK(gpt::hull_time(hull, p.h) <= p.t + 1e-12);
  }
}
