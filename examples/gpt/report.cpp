#include "report.h"

#include "plot.h"
#include "progress.h"

#include <cstdio>
#include <fstream>
#include <stdexcept>

namespace gpt {

void write_csv(const std::filesystem::path& path, const PolicyResults& results) {
  std::ofstream out(path);
  out << "policy,step,loss,step_ms,bytes_held_for_backward,peak_device_bytes\n";
  out.precision(9);
  for (const auto& [policy, result] : results) {
    for (const auto& r : result.steps) {
      out << policy_name(policy) << ',' << r.step << ',' << r.loss << ',' << r.seconds * 1e3 << ',' << r.bytes_held
          << ',';
      if (r.peak_device_bytes) out << *r.peak_device_bytes;
      out << '\n';
    }
  }
  if (!out) throw std::runtime_error("cannot write " + path.string());
}

void write_loss_plot(const std::filesystem::path& path, const PolicyResults& results, const std::string& title) {
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

void print_summary(const TrainResult& result, Policy policy, bool on_cuda) {
  const double step = result.mean_step_seconds();
  std::printf("policy %s: final loss %.4f after %zu steps\n", std::string(policy_name(policy)).c_str(),
              result.final_loss(), result.steps.size());
  std::printf("  step time  %.1f ms (mean without the first step), %.0f tokens/s\n", step * 1e3,
              static_cast<double>(result.tokens_per_step) / step);
  std::printf("  held for backward  %s at peak (activations autograd keeps between forward and backward)\n",
              format_bytes(result.peak_bytes_held()).c_str());
  if (on_cuda && result.peak_device_bytes()) {
    std::printf("  peak CUDA memory   %s (caching allocator, weights and optimizer state included)\n",
                format_bytes(*result.peak_device_bytes()).c_str());
  }
}

}  // namespace gpt
