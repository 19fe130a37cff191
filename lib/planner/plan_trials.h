// choose_plan's work, for plan_memory to count the profile's time in the planning cost.
#pragma once

#include <recompose/planner.h>

#include <functional>

namespace recompose::detail {

// choose_plan (recompose/planner.h), with `spent_before` seconds (the profile's) counted in
// Plan::planning_seconds / planning_steps and in TrialOptions::max_planning_steps.
Plan choose_plan_after(torch::nn::Module& model, const std::function<void()>& step,
                       const MemoryProfile& profile, const Budget& budget,
                       const PlannerOptions& options, double spent_before);

}  // namespace recompose::detail
