#include "swap/input_swap.h"

#include "swap/swap_core.h"

namespace recompose::detail {

std::unique_ptr<SavedTensorPolicyScope> input_swap_scope(const CheckpointOptions& options) {
  if (!options.swap_inputs()) return nullptr;
  const auto& manager = options.swap_manager() ? options.swap_manager() : SwapManager::default_manager();
  auto core = manager->core().shared_from_this();
  core->close_implicit_group();
  // The scope holds the core, whose policy it installs, whatever happens to `options`.
  return std::make_unique<SavedTensorPolicyScope>(core->policy(), "the swap_inputs scope of a checkpointed region", core);
}

}  // namespace recompose::detail
