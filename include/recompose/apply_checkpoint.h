// Composable activation checkpointing, like torch.distributed._composable.checkpoint: attach it
// to an existing module whose forward carries RECOMPOSE_FORWARD, and every later forward of that
// module with grad mode on is a checkpointed region. The module tree, parameter names, buffers
// and state_dict do not change.
//
//   for (auto& block : model->blocks) recompose::apply_checkpoint(block);
//   auto loss = model(x).sum();
//   loss.backward();                       // each block's forward is recomputed here
//
// Recomputation runs the module's forward again with apply_checkpoint's own hooks off and every
// other hook on (so a sharded trainer's unshard hook fires; it can ask is_recomputing()).
// The module is held alive as long as the autograd graph needs it.
#pragma once

#include <recompose/checkpoint_options.h>
#include <recompose/hooks/composable_api.h>
#include <recompose/hooks/module_state.h>

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace recompose {

/// The API name under which the checkpoint state is attached (see hooks::applied_apis).
inline constexpr const char* kCheckpointApi = "recompose.checkpoint";

/// Attaches checkpointing to `module` (whose forward carries RECOMPOSE_FORWARD) with `options`
/// and returns it: from then on, each forward of the module with grad mode on is a checkpointed
/// region. Overloads take a std::shared_ptr<M> or a ModuleHolder (Block) and return it.
///
/// Throws hooks::CompositionError if the module is already checkpointed, std::invalid_argument if
/// its forward is not annotated with RECOMPOSE_FORWARD or it is not owned by a std::shared_ptr,
/// and CheckpointError if options are contradictory (policy together with context_fn) or need a
/// component this build lacks (policy without selective checkpointing, swap_inputs without
/// activation swap).
///
/// Example:
/// ```
/// for (auto& block : model->blocks) recompose::apply_checkpoint(block);
/// recompose::apply_checkpoint(model->head, recompose::CheckpointOptions().early_stop(false));
/// ```
torch::nn::Module& apply_checkpoint(torch::nn::Module& module,
                                    const CheckpointOptions& options = {});

template <class M>
std::shared_ptr<M> apply_checkpoint(const std::shared_ptr<M>& module,
                                    const CheckpointOptions& options = {}) {
  apply_checkpoint(static_cast<torch::nn::Module&>(*module), options);
  return module;
}

template <class M>
torch::nn::ModuleHolder<M>& apply_checkpoint(torch::nn::ModuleHolder<M>& module,
                                             const CheckpointOptions& options = {}) {
  apply_checkpoint(static_cast<torch::nn::Module&>(*module), options);
  return module;
}

namespace detail {
int64_t apply_checkpoint_where(torch::nn::Module& model,
                               const std::function<bool(const torch::nn::Module&)>& match,
                               const std::string& type_name, const CheckpointOptions& options);
}  // namespace detail

/// Checkpoints every module of type M (BlockImpl, or its holder Block) in `model`'s tree, `model`
/// included, wherever it sits: private members, Sequential or ModuleList entries, nested blocks
/// (a block inside a block is a nested region), each with `options`. Returns how many modules it
/// checkpointed.
///
/// All or nothing: if one module cannot be checkpointed, those done are undone and the error goes
/// on. Throws std::invalid_argument if no module of type M is found (the wrong type, e.g. a base
/// class of nothing in the tree: checkpointing nothing silently would hide it), and what
/// apply_checkpoint throws (hooks::CompositionError if one is checkpointed already).
///
/// Example:
/// ```
/// recompose::apply_checkpoint_to<BlockImpl>(*model);   // model->blocks may well be private
/// ```
template <class M>
int64_t apply_checkpoint_to(torch::nn::Module& model, const CheckpointOptions& options = {}) {
  return detail::apply_checkpoint_where(model, &hooks::is_module_of_type<M>,
                                        hooks::type_name_of<M>(), options);
}
template <class M, class Root>
int64_t apply_checkpoint_to(torch::nn::ModuleHolder<Root>& model,
                            const CheckpointOptions& options = {}) {
  return apply_checkpoint_to<M>(static_cast<torch::nn::Module&>(*model), options);
}

/// Detaches checkpointing from `module`; regions already recorded still recompute. Returns false
/// if the module was not checkpointed.
///
/// Example:
/// ```
/// for (auto& block : model->blocks) recompose::remove_checkpoint(block);
/// ```
bool remove_checkpoint(torch::nn::Module& module);
template <class M>
bool remove_checkpoint(torch::nn::ModuleHolder<M>& module) {
  return remove_checkpoint(static_cast<torch::nn::Module&>(*module));
}

/// True if apply_checkpoint is attached to `module`.
///
/// Example:
/// ```
/// if (!recompose::is_checkpointed(block)) recompose::apply_checkpoint(block);
/// ```
bool is_checkpointed(const torch::nn::Module& module);
template <class M>
bool is_checkpointed(const torch::nn::ModuleHolder<M>& module) {
  return is_checkpointed(static_cast<const torch::nn::Module&>(*module));
}

}  // namespace recompose
