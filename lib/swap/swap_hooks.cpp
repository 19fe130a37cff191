#include "swap/swap_hooks.h"

#include "engine/autograd_sequence_adapter.h"
#include "engine/internal_ops.h"
#include "swap/eligibility.h"
#include "swap/swap_core.h"

#include <c10/util/Exception.h>

namespace recompose::detail {

SwapHooks::SwapHooks(std::shared_ptr<SwapCore> core, Defer defer)
    : core_(std::move(core)), defer_(std::move(defer)) {}

SwapHooks::~SwapHooks() {
  if (swapped_) core_->drop_user(*swapped_, served_);
  if (deferred_) {
    std::lock_guard lock(deferred_->mutex);
    if (deferred_->swapped) core_->drop_user(*deferred_->swapped, served_);
    deferred_->tensor = at::Tensor();  // nobody will read it: the policy skips it
  }
}

void SwapHooks::call_pack_hook(const at::Tensor& tensor) {
  version_.record(tensor);
  if (const auto why = core_->why_kept(tensor)) {
    InternalOpsGuard internal;  // recompose's detach, not the user's op
    kept_ = tensor.detach();
    core_->note_kept(tensor, *why, events::forward_tag());
    return;
  }
  if (defer_ && may_be_written_by_saving_op(tensor)) {
    // A copy now would miss a write the saving op's kernel has yet to make (rrelu_with_noise's
    // noise): the policy offloads it once the op is done.
    deferred_ = std::make_shared<DeferredOffload>();
    {
      InternalOpsGuard internal;
      deferred_->tensor = tensor.detach();
    }
    deferred_->next_node_at_save = next_autograd_sequence_nr();
    deferred_->region = events::forward_tag();
    defer_(deferred_);
    defer_ = nullptr;  // it refers to the policy, which may end before this saved tensor
    return;
  }
  swapped_ = core_->offload(tensor);
}

at::Tensor SwapHooks::call_unpack_hook() {
  version_.verify("recompose activation swap");
  if (deferred_) {
    std::lock_guard lock(deferred_->mutex);
    return deferred_->swapped ? core_->get(*deferred_->swapped, &served_) : deferred_->tensor;
  }
  return swapped_ ? core_->get(*swapped_, &served_) : kept_;
}

SwapPolicy::~SwapPolicy() {
  try {
    offload_deferred(/*all=*/true);
  } catch (const std::exception& e) {
    // A destructor must not throw (a scope ending inside a CUDA graph capture: swap refuses to
    // copy there). The tensors not offloaded stay on the device, where backward finds them.
    TORCH_WARN(e.what(), " (recompose: the saved tensors not offloaded yet stay on the device)");
  }
}

void SwapPolicy::offload_deferred(bool all) {
  if (deferred_.empty()) return;
  const uint64_t now = next_autograd_sequence_nr();
  std::size_t done = 0;
  for (; done < deferred_.size(); ++done) {
    std::shared_ptr<DeferredOffload> d = deferred_[done].lock();
    if (!d) continue;  // its saved variable is gone
    std::lock_guard lock(d->mutex);
    if (!all && d->next_node_at_save == now) break;  // its op may still be running
    if (d->tensor.defined() && !d->swapped) {
      d->swapped = core_->offload(d->tensor, std::move(d->region));
      d->tensor = at::Tensor();
    }
  }
  deferred_.erase(deferred_.begin(), deferred_.begin() + static_cast<std::ptrdiff_t>(done));
}

std::unique_ptr<torch::autograd::SavedVariableHooks> SwapPolicy::make_hooks() {
  if (!saved_by_ops_) return std::make_unique<SwapHooks>(core_, nullptr);
  offload_deferred(/*all=*/false);
  return std::make_unique<SwapHooks>(
      core_, [this](std::shared_ptr<DeferredOffload> d) { deferred_.push_back(std::move(d)); });
}

}  // namespace recompose::detail
