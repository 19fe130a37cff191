#include "planning.h"

#include "fused_adamw.h"

#include <recompose/planner.h>

#include <optional>

namespace gpt {

recompose::MemoryProfile profile_training_step(const Config& config, const CharDataset& data,
                                               const TrainOptions& options) {
  torch::manual_seed(options.seed);
  GPT model(config);
  model->to(options.device);
  model->train();
  // Training holds the optimizer's state through every step, so the profile's resident bytes (a
  // peak budget's base: recompose::MemoryProfile::resident_bytes) must count it. FusedAdamW
  // allocates its moments when built (CUDA); on CPU the profile measures no device memory.
  std::optional<FusedAdamW> optimizer;
  if (options.device.is_cuda())
    optimizer.emplace(model->parameters(), 0.9, 0.99, /*weight_decay=*/0.01);
  auto batches = at::detail::createCPUGenerator(options.seed + 1);
  auto [inputs, targets] = data.batch(options.batch, /*validation=*/false, batches, options.device);
  auto step = [&, &inputs = inputs, &targets = targets] {
    loss_of(model, inputs, targets, options.bf16).backward();
  };
  step();  // warm-up: first-time allocations and kernel selection are no part of a step's cost
  model->zero_grad();
  return recompose::profile_memory(*model, step);
}

}  // namespace gpt
