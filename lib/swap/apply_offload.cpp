// Composable activation offload: a pre-hook installs the call's batch as the saved-tensor policy,
// the post-hook takes it off and hands the batch over to be launched when the next offloaded
// call begins.
#include "engine/checkpoint_depth.h"
#include "swap/offload_batch.h"
#include "swap/swap_core.h"

#include <recompose/apply_offload.h>
#include <recompose/hooks/forward_hooks.h>
#include <recompose/hooks/module_state.h>

#include <torch/csrc/autograd/grad_mode.h>

namespace recompose {
namespace {

struct OffloadState {
  OffloadOptions options;
  std::shared_ptr<SwapManager> manager;
  std::shared_ptr<detail::OffloadCounters> counters = std::make_shared<detail::OffloadCounters>();
  hooks::HookHandle pre;
  hooks::HookHandle post;
};

// What one call keeps from its pre-hook to its post-hook.
struct CallOffload {
  std::shared_ptr<detail::OffloadBatch> batch;
  std::unique_ptr<detail::SavedTensorPolicyScope> scope;
  bool keep_last_on_device = true;
};

// Offloading does nothing where nothing is kept for backward (grad mode off), where a region
// already keeps nothing (inside a checkpointed forward), and during a recomputation (its tensors
// live until backward uses them, moments later).
bool offload_applies() {
  return torch::autograd::GradMode::is_enabled() && detail::CheckpointDepth::forward() == 0 &&
         detail::CheckpointDepth::recompute() == 0;
}

}  // namespace

torch::nn::Module& apply_offload(torch::nn::Module& module, const OffloadOptions& options) {
  if (!hooks::has_annotated_forward(module)) {
    // Let the hook layer produce its message (names the type and the annotation).
    hooks::register_forward_pre_hook(module, [](hooks::ForwardCall&) {});
  }
  auto state = hooks::attach_state(module, kOffloadApi, std::make_shared<OffloadState>());
  state->options = options;
  state->manager = options.manager() ? options.manager() : SwapManager::default_manager();
  const auto owner = hooks::HookOptions().owner(kOffloadApi);
  try {
    std::weak_ptr<OffloadState> weak = state;  // the module owns its hooks; no cycle
    // Prepended pre-hook and appended post-hook: the offload encloses every other hook of the
    // module, a checkpointed region in particular (whose inputs it then offloads), whichever was
    // applied first.
    state->pre = hooks::register_forward_pre_hook(module, [weak](hooks::ForwardCall& call) {
      auto st = weak.lock();
      if (!st || !offload_applies()) return;
      detail::launch_closed_batches();  // the previous calls' tensors leave as this one starts
      auto c = std::make_shared<CallOffload>();
      c->keep_last_on_device = st->options.keep_last_on_device();
      c->batch = std::make_shared<detail::OffloadBatch>(st->manager->core().shared_from_this(), st->counters,
                                                        st->options.policy());
      c->scope = std::make_unique<detail::SavedTensorPolicyScope>(c->batch->policy(), "recompose::apply_offload",
                                                                  c->batch);
      st->counters->calls += 1;
      call.slot(kOffloadApi) = c;
    }, hooks::HookOptions(owner).prepend(true));
    state->post = hooks::register_forward_hook(module, [](hooks::ForwardCall& call) {
      auto c = std::static_pointer_cast<CallOffload>(call.slot(kOffloadApi));
      if (!c) return;
      call.slot(kOffloadApi).reset();
      c->scope.reset();
      if (call.error()) return;  // the forward failed: its graph, and the tensors, are dropped
      if (c->keep_last_on_device) {
        detail::add_closed_batch(std::move(c->batch));
      } else {
        c->batch->launch();
      }
    }, hooks::HookOptions(owner).always_call(true));
  } catch (...) {
    state->pre.remove();
    state->post.remove();
    hooks::detach_state(module, kOffloadApi);
    throw;
  }
  return module;
}

bool remove_offload(torch::nn::Module& module) {
  auto state = hooks::find_state<OffloadState>(module, kOffloadApi);
  if (!state) return false;
  state->pre.remove();
  state->post.remove();
  hooks::detach_state(module, kOffloadApi);
  return true;
}

bool is_offloaded(const torch::nn::Module& module) {
  return hooks::find_state<OffloadState>(module, kOffloadApi) != nullptr;
}

namespace {
std::shared_ptr<OffloadState> offload_state_or_throw(const torch::nn::Module& module, const char* function) {
  auto state = hooks::find_state<OffloadState>(module, kOffloadApi);
  if (!state) {
    throw CheckpointError(std::string("recompose::") + function + ": module " + module.name() +
                          " is not offloaded; call recompose::apply_offload on it first");
  }
  return state;
}
}  // namespace

OffloadStats offload_stats(const torch::nn::Module& module) {
  return offload_state_or_throw(module, "offload_stats")->counters->snapshot();
}

void reset_offload_stats(torch::nn::Module& module) {
  offload_state_or_throw(module, "reset_offload_stats")->counters->reset();
}

}  // namespace recompose
