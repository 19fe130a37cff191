#include "backward_spans.h"

#include <recompose/selective_checkpoint.h>

#include <optional>

namespace recompose::detail {

size_t BackwardSpans::add_call(size_t module) {
  call_module_.push_back(module);
  started_.push_back(false);
  return call_module_.size() - 1;
}

BackwardSpans::Counters BackwardSpans::counters_now() {
  const SelectiveReplayStats s = selective_replay_stats();
  return {s.replayed, s.fallbacks, s.replay_ns};
}

void BackwardSpans::note(size_t call, bool output) {
  if (call >= call_module_.size()) return;
  if (output) {
    if (started_[call]) return;  // a later output of the same call: the backward began already
    started_[call] = true;
  }
  events_.push_back({call, output, timeline_.mark(), counters_now()});
}

void BackwardSpans::output_ready(size_t call) { note(call, true); }
void BackwardSpans::input_ready(size_t call) { note(call, false); }

std::vector<BackwardSpans::Span> BackwardSpans::take(StepTimeline::Mark step_end) {
  const Counters at_end = counters_now();
  std::vector<Span> out;
  for (size_t e = 0; e < events_.size(); ++e) {
    if (!events_[e].output) continue;
    const size_t call = events_[e].call;
    const Event* end = nullptr;
    for (size_t j = e + 1; j < events_.size(); ++j) {
      const Event& x = events_[j];
      if (x.output && x.call != call) {
        if (!end) end = &x;
        break;
      }
      if (!x.output && x.call == call)
        end = &x;  // the last input gradient before another call's backward
    }
    const Counters& from = events_[e].counters;
    const Counters& to = end ? end->counters : at_end;
    out.push_back({call_module_[call], events_[e].mark, end ? end->mark : step_end,
                   to.replayed - from.replayed, to.fallbacks - from.fallbacks,
                   to.replay_ns - from.replay_ns});
  }
  call_module_.clear();
  started_.clear();
  events_.clear();
  return out;
}

}  // namespace recompose::detail
