// What a selective policy sees and does, before training with it: every op of a region's
// forward as policies see it (name and overload, call index, output bytes, whether a policy is
// shown it at all, and so whether a save list can name it), what the policy decided for each,
// and the bytes the region then holds for backward against no checkpointing.
//
//   auto report = recompose::inspect_policy(recompose::SelectivePolicy({"aten::convolution"}),
//   block, x); std::cout << report;            // one line per op, then the totals
//   report.bytes_kept;              // what the policy keeps
//   report.bytes_held_without_checkpointing;
//
// inspect_policy runs the forward twice (without checkpointing, for the bytes autograd holds;
// then as a checkpointed region with the policy, whose forward trace gives the ops as the
// selective machinery classified them), with grad mode on and no backward, and leaves the
// module as it found it: the
// buffers of the modules named (BatchNorm's running statistics) and the RNG state are put back.
// It warns (TORCH_WARN, once per region label) when the policy keeps nothing (it is then full
// checkpointing plus the cost of interception) or keeps more bytes than no checkpointing holds.
#pragma once

#include <recompose/selective_checkpoint.h>

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace recompose {

// One op of the region's forward.
struct PolicyReportOp {
  std::string op;  // name and overload: "aten::convolution.default", "aten::relu_.default"
  int64_t call_index =
      0;  // calls of this overload before it in the region (SelectiveCheckpointContext::call_index)
  int64_t output_bytes = 0;  // bytes of the storages of its tensor outputs
  // Shown to policies, and so nameable in a SelectivePolicy save list. Views, in-place and out=
  // ops, and autocast's parameter casts are not: they are always recomputed.
  bool shown_to_policy = false;
  std::string
      why_hidden;  // for ops not shown: "view, in-place or out= op", "autocast parameter cast"
  // What the policy returned (ops shown to it only).
  CheckpointPolicy decision = CheckpointPolicy::PREFER_RECOMPUTE;
  bool kept() const;     // MUST_SAVE, PREFER_SAVE (kept on the device)
  bool swapped() const;  // MUST_SWAP
  // Kept by the region for its replay, whatever the policy decided: an autocast parameter cast
  // within the policy's budget (SelectivePolicy::keep_parameter_casts), or a dropout's draw (its
  // bits on CPU, native_dropout's bool mask on CUDA): the bytes held; 0 for none.
  int64_t bytes_kept_for_replay = 0;
};

struct PolicyReport {
  std::string region;  // the label given (a module's name)
  std::vector<PolicyReportOp>
      ops;  // in the order they ran (aten::detach and metadata ops left out)
  int64_t ops_kept = 0, ops_swapped = 0, ops_recomputed = 0;
  int64_t bytes_kept = 0, bytes_swapped = 0;  // sums of output bytes of those ops
  // What the region keeps for its replay beyond the policy's outputs (PolicyReportOp::
  // bytes_kept_for_replay): autocast's parameter casts and dropout's draws, counts and bytes.
  int64_t casts_kept_for_replay = 0, bytes_of_casts_kept = 0;
  int64_t draws_kept = 0, bytes_of_draws_kept = 0;
  // Measured with a SavedTensorMeter around each forward: what the region's forward leaves held
  // for backward (its inputs are not counted: the caller holds them either way).
  int64_t bytes_held_with_policy = 0;
  int64_t bytes_held_without_checkpointing = 0;
  // Names of the policy's save list (SelectivePolicy::op_names) that no op shown to the policy in
  // this region matched: they keep nothing here (a name the region's ops do not have, such as a
  // composite op's, or one meant for another region). Empty for a policy made from a callable.
  std::vector<std::string> unmatched_names;
  // Why the region's backward would run its forward again instead of replaying only what it
  // dropped (docs/architecture.md, "Selective replay"): the reason the replay's plan gives, which
  // selective_replay_stats() and the step ledger count in training. Empty when it would replay.
  std::string replay_fallback_reason;

  bool keeps_nothing() const { return ops_kept == 0 && ops_swapped == 0; }
  bool holds_more_than_no_checkpointing() const {
    return bytes_held_with_policy > bytes_held_without_checkpointing;
  }
  // One line per op, then the totals and the warnings.
  std::string to_string() const;
};

std::ostream& operator<<(std::ostream& out, const PolicyReport& report);

// Runs `forward` without checkpointing, then as a checkpointed region with `policy`, and reports.
// `state_modules`: the modules `forward` calls, whose buffers and train/eval modes, and the CPU's
// and their CUDA devices' generators, are put back as they were after each run, also when
// `forward` throws (without moving the buffers' version counters); the region preserves
// them as CheckpointOptions::state_modules does. `label` names the region in the report and
// in the warnings. Throws what `forward` and the policy throw; std::invalid_argument if `forward`
// is empty; CheckpointError if the region's summary could not be made (out of host memory).
PolicyReport inspect_policy(const SelectivePolicy& policy, const std::function<void()>& forward,
                            const std::vector<std::shared_ptr<torch::nn::Module>>& state_modules,
                            const std::string& label);

// The same for one module called with `args` (its forward need not be annotated).
template <class M, class... Args>
PolicyReport inspect_policy(const SelectivePolicy& policy, torch::nn::ModuleHolder<M>& module,
                            Args&&... args) {
  return inspect_policy(
      policy, [&] { (void)module->forward(args...); }, {module.ptr()}, module->name());
}

// The same for a module reference (an Impl, `*this`, a member held by value).
template <class M, class... Args,
          std::enable_if_t<std::is_base_of_v<torch::nn::Module, M>, int> = 0>
PolicyReport inspect_policy(const SelectivePolicy& policy, M& module, Args&&... args) {
  // Not owned: the report is made before this call returns.
  std::shared_ptr<torch::nn::Module> view(std::shared_ptr<torch::nn::Module>{}, &module);
  return inspect_policy(
      policy, [&] { (void)module.forward(args...); }, {view}, module.name());
}

}  // namespace recompose
