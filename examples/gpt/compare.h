// --compare: the same steps from the same seed under every policy, and one table of loss, step
// time and memory against `none`. Checkpointing must not change the numbers, so the losses have
// to agree up to float noise.
#pragma once

#include "data.h"
#include "model.h"
#include "report.h"
#include "train.h"

#include <vector>

namespace gpt {

// Relative loss difference above which --compare fails.
inline constexpr double kLossTolerance = 1e-4;
// The same under --bf16 on CUDA: bfloat16 rounding amplifies the last-bit differences of CUDA
// kernels that accumulate with atomics (attention backward), under every policy alike.
inline constexpr double kBf16LossTolerance = 1e-2;
inline constexpr double loss_tolerance(bool bf16) {
  return bf16 ? kBf16LossTolerance : kLossTolerance;
}

struct CompareOutcome {
  PolicyResults results;
  bool losses_match = true;
};

// Builds a trainer per policy of `policies` (none first: the table's ratios and the loss check
// are against it), runs them interleaved step by step, and prints the table.
CompareOutcome compare_policies(const Config& config, const CharDataset& data, TrainOptions options,
                                const std::vector<Policy>& policies);

}  // namespace gpt
