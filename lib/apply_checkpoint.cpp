// Composable checkpointing: hooks on an annotated module drive the same region protocol as the
// functional checkpoint(); recomputation re-invokes the module with these hooks off.
#include <recompose/apply_checkpoint.h>
#include <recompose/checkpoint_error.h>
#include <recompose/hooks/forward_hooks.h>
#include <recompose/region_run.h>

#include <torch/nn/module.h>

namespace recompose {
namespace {

struct CheckpointState {
  CheckpointOptions options;
  hooks::HookHandle pre;
  hooks::HookHandle post;
};

}  // namespace

torch::nn::Module& apply_checkpoint(torch::nn::Module& module, const CheckpointOptions& options) {
  detail::validate_options(options);  // refuse bad options when attaching, not at the first forward
  if (!hooks::has_annotated_forward(module)) {
    // Let the hook layer produce its message (names the type and the annotation).
    hooks::register_forward_pre_hook(module, [](hooks::ForwardCall&) {});
  }
  auto state = hooks::attach_state(module, kCheckpointApi, std::make_shared<CheckpointState>());
  state->options = options;
  const auto owner = hooks::HookOptions().owner(kCheckpointApi);
  try {
    // The state is captured weakly: the module owns its hooks and state, a strong reference
    // would keep it alive forever.
    std::weak_ptr<CheckpointState> weak = state;
    state->pre = hooks::register_forward_pre_hook(module, [weak](hooks::ForwardCall& call) {
      auto st = weak.lock();
      if (!st) return;
      // Arguments are kept without their tensors (the region saves those) and with the module
      // held alive until the graph no longer needs the recomputation.
      std::shared_ptr<hooks::StoredCall> stored = call.store(/*keep_tensors=*/false);
      auto recompute = [stored](const std::vector<at::Tensor>& leaves) { stored->rerun(leaves, kCheckpointApi); };
      // The module's own state (buffers, train/eval mode) is preserved across the recomputation.
      detail::RegionRun region = detail::RegionRun::begin(st->options, call.input_leaves(), std::move(recompute),
                                                          call.module().shared_from_this());
      call.slot(kCheckpointApi) = std::move(region).into_handle();
    }, owner);
    // Prepended: the region closes before the post-hooks registered earlier run, so hooks that
    // enclose it (apply_offload, a sharded trainer's unshard/reshard) nest around it.
    state->post = hooks::register_forward_hook(module, [](hooks::ForwardCall& call) {
      std::shared_ptr<void>& slot = call.slot(kCheckpointApi);
      if (!slot) return;
      detail::RegionRun::from_handle(std::move(slot)).end(call.error());
    }, hooks::HookOptions(owner).always_call(true).prepend(true));
  } catch (...) {
    state->pre.remove();
    state->post.remove();
    hooks::detach_state(module, kCheckpointApi);
    throw;
  }
  return module;
}

bool remove_checkpoint(torch::nn::Module& module) {
  auto state = hooks::find_state<CheckpointState>(module, kCheckpointApi);
  if (!state) return false;
  state->pre.remove();
  state->post.remove();
  hooks::detach_state(module, kCheckpointApi);
  return true;
}

bool is_checkpointed(const torch::nn::Module& module) {
  return hooks::find_state<CheckpointState>(module, kCheckpointApi) != nullptr;
}

}  // namespace recompose
