// Where each module call's backward starts and ends in a profiled step, from autograd hooks on
// its output and input tensors, and what the selective replay did in between.
//
// A module call's backward starts when the gradient of its first output is ready (the hook
// autograd runs before the output's grad_fn) and ends when the last gradient of its inputs is
// (inputs that are not autograd leaves: a hook on a leaf would outlive the step). A call with no
// such input ends where the next other call's backward starts, or where the step ends.
#pragma once

#include "step_timeline.h"

#include <cstddef>
#include <cstdint>
#include <vector>

namespace recompose::detail {

class BackwardSpans {
 public:
  struct Span {
    size_t module = 0;
    StepTimeline::Mark from = 0, to = 0;
    // Selective replay counters (recompose::selective_replay_stats) within the span.
    int64_t replayed = 0, fallbacks = 0, replay_ns = 0;
  };

  explicit BackwardSpans(StepTimeline& timeline) : timeline_(timeline) {}

  // A forward call of `module`; returns the id its hooks report with.
  size_t add_call(size_t module);
  // Autograd hooks: a gradient of call `call`'s output (input) is ready.
  void output_ready(size_t call);
  void input_ready(size_t call);
  // The spans of the calls whose backward started, with `step_end` (a mark taken after the
  // step) closing those nothing else closed. Forgets the calls and events.
  std::vector<Span> take(StepTimeline::Mark step_end);

 private:
  struct Counters {
    int64_t replayed = 0, fallbacks = 0, replay_ns = 0;
  };
  struct Event {
    size_t call;
    bool output;
    StepTimeline::Mark mark;
    Counters counters;
  };
  static Counters counters_now();
  void note(size_t call, bool output);

  StepTimeline& timeline_;
  std::vector<size_t> call_module_;
  std::vector<bool> started_;
  std::vector<Event> events_;
};

}  // namespace recompose::detail
