// AsyncSaveOnCpu: a swap policy installed for a scope.
#include "swap/swap_access.h"
#include "swap/swap_core.h"
#include "swap/swap_hooks.h"

namespace recompose {

// The policy on the thread's stack lives here; it holds the core.
struct AsyncSaveOnCpu::Scope {
  explicit Scope(const std::shared_ptr<detail::SwapCore>& core)
      : policy(core, /*saved_by_ops=*/true), scope(policy, "recompose::AsyncSaveOnCpu") {}
  detail::SwapPolicy policy;
  detail::SavedTensorPolicyScope scope;
};

AsyncSaveOnCpu::AsyncSaveOnCpu(std::shared_ptr<SwapManager> manager)
    : manager_(manager ? std::move(manager) : SwapManager::default_manager()) {
  // Tensors of this scope do not share an implicit group with what was saved before it.
  detail::SwapAccess::core(*manager_)->close_implicit_group();
  scope_ = std::make_unique<Scope>(detail::SwapAccess::core(*manager_));
}

AsyncSaveOnCpu::~AsyncSaveOnCpu() {
  scope_.reset();
  detail::SwapAccess::core(*manager_)->close_implicit_group();
}

}  // namespace recompose
