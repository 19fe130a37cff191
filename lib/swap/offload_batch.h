// The saved tensors of one call of an offloaded module (apply_offload): collected during the
// call, then copied to host memory as one swap group when the next offloaded call begins (or at
// the call's end), so that the last call's tensors, which backward needs first, stay on the
// device. In never-stall mode a batch launches only the tensors its module's decision moves, or
// while the module warms up, those whose copies fit the call's windows; the others stay on the
// device (See Note [ Never-stall offload decides once ]).
#pragma once

#include "engine/meter_charge.h"
#include "engine/saved_tensor_policy.h"
#include "events/events.h"
#include "swap/never_stall_plan.h"
#include "swap/saved_version_check.h"

#include <recompose/apply_offload.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

namespace recompose::detail {

class SwapCore;

// The counters behind OffloadStats, shared by a module's state and its batches.
struct OffloadCounters {
  std::atomic<int64_t> calls{0};
  std::atomic<int64_t> tensors_offloaded{0};
  std::atomic<int64_t> bytes_offloaded{0};
  std::atomic<int64_t> tensors_kept{0};
  std::atomic<int64_t> bytes_kept{0};
  std::atomic<int64_t> tensors_left_on_device{0};
  std::atomic<int64_t> bytes_left_on_device{0};
  std::atomic<int64_t> tensors_over_window{0};
  std::atomic<int64_t> bytes_over_window{0};
  std::atomic<int64_t> window_nanoseconds{0};
  std::atomic<int64_t> warmup_calls{0};
  std::atomic<int64_t> decisions{0};
  std::atomic<int64_t> bytes_landed{0};
  std::atomic<int64_t> landing_nanoseconds{0};

  // A saved tensor of `bytes` left on the device for `why`: counted under its pair (over the copy
  // window, asked for before it left, else kept) and told to the sinks through `region` (null:
  // none listens). One fact, both tallies.
  void kept(events::KeptReason why, int64_t bytes, const events::Tag& region);

  OffloadStats snapshot() const;
  void reset();
};

// One saved tensor of a batch: held on the device until launch(), then in a SwappedTensor.
// Shared by its saved-tensor hooks (owner) and its batch (weakly). Thread-safe: backward may
// unpack on another thread.
class DeferredTensor {
 public:
  // `region`: the events' tag of the call that saved it (null for none).
  DeferredTensor(std::shared_ptr<SwapCore> core, std::shared_ptr<OffloadCounters> counters,
                 at::Tensor tensor, events::Tag region);
  ~DeferredTensor();
  // Starts the copy to host, unless it started already or backward asked for the tensor.
  void launch();
  // The tensor for backward, from the device if it never left.
  at::Tensor get();
  // Bytes launch() would copy now (0 once launched, asked for, or gone).
  int64_t pending_bytes();
  // Never-stall: its copy would not fit the window; it stays on the device for good.
  void stay();
  // The offloaded tensor, once launched.
  std::shared_ptr<SwappedTensor> swapped();

 private:
  std::mutex mutex_;
  const std::shared_ptr<SwapCore> core_;
  const std::shared_ptr<OffloadCounters> counters_;
  at::Tensor on_device_;  // until launch()
  MeterCharge
      charge_;  // on_device_ is held for backward on the device, as SavedTensorMeter sees it
  std::shared_ptr<SwappedTensor> swapped_;  // after launch()
  events::Tag region_;                      // handed to the core at launch()
  int64_t served_ = -1;                     // reload generation the last get() was served from
  bool asked_ = false;                      // get() was called: launching now would be pointless
  bool stayed_ = false;  // stay() was called: counted over the window, not as left on the device
};

class OffloadBatch {
 public:
  OffloadBatch(std::shared_ptr<SwapCore> core, std::shared_ptr<OffloadCounters> counters,
               std::function<ActivationPolicy(const at::Tensor&)> policy);
  ~OffloadBatch();
  // The saved-tensor policy of the call: every tensor saved while it is installed joins the batch.
  SavedTensorPolicy& policy();
  // The bytes of the tensors it would copy, in saved order (the call's shape for NeverStallPlan).
  std::vector<int64_t> saved_bytes();
  // Never-stall mode (set before launch()): launch() copies the tensors at the positions `moves`
  // marks (the module's decision) or, when it is null, those whose copies fit `window`.
  void limit_to(const CopyWindow& window, std::shared_ptr<const std::vector<bool>> moves);
  // Copies the batch's tensors that are still alive and not asked for, as one swap group.
  void launch();
  // After the call: no saved tensor was eligible for a copy, though some were activations (not
  // parameters), e.g. all below SwapOptions::min_bytes. Their count and bytes.
  bool moves_nothing() const;
  int64_t ineligible_activations() const { return ineligible_tensors_; }
  int64_t ineligible_activation_bytes() const { return ineligible_bytes_; }

 private:
  friend class DeferredSwapHooks;
  class Policy;
  std::shared_ptr<SwapCore> core_;
  std::shared_ptr<OffloadCounters> counters_;
  std::function<ActivationPolicy(const at::Tensor&)> decide_;
  std::unique_ptr<Policy> policy_;
  std::mutex mutex_;
  std::vector<std::weak_ptr<DeferredTensor>> tensors_;
  std::vector<int64_t> saved_bytes_;  // of tensors_, when they were saved
  std::optional<CopyWindow> window_;
  std::shared_ptr<const std::vector<bool>> moves_;
  bool any_eligible_ = false;
  int64_t ineligible_tensors_ = 0, ineligible_bytes_ = 0;  // activations only (not parameters)
};

// The batches of this thread whose calls have ended and whose copies have not started. The next
// offloaded call on this thread launches them (launch_closed_batches) before it begins.
void add_closed_batch(std::shared_ptr<OffloadBatch> batch);
void launch_closed_batches();
// Adds the launch-to-landing time of this thread's launched batches whose copies have all landed
// to their counters (OffloadStats::landing_seconds).
void check_landings();

}  // namespace recompose::detail
