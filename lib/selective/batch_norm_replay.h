// What the selective replay passes to a training-mode native_batch_norm in place of the running
// statistics it must not update a second time.
//
// Note [ Batch norm replayed with stand-in running statistics ]
// native_batch_norm in training normalises with the batch's own statistics and writes the running
// statistics beside (its schema does not say so). Their values never reach its outputs, but their
// dtype does: with a low-precision input (autocast's bf16, fp16) and no float weight, float32
// running statistics make it compute in float32 and return float32 save_mean/save_invstd, while
// None makes it compute in the input's dtype (another output, by up to one ulp, and bf16
// statistics). So the replay passes stand-ins: fresh zero tensors with the dtype, sizes, strides
// and device of the forward's running statistics. The kernel takes the same path for the same
// bits, and its update lands in the stand-ins, which are dropped: the module's buffers move once,
// as without checkpointing. In eval the op only reads them, as any op reads an outside tensor, and
// runs with the forward's. Other batch-norm kernels (cudnn, miopen) still make the region rerun
// its forward (replay_plan.cpp, why_not_runnable). Tested op by op and end to end in
// tests/batch_norm_replay_test.cpp.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <c10/util/SmallVector.h>

#include <cstddef>
#include <optional>

namespace recompose::detail {

// The arguments of aten::native_batch_norm(input, weight, bias, running_mean, running_var,
// training, momentum, eps) that hold the running statistics.
inline constexpr std::size_t kBatchNormRunningMean = 3, kBatchNormRunningVar = 4;

// The training flag of a native_batch_norm call whose arguments are on top of `stack`; nullopt
// for any other op.
std::optional<bool> native_batch_norm_training(const c10::OperatorHandle& op,
                                               const torch::jit::Stack& stack);

// A running statistic as the replay passes it: described in the forward, made at the replay.
struct RunningStatStandIn {
  c10::SmallVector<int64_t, 1> sizes, strides;
  at::ScalarType dtype = at::kFloat;
  c10::Device device = c10::Device(c10::kCPU);

  // The description of `running_stat` (defined).
  static RunningStatStandIn of(const at::Tensor& running_stat);
  // A zero tensor laid out as described, belonging to nobody (InternalOpsGuard: no region
  // records it).
  at::Tensor make() const;
};

}  // namespace recompose::detail
