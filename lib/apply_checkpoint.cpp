// Composable checkpointing: hooks on an annotated module drive the same region protocol as the
// functional checkpoint(); recomputation re-invokes the module with these hooks off.
#include <recompose/apply_checkpoint.h>
#include <recompose/checkpoint_error.h>
#include <recompose/hooks/composable_api.h>
#include <recompose/region_run.h>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>

#include <stdexcept>
#include <string>

namespace recompose {
namespace {

struct CheckpointState {
  CheckpointOptions options;
};

// LibTorch's own modules cannot carry RECOMPOSE_FORWARD: name what checkpoints them instead
// (docs/guide/modules-you-cannot-annotate.md).
std::string builtin_module_advice(const torch::nn::Module& module) {
  const std::string guide = " (see docs/guide/modules-you-cannot-annotate.md)";
  if (dynamic_cast<const torch::nn::SequentialImpl*>(&module) != nullptr) {
    return "Checkpoint it with recompose::checkpoint_sequential(seq, segments, input), which "
           "checkpoints every "
           "segment but the last, or run it through recompose::checkpoint(fn, ...) with "
           "CheckpointOptions().state_modules({seq.ptr()})" +
           guide;
  }
  return "Run it through the functional checkpoint, naming it in state_modules so that its buffers "
         "and "
         "train/eval mode are preserved: "
         "recompose::checkpoint(recompose::CheckpointOptions().state_modules({"
         "layer.ptr()}), [&](const torch::Tensor& x) { return layer->forward(x); }, x)" +
         guide;
}

const hooks::ComposableApi<CheckpointState>& checkpoint_api() {
  static const hooks::ComposableApi<CheckpointState> api(
      kCheckpointApi, "recompose::apply_checkpoint", builtin_module_advice);
  return api;
}

}  // namespace

torch::nn::Module& apply_checkpoint(torch::nn::Module& module, const CheckpointOptions& options) {
  detail::validate_options(options);  // refuse bad options when attaching, not at the first forward
  auto state = std::make_shared<CheckpointState>();
  state->options = options;
  checkpoint_api().apply(
      module, std::move(state), [](hooks::ApiHooks& hooks, std::weak_ptr<CheckpointState> weak) {
        hooks.pre([weak](hooks::ForwardCall& call) {
          auto st = weak.lock();
          if (!st) return;
          // Arguments are kept without their tensors (the region saves those) and with the module
          // held alive until the graph no longer needs the recomputation.
          std::shared_ptr<hooks::StoredCall> stored = call.store(/*keep_tensors=*/false);
          auto recompute = [stored](const std::vector<at::Tensor>& leaves) {
            stored->rerun(leaves, kCheckpointApi);
          };
          // The module's own state (buffers, train/eval mode) is preserved across the
          // recomputation.
          detail::RegionRun region =
              detail::RegionRun::begin(st->options, call.input_leaves(), std::move(recompute),
                                       call.module().shared_from_this());
          call.slot(kCheckpointApi) = std::move(region).into_handle();
        });
        // Prepended: the region closes before the post-hooks registered earlier run, so hooks that
        // enclose it (apply_offload, a sharded trainer's unshard/reshard) nest around it.
        hooks.post(
            [](hooks::ForwardCall& call) {
              std::shared_ptr<void>& slot = call.slot(kCheckpointApi);
              if (!slot) return;
              detail::RegionRun::from_handle(std::move(slot)).end(call.error());
            },
            hooks::HookOptions().always_call(true).prepend(true));
      });
  return module;
}

namespace detail {
int64_t apply_checkpoint_where(torch::nn::Module& model,
                               const std::function<bool(const torch::nn::Module&)>& match,
                               const std::string& type_name, const CheckpointOptions& options) {
  validate_options(options);
  return hooks::apply_to_matching(
      model, "apply_checkpoint_to", type_name, match,
      [&](torch::nn::Module& m) { apply_checkpoint(m, options); },
      [](torch::nn::Module& m) { remove_checkpoint(m); });
}
}  // namespace detail

bool remove_checkpoint(torch::nn::Module& module) { return checkpoint_api().remove(module); }

bool is_checkpointed(const torch::nn::Module& module) {
  return checkpoint_api().is_applied(module);
}

}  // namespace recompose
