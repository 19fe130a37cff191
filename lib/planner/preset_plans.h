// The fixed presets candidate_plans lists beside the solver's plans: one configuration for every
// module (no checkpointing, full checkpointing, transformer_policy with and without every second
// aten::mm, offload), priced by module_pricing.h as the solver prices a module, then judged
// (simulated peak and step) as the solver's plans are.
#pragma once

#include "copy_window_model.h"
#include "plan_judge.h"

#include <recompose/memory_plan.h>
#include <recompose/memory_profile.h>

#include <cstdint>

namespace recompose::detail {

enum class Preset {
  None,
  Full,
  TransformerPolicy,  // transformer_policy's list kept, nothing swapped
  EverySecondMm,      // the same with every second aten::mm recomputed
  Offload,            // needs copy windows
};

// `preset` on every module of `profile`, for a budget of `limit` bytes, judged by `judge`;
// `windows` prices copies (null: none). Throws std::logic_error for Offload without windows.
Plan preset_plan(const MemoryProfile& profile, Preset preset, int64_t limit, const Judge& judge,
                 const CopyWindowModel* windows);

}  // namespace recompose::detail
