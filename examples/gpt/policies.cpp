#include "policies.h"

#include "offload_link.h"

#include <recompose/recompose.h>
#include <recompose/selective_checkpoint.h>
#include <recompose/swap.h>

namespace gpt {

std::string_view policy_name(Policy policy) {
  switch (policy) {
    case Policy::None:
      return "none";
    case Policy::Full:
      return "full";
    case Policy::Selective:
      return "selective";
    case Policy::Swap:
      return "swap";
    case Policy::Offload:
      return "offload";
    case Policy::EverySecondMm:
      return "every-second-mm";
    case Policy::OffloadWindow:
      return "offload-window";
    case Policy::Planned:
      return "planned";
  }
  return "?";
}

std::optional<Policy> parse_policy(std::string_view name) {
  for (Policy p : kAllPolicies) {
    if (policy_name(p) == name) return p;
  }
  return std::nullopt;
}

namespace {

// Swap: the outputs of matrix products (the expensive ops) are kept, in host memory between
// forward and backward, and so is the block's input; everything else is recomputed.
// min_bytes(0): this example's tensors are small, and the point is to show them all going
// through the swap path (the default manager leaves tensors under 1 MiB on the device).
recompose::CheckpointOptions swap_options(const std::shared_ptr<recompose::SwapManager>& manager) {
  auto policy =
      recompose::SelectivePolicy([](const recompose::SelectiveCheckpointContext&,
                                    const c10::OperatorHandle& op, const torch::jit::Stack&) {
        const auto& name = op.schema().name();
        return name == "aten::mm" || name == "aten::addmm" || name == "aten::bmm"
                   ? recompose::CheckpointPolicy::MUST_SWAP
                   : recompose::CheckpointPolicy::PREFER_RECOMPUTE;
      });
  return recompose::CheckpointOptions().policy(policy).swap_inputs(true).swap_manager(manager);
}

}  // namespace

std::shared_ptr<recompose::SwapManager> apply_policy(GPT& model, Policy policy) {
  const bool swaps =
      policy == Policy::Swap || policy == Policy::Offload || policy == Policy::OffloadWindow;
  auto manager =
      swaps ? recompose::SwapManager::create(recompose::SwapOptions().min_bytes(0)) : nullptr;
  for (auto& block : model->blocks) {
    switch (policy) {
      case Policy::None:
      case Policy::Planned:
        break;  // the plan is applied by recompose::apply_plan (train.cpp)
      case Policy::Full:
        recompose::apply_checkpoint(block);
        break;
      case Policy::Selective:
        recompose::apply_checkpoint(
            block, recompose::CheckpointOptions().policy(recompose::transformer_policy()));
        break;
      case Policy::Swap:
        recompose::apply_checkpoint(block, swap_options(manager));
        break;
      case Policy::EverySecondMm:
        recompose::apply_checkpoint(
            block, recompose::CheckpointOptions().policy(recompose::transformer_policy(
                       recompose::TransformerPolicyOptions().recompute_every_second_mm(true))));
        break;
      // One swap group per block, prefetched in reverse block order; the last block's
      // activations stay on the device (backward needs them first).
      case Policy::Offload:
        recompose::apply_offload(block, recompose::OffloadOptions().manager(manager));
        break;
      // The same, but a block's tensors go only while the link moves them inside the next
      // block's forward (its measured time) and come back inside a backward: never a stall.
      case Policy::OffloadWindow:
        recompose::apply_offload(
            block, recompose::OffloadOptions()
                       .manager(manager)
                       .never_stall(offload_link(model->parameters().front().device()))
                       .forward_window_seconds(offload_window()));
        break;
    }
  }
  return manager;
}

}  // namespace gpt
