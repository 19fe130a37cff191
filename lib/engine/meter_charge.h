// Backward memory held outside autograd's saved tensors (the outputs selective checkpointing
// keeps) is charged to the SavedTensorMeters alive on the thread that keeps it.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

namespace recompose::detail {

class MeterCharge {
 public:
  MeterCharge() = default;
  // Charges `bytes` to every meter alive on this thread; refunded on destruction.
  explicit MeterCharge(int64_t bytes);
  MeterCharge(MeterCharge&& other) noexcept = default;
  MeterCharge& operator=(MeterCharge&& other) noexcept;
  MeterCharge(const MeterCharge&) = delete;
  MeterCharge& operator=(const MeterCharge&) = delete;
  ~MeterCharge() { refund(); }
  void refund() noexcept;

 private:
  int64_t bytes_ = 0;
  std::vector<std::shared_ptr<void>> meters_;
};

}  // namespace recompose::detail
