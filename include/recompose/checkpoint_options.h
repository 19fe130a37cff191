// Options of a checkpointed region (CheckpointOptions), builder-style like LibTorch's options.
#pragma once

#include <recompose/region_contexts.h>

#include <torch/arg.h>

#include <memory>
#include <vector>

namespace torch::nn {
class Module;
}

namespace recompose {

class SelectivePolicy;  // recompose/selective_checkpoint.h
class SwapManager;      // recompose/swap.h

/// What the recomputation is compared against the original forward with (PyTorch's
/// `determinism_check`). A mismatch throws CheckpointError during backward.
enum class DeterminismCheck {
  /// The number of saved tensors, and the shape, dtype and device of each (PyTorch's "default").
  Default,
  /// Only the number of saved tensors (PyTorch's "none").
  None,
};

/// Options of a checkpointed region, for `apply_checkpoint`, `apply_checkpoint_to`, `checkpoint`
/// and `checkpoint_sequential` (torch.utils.checkpoint's keyword arguments, as a builder).
///
/// Example:
/// ```
/// recompose::apply_checkpoint(block, recompose::CheckpointOptions()
///                                        .preserve_rng_state(false)
///                                        .determinism_check(recompose::DeterminismCheck::None));
/// auto y = recompose::checkpoint(recompose::CheckpointOptions().early_stop(false),
///                                [&](const torch::Tensor& x) { return mlp(x); }, x);
/// ```
struct CheckpointOptions {
  /// Restore the CPU generator and the default generators of the devices the inputs live on
  /// before recomputing, so that random ops (dropout) draw the same numbers. Default: true
  TORCH_ARG(bool, preserve_rng_state) = true;
  /// Stop recomputing as soon as every tensor backward needs has been recomputed. A
  /// set_checkpoint_early_stop() guard alive at forward time overrides this. Stopping unwinds
  /// the body with an exception, so it is skipped when it would save nothing: if the forward
  /// made no autograd node after the output it saved last (the body ended with that op), the
  /// recomputation runs to the end, and any no-grad work after that op runs in it too (as
  /// with early_stop(false); module buffers and RNG streams are still left as the forward left
  /// them). Default: true
  TORCH_ARG(bool, early_stop) = true;
  /// What the recomputation's saved tensors are compared with (see DeterminismCheck).
  /// Default: DeterminismCheck::Default
  TORCH_ARG(DeterminismCheck, determinism_check) = DeterminismCheck::Default;
  /// On a determinism error, also list the ops of the forward and of the recomputation.
  /// A set_checkpoint_debug_enabled() guard alive at forward time overrides this. Default: false
  TORCH_ARG(bool, debug) = false;
  /// Contexts entered around the forward and each recomputation (PyTorch's context_fn; see
  /// recompose/region_contexts.h). Cannot be combined with policy. Default: nullptr (none)
  TORCH_ARG(ContextFn, context_fn) = nullptr;
  /// Selective activation checkpointing: a per-op policy (see recompose/selective_checkpoint.h).
  /// Cannot be combined with context_fn: apply_checkpoint, and checkpoint() when its region
  /// begins, throw CheckpointError when both are set, or when a policy is set in a build without
  /// selective checkpointing (-Dselective=disabled). Default: nullptr (every saved tensor is
  /// recomputed)
  TORCH_ARG(std::shared_ptr<const SelectivePolicy>, policy) = nullptr;

 public:
  /// Same, from a policy value (a callable or a list of op names to save); stores a copy.
  /// Example: `CheckpointOptions().policy(SelectivePolicy({"aten::mm"}))`.
  CheckpointOptions& policy(const SelectivePolicy& p);  // defined in lib/selective
  /// Activation swap (see recompose/swap.h): offload the region's inputs to host memory between
  /// forward and backward, through swap_manager. A build without activation swap
  /// (-Dswap=disabled) throws CheckpointError when it is set. Default: false
  TORCH_ARG(bool, swap_inputs) = false;
  /// The manager that swap_inputs and the selective policy's MUST_SWAP outputs go through.
  /// Default: nullptr (SwapManager::default_manager())
  TORCH_ARG(std::shared_ptr<SwapManager>, swap_manager) = nullptr;
  /// Module state. A recomputation runs the region's modules a second time: it would update
  /// their buffers twice (BatchNorm's running statistics, counters, EMAs) and run in whatever
  /// train/eval mode they are in at backward time. With preserve_module_state (the default),
  /// the recomputation runs every module of the preserved trees in the mode the forward ran in,
  /// sees each buffer with the value it had when the forward began, and leaves every buffer as it
  /// was before the recomputation, its version counter included (a tensor autograd saved
  /// outside the region, such as the running statistics of the same BatchNorm called outside it,
  /// passes its version check): training computes exactly what it computes without
  /// checkpointing. Cost: a copy of the trees' buffers at each forward of the region, held until
  /// the region's backward (every buffer is put back, written or not: kernels such as
  /// BatchNorm's write without marking it, and a write may leave the value as it was).
  ///
  /// apply_checkpoint preserves the checkpointed module's tree by itself. The functional
  /// checkpoint() cannot know which modules its body calls: name them in state_modules, or the
  /// body's buffer updates happen twice and a mode switch before backward changes the
  /// recomputation. A member tensor pointed at a new tensor (reassigned rather than written) is
  /// no longer the registered buffer and is not restored. Default: true
  TORCH_ARG(bool, preserve_module_state) = true;
  /// The modules whose trees (each with its submodules) preserve_module_state preserves, for the
  /// functional checkpoint() (apply_checkpoint adds the checkpointed module itself;
  /// checkpoint_sequential the modules of each segment). Default: {} (none)
  TORCH_ARG(std::vector<std::shared_ptr<torch::nn::Module>>, state_modules) = {};
};

}  // namespace recompose
