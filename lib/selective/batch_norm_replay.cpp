#include "batch_norm_replay.h"

#include "engine/internal_ops.h"

#include <ATen/ops/empty_strided.h>

namespace recompose::detail {

std::optional<bool> native_batch_norm_training(const c10::OperatorHandle& op,
                                               const torch::jit::Stack& stack) {
  constexpr std::size_t kTraining = 5;
  const auto& arguments = op.schema().arguments();
  if (op.operator_name().name != "aten::native_batch_norm" || arguments.size() != 8 ||
      stack.size() < arguments.size())
    return std::nullopt;
  const c10::IValue& training = stack[stack.size() - arguments.size() + kTraining];
  if (!training.isBool()) return std::nullopt;
  return training.toBool();
}

RunningStatStandIn RunningStatStandIn::of(const at::Tensor& running_stat) {
  RunningStatStandIn s;
  s.sizes.assign(running_stat.sizes().begin(), running_stat.sizes().end());
  s.strides.assign(running_stat.strides().begin(), running_stat.strides().end());
  s.dtype = running_stat.scalar_type();
  s.device = running_stat.device();
  return s;
}

at::Tensor RunningStatStandIn::make() const {
  InternalOpsGuard internal;
  // Zeros: the values are never read into an output, but an update from garbage could trap.
  return at::empty_strided(sizes, strides, at::TensorOptions().dtype(dtype).device(device)).zero_();
}

}  // namespace recompose::detail
