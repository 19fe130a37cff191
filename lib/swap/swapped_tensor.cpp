// SwappedTensor: a handle over its entry; the core owns the locking and the copies.
#include "swap/swap_core.h"

namespace recompose {

SwappedTensor::SwappedTensor(std::shared_ptr<detail::SwapCore> core,
                             std::unique_ptr<detail::SwapEntry> entry)
    : core_(std::move(core)), entry_(std::move(entry)) {}

// The entry leaves every table of the core before it is freed. See Note [ Swap lifetimes ].
SwappedTensor::~SwappedTensor() { core_->release(*entry_); }

at::Tensor SwappedTensor::get() { return core_->get(*this); }
void SwappedTensor::prefetch() { core_->prefetch(*this); }
void SwappedTensor::release() { core_->release(*entry_); }
SwapState SwappedTensor::state() const { return core_->state(*entry_); }
int64_t SwappedTensor::nbytes() const { return entry_->nbytes; }
int64_t SwappedTensor::group() const { return entry_->group; }
c10::Device SwappedTensor::device() const { return entry_->device; }

}  // namespace recompose
