#include "compare.h"

#include "progress.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

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

}  // namespace

CompareOutcome compare_policies(const Config& config, const CharDataset& data, TrainOptions options) {
  CompareOutcome outcome;
  for (Policy policy : kAllPolicies) {
    options.policy = policy;
    options.label = std::string(policy_name(policy));
    outcome.results.emplace_back(policy, train(config, data, options));
  }

  const bool on_cuda = options.device.is_cuda();
  const auto& base = outcome.results.front().second;
  std::printf("\n%zu steps, batch %lld x context %lld, %lld blocks of width %lld, device %s\n", base.steps.size(),
              static_cast<long long>(options.batch), static_cast<long long>(config.context),
              static_cast<long long>(config.layers), static_cast<long long>(config.width),
              options.device.str().c_str());
  std::printf("| policy    | loss after %-4zu | max rel. diff | step ms | time x | held for backward | memory x |",
              base.steps.size());
  std::printf(on_cuda ? " peak CUDA | CUDA x |\n" : "\n");
  std::printf("|-----------|----------------|---------------|---------|--------|-------------------|----------|");
  std::printf(on_cuda ? "-----------|--------|\n" : "\n");
  for (const auto& [policy, result] : outcome.results) {
    const double diff = max_relative_difference(base, result);
    const bool ok = diff <= kLossTolerance;
    outcome.losses_match = outcome.losses_match && ok;
    const double held_ratio = base.peak_bytes_held() > 0 ? static_cast<double>(result.peak_bytes_held()) /
                                                               static_cast<double>(base.peak_bytes_held())
                                                         : NAN;
    std::printf("| %-9s | %14.6f | %13.1e%s| %7.1f | %6.2f | %17s | %8.2f |", std::string(policy_name(policy)).c_str(),
                result.final_loss(), diff, ok ? " " : "!", result.mean_step_seconds() * 1e3,
                result.mean_step_seconds() / base.mean_step_seconds(), format_bytes(result.peak_bytes_held()).c_str(),
                held_ratio);
    if (on_cuda) {
      const double peak = static_cast<double>(result.peak_device_bytes().value_or(0));
      const double base_peak = static_cast<double>(base.peak_device_bytes().value_or(0));
      std::printf(" %9s | %6.2f |", format_bytes(static_cast<int64_t>(peak)).c_str(), peak / base_peak);
    }
    std::printf("\n");
  }
  std::printf("time x and memory x are against none; memory is the peak of bytes autograd holds for backward%s.\n",
              on_cuda ? ", peak CUDA the caching allocator's peak per step" : "");
  if (!outcome.losses_match) {
    std::printf("FAILED: losses differ across policies by more than %.0e (relative); marked with !\n",
                kLossTolerance);
  } else {
    std::printf("losses agree across policies within %.0e (relative)\n", kLossTolerance);
  }
  return outcome;
}

}  // namespace gpt
