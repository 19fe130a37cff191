#include "compare.h"

#include "progress.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <vector>

namespace gpt {
namespace {

// Largest relative difference between two loss curves, over every step.
double max_relative_difference(const TrainResult& a, const TrainResult& b) {
  double worst = 0;
  for (size_t i = 0; i < std::min(a.steps.size(), b.steps.size()); ++i) {
    const double x = a.steps[i].loss, y = b.steps[i].loss;
    const double d = std::abs(x - y) / std::max(std::abs(x), 1e-12);
    worst = std::max(worst, std::isfinite(d) ? d : INFINITY);
  }
  return worst;
}

double ratio(int64_t a, int64_t b) {
  return b > 0 ? static_cast<double>(a) / static_cast<double>(b) : NAN;
}

}  // namespace

CompareOutcome compare_policies(const Config& config, const CharDataset& data, TrainOptions options,
                                const std::vector<Policy>& policies) {
  // Every policy's trainer first (same seed: same weights, batches and dropout masks), then step k
  // of every policy before step k+1 (in_rotated_order): a clock that drifts during the run lands
  // on every policy alike instead of on the last ones trained.
  CompareOutcome outcome;
  std::vector<std::unique_ptr<Trainer>> trainers;
  for (Policy policy : policies) {
    options.policy = policy;
    options.label = std::string(policy_name(policy));
    trainers.push_back(std::make_unique<Trainer>(config, data, options));
    TrainResult result;
    result.parameters = trainers.back()->model()->parameter_count();
    result.tokens_per_step = trainers.back()->tokens_per_step();
    outcome.results.emplace_back(policy, std::move(result));
  }
  const size_t n = trainers.size();
  ProgressBar progress("compare (" + std::to_string(n) + " policies interleaved)", options.steps);
  for (int64_t step = 1; step <= options.steps; ++step) {
    in_rotated_order(step, n, [&](size_t j) {
      outcome.results[j].second.steps.push_back(trainers[j]->step(step));
    });
    progress.update(step, "");
  }
  progress.finish();

  const auto& base = outcome.results.front().second;
  const double tolerance = loss_tolerance(options.bf16);
  std::printf("\n%zu steps, batch %lld x context %lld, %lld blocks of width %lld, device %s\n\n",
              base.steps.size(), static_cast<long long>(options.batch),
              static_cast<long long>(config.context), static_cast<long long>(config.layers),
              static_cast<long long>(config.width), options.device.str().c_str());
  std::printf(
      "| policy          | loss after %3zu | max rel. diff | step ms | time x | held for backward "
      "| x     | step peak | x     | moved per step (median) |\n",
      base.steps.size());
  std::printf(
      "|-----------------|----------------|---------------|---------|--------|-------------------|-"
      "------|-----------|-------|-------------------------|\n");
  for (const auto& [policy, result] : outcome.results) {
    const double diff = max_relative_difference(base, result);
    const bool ok = diff <= tolerance;
    outcome.losses_match = outcome.losses_match && ok;
    std::printf(
        "| %-15s | %14.6f | %12.1e%s | %7.1f | %6.2f | %17s | %5.2f | %9s | %5.2f | %23s |\n",
        std::string(policy_name(policy)).c_str(), result.final_loss(), diff, ok ? " " : "!",
        result.median_step_seconds() * 1e3,
        result.median_step_seconds() / base.median_step_seconds(),
        format_bytes(result.peak_bytes_held()).c_str(),
        ratio(result.peak_bytes_held(), base.peak_bytes_held()),
        format_bytes(result.peak_step_memory()).c_str(),
        ratio(result.peak_step_memory(), base.peak_step_memory()),
        result.bytes_moved_per_step() > 0 ? format_bytes(result.bytes_moved_per_step()).c_str()
                                          : "-");
  }
  std::printf(
      "\nstep ms: median without the first step, the policies interleaved step by step.\n"
      "x: against none (ratio of medians). held for backward: peak bytes held for backward on\n"
      "the device (SavedTensorMeter: tensors autograd saves and the products selective\n"
      "checkpointing keeps; swapped ones are not).\n"
      "step peak: peak %s memory of a step above the weights and optimizer state (activations,\n"
      "gradients, temporaries). moved per step: bytes swap and offload sent to host memory in a\n"
      "step, the median without the first step.%s\n",
      options.device.is_cuda() ? "CUDA" : "CPU",
      options.device.is_cuda()
          ? ""
          : " On CPU, swap and offload copy host to host: they save no memory there.");
  if (!outcome.losses_match) {
    std::printf(
        "FAILED: losses differ across policies by more than %.0e (relative); marked with !\n",
        tolerance);
  } else {
    std::printf("losses agree across policies within %.0e (relative)\n", tolerance);
  }
  return outcome;
}

}  // namespace gpt
