// Timestamps taken while a profiled step runs, turned into durations after it.
//
// On CPU a mark is the host clock. On a device a mark is an event recorded on the current
// stream: reading the host clock there needs a synchronisation per mark, which serialises the
// step (profiling then took over 4 steps of time on an H100, against the 3 the planner allows)
// and times each op's launch rather than the device's work. Durations between events are read
// once, in resolve(), after one synchronisation.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/Event.h>

#include <chrono>
#include <cstddef>
#include <functional>
#include <vector>

namespace recompose::detail {

class StepTimeline {
 public:
  using Mark = size_t;

  explicit StepTimeline(const c10::Device& device);

  // Marks are the host clock (CPU), not events on a device's stream.
  bool on_host() const { return !on_device_; }

  // A timestamp: now on the host (CPU), or once the device's queued work is done (device).
  Mark mark();
  // Adds the seconds from `from` to `to` to what `slot` returns, in resolve(). `slot` is called
  // then, so it may name storage that moves meanwhile (an element of a growing vector).
  void add(Mark from, Mark to, std::function<double&()> slot);
  // Waits for the device (once), adds every pending span to its slot, forgets the marks.
  // Device events are kept for the next run.
  void resolve();

 private:
  struct Span {
    Mark from, to;
    std::function<double&()> slot;
  };
  double seconds_between(Mark from, Mark to) const;

  c10::Device device_;
  bool on_device_;
  std::vector<std::chrono::steady_clock::time_point> host_marks_;
  std::vector<c10::Event> device_marks_;  // reused across runs; the first `used_` are this run's
  size_t used_ = 0;
  std::vector<Span> spans_;
};

}  // namespace recompose::detail
