// A module's entry in the plan applied to it: the state of the composable API "recompose.plan",
// which lib/planner's apply_plan attaches to each module it configures. The step ledger shows it
// on the module's rows beside what they measured.
#pragma once

#include <cstdint>
#include <string>

namespace recompose::detail {

inline constexpr const char* kPlanApi = "recompose.plan";
struct PlanEntryState {
  std::string entry;  // what the plan chose: "full", "selective (keeps 2 op outputs, swaps 0)"...
  int64_t estimate_bytes = 0;  // the plan's estimate of the bytes it holds for backward
  bool offload = false;        // applied with apply_offload (else apply_checkpoint)
};

}  // namespace recompose::detail
