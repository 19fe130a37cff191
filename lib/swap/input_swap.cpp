#include "swap/input_swap.h"

#include "swap/swap_core.h"

namespace recompose::detail {

std::unique_ptr<SavedTensorPolicyScope> input_swap_scope(const CheckpointOptions& options) {
  if (!options.swap_inputs()) return nullptr;
  const auto& manager = options.swap_manager() ? options.swap_manager() : SwapManager::default_manager();
  manager->core().close_implicit_group();
  return std::make_unique<SavedTensorPolicyScope>(manager->core().policy());
}

}  // namespace recompose::detail
