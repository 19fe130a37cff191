// plan_memory(): the profiler's measurement handed to the solver (recompose/planner.h). The solver
// itself only ever sees a MemoryProfile.
#include <recompose/memory_profile.h>
#include <recompose/planner.h>

namespace recompose {

Plan plan_memory(torch::nn::Module& model, const std::function<void()>& step, const Budget& budget,
                 const PlannerOptions& options) {
  return solve_plan(profile_memory(model, step, options.profile()), budget, options.solve());
}

}  // namespace recompose
