// transformer_policy(): torchtitan's op-level SAC policy for transformer blocks.

#include "op_names.h"
#include "transformer_save_list.h"

#include <recompose/selective_checkpoint.h>

#include <memory>
#include <optional>
#include <vector>

namespace recompose {
namespace {

// Compute-intensive ops whose outputs are worth keeping. Each is one overload, as in torchtitan's
// _save_list (aten::max.default is the full reduction, not the cheap elementwise max.other).
constexpr std::string_view kSaveList[] = {
    "aten::mm.default",
    "aten::addmm.default",
    "aten::bmm.default",
    "aten::linear.default",  // composite on CPU/CUDA (never seen below autograd), kept for backends
                             // that dispatch it
    "aten::_scaled_mm.default",
    "aten::_scaled_dot_product_flash_attention.default",
    "aten::_scaled_dot_product_efficient_attention.default",
    "aten::_scaled_dot_product_cudnn_attention.default",
    "aten::_scaled_dot_product_flash_attention_for_cpu.default",
    "aten::max.default",
    "_c10d_functional::reduce_scatter_tensor.default",
};

struct TransformerSaveList {
  std::vector<c10::OperatorHandle> save;
  std::optional<c10::OperatorHandle> mm;
  bool recompute_every_second_mm = false;
};

}  // namespace

std::span<const std::string_view> detail::transformer_save_list() { return kSaveList; }

SelectivePolicy transformer_policy(TransformerPolicyOptions options) {
  auto list = std::make_shared<TransformerSaveList>();
  for (std::string_view name : kSaveList) {
    if (auto op = detail::find_overload(name))
      list->save.push_back(*op);  // absent in this build: left out
  }
  list->mm = detail::find_overload("aten::mm.default");
  list->recompute_every_second_mm = options.recompute_every_second_mm();
  SelectivePolicy policy([list](const SelectiveCheckpointContext& ctx,
                                const c10::OperatorHandle& op, const torch::jit::Stack&) {
    // call_index counts this region invocation's forward calls of the op, so the same mm calls
    // are saved in every invocation (torchtitan counts them in a per-invocation dict).
    if (list->recompute_every_second_mm && list->mm && op == *list->mm) {
      return ctx.call_index % 2 == 0 ? CheckpointPolicy::MUST_SAVE
                                     : CheckpointPolicy::PREFER_RECOMPUTE;
    }
    for (const c10::OperatorHandle& h : list->save) {
      if (h == op) return CheckpointPolicy::MUST_SAVE;
    }
    return CheckpointPolicy::PREFER_RECOMPUTE;
  });
  // Beyond torchtitan's list: Note [ Parameter casts kept for the replay ] (parameter_casts.h).
  policy.keep_parameter_casts(options.parameter_cast_budget());
  return policy;
}

}  // namespace recompose
