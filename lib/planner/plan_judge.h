// What the solver judges a whole plan by: the step simulated on the link the plan's copies cross
// (copy_window_model.h: the swap manager's throttle, its prefetch), which gives the plan's peak
// and a lower bound on its step time, and the caching allocator's share of a peak budget. Also
// the link itself: the one copies are priced on (SolveOptions, the profile's bandwidth).
#pragma once

#include "copy_window_model.h"

#include <recompose/copy_link.h>
#include <recompose/memory_plan.h>
#include <recompose/memory_profile.h>
#include <recompose/planner.h>

#include <cstdint>
#include <optional>

namespace recompose::detail {

// The link offload copies cross, or none where the solver may not offload (SolveOptions::offload:
// Auto offloads on a device with a bandwidth, Always falls back to 10 GB/s).
std::optional<LinkModel> link_for(const MemoryProfile& profile, const SolveOptions& options);

// The copy-window model copies are priced on (link_for's link on the profile's time line), or
// none where the solver may not offload. Throws std::invalid_argument as CopyWindowModel does.
std::optional<CopyWindowModel> windows_for(const MemoryProfile& profile,
                                           const SolveOptions& options);

struct Judge {
  const MemoryProfile& profile;
  LinkModel link;
  int64_t max_groups_in_flight = 2;
  double headroom = 0;  // allocator_headroom on a device; 0 on CPU (no caching allocator)

  // Fills plan.peak_bytes, and makes plan.step_seconds (the modules' costs added up) at least
  // the simulated step: the added-up costs give each module's copies back the next module's
  // backward, which the swap manager's prefetch gives only where that module offloads too.
  void finish(Plan& plan) const;
  // What a plan needs of a peak budget: its simulated peak, and where it swaps the largest
  // module's offloaded bytes, which come back into blocks cached for the copy stream.
  int64_t needs(const Plan& plan) const;
  // What of a peak budget a plan may need: the rest is the allocator's headroom.
  int64_t usable(int64_t peak) const;
  // The least peak budget whose usable part covers `need`.
  int64_t least_budget(int64_t need) const;
};

// The judge of plans for `profile`. Throws std::invalid_argument unless 0 <= allocator_headroom <
// 1 and max_groups_in_flight >= 0.
Judge judge_of(const MemoryProfile& profile, const SolveOptions& options);

// A plan for a budget of `limit` bytes with no module yet: what every candidate says of the
// profile it came from.
Plan plan_for(const MemoryProfile& profile, int64_t limit);

}  // namespace recompose::detail
