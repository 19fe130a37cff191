// Backward memory held outside autograd's saved tensors (the outputs selective checkpointing
// keeps) is charged to the SavedTensorMeters alive on the thread that keeps it.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace recompose::detail {

class MeterCharge {
 public:
  MeterCharge() = default;
  // Charges `bytes` to every meter alive on this thread; refunded on destruction.
  explicit MeterCharge(int64_t bytes);
  // Charges `tensor` as a SavedTensorMeter counts a saved tensor (its storage once however many
  // tensors share it, parameters not at all) to every meter alive on this thread. Keeps a
  // detached alias (no reference to its grad_fn).
  explicit MeterCharge(const at::Tensor& tensor);
  MeterCharge(MeterCharge&& other) noexcept = default;
  MeterCharge& operator=(MeterCharge&& other) noexcept;
  MeterCharge(const MeterCharge&) = delete;
  MeterCharge& operator=(const MeterCharge&) = delete;
  ~MeterCharge() { refund(); }
  void refund() noexcept;

 private:
  void charge_meters();  // charges tensor_ (when defined) or bytes_ to the thread's meters

  int64_t bytes_ = 0;
  at::Tensor tensor_;  // charged by storage instead of bytes_, when defined
  std::vector<std::shared_ptr<void>> meters_;
  std::shared_ptr<void> sinks_token_;  // the sinks' charge (events::bytes_charged), if any
};

class SavedTensorPolicy;
// Whether `policy` is a SavedTensorMeter's (it keeps tensors as autograd would).
bool is_meter_policy(const SavedTensorPolicy& policy);

}  // namespace recompose::detail
