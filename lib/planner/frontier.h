// The Pareto frontier of whole plans, built module by module from each module's candidates
// (module_candidates.h): plans of modules 0..i, Pareto-optimal (sorted by bytes, time strictly
// falling), thinned to one plan per 1/4096 of the largest total. Built the same way for every
// budget, so a budget only picks a point of the last one (recompose/planner.h explains why this is
// monotone).
//
// Plans with and plans without offloaded modules are solved apart (families): an offloaded module
// holds what it saves until its call ends (the copies start then), so a plan with offload holds,
// at its peak, up to the largest module's saved bytes on top of the rest; each family has that in
// its base.
#pragma once

#include "copy_window_model.h"
#include "module_candidates.h"
#include "plan_judge.h"

#include <recompose/memory_plan.h>
#include <recompose/memory_profile.h>

#include <cstdint>
#include <vector>

namespace recompose::detail {

// A whole plan on the frontier: its totals and how it was made (for the walk back).
struct Node {
  int64_t bytes;
  double seconds;
  int32_t parent;  // index in the previous module's frontier
  int32_t point;   // index in this module's points
};

struct Family {
  std::vector<ModuleOptions> modules;
  int64_t base_bytes = 0;
  // The frontier after each module.
  std::vector<std::vector<Node>> fronts;
};

// Without copy windows: one family, no copies. With them: no copies; swaps of single ops; and
// module offload as well. The no-copy family is solved on its own so that its plans stay
// candidates where a plan with copies holds fewer bytes for the same estimate but stalls or peaks
// higher. Throws std::invalid_argument if the profile has no module.
std::vector<Family> families(const MemoryProfile& profile, const CopyWindowModel* windows);

// The largest bytes a module saves: what a plan offloading modules holds on top of the rest.
int64_t largest_saved(const MemoryProfile& profile);

// A point of the final frontier: node `node` of family `family`'s last frontier.
struct Final {
  int64_t bytes;
  double seconds;
  size_t family, node;
};

// The last frontiers of all families, merged and Pareto-filtered.
std::vector<Final> final_frontier(const std::vector<Family>& families);

// The plan of one frontier point, for a budget of `limit` bytes, judged (its simulated peak and
// step).
Plan plan_at(const MemoryProfile& profile, const std::vector<Family>& families, const Final& chosen,
             int64_t limit, const Judge& judge);

}  // namespace recompose::detail
