// The state one selective region invocation shares between its forward interceptor
// (forward_interceptor.cpp), its rerun interceptor (rerun_interceptor.cpp), its replay and the
// contexts object (selective_contexts.cpp), and the small rules they share.
#pragma once

#include "dispatch_interceptor.h"
#include "forward_summary.h"
#include "forward_trace.h"
#include "kept_output.h"
#include "op_traits.h"
#include "plugin/offload.h"

#include <recompose/selective_checkpoint.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace recompose::detail {

// What a region's forward asked its policy and kept: for the policy warnings (policy_warnings.h)
// and the extra-backward error, which names the first kept op.
struct PolicyTally {
  int64_t decisions = 0;
  std::string first_decided_op;
  size_t op_signature = 0;        // a hash of the op names asked about, in order (the region's)
  std::string first_kept_op;      // empty: the forward kept nothing
  int64_t kept_device_bytes = 0;  // of the kept outputs at capture (CacheEntry::bytes)
  // While a sink of events listens and the policy is a save list: the ops asked about
  // (each once; named only at the forward's end), for the names of the list that matched none.
  bool collect_names = false;
  std::unordered_set<c10::OperatorHandle> asked_ops;

  void asked(const c10::OperatorHandle& op, const OpTraits& traits) {
    if (decisions++ == 0) first_decided_op = op.schema().name();
    op_signature = op_signature * 1000003u ^ traits.name_hash;
  }
  void kept(const std::string& op, int64_t device_bytes) {
    if (first_kept_op.empty()) first_kept_op = op;
    kept_device_bytes += device_bytes;
  }
};

// Shared by the contexts object and every token entered from it: a token may outlive the
// contexts object (the engine drops it when the region ends).
struct SacState {
  SacState(SelectivePolicy p, bool allow)
      : policy(std::move(p)), allow_cache_entry_mutation(allow) {}
  const SelectivePolicy policy;
  const bool allow_cache_entry_mutation;
  // Storages of the kept outputs of the forward -> their nodes in the trace (forward thread only).
  std::unordered_multimap<const c10::StorageImpl*, uint32_t> kept_storages;
  std::atomic<bool> forward_entered{false};
  // The region runs inside the forward of an enclosing full region: its forward keeps nothing.
  // See Note [ Kept outputs under an enclosing full region ].
  bool keeps_nothing_inside_full = false;
  std::atomic<bool> recompute_active{false};
  ForwardTrace trace;     // the one record of the forward: its ops, kept outputs and calls per op
  bool replayed = false;  // a replay answered a recomputation (and released the kept outputs)
  PolicyTally tally;      // what the forward asked the policy and kept
  SummarySink summary_sink;  // summarizing contexts only (summarizing_contexts.h)
  // Kept outputs an in-place op of the forward just wrote into, carried by their entries: their
  // versions are recorded anew at the next op or at the end of the forward, once autograd's
  // ADInplaceOrView layer (above the interceptor) has counted the write.
  std::vector<uint32_t> carried_unversioned;  // their nodes
  void version_carried_writes() {
    for (const uint32_t node : carried_unversioned) trace.kept_at(node)->entry.accept_write();
    carried_unversioned.clear();
  }
  // Where MUST_SWAP outputs go (the process's default manager unless one was given).
  // (through the offload interface, provided by activation swap when it is built).
  std::shared_ptr<SwapManager> swap;
  std::shared_ptr<Offloader> offloader_;
  Offloader* offloader() {
    if (!offloader_) offloader_ = make_offloader(swap);
    return offloader_.get();
  }
};

[[noreturn]] void internal_stack_error(const c10::OperatorHandle& op);
// Throws CheckpointError for a value that is no CheckpointPolicy.
void check_decision(CheckpointPolicy p, const c10::OperatorHandle& op, int64_t call_index);
std::string extra_backward_error(const std::string& op_name);
// A recomputation reaching a write that a kept output's entry carries: the value is in the
// entry already, so the op returns its argument as it is.
void leave_written(const c10::OperatorHandle& op, const OpTraits& traits, torch::jit::Stack* stack);
// MUST_SWAP keeps the output too, offloaded to host memory (CacheEntry::capture).
inline bool keeps_output(CheckpointPolicy p) {
  return p == CheckpointPolicy::MUST_SAVE || p == CheckpointPolicy::PREFER_SAVE ||
         p == CheckpointPolicy::MUST_SWAP;
}

// The interceptors a region installs: in its forward (asks the policy, keeps outputs, records
// the trace) and in a recomputation that runs the forward again (answers kept ops from the trace).
std::unique_ptr<OpInterceptor> make_forward_interceptor(SacState& state);
std::unique_ptr<OpInterceptor> make_rerun_interceptor(SacState& state);

// At the end of a region's forward: the policy warnings (policy_warnings.h).
void warn_about_policy(const SacState& state);

}  // namespace recompose::detail
