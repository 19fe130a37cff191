// The saved-tensor hooks and policy through which autograd's saved tensors are swapped. They use
// the core; the core knows nothing of them.
#pragma once

#include "engine/saved_tensor_policy.h"
#include "events/events.h"
#include "swap/saved_version_check.h"

#include <recompose/swap.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

namespace recompose::detail {

class SwapCore;

// A saved tensor whose offload waits for its op's kernel (see SwapHooks): the policy offloads it
// once a later op has begun, or when the policy's scope ends; unpacked before, it is served as
// kept.
struct DeferredOffload {
  std::mutex mutex;
  at::Tensor tensor;  // until offloaded
  std::shared_ptr<SwappedTensor> swapped;
  uint64_t next_node_at_save = 0;  // the autograd node counter when it was saved
  events::Tag region;              // the events' tag of the region that saved it (or null)
};

// One saved tensor: offloaded through the core if eligible, else kept (detached: a saved output
// holding its own grad_fn would be a reference cycle). Checks the version counter at unpack,
// which LibTorch skips when hooks are set. `saved_by_ops`: the tensors are saved by ops, whose
// kernels run after the save and may write into an input they saved; such a tensor is offloaded
// only once its op is done, through `deferred` (See Note [ Early stop after the op's own
// writes ]). Region inputs (swap_inputs) are not saved by ops.
class SwapHooks final : public torch::autograd::SavedVariableHooks {
 public:
  using Defer = std::function<void(std::shared_ptr<DeferredOffload>)>;
  SwapHooks(std::shared_ptr<SwapCore> core, Defer defer);
  ~SwapHooks() override;
  void call_pack_hook(const at::Tensor& tensor) override;
  at::Tensor call_unpack_hook() override;

 private:
  std::shared_ptr<SwapCore> core_;
  Defer defer_;  // empty for region inputs
  std::shared_ptr<SwappedTensor> swapped_;
  std::shared_ptr<DeferredOffload> deferred_;
  int64_t served_ = -1;  // reload generation the last unpack was served from
  at::Tensor kept_;
  SavedVersionCheck version_;
};

// Gives SwapHooks for every saved tensor (AsyncSaveOnCpu: saved by ops; swap_inputs: region
// inputs). Holds its core.
//   SwapPolicy policy(core, /*saved_by_ops=*/true);
//   SavedTensorPolicyScope scope(policy, "recompose::AsyncSaveOnCpu", core);
class SwapPolicy final : public SavedTensorPolicy {
 public:
  SwapPolicy(std::shared_ptr<SwapCore> core, bool saved_by_ops)
      : core_(std::move(core)), saved_by_ops_(saved_by_ops) {}
  ~SwapPolicy() override;  // offloads what still waits: its ops are done when the scope ends
  std::unique_ptr<torch::autograd::SavedVariableHooks> make_hooks() override;

 private:
  // Offloads the deferred tensors whose ops are done (all of them with `all`).
  void offload_deferred(bool all);

  std::shared_ptr<SwapCore> core_;
  bool saved_by_ops_;
  std::vector<std::weak_ptr<DeferredOffload>> deferred_;  // this thread's, in save order
};

}  // namespace recompose::detail
