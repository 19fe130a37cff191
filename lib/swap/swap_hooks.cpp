#include "swap/swap_hooks.h"

#include "engine/autograd_sequence_adapter.h"
#include "engine/internal_ops.h"
#include "swap/swap_core.h"

namespace recompose::detail {

SwapHooks::SwapHooks(std::shared_ptr<SwapCore> core, bool saved_by_ops)
    : core_(std::move(core)), saved_by_ops_(saved_by_ops) {}

SwapHooks::~SwapHooks() {
  if (swapped_) core_->drop_user(*swapped_, served_);
}

void SwapHooks::call_pack_hook(const at::Tensor& tensor) {
  version_.record(tensor);
  // A copy now would miss a write the saving op's kernel has yet to make: kept.
  if (core_->eligible(tensor) && !(saved_by_ops_ && may_be_written_by_saving_op(tensor))) {
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
  return std::make_unique<SwapHooks>(core_, saved_by_ops_);
}

}  // namespace recompose::detail
