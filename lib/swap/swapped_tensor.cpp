// SwappedTensor forwards to its core, which owns the locking and the copies.
#include "swap/copy_fence.h"
#include "swap/swap_core.h"

namespace recompose {

SwappedTensor::SwappedTensor(std::shared_ptr<detail::SwapCore> core, const at::Tensor& source, int64_t group)
    : core_(std::move(core)),
      device_(source.device()),
      nbytes_(static_cast<int64_t>(source.nbytes())),
      group_(group) {}

SwappedTensor::~SwappedTensor() { core_->destroy(*this); }

at::Tensor SwappedTensor::get() { return core_->get(*this); }
void SwappedTensor::prefetch() { core_->prefetch(*this); }
void SwappedTensor::release() { core_->release(*this); }
SwapState SwappedTensor::state() const { return core_->state(*this); }

}  // namespace recompose
