// AsyncSaveOnCpu: the core's swap policy installed for a scope.
#include "swap/swap_core.h"

namespace recompose {

struct AsyncSaveOnCpu::Scope {
  explicit Scope(detail::SavedTensorPolicy& policy) : scope(policy) {}
  detail::SavedTensorPolicyScope scope;
};

AsyncSaveOnCpu::AsyncSaveOnCpu(std::shared_ptr<SwapManager> manager)
    : manager_(manager ? std::move(manager) : SwapManager::default_manager()) {
  // Tensors of this scope do not share an implicit group with what was saved before it.
  manager_->core().close_implicit_group();
  scope_ = std::make_unique<Scope>(manager_->core().policy());
}

AsyncSaveOnCpu::~AsyncSaveOnCpu() {
  scope_.reset();
  manager_->core().close_implicit_group();
}

}  // namespace recompose
