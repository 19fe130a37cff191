// What swap tells the sinks of events (events/events.h) about an entry's copies: each copy begun,
// launched, and landed (once), with the tag of the region that saved the tensor. Nothing for an
// entry whose region no sink listened to. Under the core's lock.
#pragma once

#include "events/events.h"
#include "swap/swap_entry.h"

namespace recompose::detail {

// A copy of `entry` begins (its buffer is made or taken from the pool, then it is launched).
void copy_begins(const SwapEntry& entry, events::CopyDirection direction);
// Before a copy of `entry` is launched: its launch time, if a sink listens.
void copy_launching(SwapEntry& entry);
// A copy of `entry` was launched (its state says which way), taking `host_seconds` of host time.
void copy_launched(SwapEntry& entry, events::CopyCause cause, double host_seconds);
// The landing of `entry`'s last copy, once, when its fence is done.
void report_landing(SwapEntry& entry);

}  // namespace recompose::detail
