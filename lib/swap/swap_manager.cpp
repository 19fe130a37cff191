// SwapManager and SwapGroupScope: the public face of SwapCore.
#include "swap/swap_access.h"
#include "swap/swap_core.h"

#include <c10/util/Exception.h>

namespace recompose {

SwapManager::SwapManager(SwapOptions options)
    : core_(std::make_shared<detail::SwapCore>(std::move(options))) {}
SwapManager::~SwapManager() = default;

std::shared_ptr<SwapManager> SwapManager::create(SwapOptions options) {
  return std::shared_ptr<SwapManager>(new SwapManager(std::move(options)));
}

std::shared_ptr<SwapManager> SwapManager::default_manager() {
  // Leaked on purpose: pinned buffers must not be freed during static destruction, after the
  // device runtime may be gone.
  static auto* manager = new std::shared_ptr<SwapManager>(create());
  return *manager;
}

const SwapOptions& SwapManager::options() const { return core_->options(); }
int64_t SwapManager::begin_group() { return core_->begin_group(); }
void SwapManager::end_group(int64_t id) { core_->end_group(id); }
bool SwapManager::eligible(const at::Tensor& tensor) const { return core_->eligible(tensor); }
std::shared_ptr<SwappedTensor> SwapManager::offload(const at::Tensor& tensor) {
  return core_->offload(tensor);
}
void SwapManager::poll() { core_->poll(); }
void SwapManager::synchronize() { core_->synchronize(); }
SwapStats SwapManager::stats() const { return core_->stats(); }
void SwapManager::reset_stats() { core_->reset_stats(); }
int64_t SwapManager::pool_bytes() const { return core_->pool_bytes(); }
void SwapManager::clear_pool() { core_->clear_pool(); }
int64_t SwapManager::tensors_alive() const { return core_->tensors_alive(); }
int64_t SwapManager::bytes_alive() const { return core_->bytes_alive(); }

SwapGroupScope::SwapGroupScope(SwapManager& manager)
    : core_(detail::SwapAccess::core(manager)), id_(core_->begin_group()) {}

SwapGroupScope::~SwapGroupScope() {
  try {
    core_->end_group(id_);
  } catch (const std::exception& e) {
    // A destructor must not throw; a non-LIFO or cross-thread close is a bug of the caller's.
    // The group is closed all the same, or it would collect this thread's tensors for good.
    TORCH_WARN(e.what(), " (recompose::SwapGroupScope: the group has been closed anyway)");
    core_->force_end_group(id_);
  }
}

}  // namespace recompose
