#include "sac_state.h"

#include <recompose/checkpoint_error.h>

#include <string>

namespace recompose::detail {

void internal_stack_error(const c10::OperatorHandle& op) {
  throw CheckpointError(
      "recompose: selective checkpoint: internal error: the stack of " + op.schema().name() +
      " holds fewer values than its arguments. Please report this with the model that "
      "triggers it.");
}

// A policy callable can return any int cast to CheckpointPolicy; acting on one would silently
// pick a branch.
void check_decision(CheckpointPolicy p, const c10::OperatorHandle& op, int64_t call_index) {
  switch (p) {
    case CheckpointPolicy::MUST_SAVE:
    case CheckpointPolicy::PREFER_SAVE:
    case CheckpointPolicy::MUST_RECOMPUTE:
    case CheckpointPolicy::PREFER_RECOMPUTE:
    case CheckpointPolicy::MUST_SWAP:
      return;
  }
  throw CheckpointError("recompose: selective checkpoint: the policy returned CheckpointPolicy(" +
                        std::to_string(static_cast<int64_t>(p)) + ") for " + op.schema().name() +
                        " (call " + std::to_string(call_index) +
                        " in the region), which is no CheckpointPolicy value: return "
                        "MUST_SAVE, PREFER_SAVE, MUST_RECOMPUTE, PREFER_RECOMPUTE or MUST_SWAP.");
}

std::string extra_backward_error(const std::string& op_name) {
  return "recompose: selective checkpoint: Trying to backward an extra time. You are only allowed "
         "to "
         "backward once on any region computed under selective activation checkpoint (the output "
         "of " +
         op_name +
         " saved in the forward was already used by an earlier "
         "recomputation, e.g. a backward with retain_graph).";
}

// A recomputation reaching a write that a kept output's entry carries: the value is in the
// entry already, so the op returns its argument as it is.
void leave_written(const c10::OperatorHandle& op, const OpTraits& traits,
                   torch::jit::Stack* stack) {
  const c10::FunctionSchema& schema = op.schema();
  const size_t n_args = schema.arguments().size();
  if (stack->size() < n_args) internal_stack_error(op);
  const int32_t w = traits.inplace_argument;
  if (w < 0) internal_stack_error(op);  // not reached: carried only when there is one
  c10::IValue written = (*stack)[stack->size() - n_args + static_cast<size_t>(w)];
  torch::jit::drop(*stack, n_args);
  for (size_t r = 0; r < schema.returns().size(); ++r) stack->push_back(written);
}

}  // namespace recompose::detail
