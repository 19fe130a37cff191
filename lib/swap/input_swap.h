// The swap_inputs option of a checkpointed region: its inputs, saved for backward by the
// engine's no-op "save inputs" function, are offloaded to host memory.
#pragma once

#include "engine/saved_tensor_policy.h"

#include <recompose/checkpoint_options.h>

#include <memory>

namespace recompose::detail {

// nullptr when !options.swap_inputs(); otherwise a scope that offloads the tensors saved while
// it is alive through options.swap_manager() (the default manager when null). The scope keeps
// the manager's core alive (its policy lives there). Closes the manager's current
// implicit group, so that each region's inputs form a group of their own (outside explicit
// SwapGroupScopes).
//   auto swap = input_swap_scope(options);
//   at::Tensor saver = save_region_inputs(inputs);
//   swap.reset();
std::unique_ptr<SavedTensorPolicyScope> input_swap_scope(const CheckpointOptions& options);

}  // namespace recompose::detail
