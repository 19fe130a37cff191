#include "step_timeline.h"

#include "engine/device_adapter.h"

#include <utility>

namespace recompose::detail {

StepTimeline::StepTimeline(const c10::Device& device)
    : device_(device), on_device_(uses_streams(device)) {}

StepTimeline::Mark StepTimeline::mark() {
  if (!on_device_) {
    host_marks_.push_back(std::chrono::steady_clock::now());
    return host_marks_.size() - 1;
  }
  if (used_ == device_marks_.size()) {
    // Timing must be on: c10's default flag creates events that cannot be timed.
    device_marks_.emplace_back(device_.type(), c10::EventFlag::BACKEND_DEFAULT);
  }
  device_marks_[used_].record(current_stream(device_));
  return used_++;
}

void StepTimeline::add(Mark from, Mark to, std::function<double&()> slot) {
  spans_.push_back({from, to, std::move(slot)});
}

double StepTimeline::seconds_between(Mark from, Mark to) const {
  if (!on_device_)
    return std::chrono::duration<double>(host_marks_[to] - host_marks_[from]).count();
  return device_marks_[from].elapsedTime(device_marks_[to]) / 1e3;  // elapsedTime is in ms
}

void StepTimeline::resolve() {
  if (on_device_ && used_ > 0) device_marks_[used_ - 1].synchronize();
  for (const Span& s : spans_) s.slot() += seconds_between(s.from, s.to);
  spans_.clear();
  host_marks_.clear();
  used_ = 0;
}

}  // namespace recompose::detail
