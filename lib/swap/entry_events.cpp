#include "swap/entry_events.h"

#include <chrono>

namespace recompose::detail {

namespace {

events::CopyDirection direction_of(const SwapEntry& e) {
  return e.state == SwapState::Offloading ? events::CopyDirection::ToHost
                                          : events::CopyDirection::ToDevice;
}

}  // namespace

void copy_begins(const SwapEntry& e, events::CopyDirection direction) {
  if (e.region) events::copy_begun(*e.region, direction);
}

void copy_launching(SwapEntry& e) {
  if (e.region) e.copy_launched = std::chrono::steady_clock::now();
}

void copy_launched(SwapEntry& e, events::CopyCause cause, double host_seconds,
                   SwapCounters& counters) {
  const events::CopyDirection direction = direction_of(e);
  counters.update([&](SwapStats& s) {
    s.wait_seconds += host_seconds;
    if (direction == events::CopyDirection::ToHost) {
      ++s.tensors_offloaded;
      s.bytes_offloaded += e.nbytes;
      return;
    }
    ++s.tensors_reloaded;
    s.bytes_reloaded += e.nbytes;
    ++(cause == events::CopyCause::Prefetch ? s.prefetched : s.sync_loads);
  });
  e.landing_reported = false;
  if (!e.region) return;
  events::copy_launched(*e.region, {.direction = direction,
                                    .cause = cause,
                                    .bytes = e.nbytes,
                                    .host_wait_ns = static_cast<int64_t>(host_seconds * 1e9)});
}

void reload_late(SwapEntry& e, double waited_seconds, SwapCounters& counters) {
  counters.update([&](SwapStats& s) {
    ++s.late_reloads;
    s.wait_seconds += waited_seconds;
  });
  if (e.region) events::reload_late(*e.region, static_cast<int64_t>(waited_seconds * 1e9));
}

void report_landing(SwapEntry& e) {
  if (!e.region || e.landing_reported || !e.fence->done()) return;
  e.landing_reported = true;
  if (e.state != SwapState::Offloading && e.state != SwapState::Reloaded) return;
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::steady_clock::now() - e.copy_launched)
                      .count();
  events::copy_landed(*e.region, {.direction = direction_of(e), .bytes = e.nbytes, .ns = ns});
}

}  // namespace recompose::detail
