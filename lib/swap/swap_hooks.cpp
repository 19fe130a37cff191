#include "swap/swap_hooks.h"

#include "engine/internal_ops.h"
#include "swap/swap_core.h"

namespace recompose::detail {

SwapHooks::SwapHooks(std::shared_ptr<SwapCore> core) : core_(std::move(core)) {}

SwapHooks::~SwapHooks() {
  if (swapped_) core_->drop_user(*swapped_, served_);
}

void SwapHooks::call_pack_hook(const at::Tensor& tensor) {
  version_.record(tensor);
  if (core_->eligible(tensor)) {
    swapped_ = core_->offload(tensor);
  } else {
    InternalOpsGuard internal;  // recompose's detach, not the user's op
    kept_ = tensor.detach();
    core_->note_kept(tensor);
  }
}

at::Tensor SwapHooks::call_unpack_hook() {
  version_.verify("recompose activation swap");
  return swapped_ ? core_->get(*swapped_, &served_) : kept_;
}

std::unique_ptr<torch::autograd::SavedVariableHooks> SwapPolicy::make_hooks() {
  return std::make_unique<SwapHooks>(core_);
}

}  // namespace recompose::detail
