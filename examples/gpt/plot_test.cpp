// --compare's plot: cost against saving, one dot per policy in each of its two panels.
#include "cost_plot.h"

#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

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
