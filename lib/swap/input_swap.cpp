#include "swap/input_swap.h"

#include "swap/swap_access.h"
#include "swap/swap_core.h"
#include "swap/swap_hooks.h"

namespace recompose::detail {

std::unique_ptr<SavedTensorPolicyScope> input_swap_scope(const CheckpointOptions& options) {
  if (!options.swap_inputs()) return nullptr;
  const auto& manager =
      options.swap_manager() ? options.swap_manager() : SwapManager::default_manager();
  const auto& core = SwapAccess::core(*manager);
  core->close_implicit_group();
  // The scope holds the policy, and the policy its core, whatever happens to `options`.
  auto policy = std::make_shared<SwapPolicy>(core, /*saved_by_ops=*/false);
  return std::make_unique<SavedTensorPolicyScope>(
      *policy, "the swap_inputs scope of a checkpointed region", policy);
}

}  // namespace recompose::detail
