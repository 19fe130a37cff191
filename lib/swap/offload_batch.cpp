#include "swap/offload_batch.h"

#include "engine/internal_ops.h"
#include "engine/tensor_accounting.h"
#include "swap/eligibility.h"
#include "swap/swap_access.h"
#include "swap/swap_core.h"

#include <torch/csrc/autograd/saved_variable_hooks.h>

namespace recompose::detail {

OffloadStats OffloadCounters::snapshot() const {
  OffloadStats s;
  s.calls = calls.load();
  s.tensors_offloaded = tensors_offloaded.load();
  s.bytes_offloaded = bytes_offloaded.load();
  s.tensors_kept = tensors_kept.load();
  s.bytes_kept = bytes_kept.load();
  s.tensors_left_on_device = tensors_left_on_device.load();
  s.bytes_left_on_device = bytes_left_on_device.load();
  s.tensors_over_window = tensors_over_window.load();
  s.bytes_over_window = bytes_over_window.load();
  s.window_seconds = static_cast<double>(window_nanoseconds.load()) * 1e-9;
  s.warmup_calls = warmup_calls.load();
  s.decisions = decisions.load();
  s.bytes_landed = bytes_landed.load();
  s.landing_seconds = static_cast<double>(landing_nanoseconds.load()) * 1e-9;
  return s;
}

void OffloadCounters::kept(events::KeptReason why, int64_t bytes, const events::Tag& region) {
  if (why == events::KeptReason::OverCopyWindow) {
    tensors_over_window += 1;
    bytes_over_window += bytes;
  } else if (why == events::KeptReason::AskedForBeforeItLeft) {
    tensors_left_on_device += 1;
    bytes_left_on_device += bytes;
  } else {
    tensors_kept += 1;
    bytes_kept += bytes;
  }
  if (region) events::kept(*region, why, bytes);
}

void OffloadCounters::reset() {
  for (auto* c :
       {&calls, &tensors_offloaded, &bytes_offloaded, &tensors_kept, &bytes_kept,
        &tensors_left_on_device, &bytes_left_on_device, &tensors_over_window, &bytes_over_window,
        &window_nanoseconds, &warmup_calls, &decisions, &bytes_landed, &landing_nanoseconds}) {
    c->store(0);
  }
}

DeferredTensor::DeferredTensor(std::shared_ptr<SwapCore> core,
                               std::shared_ptr<OffloadCounters> counters, at::Tensor tensor,
                               events::Tag region)
    : core_(std::move(core)),
      counters_(std::move(counters)),
      on_device_(std::move(tensor)),
      charge_(on_device_),  // by storage: two saves of one tensor are held once
      region_(std::move(region)) {}

DeferredTensor::~DeferredTensor() {
  if (swapped_) core_->drop_user(*swapped_, served_);
}

void DeferredTensor::launch() {
  std::lock_guard lock(mutex_);
  if (!on_device_.defined() || asked_ || stayed_) return;
  swapped_ = core_->offload(on_device_, std::move(region_));
  counters_->tensors_offloaded += 1;
  counters_->bytes_offloaded += static_cast<int64_t>(on_device_.nbytes());
  on_device_.reset();  // device memory goes once the copy has landed (the core holds it till then)
  charge_.refund();
}

at::Tensor DeferredTensor::get() {
  std::lock_guard lock(mutex_);
  if (swapped_) return core_->get(*swapped_, &served_);
  if (!asked_) {
    asked_ = true;
    // Backward has reached the calls that kept their tensors: the newest offloaded ones are next.
    core_->prefetch_newest();
    if (!stayed_) {
      counters_->kept(events::KeptReason::AskedForBeforeItLeft,
                      static_cast<int64_t>(on_device_.nbytes()), region_);
    }
  }
  return on_device_;
}

int64_t DeferredTensor::pending_bytes() {
  std::lock_guard lock(mutex_);
  return on_device_.defined() && !asked_ && !stayed_ && !swapped_
             ? static_cast<int64_t>(on_device_.nbytes())
             : 0;
}

void DeferredTensor::stay() {
  std::lock_guard lock(mutex_);
  if (stayed_ || swapped_ || !on_device_.defined()) return;
  stayed_ = true;
  counters_->kept(events::KeptReason::OverCopyWindow, static_cast<int64_t>(on_device_.nbytes()),
                  region_);
}

std::shared_ptr<SwappedTensor> DeferredTensor::swapped() {
  std::lock_guard lock(mutex_);
  return swapped_;
}

// One saved tensor of an offloaded call: deferred (eligible and swapped by the policy) or kept.
class DeferredSwapHooks final : public torch::autograd::SavedVariableHooks {
 public:
  explicit DeferredSwapHooks(OffloadBatch& batch) : batch_(batch) {}

  void call_pack_hook(const at::Tensor& tensor) override {
    version_.record(tensor);
    const std::optional<events::KeptReason> not_eligible = batch_.core_->why_kept(tensor);
    const bool eligible = !not_eligible;
    if (eligible) {
      batch_.any_eligible_ = true;
    } else if (!is_parameter_like(tensor)) {
      batch_.ineligible_tensors_ += 1;
      batch_.ineligible_bytes_ += static_cast<int64_t>(tensor.nbytes());
    }
    const bool swap =
        eligible && (!batch_.decide_ || batch_.decide_(tensor) == ActivationPolicy::SWAP);
    // The events' tag of the call (or of the region inside it) that saves the tensor.
    events::Tag region = events::forward_tag();
    at::Tensor detached;
    {
      InternalOpsGuard internal;  // recompose's detach, not the user's op
      // Detached: a saved output holding its own grad_fn would be a reference cycle.
      detached = tensor.detach();
    }
    if (!swap) {
      // Kept (by the policy, or not eligible: below min_bytes, a slice...): held for backward on
      // the device, so a SavedTensorMeter counts it as it counts autograd's own (not parameters).
      kept_charge_ = MeterCharge(tensor);
      kept_ = std::move(detached);
      const events::KeptReason why = not_eligible.value_or(events::KeptReason::Policy);
      // The manager's SwapStats and the module's OffloadStats each count it; the sinks hear it
      // once.
      batch_.core_->note_kept(tensor, why, nullptr);
      batch_.counters_->kept(why, static_cast<int64_t>(tensor.nbytes()), region);
      return;
    }
    deferred_ = std::make_shared<DeferredTensor>(batch_.core_, batch_.counters_,
                                                 std::move(detached), std::move(region));
    std::lock_guard lock(batch_.mutex_);
    batch_.tensors_.push_back(deferred_);
    batch_.saved_bytes_.push_back(static_cast<int64_t>(tensor.nbytes()));
  }

  at::Tensor call_unpack_hook() override {
    version_.verify("recompose::apply_offload");
    return deferred_ ? deferred_->get() : kept_;
  }

 private:
  // Valid while packing only: the batch outlives its call, hooks may outlive the batch.
  OffloadBatch& batch_;
  SavedVersionCheck version_;
  at::Tensor kept_;
  MeterCharge kept_charge_;
  std::shared_ptr<DeferredTensor> deferred_;
};

class OffloadBatch::Policy final : public SavedTensorPolicy {
 public:
  explicit Policy(OffloadBatch& batch) : batch_(batch) {}
  std::unique_ptr<torch::autograd::SavedVariableHooks> make_hooks() override {
    return std::make_unique<DeferredSwapHooks>(batch_);
  }

 private:
  OffloadBatch& batch_;
};

OffloadBatch::OffloadBatch(std::shared_ptr<SwapCore> core,
                           std::shared_ptr<OffloadCounters> counters,
                           std::function<ActivationPolicy(const at::Tensor&)> policy)
    : core_(std::move(core)),
      counters_(std::move(counters)),
      decide_(std::move(policy)),
      policy_(std::make_unique<Policy>(*this)) {}

OffloadBatch::~OffloadBatch() = default;

SavedTensorPolicy& OffloadBatch::policy() { return *policy_; }

bool OffloadBatch::moves_nothing() const { return !any_eligible_ && ineligible_tensors_ > 0; }

std::vector<int64_t> OffloadBatch::saved_bytes() {
  std::lock_guard lock(mutex_);
  return saved_bytes_;
}

void OffloadBatch::limit_to(const CopyWindow& window,
                            std::shared_ptr<const std::vector<bool>> moves) {
  window_ = window;
  moves_ = std::move(moves);
  counters_->window_nanoseconds += static_cast<int64_t>(window.forward_seconds * 1e9);
}

namespace {

// A launched batch whose copies recompose has not seen landed yet.
struct Landing {
  std::shared_ptr<SwapCore> core;
  std::shared_ptr<OffloadCounters> counters;
  std::vector<std::weak_ptr<SwappedTensor>> copies;
  int64_t bytes = 0;
  std::chrono::steady_clock::time_point launched;

  // Counts the batch and returns true once every copy has landed (or its tensor is gone).
  bool landed() {
    core->poll();
    for (const auto& weak : copies) {
      auto t = weak.lock();
      if (t && core->state(SwapAccess::entry(*t)) == SwapState::Offloading) return false;
    }
    const auto took = std::chrono::steady_clock::now() - launched;
    counters->bytes_landed += bytes;
    counters->landing_nanoseconds +=
        std::chrono::duration_cast<std::chrono::nanoseconds>(took).count();
    return true;
  }
};

thread_local std::vector<Landing> landings;

}  // namespace

void check_landings() {
  std::erase_if(landings, [](Landing& l) { return l.landed(); });
}

void OffloadBatch::launch() {
  std::vector<std::shared_ptr<DeferredTensor>> alive;  // in saved order: positions count
  {
    std::lock_guard lock(mutex_);
    for (auto& weak : tensors_) alive.push_back(weak.lock());
    tensors_.clear();
    saved_bytes_.clear();
  }
  if (window_) {
    // The module's decision, or while it warms up, this call's windows: the rest stays.
    // See Note [ Never-stall offload decides once ].
    std::vector<int64_t> pending(alive.size(), 0);
    for (size_t i = 0; i < alive.size(); ++i) {
      if (alive[i]) pending[i] = alive[i]->pending_bytes();  // 0: launch() would skip it anyway
    }
    const std::vector<bool> goes = moves_ ? *moves_ : fits_window(pending, *window_);
    for (size_t i = 0; i < alive.size(); ++i) {
      if (pending[i] > 0 && !(i < goes.size() && goes[i])) {
        alive[i]->stay();
        alive[i].reset();
      }
    }
  }
  std::erase(alive, nullptr);
  if (alive.empty()) return;
  Landing landing{core_, counters_, {}, 0, std::chrono::steady_clock::now()};
  // One group per call: backward reloads groups in reverse forward order and prefetches ahead.
  struct GroupOfCall {
    SwapCore& core;
    const int64_t id = core.begin_group();
    ~GroupOfCall() { core.force_end_group(id); }  // closed also when a copy throws
  } group{*core_};
  for (auto& t : alive) {
    t->launch();
    if (auto swapped = t->swapped()) {
      landing.copies.push_back(swapped);
      landing.bytes += static_cast<int64_t>(swapped->nbytes());
    }
  }
  if (landing.copies.empty()) return;
  // Copies on CPU are synchronous: landed already. On a device: checked as later calls start.
  if (!landing.landed()) landings.push_back(std::move(landing));
}

namespace {
thread_local std::vector<std::shared_ptr<OffloadBatch>> closed_batches;
}

void add_closed_batch(std::shared_ptr<OffloadBatch> batch) {
  closed_batches.push_back(std::move(batch));
}

void launch_closed_batches() {
  check_landings();
  // Moved out first: a launch must not see the list change under it.
  auto batches = std::move(closed_batches);
  closed_batches.clear();
  for (auto& b : batches) b->launch();
}

}  // namespace recompose::detail
