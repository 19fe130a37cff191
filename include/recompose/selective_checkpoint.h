// Selective activation checkpointing (SAC): a per-op policy decides which outputs of a
// checkpointed region are saved, recomputed or swapped to host memory.
//
//   // save matrix products, recompute the rest
//   recompose::apply_checkpoint(block, recompose::CheckpointOptions().policy(
//       recompose::SelectivePolicy({"aten::mm", "aten::addmm"})));
//   // or any callable
//   auto policy = recompose::SelectivePolicy([](const recompose::SelectiveCheckpointContext& ctx,
//                                               const c10::OperatorHandle& op, const torch::jit::Stack& args) {
//     return op.schema().name() == "aten::bmm" ? recompose::CheckpointPolicy::MUST_SAVE
//                                              : recompose::CheckpointPolicy::PREFER_RECOMPUTE;
//   });
//   auto y = recompose::checkpoint(recompose::CheckpointOptions().context_fn([policy] {
//     return recompose::create_selective_checkpoint_contexts(policy);
//   }), fn, x);
//
// Ops are intercepted below autograd by a C++ dispatch mode (lib/selective/dispatch_interceptor.cpp).
#pragma once

#include <recompose/checkpoint_options.h>
#include <recompose/region_contexts.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace recompose {

enum class CheckpointPolicy {
  MUST_SAVE,
  PREFER_SAVE,
  MUST_RECOMPUTE,
  PREFER_RECOMPUTE,
  // Keep the output, offloaded to host memory between forward and backward (recompose/swap.h).
  MUST_SWAP,
};

// What a policy may want to know about the op it decides for.
struct SelectiveCheckpointContext {
  bool is_recompute = false;
  // In the forward: the op's outputs (the policy is asked after the op ran); nullptr during
  // recomputation.
  const torch::jit::Stack* outputs = nullptr;
};

using PolicyFn = std::function<CheckpointPolicy(const SelectiveCheckpointContext& ctx,
                                                const c10::OperatorHandle& op, const torch::jit::Stack& args)>;

class SelectivePolicy {
 public:
  // Any callable.
  SelectivePolicy(PolicyFn fn);  // NOLINT(google-explicit-constructor): policies read better without a cast
  // MUST_SAVE for the ops named (e.g. "aten::mm", any overload), PREFER_RECOMPUTE for the rest.
  // Throws std::invalid_argument naming an op that is not registered with the dispatcher.
  SelectivePolicy(std::vector<std::string> save_ops);  // NOLINT(google-explicit-constructor)
  SelectivePolicy(std::initializer_list<const char*> save_ops);  // NOLINT(google-explicit-constructor)

  CheckpointPolicy operator()(const SelectiveCheckpointContext& ctx, const c10::OperatorHandle& op,
                              const torch::jit::Stack& args) const {
    return fn_(ctx, op, args);
  }

 private:
  PolicyFn fn_;
};

// The forward/recompute context pair of one region invocation for `policy` (PyTorch's
// create_selective_checkpoint_contexts). With allow_cache_entry_mutation = false, a saved output
// that was modified in place before backward is an error.
std::shared_ptr<RegionContexts> create_selective_checkpoint_contexts(const SelectivePolicy& policy,
                                                                     bool allow_cache_entry_mutation = false);

struct TransformerPolicyOptions {
  // Recompute every second matrix product instead of saving all of them (torchtitan's option).
  TORCH_ARG(bool, recompute_every_second_mm) = false;
};

// A ready policy for transformer blocks: saves compute-intensive ops (mm, addmm, bmm, linear,
// scaled-dot-product attention variants, max reductions), recomputes the rest.
SelectivePolicy transformer_policy(TransformerPolicyOptions options = {});

}  // namespace recompose
