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

void copy_launched(SwapEntry& e, events::CopyCause cause, double host_seconds) {
  e.landing_reported = false;
  if (!e.region) return;
  events::copy_launched(*e.region, {.direction = direction_of(e),
                                    .cause = cause,
                                    .bytes = e.nbytes,
                                    .host_wait_ns = static_cast<int64_t>(host_seconds * 1e9)});
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
