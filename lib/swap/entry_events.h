// The facts of an entry's copies, each stated once: it counts them in the manager's SwapStats and
// tells the sinks of events (events/events.h) with the tag of the region that saved the tensor
// (nothing for an entry whose region no sink listened to): each copy begun, launched, a reload
// late, and each landing once. Under the core's lock.
#pragma once

#include "events/events.h"
#include "swap/swap_counters.h"
#include "swap/swap_entry.h"

namespace recompose::detail {

// A copy of `entry` begins (its buffer is made or taken from the pool, then it is launched).
void copy_begins(const SwapEntry& entry, events::CopyDirection direction);
// Before a copy of `entry` is launched: its launch time, if a sink listens.
void copy_launching(SwapEntry& entry);
// A copy of `entry` was launched (its state says which way: Offloading to host, Reloaded to the
// device), taking `host_seconds` of host time.
void copy_launched(SwapEntry& entry, events::CopyCause cause, double host_seconds,
                   SwapCounters& counters);
// Backward asked for `entry` before its reload landed, and waited `waited_seconds` (0 unmeasured).
void reload_late(SwapEntry& entry, double waited_seconds, SwapCounters& counters);
// The landing of `entry`'s last copy, once, when its fence is done.
void report_landing(SwapEntry& entry);

}  // namespace recompose::detail
