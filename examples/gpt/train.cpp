#include "train.h"

#include "device_memory.h"
#include "progress.h"

#ifndef RECOMPOSE_GPT_HOOKS_ONLY
#include <recompose/saved_tensor_meter.h>
#endif

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <numeric>

namespace gpt {
namespace {

torch::Tensor loss_of(GPT& model, const torch::Tensor& inputs, const torch::Tensor& targets) {
  auto logits = model(inputs);
  return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}));
}

std::string status_line(const StepRecord& r, int64_t tokens_per_step, bool on_cuda) {
  char buffer[160];
  const double tokens_per_second = static_cast<double>(tokens_per_step) / std::max(r.seconds, 1e-9);
  const std::string memory = on_cuda && r.peak_device_bytes
                                 ? "peak " + format_bytes(*r.peak_device_bytes)
                                 : "held for backward " + format_bytes(r.bytes_held);
  std::snprintf(buffer, sizeof buffer, "loss %.4f | %.0f tok/s | %s", r.loss, tokens_per_second, memory.c_str());
  return buffer;
}

}  // namespace

double TrainResult::mean_step_seconds() const {
  const auto first = steps.size() > 1 ? steps.begin() + 1 : steps.begin();
  const double total =
      std::accumulate(first, steps.end(), 0.0, [](double s, const StepRecord& r) { return s + r.seconds; });
  return total / static_cast<double>(steps.end() - first);
}

int64_t TrainResult::peak_bytes_held() const {
  int64_t peak = 0;
  for (const auto& r : steps) peak = std::max(peak, r.bytes_held);
  return peak;
}

std::optional<int64_t> TrainResult::peak_device_bytes() const {
  std::optional<int64_t> peak;
  for (const auto& r : steps) {
    if (r.peak_device_bytes) peak = std::max(peak.value_or(0), *r.peak_device_bytes);
  }
  return peak;
}

TrainResult train(const Config& config, const CharDataset& data, const TrainOptions& options, GPT* model_out) {
  torch::manual_seed(options.seed);  // weights and dropout masks
  GPT model(config);
  model->to(options.device);
  model->train();
  apply_policy(model, options.policy);

  torch::optim::AdamW optimizer(model->parameters(),
                                torch::optim::AdamWOptions(options.lr).betas({0.9, 0.99}).weight_decay(0.01));
  auto batches = at::detail::createCPUGenerator(options.seed);  // batches: independent of dropout draws

  TrainResult result;
  result.parameters = model->parameter_count();
  result.tokens_per_step = options.batch * config.context;
  ProgressBar progress(options.label, options.steps);
  const bool on_cuda = options.device.is_cuda();

  for (int64_t step = 1; step <= options.steps; ++step) {
    auto [inputs, targets] = data.batch(options.batch, /*validation=*/false, batches, options.device);
    StepRecord record;
    record.step = step;
    synchronize(options.device);
    reset_peak_memory(options.device);
    const auto start = std::chrono::steady_clock::now();
    {
#ifndef RECOMPOSE_GPT_HOOKS_ONLY
      recompose::SavedTensorMeter meter;  // what autograd holds between this forward and backward
#endif
      auto loss = loss_of(model, inputs, targets);
      optimizer.zero_grad();
      loss.backward();
#ifndef RECOMPOSE_GPT_HOOKS_ONLY
      record.bytes_held = meter.peak_bytes_held();
#endif
      torch::nn::utils::clip_grad_norm_(model->parameters(), 1.0);
      optimizer.step();
      record.loss = loss.item<double>();  // also waits for the device
    }
    synchronize(options.device);
    record.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    record.peak_device_bytes = peak_memory(options.device);
    result.steps.push_back(record);
    progress.update(step, status_line(record, result.tokens_per_step, on_cuda));
  }
  progress.finish();
  if (model_out) *model_out = model;
  return result;
}

double validation_loss(GPT& model, const CharDataset& data, int64_t batch, int64_t batches, uint64_t seed,
                       const torch::Device& device) {
  torch::NoGradGuard no_grad;
  model->eval();
  auto generator = at::detail::createCPUGenerator(seed);
  double total = 0;
  for (int64_t i = 0; i < batches; ++i) {
    auto [inputs, targets] = data.batch(batch, /*validation=*/true, generator, device);
    total += loss_of(model, inputs, targets).item<double>();
  }
  model->train();
  return total / static_cast<double>(batches);
}

}  // namespace gpt
