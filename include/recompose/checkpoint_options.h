// Options of a checkpointed region, builder-style like LibTorch's options:
//
//   recompose::apply_checkpoint(block, recompose::CheckpointOptions()
//                                          .preserve_rng_state(false)
//                                          .determinism_check(recompose::DeterminismCheck::None));
#pragma once

#include <recompose/region_contexts.h>

#include <torch/arg.h>

#include <memory>

namespace recompose {

class SelectivePolicy;  // recompose/selective_checkpoint.h
class SwapManager;      // recompose/swap.h

// What the recomputation is compared against the original forward with.
enum class DeterminismCheck {
  Default,  // shape, dtype and device of every saved tensor
  None,     // no check
};

struct CheckpointOptions {
  // Restore the CPU generator and the generators of the devices the inputs live on before
  // recomputing, so that random ops (dropout) draw the same numbers.
  TORCH_ARG(bool, preserve_rng_state) = true;
  // Stop recomputing as soon as every tensor backward needs has been recomputed. A
  // set_checkpoint_early_stop() guard alive at forward time overrides this.
  TORCH_ARG(bool, early_stop) = true;
  TORCH_ARG(DeterminismCheck, determinism_check) = DeterminismCheck::Default;
  // On a determinism error, also list the ops of the forward and of the recomputation.
  // A set_checkpoint_debug_enabled() guard alive at forward time overrides this.
  TORCH_ARG(bool, debug) = false;
  // Contexts entered around the forward and each recomputation (PyTorch's context_fn).
  TORCH_ARG(ContextFn, context_fn) = nullptr;
  // Selective activation checkpointing: a per-op policy (see recompose/selective_checkpoint.h).
  // Cannot be combined with context_fn.
  TORCH_ARG(std::shared_ptr<const SelectivePolicy>, policy) = nullptr;
  // Same, from a policy value (a callable or a list of op names to save).
 public:
  CheckpointOptions& policy(const SelectivePolicy& p);  // defined in lib/selective
  // Activation swap (see recompose/swap.h): offload the region's inputs to host memory between
  // forward and backward. Uses swap_manager, or the default manager when it is null.
  TORCH_ARG(bool, swap_inputs) = false;
  TORCH_ARG(std::shared_ptr<SwapManager>, swap_manager) = nullptr;

 public:
};

}  // namespace recompose
