// One cost function per (module, choice): what a module holds for backward and adds to the step
// under each choice (none, full, offload, full checkpointing with its inputs in host memory, a
// selective keep set with its swaps), and what the choice does on the step's time line
// (ModuleLoad). The solver's candidates, the fixed presets (candidate_plans) and the copy-window
// model's loads all price a choice here, so a new cost is added once.
//
// A choice's load says what it holds, moves and recomputes; its price follows from the load:
// bytes = what it holds on the device; seconds = its recomputation, plus what its copies expose
// beyond their windows (copy_window_model.h) and a tie-break per byte copied. A selective keep set
// is priced op by op instead: its fixed cost (the interception in the forward, the replay's own
// work), the copies of its swapped ops not kept (each op's share, as DropCosts chose them) and the
// ops its recomputation runs (replay_cost.h).
#pragma once

#include "copy_window_model.h"
#include "replay_cost.h"

#include <recompose/memory_plan.h>
#include <recompose/memory_profile.h>

#include <cstdint>
#include <vector>

namespace recompose::detail {

// A configuration's cost.
struct Price {
  int64_t bytes = 0;   // held for backward
  double seconds = 0;  // extra step time against no checkpointing
};

// What dropping each op costs a selective configuration, and which ops are swapped rather than
// recomputed when dropped.
struct DropCosts {
  // Per op: offloaded when not kept. With copy windows, the swappable ops whose copies cost less
  // than recomputing them, the dearest recomputation per byte first (nothing while they fit the
  // module's windows); none without.
  std::vector<bool> swap;
  // Per op: its copies' share where swapped, else its recomputation if a replay with nothing kept
  // runs it (0 if not).
  std::vector<double> seconds;
};

class ModulePricing {
 public:
  // Module `index` of the step's time line `windows` (null: copies are not priced; no choice that
  // copies is offered). Keeps references to both.
  ModulePricing(const ModuleProfile& module, size_t index, const CopyWindowModel* windows);

  const ModuleProfile& module() const { return m_; }

  // Whether the solver offers `choice` here: None, Full and Selective always; FullSwapInputs with
  // windows and inputs no later module takes; Offload with windows.
  bool offers(ModuleChoice choice) const;
  // The price of a whole-module choice (not Selective). Throws std::logic_error for Selective, and
  // for Offload or FullSwapInputs without windows.
  Price price(ModuleChoice choice) const;

  // Selective: what dropping each op costs (computed on each call).
  DropCosts drop_costs() const;
  // Keeping the ops with keep[k], the others swapped where drops->swap says (null: none swapped),
  // else recomputed.
  Price selective(const std::vector<bool>& keep, const DropCosts* drops = nullptr) const;
  // selective(keep, drops).seconds alone.
  double selective_seconds(const std::vector<bool>& keep, const DropCosts* drops = nullptr) const;
  // The recomputation is priced by the replay's dependency walk (ReplayCost::walks); else every op
  // not answered runs.
  bool walks() const { return replay_.walks(); }

  // What `choice` does with the module on the step's time line; Selective: keeping the ops with
  // kept[k] and swapping the others with swapped[k] (one entry per op each). Its copies are the
  // time line's to place: recompute_seconds counts none.
  ModuleLoad load(ModuleChoice choice, const std::vector<bool>& kept = {},
                  const std::vector<bool>& swapped = {}) const;

 private:
  ModuleLoad selective_load(const std::vector<bool>& kept, const std::vector<bool>& swapped) const;

  const ModuleProfile& m_;
  size_t index_ = 0;
  const CopyWindowModel* windows_ = nullptr;
  ReplayCost replay_;
  double fixed_ = 0;  // selective's fixed cost
};

}  // namespace recompose::detail
