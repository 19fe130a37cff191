#include "swap/swap_hooks.h"

#include "engine/internal_ops.h"
#include "swap/swap_core.h"

#include <recompose/checkpoint_error.h>

#include <c10/util/Exception.h>

#include <sstream>

namespace recompose::detail {

SwapHooks::SwapHooks(std::shared_ptr<SwapCore> core) : core_(std::move(core)) {}

SwapHooks::~SwapHooks() {
  if (swapped_) core_->drop_user(*swapped_, served_);
}

void SwapHooks::call_pack_hook(const at::Tensor& tensor) {
  version_ = tensor.unsafeGetTensorImpl()->version_counter();
  saved_version_ = version_->current_version();
  sizes_ = tensor.sizes().vec();
  dtype_ = tensor.scalar_type();
  if (core_->eligible(tensor)) {
    swapped_ = core_->offload(tensor);
  } else {
    InternalOpsGuard internal;  // recompose's detach, not the user's op
    kept_ = tensor.detach();
    core_->note_kept(tensor);
  }
}

at::Tensor SwapHooks::call_unpack_hook() {
  const uint32_t current = version_->current_version();
  if (current != saved_version_) {
    std::ostringstream message;
    message << "one of the variables needed for gradient computation has been modified by an "
               "inplace operation: ["
            << dtype_ << " " << c10::IntArrayRef(sizes_) << "] is at version " << current
            << "; expected version " << saved_version_
            << " instead (it was saved for backward under recompose activation swap). Do not modify a "
               "tensor in place after an op saved it for backward (clone it first).";
    throw CheckpointError(message.str());
  }
  return swapped_ ? core_->get(*swapped_, &served_) : kept_;
}

std::unique_ptr<torch::autograd::SavedVariableHooks> SwapPolicy::make_hooks() {
  return std::make_unique<SwapHooks>(core_.shared_from_this());
}

}  // namespace recompose::detail
