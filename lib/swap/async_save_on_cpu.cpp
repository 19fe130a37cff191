// AsyncSaveOnCpu: the core's swap policy installed for a scope.
#include "swap/swap_core.h"

namespace recompose {

// The scope keeps the core alive: the policy on the thread's stack lives in it.
struct AsyncSaveOnCpu::Scope {
  explicit Scope(const std::shared_ptr<detail::SwapCore>& core)
      : scope(core->policy(), "recompose::AsyncSaveOnCpu", core) {}
  detail::SavedTensorPolicyScope scope;
};

AsyncSaveOnCpu::AsyncSaveOnCpu(std::shared_ptr<SwapManager> manager)
    : manager_(manager ? std::move(manager) : SwapManager::default_manager()) {
  auto core = manager_->core().shared_from_this();
  // Tensors of this scope do not share an implicit group with what was saved before it.
  core->close_implicit_group();
  scope_ = std::make_unique<Scope>(core);
}

AsyncSaveOnCpu::~AsyncSaveOnCpu() {
  scope_.reset();
  manager_->core().close_implicit_group();
}

}  // namespace recompose
