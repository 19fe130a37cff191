#include "planning.h"

namespace gpt {

PlanningStep::PlanningStep(const Config& config, const CharDataset& data,
                           const TrainOptions& options)
    : bf16_(options.bf16) {
  torch::manual_seed(options.seed);
  model_ = GPT(config);
  model_->to(options.device);
  model_->train();
  // Training holds the optimizer's state through every step, so the profile's resident bytes (a
  // peak budget's base: recompose::MemoryProfile::resident_bytes) must count it. FusedAdamW
  // allocates its moments when built (CUDA); on CPU the profile measures no device memory.
  if (options.device.is_cuda())
    optimizer_.emplace(model_->parameters(), 0.9, 0.99, /*weight_decay=*/0.01);
  auto batches = at::detail::createCPUGenerator(options.seed + 1);
  std::tie(inputs_, targets_) =
      data.batch(options.batch, /*validation=*/false, batches, options.device);
  step();  // warm-up: first-time allocations and kernel selection are no part of a step's cost
  model_->zero_grad();
  profile_ = recompose::profile_memory(*model_, [this] { step(); });
}

void PlanningStep::step() { loss_of(model_, inputs_, targets_, bf16_).backward(); }

recompose::Plan PlanningStep::choose(const recompose::Budget& budget,
                                     const recompose::SolveOptions& solve) {
  return recompose::choose_plan(
      *model_, [this] { step(); }, profile_, budget, recompose::PlannerOptions().solve(solve));
}

}  // namespace gpt
