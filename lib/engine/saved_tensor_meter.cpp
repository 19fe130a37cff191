// SavedTensorMeter: a saved-tensor policy that keeps each saved tensor itself (as LibTorch
// would) and accounts the bytes of its storage until autograd releases it.
#include "engine/internal_ops.h"
#include "engine/meter_charge.h"
#include "engine/saved_tensor_policy.h"
#include "engine/tensor_accounting.h"
#include "events/events.h"

#include <recompose/checkpoint_error.h>
#include <recompose/saved_tensor_meter.h>

#include <ATen/core/Tensor.h>
#include <c10/core/StorageImpl.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>

namespace recompose {

struct SavedTensorMeter::Counters {
  std::mutex mutex;
  std::unordered_map<const c10::StorageImpl*, std::pair<int64_t, int64_t>> storages;  // refs, bytes
  int64_t bytes = 0;
  int64_t peak = 0;
  int64_t tensors = 0;

  void add(const at::Tensor& t) {
    std::lock_guard lock(mutex);
    ++tensors;
    auto& [refs, nbytes] = storages[t.storage().unsafeGetStorageImpl()];
    if (refs++ == 0) {
      nbytes = static_cast<int64_t>(t.storage().nbytes());
      bytes += nbytes;
      peak = std::max(peak, bytes);
    }
  }
  void add_bytes(int64_t n) {
    std::lock_guard lock(mutex);
    bytes += n;
    peak = std::max(peak, bytes);
  }
  void remove_bytes(int64_t n) {
    std::lock_guard lock(mutex);
    bytes -= n;
  }
  void remove(const at::Tensor& t) {
    std::lock_guard lock(mutex);
    --tensors;
    auto it = storages.find(t.storage().unsafeGetStorageImpl());
    if (it != storages.end() && --it->second.first == 0) {
      bytes -= it->second.second;
      storages.erase(it);
    }
  }
};

namespace {

class MeteredHooks final : public torch::autograd::SavedVariableHooks {
 public:
  explicit MeteredHooks(std::shared_ptr<SavedTensorMeter::Counters> counters)
      : counters_(std::move(counters)) {}
  ~MeteredHooks() override {
    if (counted_) counters_->remove(saved_);
  }
  void call_pack_hook(const at::Tensor& tensor) override {
    // Keep a detached alias: holding the tensor with its grad_fn would make a reference cycle
    // for outputs saved by their own node. LibTorch rebuilds the autograd metadata on unpack.
    // The detach is recompose's, not the user's op: hidden from selective checkpointing.
    detail::InternalOpsGuard internal;
    saved_ = tensor.defined() ? tensor.detach() : tensor;
    version_ = tensor._version();
    counted_ = tensor.defined() && tensor.has_storage() && !detail::is_parameter_like(tensor);
    if (counted_) counters_->add(saved_);
  }
  at::Tensor call_unpack_hook() override {
    // LibTorch skips its version check when hooks are set: do it here.
    if (saved_.defined() && saved_._version() != version_) {
      throw CheckpointError(
          "recompose: one of the variables needed for gradient computation has been modified by an "
          "inplace "
          "operation: saved at version " +
          std::to_string(version_) + ", now at version " + std::to_string(saved_._version()) +
          " (recompose::SavedTensorMeter). Do not modify a tensor in "
          "place after an op saved it for backward (clone it first).");
    }
    return saved_;
  }

 private:
  std::shared_ptr<SavedTensorMeter::Counters> counters_;
  at::Tensor saved_;
  int64_t version_ = 0;
  bool counted_ = false;
};

class MeterPolicy final : public detail::SavedTensorPolicy {
 public:
  explicit MeterPolicy(std::shared_ptr<SavedTensorMeter::Counters> counters)
      : counters_(std::move(counters)) {}
  std::unique_ptr<torch::autograd::SavedVariableHooks> make_hooks() override {
    return std::make_unique<MeteredHooks>(counters_);
  }
  const std::shared_ptr<SavedTensorMeter::Counters>& counters() const { return counters_; }

 private:
  std::shared_ptr<SavedTensorMeter::Counters> counters_;
};

}  // namespace

// The meter's policy on its thread's stack of saved-tensor policies (which checks LIFO order).
struct SavedTensorMeter::Scope {
  explicit Scope(std::shared_ptr<Counters> counters)
      : policy(std::move(counters)), scope(policy, "recompose::SavedTensorMeter") {}
  MeterPolicy policy;
  detail::SavedTensorPolicyScope scope;
};

namespace detail {

bool is_meter_policy(const SavedTensorPolicy& policy) {
  return dynamic_cast<const MeterPolicy*>(&policy) != nullptr;
}

void MeterCharge::charge_meters() {
  if (events::listening()) sinks_token_ = events::bytes_charged(tensor_, bytes_);
  // Every meter open on this thread, also behind barriers (their policies are on the stack).
  for_each_policy([&](SavedTensorPolicy& policy) {
    if (auto* meter = dynamic_cast<MeterPolicy*>(&policy)) {
      auto* counters = meter->counters().get();
      if (tensor_.defined()) {
        counters->add(tensor_);
      } else {
        counters->add_bytes(bytes_);
      }
      meters_.push_back(meter->counters());
    }
  });
}

MeterCharge::MeterCharge(int64_t bytes) : bytes_(bytes) {
  if (bytes_ != 0) charge_meters();
}

MeterCharge::MeterCharge(const at::Tensor& tensor) {
  if (!tensor.defined() || !tensor.has_storage() || is_parameter_like(tensor)) return;
  {
    // Detached: the charge lives in saved-tensor hooks, and a saved output holding its own
    // grad_fn would be a reference cycle.
    InternalOpsGuard internal;
    tensor_ = tensor.detach();
  }
  charge_meters();
}

MeterCharge& MeterCharge::operator=(MeterCharge&& other) noexcept {
  if (this != &other) {
    refund();
    tensor_ = std::move(other.tensor_);
    bytes_ = std::exchange(other.bytes_, 0);
    meters_ = std::move(other.meters_);
    sinks_token_ = std::move(other.sinks_token_);
  }
  return *this;
}

void MeterCharge::refund() noexcept {
  for (const auto& m : meters_) {
    auto* counters = static_cast<SavedTensorMeter::Counters*>(m.get());
    if (tensor_.defined()) {
      counters->remove(tensor_);
    } else {
      counters->remove_bytes(bytes_);
    }
  }
  meters_.clear();
  sinks_token_.reset();
  bytes_ = 0;
  tensor_ = at::Tensor();
}

}  // namespace detail

SavedTensorMeter::SavedTensorMeter()
    : counters_(std::make_shared<Counters>()), scope_(std::make_unique<Scope>(counters_)) {}

SavedTensorMeter::~SavedTensorMeter() { scope_.reset(); }

int64_t SavedTensorMeter::bytes_held() const {
  std::lock_guard lock(counters_->mutex);
  return counters_->bytes;
}
int64_t SavedTensorMeter::peak_bytes_held() const {
  std::lock_guard lock(counters_->mutex);
  return counters_->peak;
}
int64_t SavedTensorMeter::tensors_held() const {
  std::lock_guard lock(counters_->mutex);
  return counters_->tensors;
}
bool SavedTensorMeter::holds(const at::Tensor& tensor) const {
  if (!tensor.defined() || !tensor.has_storage()) return false;
  std::lock_guard lock(counters_->mutex);
  return counters_->storages.count(tensor.storage().unsafeGetStorageImpl()) > 0;
}

}  // namespace recompose
