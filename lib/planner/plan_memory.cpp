// plan_memory(): the profiler's measurement handed to choose_plan, which solves and tries the
// candidates on the model (Note [ Choosing by measurement ], plan_trials.cpp).
#include <recompose/memory_profile.h>
#include <recompose/planner.h>

namespace recompose {

Plan plan_memory(torch::nn::Module& model, const std::function<void()>& step, const Budget& budget,
                 const PlannerOptions& options) {
  const MemoryProfile profile = profile_memory(model, step, options.profile());
  return choose_plan(model, step, profile, budget, options);
}

}  // namespace recompose
