// What each policy costs against what it saves, one point per policy: step time (x of no
// checkpointing) against the bytes held for backward, and against the step's peak memory. The
// plot of --compare (the sweep's plot shows the same axes for the planner).
#pragma once

#include "plot.h"

#include <string>
#include <vector>

namespace gpt {

struct PolicyCost {
  std::string name;
  double time_x = 0;         // mean step time, x of no checkpointing
  double held_mib = 0;       // peak bytes held for backward
  double step_peak_mib = 0;  // peak memory of a step above weights and optimizer state
};

// Two panels: time against bytes held, time against step peak; one dot per policy.
std::vector<Chart> cost_charts(const std::vector<PolicyCost>& costs, const std::string& device);

}  // namespace gpt
