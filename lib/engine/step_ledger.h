// The hook points of recompose::StepLedger (include/recompose/step_ledger.h): what the region
// protocol, the frame, the meter's charges and the selective replay tell the ledger alive on the
// forward thread. Off (no ledger alive anywhere), each hook is one relaxed atomic load.
#pragma once

#include "engine/replay_outcome.h"

#include <ATen/core/Tensor.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <vector>

namespace torch::nn {
class Module;
}

namespace recompose {
struct CheckpointOptions;
struct LedgerSwap;  // recompose/step_ledger.h
}  // namespace recompose

namespace recompose::detail {

struct LedgerState;
struct LedgerRow;

// Ledgers alive in the process: the hooks' fast check.
extern std::atomic<int> g_ledgers_alive;
inline bool any_ledger_alive() { return g_ledgers_alive.load(std::memory_order_relaxed) != 0; }

// How a region's inputs were kept for backward, as the saved-tensor stack answered when the
// region saved them.
enum class LedgerInputs {
  Held,       // no policy or a SavedTensorMeter: kept on the device as autograd keeps them
  Enclosing,  // a region around this one saved them: it recomputes them (counted nowhere)
  Outer,      // another policy (swap, offload): counted only as that policy charges the meters
};

// A region beginning in a forward on this thread: its row in the ledger alive here (or null, when
// none is, or the region begins inside a recomputation: rows are the step's forward regions).
// Call only when any_ledger_alive().
std::shared_ptr<LedgerRow> ledger_begin_region(const CheckpointOptions& options,
                                               const torch::nn::Module* owner);

// How the saved-tensor stack of this thread would save a region's inputs now.
LedgerInputs ledger_classify_inputs();

// The row whose forward runs on this thread: the meter's charges go to it while alive. A null
// row hides the outer one (a region the ledger does not record, such as one begun in a
// recomputation).
class LedgerForwardScope {
 public:
  explicit LedgerForwardScope(std::shared_ptr<LedgerRow> row);
  ~LedgerForwardScope();
  LedgerForwardScope(const LedgerForwardScope&) = delete;
  LedgerForwardScope& operator=(const LedgerForwardScope&) = delete;

 private:
  LedgerRow* outer_;
  std::shared_ptr<LedgerRow> row_;
};

// The region saved its inputs under `how`; `inputs` are charged to the row when Held.
void ledger_inputs_saved(LedgerRow& row, LedgerInputs how, const std::vector<at::Tensor>& inputs);
// The region's forward ended: what its row holds now is what it held for backward.
void ledger_forward_ended(LedgerRow& row);

// A charge of the meters (MeterCharge) made on this thread: charged to the row whose forward runs
// here, if any; `token` refunds it (null if no row took it). A tensor is counted by storage.
std::shared_ptr<void> ledger_charge(const at::Tensor& tensor, int64_t bytes);

// Around one recomputation of a row's region (Frame::recompute): the replay (ledger_replayed)
// or, failing that, the forward run again, and its host time.
class LedgerRebuildScope {
 public:
  explicit LedgerRebuildScope(LedgerRow* row);
  ~LedgerRebuildScope();
  // The region ran its forward again (a full region, or a selective one that fell back).
  void reran() { reran_ = true; }
  LedgerRebuildScope(const LedgerRebuildScope&) = delete;
  LedgerRebuildScope& operator=(const LedgerRebuildScope&) = delete;

 private:
  LedgerRow* row_;
  LedgerRow* outer_;
  bool reran_ = false;
  std::chrono::steady_clock::time_point start_;
};

// An error left a row's forward or its rebuild in backward (`in_backward`): a
// c10::OutOfMemoryError gets the ledger's view at that moment appended to its message, once for
// all the regions it passes through (ledger_oom.cpp). Other errors are left as they are.
void ledger_explain_oom(const std::exception_ptr& error, LedgerRow& row, bool in_backward);
// The row being rebuilt on this thread (in_backward true), else the row whose forward runs here,
// else null.
LedgerRow* ledger_row_running_here(bool& in_backward);

// A selective region's forward ends on this thread: the names of its save list that no op
// matched, for the row whose forward runs here (if any).
void ledger_policy_unmatched(std::vector<std::string> names);

// The selective replay's outcome, for the row being rebuilt on this thread (if any).
void ledger_replayed(const ReplayOutcome& replay);

// ---- Plans ----

// A module's entry in the plan applied to it: the state of the composable API "recompose.plan",
// which lib/planner's apply_plan attaches to each module it configures. The module's ledger rows
// show it beside what they measured.
inline constexpr const char* kPlanApi = "recompose.plan";
struct PlanEntryState {
  std::string entry;  // what the plan chose: "full", "selective (keeps 2 op outputs, swaps 0)"...
  int64_t estimate_bytes = 0;  // the plan's estimate of the bytes it holds for backward
  bool offload = false;        // applied with apply_offload (else apply_checkpoint)
};

// ---- Swap and offload (lib/swap reports here; the engine knows nothing of swap) ----

// A call of a module with apply_offload begins in a forward on this thread: its row (null when no
// ledger records it). A checkpointed region of the same module begun inside the call takes the
// row over (one row per module). Call only when any_ledger_alive().
std::shared_ptr<LedgerRow> ledger_begin_offload(const torch::nn::Module& module);
// The call's forward ended: what its row holds now is what it held for backward (a row a region
// took over is counted again, its end sampled already by the region).
void ledger_offload_ended(LedgerRow& row);

// The row a tensor saved now on this thread belongs to: the row whose forward runs here (null if
// none). Swap keeps it with the tensor and reports its copies there, on whatever thread they run.
// Call only when any_ledger_alive().
std::shared_ptr<LedgerRow> ledger_swap_row();

// What swap did for a row (LedgerRegion::swap), added to it.
void ledger_swapped(LedgerRow& row, const LedgerSwap& swap);
// A saved tensor of the row stayed on the device under swap or offload, for `reason` (a string
// literal: "below min_bytes", "parameter", "policy", "over the copy window", ...).
void ledger_kept(LedgerRow& row, const char* reason, int64_t bytes);  // reason: not null
// Whether a row is being rebuilt on this thread (the replay's hook checks before it copies).
bool ledger_rebuilding();

}  // namespace recompose::detail
