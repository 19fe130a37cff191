// What a run leaves behind: the per-step CSV, the loss plot and the printed summaries.
#pragma once

#include "policies.h"
#include "train.h"

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

namespace gpt {

using PolicyResults = std::vector<std::pair<Policy, TrainResult>>;

// One row per policy and step: policy,step,loss,step_ms,bytes_held_for_backward,
// step_peak_bytes,peak_bytes,bytes_swapped.
void write_csv(const std::filesystem::path& path, const PolicyResults& results);
// What each policy costs against what it saves (cost_plot.h), one dot per policy, in two panels.
void write_cost_plot(const std::filesystem::path& path, const PolicyResults& results,
                     const torch::Device& device);
// Loss against step, one line per policy.
void write_loss_plot(const std::filesystem::path& path, const PolicyResults& results,
                     const std::string& title);
// Step time, throughput and memory of one run.
void print_summary(const TrainResult& result, Policy policy, const torch::Device& device);

}  // namespace gpt
