// --budget and --sweep: the memory-budget planner on this model (recompose/planner.h).
#pragma once

#include "data.h"
#include "fused_adamw.h"
#include "model.h"
#include "train.h"

#include <recompose/memory_plan.h>
#include <recompose/memory_profile.h>
#include <recompose/planner.h>

#include <torch/torch.h>

#include <optional>

namespace gpt {

// What the planner measures on, the one place --budget and --sweep get it from: a model built
// from the seed like every Trainer's, its training step (forward and backward of one batch, no
// optimizer step) and the profile of that step (recompose::profile_memory), taken after one
// warm-up step so that it sees no one-time costs. Its own model: the training that follows is the
// same as without it. On CUDA it holds FusedAdamW's moments as training does, so that the
// profile's resident bytes (a peak budget's base) and the trials' memory count them. Not movable
// (the step refers to its members); drop it before training, so its model and optimizer state do
// not stay beside the trainers'.
class PlanningStep {
 public:
  PlanningStep(const Config& config, const CharDataset& data, const TrainOptions& options);
  PlanningStep(const PlanningStep&) = delete;
  PlanningStep& operator=(const PlanningStep&) = delete;

  const recompose::MemoryProfile& profile() const { return profile_; }
  // recompose::choose_plan on this model, step and profile: the candidates the estimates rank
  // first, each tried for a few real steps, the fastest that fits as measured (Plan::trials says
  // what was weighed, Plan::planning_steps what it cost beside the profile's
  // profile_seconds). The model is put back after every trial step.
  recompose::Plan choose(const recompose::Budget& budget, const recompose::SolveOptions& solve);

 private:
  void step();

  GPT model_{nullptr};
  std::optional<FusedAdamW> optimizer_;  // CUDA: its moments are resident, as in training
  torch::Tensor inputs_, targets_;
  bool bf16_ = false;
  recompose::MemoryProfile profile_;
};

}  // namespace gpt
