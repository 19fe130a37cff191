// The copy-window cost model: a training step as a time line of compute (per module its forward
// and its backward, in forward order), on which offload copies run beside the compute on one
// copy stream (SwapManager's: copies out and back queue on it in order).
//
// Two views of it:
// - exposed_seconds(), per module, for the solver to add up: module i's copies out must land
//   within the NEXT module's forward (its window; the last module's is the forward compute after
//   it, head and loss), its copies back within the next module's backward (the last module's:
//   the backward before it). What does not fit is exposed.
// - simulate(), the whole step as SwapManager runs it, which gives the plan's time and peak:
//   * Forward: a module's copies start when its forward ends, after the copies queued before
//     them. When a module that offloads starts, the swap manager's throttle
//     (SwapOptions::max_groups_in_flight, G) lets at most G - 1 earlier modules' copies stay in
//     flight: the host waits for the rest to land, and the compute with it (a selective region
//     paces the device from the host: it has nothing queued to run meanwhile). With G = 2 a
//     module's copies must land before the module after the next starts, as in exposed_seconds.
//   * Backward: a module's copies come back when backward first uses one of its tensors (its
//     reload then waits in full), unless a later module that offloads was used first: its first
//     use prefetches the nearest earlier module's copies (SwapOptions::prefetch_groups(1)). So
//     the module that starts a run of offloading modules in backward order (the last in forward
//     order, or one followed by modules that offload nothing) reloads on demand, exposed;
//     exposed_seconds() gives it the next module's backward all the same, so a plan is timed by
//     simulate() (the solver's Plan::step_seconds is the larger of the two).
//
// Memory on the same time line: a module's forward allocates what it saves at a steady rate
// over its forward; offloaded bytes are freed when their copy lands and come back when their
// reload starts; what a recomputation rematerialises lives during the module's backward only.
#pragma once

#include <recompose/copy_link.h>
#include <recompose/memory_plan.h>
#include <recompose/memory_profile.h>

#include <cstdint>
#include <vector>

namespace recompose::detail {

// The compute of one step, without checkpointing.
struct StepCompute {
  struct Module {
    double forward_seconds = 0;
    double backward_seconds = 0;
  };
  std::vector<Module> modules;       // forward order
  double forward_tail_seconds = 0;   // forward compute after the last module (head, loss)
  double backward_head_seconds = 0;  // backward compute before the last module's (head, loss)
};

// What a plan does with one module, as the time line sees it.
struct ModuleLoad {
  int64_t held_bytes = 0;  // on the device from the end of its forward to the end of its backward
  int64_t offload_bytes = 0;     // to host memory after its forward, back before its backward
  int64_t offload_copies = 0;    // how many tensors those bytes are (each copy pays the fixed cost)
  int64_t backward_bytes = 0;    // on the device during its backward only (what it recomputes)
  double recompute_seconds = 0;  // added to its backward
};

struct SimulatedStep {
  double seconds = 0;          // the step: compute, recomputation and waits for copies
  double compute_seconds = 0;  // compute and recomputation only
  std::vector<double> forward_wait_seconds;   // per module: the compute waited for its copy out
  std::vector<double> backward_wait_seconds;  // per module: the compute waited for its copy back
  int64_t peak_bytes = 0;  // the most held at once: base + module bytes (activations)
  bool peak_in_backward = false;
  // The module whose forward or backward (recomputation included) the peak falls in; -1 between
  // modules (the step's start, or the turn from forward to backward with everything held).
  int peak_module = -1;
};

class CopyWindowModel {
 public:
  // `max_groups_in_flight`: the swap manager's throttle (SwapOptions; 0: none). Throws
  // std::invalid_argument if the link is not valid, a time or the throttle is negative.
  CopyWindowModel(StepCompute compute, LinkModel link, int64_t max_groups_in_flight = 2);

  const StepCompute& compute() const { return compute_; }
  const LinkModel& link() const { return link_; }
  int64_t max_groups_in_flight() const { return max_groups_in_flight_; }
  // The forward compute in which module i's copy to host must land.
  double forward_window(size_t i) const;
  // The backward compute in which module i's copy back must land.
  double backward_window(size_t i) const;
  // What moving `bytes` in `copies` copies out of module i and back costs the step (the part of
  // each copy that does not fit its window); 0 when both fit.
  double exposed_seconds(size_t i, int64_t bytes, int64_t copies) const;
  // The most bytes module i can move in `copies` copies without exposing any time.
  int64_t free_bytes(size_t i, int64_t copies) const;

  // Runs the step with one load per module and `base_bytes` held throughout (what no module
  // holds). Throws std::invalid_argument if the loads do not match the modules.
  SimulatedStep simulate(const std::vector<ModuleLoad>& loads, int64_t base_bytes) const;

 private:
  StepCompute compute_;
  LinkModel link_;
  int64_t max_groups_in_flight_ = 2;
};

// The time line of a profiled step: each module's measured forward and backward
// (MemoryProfile::backward_measured(); scaled down together should they exceed the step's time
// beyond the forwards), the remainder of the step split one third to the forward after the
// modules and two thirds to the backward before them. A profile without measured backward times
// (one saved before they were) falls back to each module's backward taking twice its forward (a
// backward computes two products per forward product) while that fits.
StepCompute step_compute_of(const MemoryProfile& profile);

// How many copies offloading module `m` whole makes: one per op with outputs (at least one).
int64_t offload_copies(const ModuleProfile& m);

// What `plan` does with each module of `profile`, as loads (same order as profile.modules; a
// module the plan does not name is None).
std::vector<ModuleLoad> module_loads(const MemoryProfile& profile, const Plan& plan);

// simulate() on the profile's time line under `plan`, with the profile's other_bytes as base.
SimulatedStep simulate_plan(const MemoryProfile& profile, const Plan& plan, const LinkModel& link,
                            int64_t max_groups_in_flight = 2);

}  // namespace recompose::detail
