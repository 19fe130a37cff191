// --sweep: the planner's curve (bytes held for backward against step time, one plan per budget
// from the full-checkpointing minimum to 100%) beside the fixed policies, all trained side by
// side from the same seed (their steps interleaved, so machine noise hits them alike). Writes
// sweep.csv, sweep.svg, profile.json and the plans (plan_<percent>.json) to the output folder,
// and prints the targets of the planner and whether each is met.
#pragma once

#include "data.h"
#include "model.h"
#include "train.h"

#include <filesystem>

namespace gpt {

// Returns 0 when every loss matches none's and the byte budget holds at every point, 1 otherwise
// (time targets are reported, not enforced: timings on a shared machine are noisy).
// `peak`: the budgets are peaks of device memory for the whole step (Budget::peak_bytes, 50% to
// 100% of no checkpointing's resident + activation bytes), checked against the measured peak of
// each run alone (the caching allocator's, less what the sweep's other runs hold; on a device
// only): a second table gives per budget the plan's simulated peak and the measured one.
int run_sweep(const Config& config, const CharDataset& data, const TrainOptions& options,
              const std::filesystem::path& out, bool peak = false);

}  // namespace gpt
