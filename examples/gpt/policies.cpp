#include "policies.h"

#ifndef RECOMPOSE_GPT_HOOKS_ONLY
#include <recompose/recompose.h>
#include <recompose/selective_checkpoint.h>
#endif

namespace gpt {

std::string_view policy_name(Policy policy) {
  switch (policy) {
    case Policy::None: return "none";
    case Policy::Full: return "full";
    case Policy::Selective: return "selective";
    case Policy::Swap: return "swap";
  }
  return "?";
}

std::optional<Policy> parse_policy(std::string_view name) {
  for (Policy p : kAllPolicies) {
    if (policy_name(p) == name) return p;
  }
  return std::nullopt;
}

#ifndef RECOMPOSE_GPT_HOOKS_ONLY
namespace {

// Swap: matrix products (the outputs worth keeping) go to host memory between forward and
// backward instead of staying on the device; everything else is recomputed.
recompose::CheckpointOptions swap_options() {
  return recompose::CheckpointOptions().policy(recompose::SelectivePolicy(
      [](const recompose::SelectiveCheckpointContext&, const c10::OperatorHandle& op, const torch::jit::Stack&) {
        const auto& name = op.schema().name();
        return name == "aten::mm" || name == "aten::addmm" || name == "aten::bmm"
                   ? recompose::CheckpointPolicy::MUST_SWAP
                   : recompose::CheckpointPolicy::PREFER_RECOMPUTE;
      }));
}

}  // namespace
#endif

void apply_policy(GPT& model, Policy policy) {
#ifdef RECOMPOSE_GPT_HOOKS_ONLY
  if (policy != Policy::None) throw std::runtime_error("built without the recompose library");
  (void)model;
#else
  for (auto& block : model->blocks) {
    switch (policy) {
      case Policy::None: break;
      case Policy::Full: recompose::apply_checkpoint(block); break;
      case Policy::Selective:
        recompose::apply_checkpoint(block, recompose::CheckpointOptions().policy(recompose::transformer_policy()));
        break;
      case Policy::Swap: recompose::apply_checkpoint(block, swap_options()); break;
    }
  }
#endif
}

}  // namespace gpt
