#include "planning.h"

#include <recompose/planner.h>

namespace gpt {

recompose::MemoryProfile profile_training_step(const Config& config, const CharDataset& data,
                                               const TrainOptions& options) {
  torch::manual_seed(options.seed);
  GPT model(config);
  model->to(options.device);
  model->train();
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
