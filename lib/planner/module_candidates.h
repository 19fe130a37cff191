// Each module's candidate configurations for the solver, as (bytes, time) points priced by
// module_pricing.h: none; full; offload and full checkpointing with its inputs in host memory
// where copies are priced; selective keep sets grown one op at a time (the op that saves the most
// time per byte first), the swappable ops swapped and the rest kept, and what transformer_policy
// keeps (with and without every second aten::mm). Only the Pareto front is kept: more bytes must
// buy less time.
#pragma once

#include "copy_window_model.h"

#include <recompose/memory_plan.h>
#include <recompose/memory_profile.h>

#include <cstdint>
#include <vector>

namespace recompose::detail {

struct Point {
  int64_t bytes = 0;
  double seconds = 0;  // extra step time against no checkpointing
  ModuleChoice choice = ModuleChoice::None;
  size_t keep_set = 0;  // Selective: index into ModuleOptions::keep_sets
};

// One module's configurations.
struct ModuleOptions {
  const ModuleProfile* profile = nullptr;
  std::vector<std::vector<bool>> keep_sets;  // Selective: per op, kept or not
  std::vector<bool> swap;     // per op: offloaded rather than recomputed when not kept
  std::vector<Point> points;  // Pareto front, fewest bytes first
};

// Every module's options; `windows` (null: no copies) prices copies, `offload` offers module
// offload. Throws std::invalid_argument if the profile has no module.
std::vector<ModuleOptions> module_options(const MemoryProfile& profile,
                                          const CopyWindowModel* windows, bool offload);

// The plan entry of point `p` of `options`.
ModulePlan module_plan(const ModuleOptions& options, const Point& p);

}  // namespace recompose::detail
