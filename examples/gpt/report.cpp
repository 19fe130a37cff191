#include "report.h"

#include "cost_plot.h"
#include "plot.h"
#include "progress.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <stdexcept>

namespace gpt {

void write_csv(const std::filesystem::path& path, const PolicyResults& results) {
  std::ofstream out(path);
  out << "policy,step,loss,step_ms,bytes_held_for_backward,step_peak_bytes,peak_bytes,bytes_"
         "swapped,own_peak_bytes,offload_waits,late_reloads,swap_wait_ms,allocator_retries\n";
  out.precision(9);
  for (const auto& [policy, result] : results) {
    for (const auto& r : result.steps) {
      out << policy_name(policy) << ',' << r.step << ',' << r.loss << ',' << r.seconds * 1e3 << ','
          << r.bytes_held << ',' << r.peak_memory - r.resting_memory << ',' << r.peak_memory << ','
          << r.bytes_swapped << ',' << r.own_peak_memory << ',' << r.offload_waits << ','
          << r.late_reloads << ',' << r.swap_wait_seconds * 1e3 << ',' << r.allocator_retries
          << '\n';
    }
  }
  if (!out) throw std::runtime_error("cannot write " + path.string());
}

void write_cost_plot(const std::filesystem::path& path, const PolicyResults& results,
                     const torch::Device& device) {
  if (results.empty()) return;
  const double base = results.front().second.median_step_seconds();  // none comes first
  constexpr double kMiB = 1024.0 * 1024.0;
  std::vector<PolicyCost> costs;
  for (const auto& [policy, result] : results) {
    costs.push_back({std::string(policy_name(policy)), result.median_step_seconds() / base,
                     static_cast<double>(result.peak_bytes_held()) / kMiB,
                     static_cast<double>(result.peak_step_memory()) / kMiB});
  }
  write_svg(path, cost_charts(costs, device.is_cuda() ? "CUDA" : "CPU"));
}

void write_loss_plot(const std::filesystem::path& path, const PolicyResults& results,
                     const std::string& title) {
  Chart chart{title, "step", "training loss (cross-entropy)", {}};
  for (const auto& [policy, result] : results) {
    Series s{std::string(policy_name(policy)), {}, {}};
    for (const auto& r : result.steps) {
      s.x.push_back(static_cast<double>(r.step));
      s.y.push_back(r.loss);
    }
    chart.series.push_back(std::move(s));
  }
  write_svg(path, chart);
}

void print_summary(const TrainResult& result, Policy policy, const torch::Device& device) {
  const double step = result.mean_step_seconds();
  std::printf("policy %s: loss %.4f after %zu steps\n", std::string(policy_name(policy)).c_str(),
              result.final_loss(), result.steps.size());
  std::printf("  step time          %.1f ms (mean without the first step), %.0f tokens/s\n",
              step * 1e3, static_cast<double>(result.tokens_per_step) / step);
  std::printf("  held for backward  %s (peak; tensors autograd keeps from forward to backward)\n",
              format_bytes(result.peak_bytes_held()).c_str());
  std::printf("  step peak memory   %s above weights and optimizer state; %s in all (%s)\n",
              format_bytes(result.peak_step_memory()).c_str(),
              format_bytes(result.peak_memory()).c_str(),
              device.is_cuda() ? "CUDA caching allocator" : "CPU allocator");
  std::printf(
      "  CPU time           %.1f ms per step (process CPU time, mean without the first step)\n",
      result.mean_step_cpu_seconds() * 1e3);
  std::printf("  page faults        %.0f per step (minor, mean without the first step)\n",
              result.mean_page_faults());
  if (result.steps.back().forward_seconds > 0) {
    const double forward = result.mean_forward_seconds(), backward = result.mean_backward_seconds();
    std::printf(
        "  phases             forward %.1f ms, backward %.1f ms, optimizer and the rest %.1f ms "
        "(means,\n"
        "                     the device synchronised after each; --phase-times)\n",
        forward * 1e3, backward * 1e3, (step - forward - backward) * 1e3);
  }
  if (result.bytes_moved_per_step() > 0) {
    std::printf("  swapped to host    %s per step (median)\n",
                format_bytes(result.bytes_moved_per_step()).c_str());
  }
  // Where copies or a tight cap held the steps up (all steps but the first).
  int64_t waits = 0, late = 0, retries = 0;
  double waited = 0;
  for (size_t i = 1; i < result.steps.size(); ++i) {
    const StepRecord& r = result.steps[i];
    waits += r.offload_waits, late += r.late_reloads, retries += r.allocator_retries;
    waited += r.swap_wait_seconds;
  }
  const double later_steps = static_cast<double>(std::max<size_t>(1, result.steps.size() - 1));
  if (result.steps.back().bytes_swapped > 0 || waits > 0) {
    std::printf(
        "  copy stalls        %.1f offload waits, %.1f late reloads, %.2f ms host waited per step\n"
        "                     (SwapStats, mean without the first step)\n",
        static_cast<double>(waits) / later_steps, static_cast<double>(late) / later_steps,
        waited / later_steps * 1e3);
  }
  if (device.is_cuda()) {
    std::printf(
        "  allocator retries  %.1f per step (cudaMalloc failed, the cache was freed and the call\n"
        "                     retried, synchronising the device; mean without the first step)\n",
        static_cast<double>(retries) / later_steps);
  }
}

}  // namespace gpt
