#include "cost_plot.h"

namespace gpt {

std::vector<Chart> cost_charts(const std::vector<PolicyCost>& costs, const std::string& device) {
  Chart held{"Cost against bytes held for backward (" + device + ")",
             "held for backward, MiB",
             "step time, x of no checkpointing",
             {}};
  Chart peak{"Cost against step peak memory (" + device + ")",
             "step peak above weights and optimizer, MiB",
             "step time, x of no checkpointing",
             {}};
  for (const auto& c : costs) {
    held.series.push_back({c.name, {c.held_mib}, {c.time_x}, /*line=*/false, /*markers=*/true});
    peak.series.push_back(
        {c.name, {c.step_peak_mib}, {c.time_x}, /*line=*/false, /*markers=*/true});
  }
  return {held, peak};
}

}  // namespace gpt
