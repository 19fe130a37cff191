// --budget and --sweep: the memory-budget planner on this model (recompose/planner.h).
#pragma once

#include "data.h"
#include "model.h"
#include "train.h"

#include <recompose/memory_profile.h>

namespace gpt {

// Profiles one training step (forward and backward of a batch) of a model built from the seed
// like every Trainer's, after one warm-up step so the profile sees no one-time costs. The
// profile is taken on its own model: the training that follows is the same as without it.
recompose::MemoryProfile profile_training_step(const Config& config, const CharDataset& data,
                                               const TrainOptions& options);

}  // namespace gpt
